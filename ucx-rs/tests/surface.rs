//! The UCX-Py/UCXX surface beyond plain tagged messages: multi-buffer messages, probes,
//! worker-level receives, close_after_n_recv and introspection.

mod common;

use common::*;
use ucx::{Error, ProgressMode, Tag};

#[tokio::test(flavor = "current_thread")]
async fn multi_buffer_messages() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    for (count, big) in [(1usize, 16 << 20), (3, 1 << 20), (150, 4096), (0, 0)] {
        let frames: Vec<Vec<u8>> = (0..count)
            .map(|i| pattern(if i == 0 { big } else { i * 7 % 300 }, i as u8))
            .collect();
        let (sent, got) = within("multi", async {
            tokio::join!(client.send_multi(frames.clone(), 11), server.recv_multi(11))
        })
        .await;
        sent.0.unwrap();
        assert_eq!(sent.1.len(), count, "buffers come back");
        assert_eq!(got.unwrap(), frames, "{count} frames");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn bad_multi_header_is_rejected() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    // A header announcing 5 frames of 2^60 bytes: refused before anything is allocated.
    let mut h = ucx::multi::encode_headers(
        &[ucx::multi::FrameInfo {
            size: 1,
            cuda: false,
        }; 5],
    )
    .remove(0);
    for j in 0..5 {
        let o = 9 + 4 * 100 + 8 * j;
        h[o..o + 8].copy_from_slice(&(1u64 << 60).to_ne_bytes());
    }
    let (sent, got) = within("bad header", async {
        tokio::join!(client.send(h, 3), server.recv_multi(3))
    })
    .await;
    sent.0.unwrap();
    assert!(
        matches!(
            got,
            Err(Error::Protocol(ucx::ProtocolError::TooLarge { .. }))
        ),
        "{got:?}"
    );
    // A short message where a header belongs.
    let (sent, got) = within("short header", async {
        tokio::join!(client.send(vec![1u8; 20], 4), server.recv_multi(4))
    })
    .await;
    sent.0.unwrap();
    let e = got.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Protocol(ucx::ProtocolError::MultiHeaderLength { got: 20, .. })
        ),
        "{e:?}"
    );
    // Bad bytes from a peer are invalid data to std::io users.
    assert_eq!(
        std::io::Error::from(e).kind(),
        std::io::ErrorKind::InvalidData
    );
}

