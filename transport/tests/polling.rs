//! Behaviour that depends on how UCX is progressed, with `ucx://` in polling mode (the mode
//! the benchmarks use; `suite.rs` runs the default), over every backend:
//! - concurrent senders of messages with many frames (more than 30: more sends per message
//!   than one poll of a join would post) never interleave;
//! - `recv` under a short timeout, cancelled again and again mid-message, loses nothing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::STEP;
use transport::{Connection, Message, UcxIntent};

fn polling() {
    // Once per process; the other tests in this file see the same setting.
    let _ = transport::configure_ucx(UcxIntent {
        progress: ::ucx::ProgressMode::Polling,
        ..Default::default()
    });
}

async fn pair(addr: &str) -> (Connection, Connection) {
    polling();
    common::pair(addr).await
}

/// Message `i` of sender `ch`: its identity in the first frame, then `k` frames of bytes.
fn message(ch: u32, i: u32, k: usize, size: usize) -> Message {
    let mut frames = vec![[ch.to_le_bytes(), i.to_le_bytes()].concat()];
    frames.extend((0..k).map(|j| vec![(ch as u8) ^ (i as u8) ^ (j as u8); size]));
    Message::from(frames)
}

fn check(m: &Message, k: usize, size: usize) -> (u32, u32) {
    let id = m.host(0).expect("a host frame first");
    let ch = u32::from_le_bytes(id[..4].try_into().unwrap());
    let i = u32::from_le_bytes(id[4..8].try_into().unwrap());
    assert_eq!(
        m.frames.len(),
        k + 1,
        "sender {ch} message {i}: frame count"
    );
    for j in 0..k {
        let want = (ch as u8) ^ (i as u8) ^ (j as u8);
        let f = m.host(j + 1).unwrap();
        assert!(
            f.len() == size && f.iter().all(|&b| b == want),
            "sender {ch} message {i}: frame {j} holds another message's bytes"
        );
    }
    (ch, i)
}

async fn many_frames_from_concurrent_senders(addr: &str) {
    let (server, client) = pair(addr).await;
    let client = Arc::new(client);
    let (k, size, per) = (40usize, 20_000usize, 10u32);
    tokio::time::timeout(STEP, async {
        let senders: Vec<_> = (0..3u32)
            .map(|ch| {
                let c = Arc::clone(&client);
                tokio::spawn(async move {
                    for i in 0..per {
                        c.send(ch, message(ch, i, k, size)).await.unwrap();
                    }
                })
            })
            .collect();
        let mut next = [0u32; 3];
        for _ in 0..3 * per {
            let (channel, m) = server.recv().await.unwrap();
            let (ch, i) = check(&m, k, size);
            assert_eq!((channel, i), (ch, next[ch as usize]), "{addr}: order");
            next[ch as usize] += 1;
        }
        for s in senders {
            s.await.unwrap();
        }
    })
    .await
    .expect("in time");
}

async fn cancelled_receives_lose_nothing(addr: &str) {
    let (server, client) = pair(addr).await;
    let total = 120u32;
    tokio::time::timeout(STEP, async {
        let send = async {
            for i in 0..total {
                // Small (inlined on ucx://) and framed messages, mixed.
                let (k, size) = if i % 3 == 0 { (3, 50_000) } else { (1, 100) };
                client.send(0, message(0, i, k, size)).await.unwrap();
                if i % 2 == 1 {
                    // Pauses, so that receives wait and time out, again and again.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        };
        let receive = async {
            let (mut got, mut cancelled) = (0u32, 0u32);
            while got < total {
                match tokio::time::timeout(Duration::from_micros(300), server.recv()).await {
                    Ok(r) => {
                        let (_, m) = r.unwrap();
                        let (k, size) = if got % 3 == 0 { (3, 50_000) } else { (1, 100) };
                        assert_eq!(
                            check(&m, k, size),
                            (0, got),
                            "{addr}: message lost or mixed"
                        );
                        got += 1;
                    }
                    Err(_) => cancelled += 1,
                }
            }
            cancelled
        };
        let ((), cancelled) = tokio::join!(send, receive);
        eprintln!("{addr}: {total} messages, {cancelled} receives cancelled on the way");
    })
    .await
    .expect("in time");
}

macro_rules! backends {
    ($name:ident, $addr:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn many_frames_concurrent() {
                many_frames_from_concurrent_senders($addr).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cancelled_receives() {
                cancelled_receives_lose_nothing($addr).await;
            }
        }
    };
}

backends!(inproc, "inproc://polling");
backends!(tcp, "tcp://127.0.0.1:0");
#[cfg(feature = "tls")]
backends!(tls, "tls://127.0.0.1:0");
backends!(ucx, "ucx://127.0.0.1:0");
#[cfg(feature = "ucx")]
backends!(ucx_direct, crate::common::UCX_DIRECT);
