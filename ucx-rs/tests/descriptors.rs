//! Endpoints created, used once and closed give back their descriptors: a server that runs for
//! a day serves more clients than its descriptor limit. One test in its own binary, so that no
//! other test opens descriptors while it counts them.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ucx::{Endpoint, Listener, ProgressMode, Worker};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

async fn round(listener: &mut Listener, cw: &Worker, addr: std::net::SocketAddr, order: Order) {
    let (s, c) = tokio::join!(listener.accept(), Endpoint::connect(cw, addr));
    let (s, c) = (s.unwrap(), c.unwrap());
    let (sent, got) = tokio::join!(c.send(vec![7u8; 8], 0), s.recv_vec(0));
    sent.0.unwrap();
    assert_eq!(got.unwrap(), vec![7u8; 8]);
    match order {
        Order::Together => {
            let (a, b) = tokio::join!(s.close(), c.close());
            a.unwrap();
            b.unwrap();
        }
        // The server closes; the client closes once it has seen the server's close.
        Order::ServerFirst => {
            let seen = async {
                while !c.is_closed() {
                    cw.progress(); // polling mode: nothing else progresses it now
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            };
            let (closed, ()) = tokio::join!(s.close(), seen);
            closed.unwrap();
            c.close().await.unwrap();
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Order {
    Together,
    ServerFirst,
}

/// Both sides close; the two sides on one worker (as a Python process serving and connecting
/// on its one worker has them) or on two. Returns the descriptors before and after.
async fn churn(
    mode: ProgressMode,
    one_worker: bool,
    order: Order,
    rounds: usize,
) -> (usize, usize) {
    init_tracing();
    let ctx = ucx::Context::builder()
        .option("KEEPALIVE_INTERVAL", KEEPALIVE)
        .build()
        .unwrap();
    let sw = Worker::new(&ctx, mode).unwrap();
    let cw = if one_worker {
        sw.clone()
    } else {
        Worker::new(&ctx, mode).unwrap()
    };
    let mut listener = Listener::bind(&sw, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    for _ in 0..5 {
        within("a warm-up round", round(&mut listener, &cw, addr, order)).await;
    }
    let before = open_fds();
    for _ in 0..rounds {
        within("a round", round(&mut listener, &cw, addr, order)).await;
    }
    // UCX lets go of the sockets of a connection both sides closed at once when a keepalive
    // round finds the peer gone, as its workers progress (in polling mode, only when someone
    // progresses them): allow it a few rounds.
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_fds() > before + SLACK && Instant::now() < deadline {
        sw.progress();
        cw.progress();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (before, open_fds())
}

/// Descriptors a burst may leave behind for a while (UCX's own caches).
const SLACK: usize = 4;

/// UCX's keepalive interval here (as `ucxrs`, the Python package, sets it). With UCX's
/// default of 20 s, the sockets of connections whose two sides closed at once stay that long:
/// 60 such endpoints took 60 descriptors (docs/ucx-notes.md).
const KEEPALIVE: &str = "1s";

#[test]
fn closed_endpoints_give_back_their_descriptors_in_every_mode() {
    const ROUNDS: usize = 60;
    for mode in MODES {
        for (one_worker, order) in [
            (true, Order::Together),
            (false, Order::Together),
            (true, Order::ServerFirst),
            (false, Order::ServerFirst),
        ] {
            let rt = match mode {
                ProgressMode::Blocking => tokio::runtime::Builder::new_current_thread(),
                _ => tokio::runtime::Builder::new_multi_thread(),
            }
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
            let (before, after) = rt.block_on(churn(mode, one_worker, order, ROUNDS));
            eprintln!(
                "{mode:?}, one worker {one_worker}, {order:?}: descriptors {before} -> {after}"
            );
            assert!(
                after <= before + SLACK,
                "{mode:?}, one worker {one_worker}, {order:?}: {ROUNDS} endpoints closed took the \
                 descriptors from {before} to {after}"
            );
        }
    }
}
