//! Message ping-pong through `transport` against a `transport-echo server` child process
//! (CPU 0; this process on CPU 1): `tcp://` and `ucx://` (polling), one host frame per
//! message, 8 B / 1 MiB / 16 MiB. `cargo bench -p ucxrs-transport --bench transport_pingpong`.
//! For ratios against ucx_perftest and ucx-rs in one run, see `scripts/compare.py`.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use transport::{configure_ucx, connect, Address, Message, UcxIntent};

struct Server(Child, Address);

impl Server {
    fn spawn(listen: &str) -> Server {
        let mut child = Command::new("taskset")
            .args(["-c", "0", env!("CARGO_BIN_EXE_transport-echo"), "server"])
            .args(["--listen", listen, "--ucx-progress", "polling"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn transport-echo server");
        let addr = test_support::listening(&mut child, test_support::START_LIMIT)
            .expect("server address")
            .parse()
            .expect("address");
        Server(child, addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pingpong(c: &mut Criterion) {
    configure_ucx(UcxIntent {
        progress: ucx::ProgressMode::Polling,
        ..UcxIntent::default()
    })
    .expect("UCX configuration");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for scheme in ["tcp", "ucx"] {
        let server = Server::spawn(&format!("{scheme}://127.0.0.1:0"));
        let conn = Arc::new(rt.block_on(connect(&server.1)).expect("connect"));
        let mut group = c.benchmark_group(format!("transport_pingpong_{scheme}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(2));
        for size in [8usize, 1 << 20, 16 << 20] {
            let msg = Message::from(vec![vec![5u8; size]]);
            group.throughput(Throughput::Bytes(size as u64));
            group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, _| {
                b.iter_custom(|iters| {
                    let (conn, msg) = (Arc::clone(&conn), msg.clone());
                    // A task, not the block_on future (polling UCX futures reschedule
                    // themselves, which costs a system call only in block_on).
                    rt.block_on(async move {
                        tokio::spawn(async move {
                            let t0 = Instant::now();
                            for _ in 0..iters {
                                conn.send(0, msg.clone()).await.unwrap();
                                let (_, back) = conn.recv().await.unwrap();
                                assert_eq!(back.len(), msg.len());
                            }
                            // One-way time per message.
                            t0.elapsed() / 2
                        })
                        .await
                        .unwrap()
                    })
                });
            });
        }
        group.finish();
        rt.block_on(async { conn.close().await.unwrap() });
    }
}

criterion_group!(benches, pingpong);
criterion_main!(benches);
