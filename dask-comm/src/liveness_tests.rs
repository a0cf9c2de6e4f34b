//! Liveness seen from a worker and a client, against a scheduler played by the test: one that
//! welcomes and then says nothing (stopped), one that removes the worker. In process, over
//! `inproc://`, in well under a second each.

use std::time::{Duration, Instant};

use transport::Address;

use crate::client::{Client, ClientOptions};
use crate::error::Error;
use crate::net;
use crate::protocol::{ClientId, FromClient, FromWorker, Hello, ToClient, ToWorker, WorkerId};
use crate::security::Secret;
use crate::worker::{exit_code, run_worker, WorkerOptions, EXIT_REMOVED, EXIT_SCHEDULER_LOST};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn inproc(tag: &str) -> Address {
    format!("inproc://liveness-{tag}-{:x}", rand::random::<u64>())
        .parse()
        .unwrap()
}

/// Bounds against a hang, far above what each case takes.
const HANG: Duration = Duration::from_secs(30);

/// A worker whose scheduler welcomes it and then never answers a heartbeat ends with
/// `Disconnected` (exit code `EXIT_SCHEDULER_LOST`) once its scheduler timeout has passed.
#[test]
fn a_worker_takes_a_silent_scheduler_for_lost() {
    rt().block_on(async {
        let secret = Secret::generate();
        let addr = inproc("silent-scheduler");
        let mut listener = net::listen(&addr).await.unwrap();
        let mut opts = WorkerOptions::new(addr.clone(), secret.clone(), 1);
        opts.scheduler_timeout = Duration::from_millis(300);
        opts.listen = Some(inproc("silent-scheduler-data"));
        let worker = tokio::spawn(run_worker(opts));
        let conn = listener.accept().await.unwrap();
        assert!(matches!(
            net::admit(&conn, &secret).await.unwrap(),
            Hello::Worker { .. }
        ));
        let welcome = ToWorker::Welcome {
            id: WorkerId(0),
            heartbeat_ms: 20,
        };
        net::send_batch(&conn, vec![welcome]).await.unwrap();
        // It beats; nobody answers.
        let started = Instant::now();
        let mut beats = 0;
        let drain = async {
            while let Ok(msgs) = net::recv_batch::<FromWorker>(&conn).await {
                beats += msgs
                    .iter()
                    .filter(|m| matches!(m, FromWorker::Heartbeat { .. }))
                    .count();
            }
        };
        let (r, ()) = tokio::time::timeout(HANG, async {
            tokio::join!(async { worker.await.unwrap() }, async {
                let _ = tokio::time::timeout(HANG, drain).await;
            })
        })
        .await
        .expect("the worker never gave up on its silent scheduler");
        let took = started.elapsed();
        assert!(
            matches!(r, Err(Error::Disconnected(ref why)) if why.contains("no heartbeat")),
            "{r:?}"
        );
        assert_eq!(exit_code(&r), EXIT_SCHEDULER_LOST);
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(beats >= 3, "heartbeats at the welcome's pace: {beats}");
    });
}

/// A worker told it was removed ends with `Removed` (exit code `EXIT_REMOVED`: restarted),
/// even when the connection closes right after the news; so does one whose scheduler closes
/// its connection without a word (dropped: it does not read), while one told to close ends
/// cleanly.
#[test]
fn a_worker_told_it_was_removed_or_dropped_exits_to_be_restarted() {
    for case in ["removed", "dropped", "closed"] {
        rt().block_on(async {
            let secret = Secret::generate();
            let addr = inproc(case);
            let mut listener = net::listen(&addr).await.unwrap();
            let mut opts = WorkerOptions::new(addr.clone(), secret.clone(), 1);
            opts.listen = Some(inproc(&format!("{case}-data")));
            let worker = tokio::spawn(run_worker(opts));
            let conn = listener.accept().await.unwrap();
            net::admit(&conn, &secret).await.unwrap();
            let mut msgs = vec![ToWorker::Welcome {
                id: WorkerId(0),
                heartbeat_ms: 20,
            }];
            match case {
                "removed" => msgs.push(ToWorker::Removed {
                    reason: "no heartbeat for more than 60s".into(),
                }),
                "closed" => msgs.push(ToWorker::Close),
                _ => {}
            }
            net::send_batch(&conn, msgs).await.unwrap();
            if case == "dropped" {
                // Its first heartbeat, then the close.
                let _ = net::recv_batch::<FromWorker>(&conn).await;
            }
            let _ = conn.close().await;
            let r = tokio::time::timeout(HANG, worker).await.unwrap().unwrap();
            match case {
                "removed" => assert!(
                    matches!(r, Err(Error::Removed(ref why)) if why.contains("no heartbeat")),
                    "{r:?}"
                ),
                "dropped" => assert!(matches!(r, Err(Error::Removed(_))), "{r:?}"),
                _ => assert!(r.is_ok(), "{r:?}"),
            }
            let code = if case == "closed" { 0 } else { EXIT_REMOVED };
            assert_eq!(exit_code(&r), code, "{case}");
        });
    }
}

/// A client whose scheduler stops answering fails its calls with `Disconnected` once its
/// scheduler timeout has passed (here a `who_has`, which waits on the scheduler's reply);
/// one the scheduler drops hears why.
#[test]
fn a_client_takes_a_silent_scheduler_for_lost_and_hears_when_dropped() {
    // The played scheduler runs on threads of its own while the client's calls block here.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for dropped in [false, true] {
        let secret = Secret::generate();
        let addr = inproc("client");
        let mut listener = rt.block_on(net::listen(&addr)).unwrap();
        let server = rt.spawn({
            let secret = secret.clone();
            async move {
                let conn = listener.accept().await.unwrap();
                net::admit(&conn, &secret).await.unwrap();
                let welcome = ToClient::Welcome {
                    id: ClientId(0),
                    heartbeat_ms: 20,
                    workers: Vec::new(),
                };
                net::send_batch(&conn, vec![welcome]).await.unwrap();
                if dropped {
                    // The client's first request, then the news.
                    let _ = net::recv_batch::<FromClient>(&conn).await;
                    let removed = ToClient::Removed {
                        reason: "silent for more than 60s".into(),
                    };
                    net::send_batch(&conn, vec![removed]).await.unwrap();
                    let _ = conn.close().await;
                } else {
                    // Reads, never answers.
                    while net::recv_batch::<FromClient>(&conn).await.is_ok() {}
                }
            }
        });
        let client = crate::runtime::block_on(Client::connect_with(
            &addr,
            secret,
            ClientOptions {
                scheduler_timeout: Duration::from_millis(300),
                ..ClientOptions::default()
            },
        ))
        .unwrap();
        let started = Instant::now();
        let r = crate::runtime::block_on(client.holders(&[]));
        let took = started.elapsed();
        match r {
            Err(Error::Disconnected(why)) if dropped => {
                assert!(why.contains("dropped by the scheduler"), "{why}")
            }
            Err(Error::Disconnected(why)) => {
                assert!(why.contains("no heartbeat"), "{why}");
                assert!(took >= Duration::from_millis(200), "{took:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(took < HANG);
        drop(client);
        server.abort();
    }
}
