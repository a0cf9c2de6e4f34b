//! The same behaviour over every backend: inproc://, tcp:// and ucx:// (real UCX, loopback).

mod common;

use std::time::Duration;

use common::{pair, STEP};
use transport::frame;
use transport::{connect, listen, Address, CloseReason, Message, ProtocolError};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// The fewest frames whose header does not fit a `ucx://` first message.
fn header_over_first_message() -> usize {
    (transport::UCX_FIRST_MAX - frame::FIXED_LEN) / frame::ENTRY_LEN + 1
}

async fn echo_and_order(addr: &str) {
    let (server, client) = pair(addr).await;
    tokio::time::timeout(STEP, async {
        // Empty messages and frames, one byte, mixed sizes, 16 MiB, and more frames than fit a
        // first UCX message's header (with and without bytes).
        let over = header_over_first_message();
        let shapes = [
            vec![],
            vec![0],
            vec![1],
            vec![0, 5, 100_000],
            vec![16 << 20],
            vec![1; 2000],
            vec![0; 2000],
            // ucx://: the largest inlined message, the smallest that is not, and a header just
            // over the first message (its second part a few bytes), with and without bytes.
            vec![transport::UCX_FIRST_MAX - 21],
            vec![transport::UCX_FIRST_MAX - 20],
            vec![0; over],
            vec![1; over],
            // ucx://: inlined messages past the size a receiver copies out (it hands over the
            // buffer they landed in), of a few frames and of many.
            vec![10_000, 0, 10_000],
            vec![200; 100],
        ];
        for (i, shape) in shapes.iter().enumerate() {
            let msg = Message::from(
                shape
                    .iter()
                    .map(|&n| pattern(n, i as u8))
                    .collect::<Vec<_>>(),
            );
            let (sent, got) = tokio::join!(client.send(i as u32, msg.clone()), server.recv());
            sent.unwrap();
            let (channel, got) = got.unwrap();
            assert_eq!(channel, i as u32, "{addr}: message {i}");
            assert_eq!(
                got.to_host().unwrap(),
                msg.to_host().unwrap(),
                "{addr}: message {i}"
            );
        }
        // Order on one connection.
        let send_all = async {
            for i in 0..100u32 {
                client
                    .send(7, Message::from(vec![i.to_le_bytes().to_vec()]))
                    .await
                    .unwrap();
            }
        };
        let recv_all = async {
            for i in 0..100u32 {
                let (ch, m) = server.recv().await.unwrap();
                assert_eq!((ch, m.host(0)), (7, Some(&i.to_le_bytes()[..])), "{addr}");
            }
        };
        tokio::join!(send_all, recv_all);
    })
    .await
    .expect("echo in time");
}

async fn concurrent_senders(addr: &str) {
    let body = |i: u32| if i.is_multiple_of(3) { 100_000 } else { 3000 };
    let (server, client) = pair(addr).await;
    let client = std::sync::Arc::new(client);
    tokio::time::timeout(STEP, async {
        let mut senders = Vec::new();
        for ch in 0..4u32 {
            let c = client.clone();
            senders.push(tokio::spawn(async move {
                for i in 0..50u32 {
                    // Small (one UCX message) and large (header + frames) messages mixed.
                    let frames = vec![
                        ch.to_le_bytes().to_vec(),
                        i.to_le_bytes().to_vec(),
                        pattern(body(i), i as u8),
                    ];
                    c.send(ch, Message::from(frames)).await.unwrap();
                }
            }));
        }
        let mut next = [0u32; 4];
        for _ in 0..200 {
            let (ch, m) = server.recv().await.unwrap();
            assert_eq!(
                m.host(0),
                Some(&ch.to_le_bytes()[..]),
                "{addr}: frames mixed up"
            );
            let i = u32::from_le_bytes(m.host(1).unwrap().try_into().unwrap());
            assert_eq!(i, next[ch as usize], "{addr}: channel {ch} out of order");
            assert_eq!(m.host(2).unwrap(), &pattern(body(i), i as u8)[..]);
            next[ch as usize] += 1;
        }
        for s in senders {
            s.await.unwrap();
        }
    })
    .await
    .expect("concurrent senders in time");
}

async fn close_ends_pending_recv(addr: &str) {
    let (server, client) = pair(addr).await;
    let pending = server.recv();
    let close = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        client.close().await.unwrap();
    };
    let (r, ()) = tokio::time::timeout(STEP, async { tokio::join!(pending, close) })
        .await
        .expect("the pending receive ended");
    assert!(
        matches!(r, Err(transport::Error::Closed(CloseReason::PeerClosed))),
        "{addr}: {r:?}"
    );
}

