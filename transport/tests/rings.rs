//! `ucx://` on one host: large host frames through the shared-memory rings (the connection's
//! same-host lane), and what a peer breaking the ring's rules gets.
#![cfg(feature = "ucx")]

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use common::{pair, STEP};
use transport::{frame, listen, Message, ProtocolError};

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) as u8)
        .collect()
}

/// Messages mixing small frames (over UCX) and large ones (through the ring), some larger
/// than half the ring (over UCX whole), from a sender that runs ahead of a slow receiver (the
/// ring fills and the sender waits for room): every byte arrives, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rings_carry_large_frames_in_order() {
    let (server, client) = pair("ucx://127.0.0.1:0").await;
    assert_eq!(
        client.ucx_rings(),
        (true, true),
        "both directions through rings"
    );
    assert_eq!(server.ucx_rings(), (true, true));
    fn large(i: u32) -> usize {
        match i % 5 {
            0 => 65 * 1024 + 1,
            1 => 1 << 20,
            2 => 3 << 20,
            3 => 6 << 20, // with the 3 MiB before it, more than half the ring: over UCX
            _ => 300_000,
        }
    }
    let frames = move |i: u32| {
        vec![
            pattern(i as usize % 100, i),
            pattern(large(i), i),
            i.to_le_bytes().to_vec(),
            pattern(large(i + 1), i + 7),
        ]
    };
    const N: u32 = 60;
    tokio::time::timeout(STEP, async {
        let sender = tokio::spawn(async move {
            for i in 0..N {
                client.send(1, Message::from(frames(i))).await.unwrap();
            }
            client
        });
        for i in 0..N {
            if i % 10 == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let (ch, m) = server.recv().await.unwrap();
            assert_eq!(ch, 1);
            let want = frames(i);
            assert_eq!(m.frames.len(), want.len(), "message {i}");
            for (k, w) in want.iter().enumerate() {
                assert!(m.host(k) == Some(&w[..]), "message {i}, frame {k} differs");
            }
        }
        let client = sender.await.unwrap();
        // And back: the other direction has its own ring.
        let back = pattern(2 << 20, 9);
        server
            .send(2, Message::from(vec![back.clone()]))
            .await
            .unwrap();
        let (ch, m) = client.recv().await.unwrap();
        assert!(ch == 2 && m.host(0) == Some(&back[..]), "the way back");
    })
    .await
    .expect("in time");
}

/// A ring offered by hand, as a raw UCX peer would: `size` bytes, sealed.
struct RawRing {
    fd: OwnedFd,
    size: u64,
}

impl RawRing {
    fn new(size: u64) -> RawRing {
        // SAFETY: plain libc calls on a descriptor made and owned here; results checked.
        let fd = unsafe {
            let raw = libc::memfd_create(c"test-ring".as_ptr(), libc::MFD_ALLOW_SEALING);
            assert!(raw >= 0);
            OwnedFd::from_raw_fd(raw)
        };
        // SAFETY: as above.
        unsafe {
            assert_eq!(
                libc::ftruncate(fd.as_raw_fd(), (4096 + size) as libc::off_t),
                0
            );
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
            assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
        }
        RawRing { fd, size }
    }

    fn offer(&self) -> Vec<u8> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat fills the buffer on success (asserted).
        let st = unsafe {
            assert_eq!(libc::fstat(self.fd.as_raw_fd(), st.as_mut_ptr()), 0);
            st.assume_init()
        };
        let mut v = vec![1u8];
        v.extend_from_slice(&std::process::id().to_le_bytes());
        v.extend_from_slice(&self.fd.as_raw_fd().to_le_bytes());
        v.extend_from_slice(&st.st_ino.to_le_bytes());
        v.extend_from_slice(&st.st_dev.to_le_bytes());
        v.extend_from_slice(&self.size.to_le_bytes());
        v
    }
}

/// Connects a raw UCX peer that offers `offer` and takes no ring; returns the server's
/// connection, the raw endpoint and the server's verdict on the offer.
async fn raw_with_offer(offer: Vec<u8>) -> (transport::Connection, ucx::Endpoint, u8) {
    let mut l = listen(&"ucx://127.0.0.1:0".parse().unwrap()).await.unwrap();
    let transport::Address::Ucx { port, .. } = l.local_addr().clone() else {
        unreachable!()
    };
    let ctx = ucx::Context::new().unwrap();
    let worker = ucx::Worker::new(&ctx, ucx::ProgressMode::Thread).unwrap();
    let (server, (raw, verdict)) = tokio::join!(l.accept(), async {
        let raw = ucx::Endpoint::connect(&worker, ("127.0.0.1", port))
            .await
            .unwrap();
        let (r, _) = raw.send(offer, transport::UCX_RING_OFFER_TAG).await;
        r.unwrap();
        raw.recv_vec(transport::UCX_RING_OFFER_TAG).await.unwrap();
        let (r, _) = raw.send(vec![0u8], transport::UCX_RING_VERDICT_TAG).await;
        r.unwrap();
        let verdict = raw.recv_vec(transport::UCX_RING_VERDICT_TAG).await.unwrap();
        (raw, verdict)
    });
    (server.unwrap(), raw, verdict[0])
}

