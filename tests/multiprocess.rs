//! Real multi-process behaviour: an `ucx-echo server` child process and this test as client.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_support::{listening_port, START_LIMIT};
use ucx::{Context, Endpoint, ProgressMode, Worker};
use ucx_stack::echo;

const STEP: Duration = Duration::from_secs(60);

/// A child echo server, killed when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn spawn(mode: &str, once: bool) -> Server {
        Server::spawn_with(mode, once, &[])
    }

    fn spawn_with(mode: &str, once: bool, extra: &[&str]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ucx-echo"));
        cmd.args(["server", "--bind", "127.0.0.1", "--mode", mode]);
        cmd.args(extra);
        if once {
            cmd.arg("--once");
        }
        let mut child = cmd
            .env("UCX_KEEPALIVE_INTERVAL", "1s")
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn ucx-echo server");
        let port = listening_port(&mut child, START_LIMIT).expect("server port");
        Server { child, port }
    }

    fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "server did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn context() -> Context {
    Context::builder()
        .option("KEEPALIVE_INTERVAL", "1s")
        .build()
        .unwrap()
}

async fn connect(w: &Worker, port: u16) -> Endpoint {
    tokio::time::timeout(STEP, Endpoint::connect(w, ("127.0.0.1", port)))
        .await
        .expect("connect in time")
        .expect("connect")
}

