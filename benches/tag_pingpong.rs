//! Tagged ping-pong through ucx-rs against an `ucx-echo server` child process (CPU 0; this
//! process on CPU 1), host memory, polling and blocking progress, 8 B / 1 MiB / 64 MiB.
//!
//! `cargo bench --bench tag_pingpong`. Compare with `python3 scripts/compare.py`, which runs
//! `ucx_perftest` in the same run and prints ratios.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use test_support::{listening_port, START_LIMIT};
use ucx::{Context, Endpoint, ProgressMode, Worker};
use ucx_stack::{echo, measure::pin_to_cpu};

struct Server(Child, u16);

impl Server {
    fn spawn(mode: &str) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ucx-echo"))
            .args([
                "server",
                "--bind",
                "127.0.0.1",
                "--cpu",
                "0",
                "--mode",
                mode,
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn ucx-echo server");
        let port = listening_port(&mut child, START_LIMIT).expect("server port");
        Server(child, port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pingpong(c: &mut Criterion) {
    let _ = pin_to_cpu(1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ctx = Context::new().unwrap();
    for (mode, name) in [
        (ProgressMode::Polling, "polling"),
        (ProgressMode::Blocking, "blocking"),
    ] {
        let server = Server::spawn(name);
        let (worker, ep) = rt.block_on(async {
            let w = Worker::new(&ctx, mode).unwrap();
            let ep = Endpoint::connect(&w, ("127.0.0.1", server.1))
                .await
                .unwrap();
            (w, Arc::new(ep))
        });
        let mut group = c.benchmark_group(format!("tag_pingpong_{name}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(2));
        for size in [8usize, 1 << 20, 64 << 20] {
            group.throughput(Throughput::Bytes(size as u64));
            group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
                b.iter_custom(|iters| {
                    // A task, not the block_on future: a polling future re-schedules itself
                    // on every poll, which costs tokio a system call only in block_on.
                    let ep = Arc::clone(&ep);
                    rt.block_on(async move {
                        tokio::spawn(async move {
                            // One untimed round trip first: fresh buffers fault in and register.
                            let s = echo::pingpong(&ep, size, 1, iters as usize).await.unwrap();
                            // Criterion wants the total time of `iters` one-way messages.
                            s.mean * iters as u32
                        })
                        .await
                        .unwrap()
                    })
                });
            });
        }
        group.finish();
        rt.block_on(async { ep.close().await.unwrap() });
        drop(worker);
    }
}

criterion_group!(benches, pingpong);
criterion_main!(benches);
