//! The guarantees users rely on: no use-after-free when futures are dropped, every pending
//! operation ends when either side closes, bad handshakes never take a listener down.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::FutureExt;
use ucx::{ConnectOptions, Endpoint, Error, Listener, ProgressMode, Worker};

/// One test of this file at a time. UCX before 1.17 asserts (`async.c:643`, `handler->async ==
/// async`: the process aborts) when a worker's missed async event names a handler that another
/// worker has registered since, under the same id (fixed by openucx/ucx#9942, "Skip released
/// handler in poll missed process"). These tests open and close listeners, connections and raw
/// sockets quickly; run in parallel, many workers churn them at once (seen once in CI, on
/// Debian's UCX 1.13.1). One at a time also keeps `open_fds` counts to one test's.
async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ONE.lock().await
}

async fn eventually(what: &str, cond: impl Fn() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

async fn drop_safety_of_receives(mode: ProgressMode) {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, mode).await;
    const N: usize = 8;
    const SIZES: [usize; 2] = [100, 40_000];
    let mut views = Vec::new();
    let mut flags = Vec::new();
    for i in 0..N {
        let (buf, view, dropped) = Canary::new(vec![0u8; 64 * 1024]);
        // Poll once (posts the receive), then drop the future mid-flight.
        assert!(server.recv(buf, 1000 + i as i64).now_or_never().is_none());
        views.push(view);
        flags.push(dropped);
    }
    // UCX's cancellation callback releases each parked buffer.
    eventually("parked buffers released", || {
        server.worker().progress();
        flags.iter().all(|f| f.load(Ordering::SeqCst))
    })
    .await;
    // Messages sent to the abandoned tags must reach new receives, not the dropped buffers.
    for i in 0..N {
        let data = pattern(SIZES[i % 2], i as u8);
        let (sent, got) = within("resend", async {
            tokio::join!(
                client.send(data.clone(), 1000 + i as i64),
                server.recv_vec(1000 + i as i64)
            )
        })
        .await;
        sent.0.unwrap();
        assert_eq!(got.unwrap(), data, "{mode:?}: message {i}");
    }
    for (i, v) in views.iter().enumerate() {
        assert!(
            v.iter().all(|&b| b == CANARY),
            "{mode:?}: buffer {i} was written after its receive was dropped"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn dropped_receives_are_cancelled_blocking() {
    let _one = one_at_a_time().await;
    drop_safety_of_receives(ProgressMode::Blocking).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_receives_are_cancelled_thread() {
    let _one = one_at_a_time().await;
    drop_safety_of_receives(ProgressMode::Thread).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_receives_are_cancelled_polling() {
    let _one = one_at_a_time().await;
    drop_safety_of_receives(ProgressMode::Polling).await;
}

#[tokio::test(flavor = "current_thread")]
async fn dropped_send_keeps_its_buffer_until_ucx_is_done() {
    let _one = one_at_a_time().await;
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    // 8 MiB goes by rendezvous: UCX reads the sender's memory only once the receiver is there.
    let data = pattern(8 << 20, 5);
    let (buf, _view, dropped) = Canary::new(data.clone());
    assert!(
        client.send(buf, 77).now_or_never().is_none(),
        "8 MiB cannot complete at once"
    );
    assert!(
        !dropped.load(Ordering::SeqCst),
        "buffer freed while UCX still owns it"
    );
    let got = within("receive", server.recv_vec(77)).await.unwrap();
    assert!(got == data, "receiver saw freed (canary) memory");
    eventually("parked send buffer released", || {
        dropped.load(Ordering::SeqCst)
    })
    .await;
}

async fn close_cancels_peer_receive(mode: ProgressMode, close_server: bool) {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, mode).await;
    let (closer, waiter) = if close_server {
        (&server, &client)
    } else {
        (&client, &server)
    };
    let pending = waiter.recv(vec![0u8; 16], 3);
    let close = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        closer.close().await.unwrap();
    };
    let ((r, _), ()) = within("peer close", async { tokio::join!(pending, close) }).await;
    let e = r.unwrap_err();
    assert!(
        e.is_disconnect(),
        "{mode:?}: expected a disconnect error, got {e:?}"
    );
    assert!(waiter.is_closed());
    // Operations after the failure fail at once.
    let (r, _) = within("send after close", waiter.send(vec![1u8], 3)).await;
    assert!(r.is_err());
}

#[tokio::test(flavor = "current_thread")]
async fn client_close_cancels_server_receive() {
    let _one = one_at_a_time().await;
    close_cancels_peer_receive(ProgressMode::Blocking, false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn server_close_cancels_client_receive() {
    let _one = one_at_a_time().await;
    close_cancels_peer_receive(ProgressMode::Blocking, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_cancels_peer_receive_thread_and_polling() {
    let _one = one_at_a_time().await;
    close_cancels_peer_receive(ProgressMode::Thread, false).await;
    close_cancels_peer_receive(ProgressMode::Polling, true).await;
}

#[tokio::test(flavor = "current_thread")]
async fn local_close_fails_own_pending_receive_and_calls_back() {
    let _one = one_at_a_time().await;
    let ctx = context();
    let (_server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    let (tx, rx) = std::sync::mpsc::channel();
    client.on_close(move |reason| tx.send(reason).unwrap());
    let pending = client.recv(vec![0u8; 16], 3);
    let close = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        client.abort();
    };
    let ((r, _), ()) = within("local abort", async { tokio::join!(pending, close) }).await;
    assert_eq!(r.unwrap_err(), Error::Closed);
    assert_eq!(rx.recv_timeout(STEP).unwrap(), None);
}

#[tokio::test(flavor = "current_thread")]
async fn endpoints_outlive_their_listener() {
    let _one = one_at_a_time().await;
    let ctx = context();
    let sw = Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    let cw = Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    let mut listener = Listener::bind(&sw, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let (s, c) = within("connect", async {
        tokio::join!(listener.accept(), Endpoint::connect(&cw, addr))
    })
    .await;
    let (s, c) = (s.unwrap(), c.unwrap());
    drop(listener);
    for size in [10usize, 1 << 20] {
        let (sent, got) = within("echo", async {
            tokio::join!(c.send(pattern(size, 1), 0), s.recv_vec(0))
        })
        .await;
        sent.0.unwrap();
        assert_eq!(got.unwrap(), pattern(size, 1));
    }
    // The port is free again: connecting now fails promptly instead of hanging.
    let r = Endpoint::connect_with(
        &cw,
        addr,
        ConnectOptions {
            timeout: Duration::from_secs(10),
            ..Default::default()
        },
    )
    .await;
    assert!(r.is_err(), "connected to a dropped listener");
}

#[tokio::test(flavor = "current_thread")]
async fn connect_to_nothing_fails_promptly() {
    let _one = one_at_a_time().await;
    let ctx = context();
    let w = Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    // Bind-and-drop a TCP socket to find a port with nobody listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = within("connect", Endpoint::connect(&w, ("127.0.0.1", port))).await;
    let e = r.unwrap_err();
    assert!(
        !matches!(e, Error::Timeout(_)),
        "should be refused, not time out: {e}"
    );
}

/// A raw client that connects without the UCXX handshake.
async fn raw_client(w: &Worker, port: u16) -> Endpoint {
    Endpoint::connect_with(
        w,
        ("127.0.0.1", port),
        ConnectOptions {
            handshake: false,
            ..Default::default()
        },
    )
    .await
    .expect("raw connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_handshakes_are_rejected_and_the_listener_keeps_serving() {
    let _one = one_at_a_time().await;
    let ctx = context();
    let sw = Worker::new(&ctx, ProgressMode::Thread).unwrap();
    let cw = Worker::new(&ctx, ProgressMode::Thread).unwrap();
    let mut listener = Listener::bind(&sw, "127.0.0.1:0".parse().unwrap()).unwrap();
    listener.set_handshake_timeout(Duration::from_millis(500));
    let port = listener.port();

    // 1. Garbage: a well-sized handshake with a wrong checksum.
    let garbage = async {
        let ep = raw_client(&cw, port).await;
        let (r, _) = ep.stream_recv_exact(Vec::with_capacity(16)).await;
        r.unwrap();
        let (r, _) = ep.stream_send(vec![0x5Au8; 16]).await;
        r.unwrap();
        ep
    };
    let (accepted, _keep) = within("garbage", async {
        tokio::join!(listener.accept(), garbage)
    })
    .await;
    let e = accepted.unwrap_err();
    assert!(
        matches!(&e, Error::Handshake(ucx::HandshakeError::Checksum { .. })),
        "{e:?}"
    );

    // 2. Short: 5 bytes and then silence.
    let short = async {
        let ep = raw_client(&cw, port).await;
        let (r, _) = ep.stream_send(vec![1u8; 5]).await;
        r.unwrap();
        ep
    };
    let (accepted, _keep2) =
        within("short", async { tokio::join!(listener.accept(), short) }).await;
    assert!(matches!(accepted, Err(Error::Handshake(_))), "{accepted:?}");

    // 3. Short, then the client goes away.
    let gone = async {
        let ep = raw_client(&cw, port).await;
        let (r, _) = ep.stream_send(vec![1u8; 3]).await;
        r.unwrap();
        ep.close().await.unwrap();
    };
    let (accepted, ()) = within("gone", async { tokio::join!(listener.accept(), gone) }).await;
    assert!(matches!(accepted, Err(Error::Handshake(_))), "{accepted:?}");

    // 4. A proper client is still served.
    let (s, c) = within("good client", async {
        tokio::join!(
            listener.accept(),
            Endpoint::connect(&cw, ("127.0.0.1", port))
        )
    })
    .await;
    let (s, c) = (s.unwrap(), c.unwrap());
    let (sent, got) = within("echo", async {
        tokio::join!(c.send(b"ok".to_vec(), 0), s.recv_vec(0))
    })
    .await;
    sent.0.unwrap();
    assert_eq!(got.unwrap(), b"ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_storm_4_listeners_50_clients_each() {
    let _one = one_at_a_time().await;
    let ctx = context();
    let sw = Worker::new(&ctx, ProgressMode::Thread).unwrap();
    let cw = Worker::new(&ctx, ProgressMode::Thread).unwrap();
    let mut ports = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..4 {
        let mut l = Listener::bind(&sw, "127.0.0.1:0".parse().unwrap()).unwrap();
        ports.push(l.port());
        servers.push(tokio::spawn(async move {
            let mut echoes = Vec::new();
            for _ in 0..50 {
                let ep = l.accept().await.expect("accept");
                echoes.push(tokio::spawn(async move {
                    let msg = ep.recv_vec(0).await.expect("server recv");
                    let (r, _) = ep.send(msg, 0).await;
                    r.expect("server send");
                    // Keep the endpoint until the client has its reply and closes.
                    let _ = ep.recv_vec(1).await;
                }));
            }
            for e in echoes {
                e.await.unwrap();
            }
        }));
    }
    let mut clients = Vec::new();
    for (li, &port) in ports.iter().enumerate() {
        for ci in 0..50 {
            let cw = cw.clone();
            clients.push(tokio::spawn(async move {
                let ep = Endpoint::connect_with(
                    &cw,
                    ("127.0.0.1", port),
                    ConnectOptions {
                        timeout: Duration::from_secs(30),
                        ..Default::default()
                    },
                )
                .await
                .expect("connect");
                let data = pattern(1000 + ci, li as u8);
                let (r, _) = ep.send(data.clone(), 0).await;
                r.unwrap();
                assert_eq!(ep.recv_vec(0).await.unwrap(), data);
                ep.close().await.unwrap();
            }));
        }
    }
    within("storm", async {
        for c in clients {
            c.await.unwrap();
        }
        for s in servers {
            s.await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn dropped_stream_receive_abandons_the_stream() {
    let _one = one_at_a_time().await;
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    // UCX cannot cancel stream receives: a dropped one must not let later receives read
    // shifted bytes.
    assert!(server
        .stream_recv_exact(Vec::with_capacity(8))
        .now_or_never()
        .is_none());
    let (r, _) = within("stream send", client.stream_send(vec![9u8; 8])).await;
    r.unwrap();
    let (r, _) = within(
        "stream recv",
        server.stream_recv_exact(Vec::with_capacity(8)),
    )
    .await;
    assert_eq!(r.unwrap_err(), Error::StreamAbandoned);
    // Tagged messaging on the endpoint is unaffected.
    let (sent, got) = within("tagged", async {
        tokio::join!(client.send(b"t".to_vec(), 1), server.recv_vec(1))
    })
    .await;
    sent.0.unwrap();
    assert_eq!(got.unwrap(), b"t");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_ends_a_pending_receive_of_unknown_size() {
    let _one = one_at_a_time().await;
    for mode in [ProgressMode::Thread, ProgressMode::Blocking] {
        let ctx = context();
        let (_server, client, _sw, _cw) = pair(&ctx, mode).await;
        let client = Arc::new(client);
        let waiter = {
            let c = Arc::clone(&client);
            tokio::spawn(async move { c.recv_vec(5).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        client.abort();
        let r = within("recv_vec after abort", waiter).await.unwrap();
        assert_eq!(r.unwrap_err(), Error::Closed, "{mode:?}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn dropped_active_message_and_multi_sends_keep_their_buffers() {
    let _one = one_at_a_time().await;
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    // 8 MiB active message: rendezvous, so UCX reads the sender's memory later.
    let data = pattern(8 << 20, 6);
    let (buf, _view, dropped) = Canary::new(data.clone());
    assert!(
        client.am_send(buf).now_or_never().is_none(),
        "8 MiB cannot complete at once"
    );
    assert!(
        !dropped.load(Ordering::SeqCst),
        "buffer freed while UCX still owns it"
    );
    let got = within("am receive", server.am_recv()).await.unwrap();
    assert!(got == data, "receiver saw freed (canary) memory");
    eventually("parked AM buffer released", || {
        dropped.load(Ordering::SeqCst)
    })
    .await;
    // A multi-buffer send dropped after its first poll: every frame still arrives intact.
    let frames: Vec<(Canary, Vec<u8>)> = (0..3)
        .map(|i| {
            let d = pattern(4 << 20, i);
            (Canary::new(d.clone()).0, d)
        })
        .collect();
    let (bufs, expected): (Vec<Canary>, Vec<Vec<u8>>) = frames.into_iter().unzip();
    assert!(client.send_multi(bufs, 21).now_or_never().is_none());
    let got = within("multi receive", server.recv_multi(21))
        .await
        .unwrap();
    assert!(
        got == expected,
        "a frame was read after its buffer was freed"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn dropped_puts_and_gets_keep_their_buffers() {
    let _one = one_at_a_time().await;
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    let mut region = ucx::MemoryHandle::alloc(&ctx, 8 << 20).unwrap();
    let original = pattern(8 << 20, 3);
    region.write(0, &original).unwrap();
    let key = client.unpack_rkey(&region.pack_rkey().unwrap()).unwrap();
    // The server keeps a receive pending so that its worker progresses (software RMA).
    let serve = async { server.recv_vec(9).await.unwrap() };
    let work = async {
        // A get dropped after its first poll: its buffer may only be dropped (and filled with
        // the canary) after UCX finished writing into it.
        let (buf, view, dropped) = Canary::new(vec![0u8; 8 << 20]);
        let pending = key.get(buf, 0).now_or_never();
        if pending.is_none() {
            eventually("parked get buffer released", || {
                client.worker().progress();
                dropped.load(Ordering::SeqCst)
            })
            .await;
            assert!(
                view.iter().all(|&b| b == CANARY),
                "written after the get's buffer was dropped"
            );
        }
        // A put dropped after its first poll: the region must get the put's bytes, never the
        // canary its buffer is filled with once freed.
        let data = pattern(8 << 20, 4);
        let (buf, _view, dropped) = Canary::new(data.clone());
        let _ = key.put(buf, 0).now_or_never();
        client.flush().await.unwrap();
        eventually("parked put buffer released", || {
            dropped.load(Ordering::SeqCst)
        })
        .await;
        let (r, _) = client.send(b"done".to_vec(), 9).await;
        r.unwrap();
        data
    };
    let (_, data) = within("rma drop-safety", async { tokio::join!(serve, work) }).await;
    assert!(
        region.read() == data,
        "the region holds freed (canary) bytes"
    );
    drop(key);
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Sends the connection manager's header on `raw` (a request of no length, status 0) and
/// checks the answer is a refusal: a header carrying UCS_ERR_REJECTED (-23), or the
/// connection closed.
async fn send_request_expect_refusal(mut raw: std::net::TcpStream) {
    use std::io::{Read, Write};
    raw.write_all(&[0u8; 16]).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let read = tokio::task::spawn_blocking(move || {
        let mut hdr = [0u8; 16];
        raw.read(&mut hdr).map(|n| (n, hdr))
    })
    .await
    .unwrap();
    match read {
        Ok((16, hdr)) => assert_eq!(hdr[8] as i8, -23, "{hdr:?}"),
        Ok((0, _)) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        Ok((n, hdr)) => panic!("a partial answer: {:?}", &hdr[..n]),
    }
}

/// UCX's TCP connection manager accepts a connection before the client's request arrives on
/// it, and the accepted connection keeps a pointer to its listener that
/// `ucp_listener_destroy` leaves dangling (UCX 1.13.1 to the master of 2026): a request that arrives after
/// the listener is dropped would call back into freed memory (a crash seen in CI, in
/// `ucp_cm_server_conn_request_cb`, when a cluster shut down while a worker reconnected).
/// Here a client that speaks the connection manager's framing by hand holds an accepted
/// connection across the drop, then sends its request: it is refused, the process lives, and
/// the port is free again for a new listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_arriving_after_its_listener_was_dropped_is_refused() {
    let _one = one_at_a_time().await;
    let ctx = context();
    let w = Worker::new(&ctx, ProgressMode::Thread).unwrap();
    let listener = Listener::bind(&w, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let before = open_fds();
    let raw = std::net::TcpStream::connect(addr).unwrap();
    // UCX's async thread accepts it: one more descriptor here for our end, one for UCX's.
    eventually("UCX accepts the connection", || open_fds() >= before + 2).await;
    drop(listener);
    send_request_expect_refusal(raw).await;
    // A client that keeps trying is refused each time, past the linger counted from the drop
    // (each refusal starts it again: a connection accepted meanwhile is not left dangling).
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        send_request_expect_refusal(std::net::TcpStream::connect(addr).unwrap()).await;
    }
    // Destroyed after the linger: the port stops accepting.
    within("the listener is destroyed", async {
        while std::net::TcpStream::connect(addr).is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// A dropped listener lingers (see the test above), but binding its port again is honoured
/// at once.
#[tokio::test(flavor = "current_thread")]
async fn a_dropped_listeners_port_can_be_bound_again_at_once() {
    let _one = one_at_a_time().await;
    let ctx = context();
    let w = Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    let first = Listener::bind(&w, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = first.local_addr();
    drop(first);
    let again = Listener::bind(&w, addr).unwrap();
    assert_eq!(again.local_addr(), addr);
    let cw = Worker::new(&ctx, ProgressMode::Blocking).unwrap();
    let mut again = again;
    let (s, c) = within("connect", async {
        tokio::join!(again.accept(), Endpoint::connect(&cw, addr))
    })
    .await;
    let (_s, _c) = (s.unwrap(), c.unwrap());
}