#[tokio::test(flavor = "current_thread")]
async fn probe_then_receive_even_after_the_peer_closed() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    let (r, _) = within("send", client.send(pattern(5000, 1), 8)).await;
    r.unwrap();
    let (r, _) = within("send", client.send(pattern(10, 2), 9)).await;
    r.unwrap();
    // Wait until both arrived, without removing them.
    let info = within("probe", async {
        loop {
            if let Some(p) = server.tag_probe(8, false) {
                assert!(p.message.is_none());
                break p.info;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await;
    assert_eq!(info.length, 5000);
    let probed9 = within("probe 9", async {
        loop {
            if let Some(p) = server.tag_probe(9, true) {
                break p;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await;
    client.close().await.unwrap();
    // Removed from the queue before the close: still receivable.
    let msg = probed9.message.expect("removed");
    let (n, buf) = within("recv probed", msg.recv(Vec::with_capacity(10))).await;
    assert_eq!(n.unwrap(), 10);
    assert_eq!(buf, pattern(10, 2));
    // Dropping a removed message unreceived discards it; a too-small buffer is refused.
    let p8 = server
        .tag_probe(8, true)
        .expect("still queued")
        .message
        .unwrap();
    let (r, _) = within("too small", p8.recv(Vec::with_capacity(100))).await;
    assert!(
        matches!(
            r,
            Err(Error::Truncated {
                message: 5000,
                buffer: 100
            })
        ),
        "{r:?}"
    );
    assert!(server.tag_probe(8, false).is_none(), "discarded");
}

/// Messages that arrived before the peer closed are delivered by a plain `recv` after UCX
/// reported the endpoint failed; then the failure.
#[tokio::test(flavor = "current_thread")]
async fn recv_delivers_what_arrived_before_the_peer_failed() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    for i in 0..3u8 {
        let (r, _) = within("send", client.send(pattern(100, i), 4)).await;
        r.unwrap();
    }
    client.close().await.unwrap();
    // Wait until this side has seen the failure.
    within("failure seen", async {
        while server.peer_error().is_none() {
            server.worker().progress();
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await;
    for i in 0..3u8 {
        let (n, buf) = within("recv", server.recv(Vec::with_capacity(100), 4)).await;
        assert_eq!(n.unwrap(), 100, "message {i}");
        assert_eq!(buf, pattern(100, i));
    }
    let (r, _) = within("recv after", server.recv(Vec::with_capacity(100), 4)).await;
    assert!(r.unwrap_err().is_disconnect());
}

#[tokio::test(flavor = "current_thread")]
async fn worker_level_receive_reports_the_sender_tag() {
    let ctx = context();
    let (server, client, sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    let raw = 0xabcd_0000_0000_0042u64;
    let (sent, (r, buf)) = within("worker recv", async {
        tokio::join!(
            client.send(b"any".to_vec(), Tag::Forced(raw)),
            sw.tag_recv(
                Vec::with_capacity(16),
                0xabcd_0000_0000_0000,
                0xffff_0000_0000_0000
            )
        )
    })
    .await;
    sent.0.unwrap();
    let info = r.unwrap();
    assert_eq!(info.sender_tag, raw);
    assert_eq!(info.length, 3);
    assert_eq!(buf, b"any");
    drop(server);
}

#[tokio::test(flavor = "current_thread")]
async fn close_after_n_receives() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    within("one receive", async {
        let (sent, got) = tokio::join!(client.send(vec![7u8], 1), server.recv_vec(1));
        sent.0.unwrap();
        got.unwrap();
    })
    .await;
    // Fewer than already received is an error; counting from now works.
    assert!(matches!(
        server.close_after_n_recv(0, false),
        Err(Error::InvalidArgument(_))
    ));
    assert!(!server.is_closed());
    server.close_after_n_recv(2, true).unwrap();
    within("two more receives", async {
        for i in 0..2u8 {
            assert!(!server.is_closed(), "closed too early");
            let (sent, got) = tokio::join!(client.send(vec![i], 1), server.recv_vec(1));
            sent.0.unwrap();
            assert_eq!(got.unwrap(), vec![i]);
        }
    })
    .await;
    assert!(server.is_closed(), "closed after the second receive");
    // The peer notices: its pending receive fails.
    let (r, _) = within("peer sees close", client.recv(vec![0u8; 4], 1)).await;
    assert!(r.unwrap_err().is_disconnect());
    // n equal to what is already done closes at once.
    let (server, _client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    server.close_after_n_recv(0, false).unwrap();
    assert!(server.is_closed());
}

#[tokio::test(flavor = "current_thread")]
async fn introspection() {
    let ctx = context();
    let (server, client, sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    // Each end's local address is what the other end sees as its peer's.
    let client_local = client
        .local_addr()
        .expect("a client-server endpoint's local address");
    assert_eq!(Some(client_local), server.peer_addr());
    assert_eq!(server.local_addr(), client.peer_addr());
    let t = server.transports().unwrap();
    assert!(t.contains("lane"), "{t}");
    assert!(!sw.info().unwrap().is_empty());
    assert!(
        ctx.memory_types() & 1 != 0,
        "host memory is always supported"
    );
    // Debian's UCX has no CUDA support; the wheel's has it only with a GPU.
    let cuda_in_ucx = ctx.memory_types() & (1 << 1) != 0; // bit UCS_MEMORY_TYPE_CUDA = 1
    assert_eq!(
        ctx.cuda_support() == ucx::CudaSupport::ZeroCopy,
        cuda_in_ucx,
        "{:?}",
        ctx.cuda_support()
    );
    server.abort();
    assert_eq!(server.transports().unwrap_err(), Error::Closed);
    assert_eq!(server.local_addr(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_messages_eager_and_rendezvous() {
    for mode in MODES {
        let ctx = context();
        let (server, client, _sw, _cw) = pair(&ctx, mode).await;
        let sizes = [0usize, 1, 100, 8 << 10, 1 << 20, 16 << 20];
        within("am", async {
            for (i, &size) in sizes.iter().enumerate() {
                let data = pattern(size, i as u8);
                let (sent, got) = tokio::join!(client.am_send(data.clone()), server.am_recv());
                sent.0.unwrap();
                assert_eq!(got.unwrap(), data, "{mode:?} {size} bytes");
                // And back, on the other endpoint.
                let (sent, got) = tokio::join!(server.am_send(data.clone()), client.am_recv());
                sent.0.unwrap();
                assert!(got.unwrap() == data, "{mode:?} {size} bytes back");
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn active_messages_keep_order_per_connection_and_end_on_close() {
    let ctx = context();
    let (server, client, sw, cw) = pair(&ctx, ProgressMode::Blocking).await;
    // A second connection on the same workers: its messages are not mixed in.
    let mut l2 = ucx::Listener::bind(&sw, "127.0.0.1:0".parse().unwrap()).unwrap();
    let a2 = l2.local_addr();
    let (s2, c2) = within("second pair", async {
        tokio::join!(l2.accept(), ucx::Endpoint::connect(&cw, a2))
    })
    .await;
    let (s2, c2) = (s2.unwrap(), c2.unwrap());
    within("order", async {
        for i in 0..5u8 {
            let (r, _) = client.am_send(vec![i; 3]).await;
            r.unwrap();
            let (r, _) = c2.am_send(vec![100 + i; 2]).await;
            r.unwrap();
        }
        for i in 0..5u8 {
            assert_eq!(server.am_recv().await.unwrap(), vec![i; 3]);
        }
        for i in 0..5u8 {
            assert_eq!(s2.am_recv().await.unwrap(), vec![100 + i; 2]);
        }
    })
    .await;
    // A message that arrived before the peer closed is still delivered; then the error.
    let (r, _) = within("last", client.am_send(b"last".to_vec())).await;
    r.unwrap();
    client.close().await.unwrap();
    let got = within("after close", server.am_recv()).await;
    assert_eq!(got.unwrap(), b"last");
    let e = within("closed", server.am_recv()).await.unwrap_err();
    assert!(e.is_disconnect(), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rma_put_get_checked_byte_for_byte() {
    for mode in MODES {
        let ctx = context();
        let (server, client, _sw, cw) = pair(&ctx, mode).await;
        // The server exposes 16 MiB; the key travels over the connection.
        let mut region = ucx::MemoryHandle::alloc(&ctx, 16 << 20).unwrap();
        let seed = pattern(4096, 77);
        region.write(8192, &seed).unwrap();
        let packed = region.pack_rkey().unwrap();
        let (sent, got) = within("key", async {
            tokio::join!(server.send(packed, 1), client.recv_vec(1))
        })
        .await;
        sent.0.unwrap();
        let key = client.unpack_rkey(&got.unwrap()).unwrap();
        assert_eq!(key.len(), 16 << 20);
        // The target must progress for software RMA (TCP lanes) and for flush acknowledgements:
        // keep a receive pending on the server until the client is done.
        let serve = async {
            let done = server.recv_vec(2).await.unwrap();
            assert_eq!(done, b"done");
        };
        let work = async {
            for (size, offset) in [(1usize, 0usize), (4096, 100), (16 << 20, 0)] {
                let data = pattern(size, size as u8);
                let (r, _) = key.put(data.clone(), offset).await;
                r.unwrap();
                client.flush().await.unwrap();
                let back = region.read();
                assert!(
                    back[offset..offset + size] == data[..],
                    "{mode:?}: put of {size}"
                );
                let (n, got) = key.get(Vec::with_capacity(size), offset).await;
                assert_eq!(n.unwrap(), size);
                assert!(got == data, "{mode:?}: get of {size}");
            }
            cw.flush().await.unwrap();
            cw.fence().unwrap();
            let (r, _) = client.send(b"done".to_vec(), 2).await;
            r.unwrap();
        };
        within("rma", async { tokio::join!(serve, work) }).await;
        // Out of bounds is refused locally.
        let (r, _) = key.put(vec![0u8; 10], (16 << 20) - 5).await;
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
        drop(key);
        let buf = region.unmap().unwrap();
        assert_eq!(buf.len(), 16 << 20);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn rma_rejects_bad_keys_and_fails_after_the_peer_closes() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    let region = ucx::MemoryHandle::alloc(&ctx, 4096).unwrap();
    let packed = region.pack_rkey().unwrap();
    assert!(
        client.unpack_rkey(&packed[..packed.len() - 3]).is_err(),
        "truncated"
    );
    let mut bad = packed.clone();
    bad[26] ^= 0x40;
    let e = client.unpack_rkey(&bad).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    assert!(client.unpack_rkey(b"garbage").is_err());
    let key = client.unpack_rkey(&packed).unwrap();
    server.close().await.unwrap();
    // Wait for the client to notice, then puts fail instead of hanging.
    within("notice", async {
        while !client.is_closed() {
            let _ = client.tag_probe(0, false);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    let (r, _) = within("put after close", key.put(vec![1u8; 64], 0)).await;
    assert!(r.is_err());
    drop(key);
    drop(region);
}

/// A host allocator that counts its allocations, to show the hook is used.
struct Counting(std::sync::atomic::AtomicUsize);

impl ucx::AmAllocator for Counting {
    fn allocate(&self, len: usize) -> ucx::Result<Box<dyn ucx::IoBufMut>> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Box::new(vec![0u8; len]))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn active_message_allocator_per_memory_type() {
    let ctx = context();
    let (server, client, sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    let counting = std::sync::Arc::new(Counting(Default::default()));
    sw.set_am_allocator(ucx::MemoryType::Host, counting.clone());
    within("am with allocator", async {
        // Rendezvous: received straight into the allocator's buffer.
        let big = pattern(4 << 20, 1);
        let (sent, got) = tokio::join!(client.am_send(big.clone()), server.am_recv_buf());
        sent.0.unwrap();
        let mut got = got.unwrap();
        assert_eq!(got.sender_memory, ucx::MemoryType::Host);
        assert_eq!(got.len, big.len());
        let p = got.buffer.stable_mut_ptr();
        // SAFETY: the buffer holds `len` received bytes.
        let bytes = unsafe { std::slice::from_raw_parts(p, got.len) };
        assert!(bytes == &big[..]);
        assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Eager: arrives in host memory, no allocation asked of the allocator.
        let (sent, got) = tokio::join!(client.am_send(b"small".to_vec()), server.am_recv_buf());
        sent.0.unwrap();
        assert_eq!(got.unwrap().len, 5);
        assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    })
    .await;
}

/// On one host a client-server endpoint moves large messages through shared memory, not
/// through TCP's emulated put (`TCP_PUT_ENABLE=n` in `DEFAULT_OPTIONS`): UCX 1.13 then puts
/// no TCP lane on it at all. Asking for TCP's put back brings the TCP rendezvous lanes back,
/// so the option is what decides it.
#[tokio::test(flavor = "current_thread")]
async fn same_host_client_server_endpoints_have_no_tcp_lanes() {
    if !ucx::version().starts_with("1.13") {
        eprintln!(
            "skipped: lane choice checked on UCX 1.13 only ({})",
            ucx::version()
        );
        return;
    }
    if std::env::var_os("UCX_TCP_PUT_ENABLE").is_some() || std::env::var_os("UCX_TLS").is_some() {
        eprintln!("skipped: UCX_TCP_PUT_ENABLE or UCX_TLS set in the environment");
        return;
    }
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    for ep in [&server, &client] {
        let t = ep.transports().unwrap();
        assert!(t.contains("sysv/memory"), "{t}");
        assert!(!t.contains("tcp/"), "{t}");
    }
    // A large message still arrives whole (rendezvous over shared memory).
    let big = pattern(8 << 20, 5);
    let (sent, got) = within("8 MiB", async {
        tokio::join!(client.send(big.clone(), 3), server.recv_vec(3))
    })
    .await;
    sent.0.unwrap();
    assert_eq!(got.unwrap(), big);

    let ctx = ucx::Context::builder()
        .option("TCP_PUT_ENABLE", "y")
        .build()
        .unwrap();
    let (server, _client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    let t = server.transports().unwrap();
    assert!(t.contains("tcp/") && t.contains("rma_bw#0"), "{t}");
}

/// What a sender sent before `sync_with_peer` returned has reached the peer's worker: a close
/// right after it cannot overtake a rendezvous still in the peer's shared-memory queue (without
/// the round trip, a 1 MiB message sent just before the close was lost now and then). Answered
/// by the peer's progress engine, not its application: here nothing receives on the peer
/// while the first round trip runs (in the modes with a progress engine of their own). Once
/// the peer is gone, it fails instead of waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_with_peer_before_close() {
    let ctx = context();
    for mode in MODES {
        let (server, client, sw, _cw) = pair(&ctx, mode).await;
        if mode != ProgressMode::Polling {
            // A polling worker progresses only inside its futures: none runs on the peer here.
            within("a round trip with nothing sent", client.sync_with_peer())
                .await
                .unwrap();
        }
        for round in 0..20u8 {
            let (server, client, _sw, _cw) = pair(&ctx, mode).await;
            let big = pattern(1 << 20, round);
            // The receiver keeps its endpoint until the sender closed (it answers the sync).
            let recv = tokio::spawn(async move {
                let got = server.recv_vec(4).await;
                let _ = server.recv_vec(5).await; // ends with the sender's close
                got
            });
            within("send", client.send(big.clone(), 4)).await.0.unwrap();
            within("sync", client.sync_with_peer()).await.unwrap();
            within("close", client.close()).await.unwrap();
            let got = within("receive", recv).await.unwrap();
            assert_eq!(got.unwrap(), big, "{mode:?}, round {round}");
        }
        server.abort();
        for _ in 0..100 {
            sw.progress(); // a polling worker's abort goes out only as it progresses
        }
        let what = format!("{mode:?}: sync with a closed peer");
        let r = within(&what, client.sync_with_peer()).await;
        assert!(r.is_err(), "{mode:?}: {r:?}");
    }
}