/// `send_batch`: order within a batch and with single sends around it, every shape of
/// message in one batch, a batch larger than the credit window, and a batch with one message
/// over the limits refused before anything is sent.
async fn batches(addr: &str) {
    let (server, client) = pair(addr).await;
    tokio::time::timeout(STEP, async {
        let over = vec![1; header_over_first_message()];
        let shapes: [&[usize]; 10] = [
            &[8],
            &[],
            &[0, 3],
            &[100_000, 5],
            &[1 << 20],
            &[transport::UCX_FIRST_MAX - 21],
            &[1; 909],
            &over,
            &[9_000],
            &[200; 100],
        ];
        let batch: Vec<Message> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| Message::from(s.iter().map(|&n| pattern(n, i as u8)).collect::<Vec<_>>()))
            .collect();
        let expect = batch.clone();
        let send = async {
            client
                .send(4, Message::from(vec![b"before".to_vec()]))
                .await
                .unwrap();
            client.send_batch(4, batch).await.unwrap();
            client
                .send(4, Message::from(vec![b"after".to_vec()]))
                .await
                .unwrap();
        };
        let recv = async {
            let (_, m) = server.recv().await.unwrap();
            assert_eq!(m.host(0), Some(&b"before"[..]), "{addr}");
            for (i, want) in expect.iter().enumerate() {
                let (ch, m) = server.recv().await.unwrap();
                assert_eq!(ch, 4, "{addr}");
                assert_eq!(
                    m.to_host().unwrap(),
                    want.to_host().unwrap(),
                    "{addr}: message {i}"
                );
            }
            let (_, m) = server.recv().await.unwrap();
            assert_eq!(m.host(0), Some(&b"after"[..]), "{addr}");
        };
        tokio::join!(send, recv);
        // More small messages than the credit window holds (ucx://: several runs, with waits
        // for the receiver's grants in between).
        const MANY: u32 = 20_000;
        let many: Vec<Message> = (0..MANY)
            .map(|i| Message::from(vec![i.to_le_bytes().to_vec()]))
            .collect();
        let send = async { client.send_batch(9, many).await.unwrap() };
        let recv = async {
            // One by one, and many at a time (what has arrived, at most a few).
            let mut i = 0u32;
            while i < MANY {
                let got = if i.is_multiple_of(2) {
                    vec![server.recv().await.unwrap()]
                } else {
                    let most = 1 + (i as usize % 300);
                    let got = server.recv_many(most).await.unwrap();
                    assert!(!got.is_empty() && got.len() <= most, "{addr}");
                    got
                };
                for (ch, m) in got {
                    assert_eq!((ch, m.host(0)), (9, Some(&i.to_le_bytes()[..])), "{addr}");
                    i += 1;
                }
            }
        };
        tokio::join!(send, recv);
        // One message over the limits: the whole batch is refused, nothing of it is sent.
        let too_many_frames = Message::from(vec![Vec::new(); 100_000]);
        let r = client
            .send_batch(5, vec![Message::from(vec![b"x".to_vec()]), too_many_frames])
            .await;
        assert!(
            matches!(r, Err(transport::Error::Refused(_))),
            "{addr}: {r:?}"
        );
        let (sent, got) = tokio::join!(
            client.send(6, Message::from(vec![b"next".to_vec()])),
            server.recv()
        );
        sent.unwrap();
        let (ch, m) = got.unwrap();
        assert_eq!(
            (ch, m.host(0)),
            (6, Some(&b"next"[..])),
            "{addr}: part of a refused batch was sent"
        );
    })
    .await
    .expect("batches in time");
}

