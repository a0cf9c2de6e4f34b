//! Tagged messaging between two workers in one process, over loopback, in every progress mode.

mod common;

use common::*;
use ucx::{Error, ProgressMode, Tag};

/// 1 B to 16 MiB in steps of x16.
const SIZES: [usize; 7] = [1, 16, 256, 4096, 65536, 1 << 20, 16 << 20];

async fn echo_sizes(mode: ProgressMode) {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, mode).await;
    // The server echoes until the client closes; its pending receive must then fail.
    let echo = async {
        let mut echoed = 0;
        loop {
            match server.recv_vec(1).await {
                Ok(msg) => {
                    let (r, _) = server.send(msg, 2).await;
                    r.expect("server send");
                    echoed += 1;
                }
                Err(e) => {
                    assert!(e.is_disconnect(), "{mode:?}: unexpected error {e}");
                    break;
                }
            }
        }
        assert_eq!(echoed, SIZES.len());
    };
    let drive = async {
        for (i, &size) in SIZES.iter().enumerate() {
            let data = pattern(size, i as u8);
            let (r, data) = client.send(data, 1).await;
            r.expect("client send");
            let (n, back) = client.recv(Vec::with_capacity(size), 2).await;
            assert_eq!(n.expect("client recv"), size, "{mode:?} size {size}");
            assert!(back == data, "{mode:?}: echo of {size} bytes differs");
        }
        client.close().await.expect("close");
    };
    within("echo", async { tokio::join!(echo, drive) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_polling() {
    echo_sizes(ProgressMode::Polling).await;
}

#[tokio::test(flavor = "current_thread")]
async fn echo_blocking() {
    echo_sizes(ProgressMode::Blocking).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_thread() {
    echo_sizes(ProgressMode::Thread).await;
}

#[tokio::test(flavor = "current_thread")]
async fn tags_are_isolated() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    within("tags", async {
        let recv_b = server.recv(vec![0u8; 16], 200);
        let send_a = async {
            let (r, _) = client.send(b"for-a".to_vec(), 100).await;
            r.unwrap();
            let (r, _) = client.send(b"for-b".to_vec(), 200).await;
            r.unwrap();
        };
        let ((n, got_b), ()) = tokio::join!(recv_b, send_a);
        assert_eq!(
            &got_b[..n.unwrap()],
            b"for-b",
            "tag 200 got tag 100's message"
        );
        let (n, got_a) = server.recv(vec![0u8; 16], 100).await;
        assert_eq!(&got_a[..n.unwrap()], b"for-a");
        // Negative tags and forced tags work and differ from positive ones.
        let (r, _) = client.send(b"neg".to_vec(), -5i64).await;
        r.unwrap();
        let raw = Tag::Forced(0xfeed);
        let (r, _) = client.send(b"raw".to_vec(), raw).await;
        r.unwrap();
        let (n, got) = server.recv(vec![0u8; 8], raw).await;
        assert_eq!(&got[..n.unwrap()], b"raw");
        let (n, got) = server.recv(vec![0u8; 8], -5i64).await;
        assert_eq!(&got[..n.unwrap()], b"neg");
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn truncation_names_both_sizes() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    within("truncation", async {
        for size in [100usize, 1 << 20] {
            let (sent, (r, _)) = tokio::join!(
                client.send(pattern(size, 3), 9),
                server.recv(vec![0u8; 10], 9)
            );
            let err = r.unwrap_err();
            match err {
                Error::Truncated { message, buffer } => {
                    assert_eq!(buffer, 10);
                    assert!(message == size || message == 0, "reported {message}");
                    assert!(err.to_string().contains("10-byte"), "{err}");
                }
                other => panic!("expected Truncated, got {other:?}"),
            }
            // The sender may see success or an error for a truncated rendezvous; it must end.
            let _ = sent.0;
        }
        // A smaller message returns its length.
        let (sent, (n, buf)) = tokio::join!(
            client.send(b"abc".to_vec(), 9),
            server.recv(vec![0u8; 10], 9)
        );
        sent.0.unwrap();
        assert_eq!(n.unwrap(), 3);
        assert_eq!(buf, b"abc");
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn send_obj_recv_obj() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    within("objects", async {
        for size in [0usize, 1, 5000, 3 << 20] {
            let data = pattern(size, 9);
            let (sent, got) = tokio::join!(client.send_obj(data.clone(), 4), server.recv_obj(4));
            sent.0.unwrap();
            assert_eq!(got.unwrap(), data, "object of {size} bytes");
        }
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn recv_vec_refuses_oversized_messages() {
    let ctx = context();
    let (mut server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    server.set_max_message(1000);
    within("limit", async {
        let (sent, got) = tokio::join!(client.send(pattern(5000, 1), 6), server.recv_vec(6));
        let _ = sent.0;
        assert!(
            matches!(got, Err(Error::Truncated { message: 5000, .. })),
            "{got:?}"
        );
        // The endpoint still works afterwards.
        let (sent, got) = tokio::join!(client.send(pattern(10, 1), 6), server.recv_vec(6));
        sent.0.unwrap();
        assert_eq!(got.unwrap(), pattern(10, 1));
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn endpoints_by_worker_address() {
    let ctx = context();
    let a = ucx::Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    let b = ucx::Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    // SAFETY: both addresses come straight from Worker::address of live workers.
    let a_to_b = unsafe { ucx::Endpoint::connect_address(&a, &b.address().unwrap()) }.unwrap();
    // SAFETY: as above.
    let b_to_a = unsafe { ucx::Endpoint::connect_address(&b, &a.address().unwrap()) }.unwrap();
    within("address endpoints", async {
        for size in [1usize, 70_000, 4 << 20] {
            let (sent, got) = tokio::join!(a_to_b.send(pattern(size, 2), 5), b_to_a.recv_vec(5));
            sent.0.unwrap();
            assert_eq!(got.unwrap(), pattern(size, 2));
        }
        let (sent, got) = tokio::join!(
            b_to_a.send(b"forced".to_vec(), Tag::Forced(42)),
            a_to_b.recv_vec(Tag::Forced(42))
        );
        sent.0.unwrap();
        assert_eq!(got.unwrap(), b"forced");
    })
    .await;
    // SAFETY: too short to reach UCX: rejected before any parsing.
    let e = unsafe { ucx::Endpoint::connect_address(&a, &[1, 2, 3]) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn all_interfaces_ipv4_and_ipv6_refusal() {
    let ctx = context();
    let sw = ucx::Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    let cw = ucx::Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    // All IPv4 interfaces, reached through 127.0.0.1.
    let mut any = ucx::Listener::bind_port(&sw, 0).unwrap();
    assert!(any.ip().is_unspecified());
    let port = any.port();
    let (s, c) = within("ipv4 any", async {
        tokio::join!(
            any.accept(),
            ucx::Endpoint::connect(&cw, ("127.0.0.1", port))
        )
    })
    .await;
    let (s, c) = (s.unwrap(), c.unwrap());
    let (sent, got) = within("echo v4", async {
        tokio::join!(c.send(b"v4".to_vec(), 0), s.recv_vec(0))
    })
    .await;
    sent.0.unwrap();
    assert_eq!(got.unwrap(), b"v4");
    // IPv6 with the default TCP address-family order is refused with a reason (UCX's TCP
    // transport overflows a heap buffer otherwise: seen under valgrind with UCX 1.13.1 and
    // 1.22.0). With UCX_TCP_AF_PRIO=inet6 the overflow is gone, but on this machine UCX then
    // reports the IPv6 loopback peer unreachable, so no IPv6 echo is asserted here.
    if std::env::var_os("UCX_TCP_AF_PRIO").is_none() {
        let e = ucx::Listener::bind(&sw, "[::1]:0".parse().unwrap()).unwrap_err();
        assert!(e.to_string().contains("UCX_TCP_AF_PRIO=inet6"), "{e}");
        let e = within("v6 connect", ucx::Endpoint::connect(&cw, "[::1]:9"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("UCX_TCP_AF_PRIO=inet6"), "{e}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_listeners_arrivals_count_each_request_that_accept_yields_once() {
    let ctx = context();
    let sw = ucx::Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    let cw = ucx::Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    let mut listener = ucx::Listener::bind(&sw, "127.0.0.1:0".parse().unwrap()).unwrap();
    let arrivals = listener.arrivals();
    assert_eq!(arrivals.total(), 0);
    let port = listener.port();
    // A client's connect can return before the listener's side of its handshake does: the
    // request is counted from when UCX reports it, before `accept` yields it.
    let mut clients = Vec::new();
    let mut accepted = Vec::new();
    for i in 0..3 {
        let (s, c) = within("connect", async {
            tokio::join!(
                listener.accept(),
                ucx::Endpoint::connect(&cw, ("127.0.0.1", port))
            )
        })
        .await;
        accepted.push(s.unwrap());
        clients.push(c.unwrap());
        assert_eq!(arrivals.total(), i + 1, "one request per connection");
    }
    drop(listener);
    assert_eq!(arrivals.total(), 3, "the handle outlives the listener");
}