async fn echo_across_processes(mode: ProgressMode, name: &str) {
    let mut server = Server::spawn(name, true);
    let ctx = context();
    let w = Worker::new(&ctx, mode).unwrap();
    let ep = connect(&w, server.port).await;
    let mut size = 1usize;
    while size <= 16 << 20 {
        let s = tokio::time::timeout(STEP, echo::pingpong(&ep, size, 1, 3))
            .await
            .expect("echo in time")
            .unwrap_or_else(|e| panic!("{name}: echo of {size} bytes: {e}"));
        assert_eq!(s.iters, 3);
        size *= 16;
    }
    // Closing cancels the server's pending receive: it ends that client and (--once) exits 0.
    ep.close().await.unwrap();
    let st = server.wait_exit(STEP);
    assert!(st.success(), "{name}: server exited with {st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_two_processes_polling() {
    echo_across_processes(ProgressMode::Polling, "polling").await;
}

#[tokio::test(flavor = "current_thread")]
async fn echo_two_processes_blocking() {
    echo_across_processes(ProgressMode::Blocking, "blocking").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_two_processes_thread() {
    echo_across_processes(ProgressMode::Thread, "thread").await;
}

#[tokio::test(flavor = "current_thread")]
async fn peer_killed_mid_transfer_fails_pending_operations() {
    let mut server = Server::spawn("blocking", false);
    let ctx = context();
    let w = Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    let ep = connect(&w, server.port).await;
    // A receive nobody will ever answer, pending on its own tag.
    let orphan = ep.recv(vec![0u8; 64], 999);
    // Large ping-pongs keep a transfer in flight when the server dies.
    let transfer = echo::pingpong(&ep, 16 << 20, 0, 10_000);
    let killer = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.child.kill().unwrap();
        Instant::now()
    };
    // An active message and a multi-buffer message nobody will send.
    let am = ep.am_recv();
    let multi = ep.recv_multi(555);
    let started = Instant::now();
    let (transfer_result, (orphan_result, _), am_result, multi_result, killed_at) =
        tokio::time::timeout(STEP, async {
            tokio::join!(transfer, orphan, am, multi, killer)
        })
        .await
        .expect("pending operations ended after the peer died");
    assert!(am_result.expect_err("am_recv must fail").is_disconnect());
    assert!(multi_result
        .expect_err("recv_multi must fail")
        .is_disconnect());
    let e = transfer_result.expect_err("the transfer cannot succeed with a dead peer");
    assert!(e.is_disconnect(), "transfer error: {e:?}");
    let e = orphan_result.expect_err("the orphan receive must fail");
    assert!(e.is_disconnect(), "orphan receive error: {e:?}");
    let after_kill = killed_at.elapsed();
    assert!(
        after_kill < Duration::from_secs(30),
        "took {after_kill:?} after the kill"
    );
    eprintln!(
        "pending operations failed {:?} after the kill ({:?} in all)",
        after_kill,
        started.elapsed()
    );
    assert!(ep.is_closed());
    let (r, _) = ep.send(vec![0u8; 8], 1).await;
    assert!(r.is_err(), "send on a dead endpoint must fail");
}

/// CPU time (user + system) a process has used, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may contain spaces): utime is the 14th field.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Also a thread-mode server allowed one CPU, whose waits assist the progress thread.
#[test]
fn idle_blocking_and_thread_workers_do_not_spin() {
    let one_cpu: &[&str] = &["--cpu", "0"];
    for (mode, extra) in [("blocking", &[][..]), ("thread", &[]), ("thread", one_cpu)] {
        let server = Server::spawn_with(mode, false, extra);
        std::thread::sleep(Duration::from_millis(300));
        let before = cpu_seconds(server.child.id());
        std::thread::sleep(Duration::from_secs(2));
        let used = cpu_seconds(server.child.id()) - before;
        // A spinning worker uses ~2 s here; an idle, sleeping one ~0.
        assert!(
            used < 0.5,
            "{mode} {extra:?}: an idle server used {used:.2} s of CPU in 2 s"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn stream_am_multi_and_rma_across_processes() {
    let mut server = Server::spawn("blocking", true);
    let ctx = context();
    let w = Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    let ep = connect(&w, server.port).await;
    let pattern = |n: usize, seed: u8| -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
            .collect()
    };
    tokio::time::timeout(STEP, async {
        for size in [0usize, 1, 4096, 1 << 20, 16 << 20] {
            let d = pattern(size, 1);
            assert!(
                echo::am_echo(&ep, d.clone()).await.unwrap() == d,
                "AM {size}"
            );
            if size > 0 {
                let d = pattern(size, 2);
                assert!(
                    echo::stream_echo(&ep, d.clone()).await.unwrap() == d,
                    "stream {size}"
                );
            }
        }
        for count in [1usize, 3, 150] {
            let frames: Vec<Vec<u8>> = (0..count)
                .map(|i| pattern(i * 997 % 70_000, i as u8))
                .collect();
            assert_eq!(
                echo::multi_echo(&ep, frames.clone()).await.unwrap(),
                frames,
                "{count} frames"
            );
        }
        for (size, offset, n) in [
            (64usize, 3usize, 1usize),
            (1 << 20, 4096, 4096),
            (16 << 20, 0, 16 << 20),
        ] {
            let d = pattern(n, 9);
            let (got, seen) = echo::rma_roundtrip(&ep, size, offset, d.clone())
                .await
                .unwrap();
            assert!(got == d, "get of {n} bytes");
            assert!(
                seen[offset..offset + n] == d[..],
                "the server's region after a put of {n} bytes"
            );
        }
    })
    .await
    .expect("within the step limit");
    ep.close().await.unwrap();
    assert!(server.wait_exit(STEP).success());
}

/// Runs `ucx-echo client` (with `args`, 20 iterations of each of `sizes`) against `server`,
/// which must then exit cleanly; the client must succeed with a row per size.
fn echo_client_rows(server: &mut Server, args: &[&str], sizes: &str, what: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_ucx-echo"))
        .args(["client", "--connect", &format!("127.0.0.1:{}", server.port)])
        .args(args)
        .args(["--json", "--iters", "20", "--sizes", sizes])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .count();
    assert_eq!(
        rows,
        sizes.split(',').count(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        server.wait_exit(STEP).success(),
        "{what}: server did not finish cleanly"
    );
}

/// Thread mode in processes allowed one CPU each, both the same CPU (`--cpu 0`): the progress
/// threads yield that CPU, and a task awaiting an operation progresses the worker itself for a
/// while before it parks. Messages of every protocol (eager, rendezvous) still arrive whole, on
/// client-server and direct endpoints (idle, such a server stops using the CPU: the test
/// below).
#[test]
fn thread_mode_on_one_cpu() {
    for direct in [false, true] {
        let mut server = Server::spawn_with("thread", true, &["--cpu", "0"]);
        let mut args = vec!["--mode", "thread", "--cpu", "0"];
        args.extend(if direct { &["--direct"][..] } else { &[] });
        let what = format!("thread mode on one CPU, direct: {direct}");
        echo_client_rows(&mut server, &args, "1,8192,65536,4194304", &what);
    }
}

#[test]
fn worker_address_endpoints_across_processes() {
    // `ucx-echo client --direct` exchanges worker addresses over the first connection, closes
    // it, and runs the echo on endpoints connected by address in both processes.
    let mut server = Server::spawn("blocking", true);
    let args = ["--mode", "blocking", "--direct"];
    echo_client_rows(&mut server, &args, "1,65536,4194304", "direct endpoints");
}
