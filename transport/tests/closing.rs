//! How connections end, on every backend: a peer that closes, one that vanishes, one that
//! breaks the protocol; refusals that keep the connection; options; peer identities.

mod common;

use std::time::Duration;

use common::{pair, pair_with, STEP};
use transport::frame::Limits;
use transport::{
    Address, CloseReason, Failure, Message, Options, ProtocolError, Refusal, CLOSE_CHANNEL,
};

fn msg(n: usize) -> Message {
    Message::from(vec![vec![7u8; n]])
}

/// Everything sent before a close arrives, then the receiver learns the peer closed; both
/// sides report why; `closed()` wakes on both sides.
async fn close_is_told_from_failure(addr: &str) {
    let (server, client) = pair(addr).await;
    tokio::time::timeout(STEP, async {
        for i in 0..10 {
            client.send(i, msg(100 + i as usize)).await.unwrap();
        }
        client.close().await.unwrap();
        assert!(client.is_closed());
        assert_eq!(client.close_reason(), Some(CloseReason::Local));
        for i in 0..10 {
            let (ch, m) = server
                .recv()
                .await
                .unwrap_or_else(|e| panic!("{addr}: {i}: {e}"));
            assert_eq!((ch, m.len()), (i, 100 + i as usize), "{addr}");
        }
        let e = server.recv().await.unwrap_err();
        assert_eq!(
            e.close_reason(),
            Some(&CloseReason::PeerClosed),
            "{addr}: {e}"
        );
        assert_eq!(server.closed().await, CloseReason::PeerClosed);
        assert_eq!(client.closed().await, CloseReason::Local);
        // Sends after the close fail with the reason, on both sides.
        let e = client.send(0, msg(1)).await.unwrap_err();
        assert_eq!(e.close_reason(), Some(&CloseReason::Local));
        let e = server.send(0, msg(1)).await.unwrap_err();
        assert_eq!(e.close_reason(), Some(&CloseReason::PeerClosed));
        // A second close is harmless.
        client.close().await.unwrap();
    })
    .await
    .expect("in time");
}

/// A peer that goes away without closing is a failure, not a close.
async fn vanished_peer_is_a_failure(addr: &str) {
    let (server, client) = pair(addr).await;
    tokio::time::timeout(STEP, async {
        client.send(1, msg(10)).await.unwrap();
        drop(client);
        let (ch, _) = server.recv().await.unwrap();
        assert_eq!(ch, 1);
        let e = server.recv().await.unwrap_err();
        assert!(
            matches!(e.close_reason(), Some(CloseReason::PeerFailed(_))),
            "{addr}: {e:?}"
        );
        assert!(matches!(server.closed().await, CloseReason::PeerFailed(_)));
        eprintln!("{addr}: {e}");
    })
    .await
    .expect("in time");
}

/// Over the limits, or on the transport's own channel: refused before sending, and the
/// connection goes on.
async fn refusals_keep_the_connection(addr: &str) {
    let opts = Options {
        limits: Limits {
            max_frames: 4,
            max_message: 1000,
        },
        ..Default::default()
    };
    let (server, client) = pair_with(addr, &opts).await;
    tokio::time::timeout(STEP, async {
        let e = client.send(CLOSE_CHANNEL, msg(1)).await.unwrap_err();
        assert!(
            matches!(
                e,
                transport::Error::Refused(Refusal::Channel(CLOSE_CHANNEL))
            ),
            "{e:?}"
        );
        let e = client.send(0, msg(1001)).await.unwrap_err();
        assert!(
            matches!(e, transport::Error::Refused(Refusal::Limits(_))),
            "{e:?}"
        );
        let e = client
            .send(0, Message::from(vec![vec![]; 5]))
            .await
            .unwrap_err();
        assert!(
            matches!(e, transport::Error::Refused(Refusal::Limits(_))),
            "{e:?}"
        );
        assert!(!client.is_closed());
        client.send(2, msg(1000)).await.unwrap();
        let (ch, m) = server.recv().await.unwrap();
        assert_eq!((ch, m.len()), (2, 1000));
    })
    .await
    .expect("in time");
}

macro_rules! backends {
    ($name:ident, $addr:expr) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn close_is_told_from_failure() {
                super::close_is_told_from_failure($addr).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn vanished_peer_is_a_failure() {
                super::vanished_peer_is_a_failure($addr).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn refusals_keep_the_connection() {
                super::refusals_keep_the_connection($addr).await;
            }
        }
    };
}

backends!(inproc, "inproc://closing");
backends!(tcp, "tcp://127.0.0.1:0");
#[cfg(feature = "tls")]
backends!(tls, "tls://127.0.0.1:0");
#[cfg(feature = "ucx")]
backends!(ucx, "ucx://127.0.0.1:0");
#[cfg(feature = "ucx")]
backends!(ucx_direct, crate::common::UCX_DIRECT);

/// inproc:// enforces the receiver's limits too (the sender's may be looser), and each accepted
/// connection has its own peer address.
#[tokio::test(flavor = "current_thread")]
async fn inproc_limits_and_identities() {
    let small = Options {
        limits: Limits {
            max_frames: 2,
            max_message: 100,
        },
        ..Default::default()
    };
    let addr: Address = "inproc://limits".parse().unwrap();
    let mut l = transport::listen_with(&addr, &small).await.unwrap();
    let (s1, c1) = tokio::join!(l.accept(), transport::connect(&addr));
    let (s1, c1) = (s1.unwrap(), c1.unwrap());
    let (s2, _c2) = tokio::join!(l.accept(), transport::connect(&addr));
    let s2 = s2.unwrap();
    assert_ne!(s1.peer_addr(), s2.peer_addr());
    assert!(s1.peer_addr().to_string().starts_with("inproc://limits/"));
    assert_eq!(c1.peer_addr(), &addr);
    c1.send(0, msg(101)).await.unwrap();
    let e = s1.recv().await.unwrap_err();
    assert!(
        matches!(e, transport::Error::Protocol(ProtocolError::Header(_))),
        "{e:?}"
    );
    assert!(matches!(s1.close_reason(), Some(CloseReason::Refused(_))));
}