macro_rules! suite {
    ($name:ident, $addr:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn echo() {
                echo_and_order($addr).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent() {
                concurrent_senders($addr).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn batch() {
                batches($addr).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn close() {
                close_ends_pending_recv($addr).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn slow_receiver_large() {
                slow_receiver_blocks_sends($addr, 1 << 20, 100).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn slow_receiver_small() {
                slow_receiver_blocks_sends($addr, 1024, 50_000).await;
            }
        }
    };
}

suite!(inproc_a, "inproc://suite-a");
suite!(tcp, "tcp://127.0.0.1:0");
#[cfg(feature = "tls")]
suite!(tls, "tls://127.0.0.1:0");
#[cfg(feature = "ucx")]
suite!(ucx, "ucx://127.0.0.1:0");
#[cfg(feature = "ucx")]
suite!(ucx_direct, crate::common::UCX_DIRECT);

#[tokio::test(flavor = "current_thread")]
async fn inproc_names_are_exclusive_and_free_again() {
    let a: Address = "inproc://exclusive".parse().unwrap();
    let l = listen(&a).await.unwrap();
    assert!(matches!(listen(&a).await, Err(transport::Error::Inproc(_))));
    drop(l);
    listen(&a)
        .await
        .expect("free again after the listener dropped");
    assert!(connect(&"inproc://nobody".parse().unwrap()).await.is_err());
}

/// A receiver that does not read makes sends wait after a bounded number, so neither side
/// buffers without bound. 1 MiB messages: inproc stops at the channel depth, TCP at the socket
/// buffers, UCX at once (rendezvous waits for the receive). 1 KiB messages: UCX would complete
/// eager sends forever without the transport's credits (8 MiB by default: about 7,700). Then reading resumes
/// the stream, in order, and the blocked send ends.
async fn slow_receiver_blocks_sends(addr: &str, size: usize, most: usize) {
    let (server, client) = pair(addr).await;
    let client = std::sync::Arc::new(client);
    let mut sent = 0usize;
    let mut blocked = None;
    while blocked.is_none() {
        let msg = Message::from(vec![pattern(size, sent as u8)]);
        let c = std::sync::Arc::clone(&client);
        let mut send = tokio::spawn(async move { c.send(0, msg).await });
        match tokio::time::timeout(Duration::from_millis(500), &mut send).await {
            Ok(r) => {
                r.unwrap().unwrap();
                sent += 1;
                assert!(
                    sent <= most,
                    "{addr}: {most} messages of {size} B sent to a receiver that reads nothing"
                );
            }
            Err(_) => blocked = Some(send),
        }
    }
    // The receiver catches up: every message arrives, in order, and the blocked send ends.
    for i in 0..=sent {
        let (_, msg) = tokio::time::timeout(STEP, server.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            msg.host(0),
            Some(&pattern(size, i as u8)[..]),
            "message {i}"
        );
    }
    blocked.unwrap().await.unwrap().unwrap();
    eprintln!("{addr}: {sent} messages of {size} B accepted before sends waited");
}

#[tokio::test(flavor = "current_thread")]
async fn tcp_garbage_header_closes_the_connection() {
    use tokio::io::AsyncWriteExt;
    let mut l = listen(&"tcp://127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (server, mut raw) = common::raw_tcp(&mut l).await;
    // Right magic, absurd frame count: refused before anything is allocated.
    let mut junk = transport::frame::MAGIC.to_vec();
    junk.extend_from_slice(&0u32.to_le_bytes());
    junk.extend_from_slice(&u32::MAX.to_le_bytes());
    raw.write_all(&junk).await.unwrap();
    let r = tokio::time::timeout(STEP, server.recv()).await.unwrap();
    assert!(
        matches!(r, Err(transport::Error::Protocol(ProtocolError::Header(_)))),
        "{r:?}"
    );
    assert!(matches!(
        server.close_reason(),
        Some(CloseReason::Refused(_))
    ));
    // Wrong magic.
    let (server2, mut raw2) = common::raw_tcp(&mut l).await;
    raw2.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let r = tokio::time::timeout(STEP, server2.recv()).await.unwrap();
    assert!(
        matches!(r, Err(transport::Error::Protocol(ProtocolError::Header(_)))),
        "{r:?}"
    );
}

/// A raw UCX peer (ucx-rs, the same handshake) sending malformed messages on the transport's
/// tag: each is a protocol error that closes the connection (`Refused`); nothing is allocated
/// from the announced sizes.
#[cfg(feature = "ucx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ucx_garbage_closes_the_connection() {
    let mut l = listen(&"ucx://127.0.0.1:0".parse().unwrap()).await.unwrap();
    let ctx = ::ucx::Context::new().unwrap();
    let worker = ::ucx::Worker::new(&ctx, ::ucx::ProgressMode::Thread).unwrap();
    for (what, bytes) in [
        ("wrong magic", b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        ("absurd frame count", {
            let mut h = transport::frame::MAGIC.to_vec();
            h.extend_from_slice(&0u32.to_le_bytes());
            h.extend_from_slice(&u32::MAX.to_le_bytes());
            h
        }),
        ("absurd frame size", {
            let mut h = transport::frame::encode(0, &[]);
            h[8..12].copy_from_slice(&1u32.to_le_bytes());
            h.extend_from_slice(&u64::MAX.to_le_bytes());
            h.push(0);
            h
        }),
        ("inline bytes that do not match", {
            let mut h = transport::frame::encode(
                0,
                &[transport::frame::FrameMeta {
                    size: 10,
                    cuda: false,
                }],
            );
            h.extend_from_slice(&[1, 2, 3]);
            h
        }),
        // Bundles (a batched send's UCX message) hold whole inlined messages only.
        ("a bundle ending in a close marker", {
            let mut h = transport::frame::encode(0, &[]);
            h.extend_from_slice(&transport::frame::encode(transport::CLOSE_CHANNEL, &[]));
            h
        }),
        ("a bundle ending in a header whose frames follow", {
            let mut h = transport::frame::encode(0, &[]);
            h.extend_from_slice(&transport::frame::encode(
                0,
                &[transport::frame::FrameMeta {
                    size: 10,
                    cuda: false,
                }],
            ));
            h
        }),
        (
            "a first message past UCX_FIRST_MAX (whole, one byte over)",
            {
                let size = transport::UCX_FIRST_MAX + 1 - transport::frame::header_len(1);
                let meta = transport::frame::FrameMeta {
                    size: size as u64,
                    cuda: false,
                };
                let mut h = transport::frame::encode(0, &[meta]);
                h.resize(transport::UCX_FIRST_MAX + 1, 5);
                h
            },
        ),
        ("a bundle ending in half a header", {
            let mut h = transport::frame::encode(0, &[]);
            h.extend_from_slice(&transport::frame::encode(0, &[])[..5]);
            h
        }),
    ] {
        let (server, raw) = common::raw_ucx(&mut l, &worker).await;
        // Together: a long message may go by rendezvous, which waits for the receiver.
        let long = bytes.len() > transport::UCX_FIRST_MAX;
        let ((sent, _), r) = tokio::time::timeout(
            STEP,
            futures::future::join(
                raw.send(bytes, transport::UCX_TAG),
                tokio::time::timeout(STEP, server.recv()),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: the send did not end"));
        // Refused mid-rendezvous, the long one's send may fail.
        if !long {
            sent.unwrap();
        }
        let r = r.unwrap();
        assert!(
            matches!(r, Err(transport::Error::Protocol(_))),
            "{what}: {r:?}"
        );
        assert!(
            matches!(server.close_reason(), Some(CloseReason::Refused(_))),
            "{what}"
        );
        eprintln!("{what}: {}", r.unwrap_err());
    }
}

/// What a peer sent before bytes the wire format does not allow is delivered first, even when
/// a receive took both ahead in one pass; the next receive reports the bad bytes.
#[cfg(feature = "ucx")]
#[tokio::test(flavor = "current_thread")]
async fn ucx_messages_before_garbage_arrive_first() {
    let mut l = listen(&"ucx://127.0.0.1:0".parse().unwrap()).await.unwrap();
    let ctx = ::ucx::Context::new().unwrap();
    let worker = ::ucx::Worker::new(&ctx, ::ucx::ProgressMode::Thread).unwrap();
    let (server, raw) = common::raw_ucx(&mut l, &worker).await;
    let meta = transport::frame::FrameMeta {
        size: 5,
        cuda: false,
    };
    let mut good = transport::frame::encode(3, &[meta]);
    good.extend_from_slice(b"hello");
    for bytes in [good.clone(), good, b"GET / HTTP/1.1\r\n\r\n".to_vec()] {
        let (r, _) = raw.send(bytes, transport::UCX_TAG).await;
        r.unwrap();
    }
    // All three have arrived before the first receive (which then takes them ahead).
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..2 {
        let (channel, msg) = tokio::time::timeout(STEP, server.recv())
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("message {i}: {e}"));
        assert_eq!(
            (channel, msg.host(0)),
            (3, Some(&b"hello"[..])),
            "message {i}"
        );
    }
    let r = tokio::time::timeout(STEP, server.recv()).await.unwrap();
    assert!(matches!(r, Err(transport::Error::Protocol(_))), "{r:?}");
}

/// Without the `ucx` feature, `ucx://` addresses still parse but say what is missing.
#[cfg(not(feature = "ucx"))]
#[tokio::test(flavor = "current_thread")]
async fn ucx_needs_its_feature() {
    let addr: Address = "ucx://127.0.0.1:0".parse().unwrap();
    let e = listen(&addr).await.unwrap_err();
    assert!(
        matches!(
            e,
            transport::Error::NotBuilt {
                scheme: "ucx",
                feature: "ucx"
            }
        ),
        "{e:?}"
    );
    let e = connect(&addr).await.unwrap_err();
    assert!(matches!(e, transport::Error::NotBuilt { .. }), "{e:?}");
    assert!(e.to_string().contains("`ucx` feature"), "{e}");
}

/// `Options::tcp_spin`: receives poll the socket before parking. Messages of every size still
/// arrive whole and in order, both ways, and a close still ends a pending receive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_spin_receives_the_same() {
    let opts = transport::Options {
        tcp_spin: Duration::from_micros(200),
        ..Default::default()
    };
    let (server, client) = common::pair_with("tcp://127.0.0.1:0", &opts).await;
    tokio::time::timeout(STEP, async {
        for i in 0..200u32 {
            let size = (i as usize * 9973) % 300_000;
            let msg = Message::from(vec![pattern(size, i as u8), pattern(i as usize, 3)]);
            let (a, b) = if i % 2 == 0 {
                (&client, &server)
            } else {
                (&server, &client)
            };
            let (sent, got) = tokio::join!(a.send(i, msg.clone()), b.recv());
            sent.unwrap();
            let (channel, got) = got.unwrap();
            assert_eq!(channel, i);
            assert_eq!(
                got.to_host().unwrap(),
                msg.to_host().unwrap(),
                "message {i}"
            );
        }
        let server = std::sync::Arc::new(server);
        let s = std::sync::Arc::clone(&server);
        let pending = tokio::spawn(async move { s.recv().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        client.close().await.unwrap();
        let r = pending.await.unwrap();
        assert!(
            matches!(r, Err(transport::Error::Closed(CloseReason::PeerClosed))),
            "{r:?}"
        );
    })
    .await
    .expect("in time");
}

/// Two transports configured differently in one process, beside the process-wide one: each has
/// its own UCX context (one on TCP only, one as UCX chooses), worker and receive budget, and
/// the `ucx://` connections of each carry a message larger than the smaller budget.
#[cfg(feature = "ucx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_configured_transports_in_one_process() {
    use transport::{Transport, TransportConfig, UcxIntent};
    let mut tcp_only = TransportConfig::default();
    tcp_only.ucx = UcxIntent {
        tcp: true,
        shared_memory: false,
        ..UcxIntent::default()
    };
    tcp_only.receive_budget = 8 << 20;
    let tcp_only = Transport::new(tcp_only).unwrap();
    let mut plain = TransportConfig::default();
    plain.receive_budget = 64 << 20;
    let plain = Transport::new(plain).unwrap();
    assert_eq!(
        (tcp_only.receive_budget(), plain.receive_budget()),
        (8 << 20, 64 << 20)
    );
    let (a, b) = (tcp_only.ucx_worker().unwrap(), plain.ucx_worker().unwrap());
    let global = transport::ucx_worker().unwrap();
    assert!(!a.same_as(&b) && !a.same_as(&global) && !b.same_as(&global));
    assert_eq!(a.context().config()["TLS"], "self,tcp");
    assert_ne!(b.context().config()["TLS"], "self,tcp");
    assert!(
        tcp_only.ucx_worker().unwrap().same_as(&a),
        "one worker per transport"
    );
    // A message of 12 MiB: more than the TCP-only transport's whole budget (it waits for all
    // of it, then runs alone), well within the other's.
    let big = pattern(12 << 20, 9);
    for t in [&tcp_only, &plain] {
        let mut l = t
            .listen(&"ucx://127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = l.local_addr().clone();
        let (s, c) = tokio::join!(l.accept(), t.connect(&addr));
        let (s, c) = (s.unwrap(), c.unwrap());
        // A rendezvous send completes once the receiver takes it: both at once.
        let both = async { tokio::join!(c.send(1, Message::from(vec![big.clone()])), s.recv()) };
        let (sent, received) = tokio::time::timeout(Duration::from_secs(60), both)
            .await
            .expect("sent and received in time");
        sent.unwrap();
        let (channel, m) = received.unwrap();
        assert_eq!(channel, 1);
        assert_eq!(m.host(0), Some(&big[..]), "{t:?}");
        c.close().await.unwrap();
        assert!(matches!(
            s.recv().await,
            Err(transport::Error::Closed(CloseReason::PeerClosed))
        ));
    }
    // A configuration UCX cannot take is refused when the transport is made.
    let mut bad = TransportConfig::default();
    bad.ucx.shared_memory = false;
    assert!(Transport::new(bad).is_err());
}
