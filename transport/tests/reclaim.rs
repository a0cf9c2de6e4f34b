//! `Options::reclaimable_frames`: received host frames that `transport::writable` hands back
//! as the caller's own memory without a copy, on every backend that receives into buffers of
//! its own, whatever lane carried the frame (eager, a same-host ring, a rendezvous).

mod common;

use bytes::Bytes;
use common::pair_with;
use transport::{Frame, Message, Options};

fn sizes() -> Vec<usize> {
    // Small (eager), over 65 KiB (a ring on ucx://), 9 MiB (past half the ring: rendezvous).
    vec![0, 100, 70_000, 1 << 20, 9 << 20]
}

fn host(f: Frame) -> Bytes {
    match f {
        Frame::Host(b) => b,
        other => panic!("a host frame expected, got {other:?}"),
    }
}

async fn received(addr: &str, reclaimable: bool) -> Vec<Bytes> {
    let opts = Options {
        reclaimable_frames: reclaimable,
        ..Default::default()
    };
    let (server, client) = pair_with(addr, &opts).await;
    let frames: Vec<Vec<u8>> = sizes().iter().map(|&n| vec![(n % 251) as u8; n]).collect();
    // Concurrently: the message is larger than the credit window and the socket buffers.
    let (sent, got) = tokio::join!(client.send(0, Message::from(frames)), server.recv());
    sent.unwrap();
    let (_, msg) = got.unwrap();
    client.close().await.unwrap();
    msg.frames.into_iter().map(host).collect()
}

async fn check(addr: &str) {
    for (b, n) in received(addr, true).await.into_iter().zip(sizes()) {
        let at = b.as_ptr();
        let mut mine = transport::writable(b).unwrap();
        assert_eq!(mine.len(), n, "{addr}");
        assert!(
            mine.iter().all(|&x| x == (n % 251) as u8),
            "{addr}: {n} bytes"
        );
        if n > 0 {
            assert_eq!(mine.as_ptr(), at, "{addr}: the {n}-byte frame was copied");
            mine[0] = mine[0].wrapping_add(1);
        }
        transport::recycle_buffer(mine.into());
    }
    // Without the option a pooled frame (64 KiB and more) goes back to the pool by itself,
    // and `writable` copies it.
    for (b, n) in received(addr, false).await.into_iter().zip(sizes()) {
        if n >= 64 << 10 {
            let at = b.as_ptr();
            let mine = transport::writable(b).unwrap();
            assert_ne!(
                mine.as_ptr(),
                at,
                "{addr}: a pooled {n}-byte frame, not copied"
            );
            assert_eq!(mine.len(), n);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_frames_are_reclaimed_without_a_copy() {
    check("tcp://127.0.0.1:0").await;
}

#[cfg(feature = "ucx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ucx_frames_are_reclaimed_without_a_copy() {
    check("ucx://127.0.0.1:0").await;
}