/// Limits changed on a live connection apply from the next message: a runtime starts with
/// small limits until the peer authenticates.
async fn limits_can_be_raised(addr: &str) {
    let small = Options {
        limits: Limits {
            max_frames: 2,
            max_message: 64,
        },
        ..Default::default()
    };
    let (server, client) = pair_with(addr, &small).await;
    tokio::time::timeout(STEP, async {
        client.send(0, msg(64)).await.unwrap();
        assert_eq!(server.recv().await.unwrap().1.len(), 64);
        let big = Limits::default();
        client.set_limits(big);
        server.set_limits(big);
        // Concurrently: on ucx:// a large frame's send waits for the receive (rendezvous).
        let (sent, got) = tokio::join!(client.send(0, msg(100_000)), server.recv());
        sent.unwrap();
        assert_eq!(got.unwrap().1.len(), 100_000);
        // And lowered again: the peer's oversized message is refused.
        server.set_limits(small.limits);
        client.send(0, msg(1000)).await.unwrap();
        assert!(matches!(
            server.recv().await,
            Err(transport::Error::Protocol(_))
        ));
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_can_be_raised_on_every_backend() {
    let mut addrs = vec!["inproc://limits-raised", "tcp://127.0.0.1:0"];
    if cfg!(feature = "ucx") {
        addrs.push("ucx://127.0.0.1:0");
    }
    if cfg!(feature = "tls") {
        addrs.push("tls://127.0.0.1:0");
    }
    for addr in addrs {
        limits_can_be_raised(addr).await;
    }
}

/// Accepted tcp://, tls:// and ucx:// connections report where the peer came from (not `?:0`),
/// and each end's local address is what the other end sees as its peer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_peers_have_addresses() {
    let mut addrs = vec!["tcp://127.0.0.1:0"];
    if cfg!(feature = "ucx") {
        addrs.push("ucx://127.0.0.1:0");
    }
    if cfg!(feature = "tls") {
        addrs.push("tls://127.0.0.1:0");
    }
    for addr in addrs {
        let (server, client) = pair(addr).await;
        let peer = server.peer_addr().to_string();
        assert!(peer.contains("127.0.0.1:"), "{addr}: {peer}");
        assert!(!peer.ends_with(":0"), "{addr}: {peer}");
        let local = client.local_addr().expect("the client's local address");
        assert!(
            peer.ends_with(&local.to_string()),
            "{addr}: {peer} vs {local}"
        );
        let server_local = server.local_addr().expect("the server's local address");
        assert!(
            client
                .peer_addr()
                .to_string()
                .ends_with(&server_local.to_string()),
            "{addr}: {} vs {server_local}",
            client.peer_addr()
        );
    }
}

/// A TCP send dropped part-way through a message closes the connection (the peer would read
/// the next message's bytes as this one's): this side's later operations say it closed, and
/// the peer sees a message cut short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_send_dropped_mid_message_closes() {
    let (server, client) = pair("tcp://127.0.0.1:0").await;
    // Larger than the socket buffers, to a receiver that does not read: the send blocks
    // part-way, and is dropped there.
    let big = Message::from(vec![vec![1u8; 64 << 20]]);
    let r = tokio::time::timeout(Duration::from_millis(300), client.send(0, big)).await;
    assert!(r.is_err(), "the send should still have been writing");
    let e = tokio::time::timeout(STEP, client.send(0, msg(1)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.close_reason(), Some(&CloseReason::Local), "{e:?}");
    let e = tokio::time::timeout(STEP, server.recv())
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            e.close_reason(),
            Some(CloseReason::PeerFailed(Failure::Truncated | Failure::Io(_)))
        ),
        "{e:?}"
    );
}

/// UCX's credit window is in bytes: a receiver that reads nothing holds at most the window's
/// worth (each message counted as `ucx_charge`).
#[cfg(feature = "ucx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ucx_credit_window_is_in_bytes() {
    let opts = Options {
        credit_bytes: 1 << 20,
        ..Default::default()
    };
    let (server, client) = pair_with("ucx://127.0.0.1:0", &opts).await;
    let client = std::sync::Arc::new(client);
    let most = (1u64 << 20) / transport::ucx_charge(1024);
    let mut sent = 0u64;
    loop {
        let c = std::sync::Arc::clone(&client);
        let send = tokio::spawn(async move { c.send(0, msg(1024)).await });
        match tokio::time::timeout(Duration::from_millis(300), send).await {
            Ok(r) => {
                r.unwrap().unwrap();
                sent += 1;
                assert!(sent <= most, "{sent} sends of 1 KiB within a 1 MiB window");
            }
            Err(_) => break,
        }
    }
    assert_eq!(sent, most, "every credit is usable");
    for _ in 0..sent {
        tokio::time::timeout(STEP, server.recv())
            .await
            .unwrap()
            .unwrap();
    }
}

#[test]
fn options_are_checked() {
    let e = Options {
        credit_bytes: 1 << 10,
        ..Default::default()
    }
    .validate()
    .unwrap_err();
    assert!(matches!(e, transport::Error::Config(_)), "{e:?}");
}