/// A plan that puts a frame outside the ring, or names the wrong number of offsets: the
/// connection is refused, typed; nothing outside the ring is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_plan_is_refused() {
    const RING: u64 = 1 << 20;
    let size = 100_000u64;
    let header = frame::encode(0, &[frame::FrameMeta { size, cuda: false }]);
    for (what, plan) in [
        ("past the end", (RING - 10).to_le_bytes().to_vec()),
        ("far past the end", u64::MAX.to_le_bytes().to_vec()),
        (
            "two offsets for one frame",
            [0u64.to_le_bytes(), 0u64.to_le_bytes()].concat(),
        ),
    ] {
        let ring = RawRing::new(RING);
        let (server, raw, verdict) = raw_with_offer(ring.offer()).await;
        assert_eq!(verdict, 1, "{what}: the ring is taken");
        assert_eq!(server.ucx_rings(), (false, true), "{what}");
        let (r, _) = raw.send(header.clone(), transport::UCX_TAG).await;
        r.unwrap();
        let (r, _) = raw.send(plan, transport::UCX_TAG).await;
        r.unwrap();
        let got = tokio::time::timeout(STEP, server.recv())
            .await
            .expect("in time");
        match (what, got) {
            (
                "two offsets for one frame",
                Err(transport::Error::Protocol(ProtocolError::RingPlanSize { got: 16, want: 8 })),
            ) => {}
            (_, Err(transport::Error::Protocol(ProtocolError::RingPlan { len, size: s, .. })))
                if len == size && s == RING => {}
            (_, other) => panic!("{what}: {:?}", other.map(|(c, m)| (c, m.len()))),
        }
    }
}

/// A good plan from a raw peer: the frame is read where it says, and the count of frames
/// copied out reaches the peer's control page. A ring larger than the server's own is
/// declined (the message then travels over UCX).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_peer_speaks_the_ring() {
    const RING: u64 = 1 << 20;
    let ring = RawRing::new(RING);
    let (server, raw, verdict) = raw_with_offer(ring.offer()).await;
    assert_eq!(verdict, 1);
    let body = pattern(200_000, 3);
    // SAFETY: maps the ring's file read-write (4096 bytes of control, then the ring); the
    // mapping is unmapped below, and nothing else writes where this test does.
    let map = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            (4096 + RING) as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            ring.fd.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        p.cast::<u8>()
    };
    let at = 4096u64;
    // SAFETY: inside the mapping (at + body ≤ RING).
    unsafe {
        std::ptr::copy_nonoverlapping(body.as_ptr(), map.add(4096 + at as usize), body.len())
    };
    let header = frame::encode(
        5,
        &[
            frame::FrameMeta {
                size: 3,
                cuda: false,
            },
            frame::FrameMeta {
                size: body.len() as u64,
                cuda: false,
            },
        ],
    );
    for bytes in [header, at.to_le_bytes().to_vec(), b"abc".to_vec()] {
        let (r, _) = raw.send(bytes, transport::UCX_TAG).await;
        r.unwrap();
    }
    let (ch, m) = tokio::time::timeout(STEP, server.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((ch, m.host(0)), (5, Some(&b"abc"[..])));
    assert!(m.host(1) == Some(&body[..]));
    // SAFETY: the control word, at the mapping's start, aligned; written by the server.
    let count = unsafe {
        (*(map as *const std::sync::atomic::AtomicU64)).load(std::sync::atomic::Ordering::Acquire)
    };
    assert_eq!(count, 1, "one frame counted copied out");
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(map.cast(), (4096 + RING) as usize) };

    let big = RawRing::new(transport::DEFAULT_SAME_HOST_RING * 2);
    let (server, raw, verdict) = raw_with_offer(big.offer()).await;
    assert_eq!(
        verdict, 0,
        "a ring larger than the server's own is declined"
    );
    assert_eq!(server.ucx_rings(), (false, false));
    let header = frame::encode(
        0,
        &[frame::FrameMeta {
            size: body.len() as u64,
            cuda: false,
        }],
    );
    let (r, _) = raw.send(header, transport::UCX_TAG).await;
    r.unwrap();
    let ((r, _), got) = tokio::time::timeout(STEP, async {
        tokio::join!(raw.send(body.clone(), transport::UCX_TAG), server.recv())
    })
    .await
    .expect("in time");
    r.unwrap();
    let (_, m) = got.unwrap();
    assert!(m.host(0) == Some(&body[..]), "over UCX, whole");
}

/// Between two processes: a `transport-echo` server takes this process's ring and offers its
/// own (`pidfd_getfd` across processes), echoes large frames through them, and when it is
/// killed mid-conversation the receive waiting for its next message fails, typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rings_between_processes_and_a_killed_peer() {
    let (mut server, addr) =
        common::EchoProcess::start(env!("CARGO_BIN_EXE_transport-echo"), "ucx");
    let conn = transport::connect(&addr).await.expect("connects");
    assert_eq!(
        conn.ucx_rings(),
        (true, true),
        "rings both ways across processes"
    );
    tokio::time::timeout(STEP, async {
        for i in 0..20u32 {
            let body = pattern((3 << 20) + i as usize * 4097, i);
            conn.send(2, Message::from(vec![body.clone()]))
                .await
                .unwrap();
            let (ch, back) = conn.recv().await.unwrap();
            assert!(
                ch == 2 && back.host(0) == Some(&body[..]),
                "echo {i} differs"
            );
        }
    })
    .await
    .expect("in time");
    conn.send(2, Message::from(vec![pattern(5 << 20, 99)]))
        .await
        .unwrap();
    server.0.kill().expect("kill");
    let _ = server.0.wait();
    let outcome = tokio::time::timeout(STEP, async {
        // The echo of what was sent may have come back before the kill; the next receive
        // ends with the peer's death.
        loop {
            match conn.recv().await {
                Ok(_) => continue,
                Err(e) => return e,
            }
        }
    })
    .await
    .expect("the receive ends");
    assert!(outcome.close_reason().is_some(), "{outcome}");
}
