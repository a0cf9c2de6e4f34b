//! Device (CUDA) frames over every backend (feature `cuda`).
//!
//! Runs everywhere: a frame the peer marks as device memory lands in device memory where a GPU
//! can be used and in host memory where not, with the same bytes either way. On a GPU machine
//! also: device frames sent from device memory arrive in device memory, byte for byte, over
//! inproc://, tcp:// and ucx:// (UCX's device path, or staging where UCX has no CUDA).
#![cfg(feature = "cuda")]

mod common;

use common::{pair, STEP};
use tokio::io::AsyncWriteExt;
use transport::frame::{encode, FrameMeta};
use transport::{listen, Frame, Message};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// A header announcing `sizes` as device frames (and one host frame first), then the bytes.
fn device_message(sizes: &[usize]) -> (Vec<u8>, Vec<Vec<u8>>) {
    let frames: Vec<Vec<u8>> = std::iter::once(b"meta".to_vec())
        .chain(sizes.iter().enumerate().map(|(i, &n)| pattern(n, i as u8)))
        .collect();
    let metas: Vec<FrameMeta> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| FrameMeta {
            size: f.len() as u64,
            cuda: i > 0,
        })
        .collect();
    (encode(5, &metas), frames)
}

fn check_landed(msg: &Message, frames: &[Vec<u8>], what: &str) {
    let gpu = ucx::cuda::gpu_available();
    assert_eq!(msg.frames.len(), frames.len(), "{what}");
    assert!(!msg.frames[0].is_cuda(), "{what}: the host frame");
    for (i, f) in msg.frames.iter().enumerate().skip(1) {
        assert_eq!(f.is_cuda(), gpu, "{what}: frame {i} (GPU present: {gpu})");
    }
    assert_eq!(msg.to_host().unwrap(), frames, "{what}: bytes");
}

/// A raw TCP peer announcing device frames: they land on the GPU, or in host memory without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_device_frames_land_where_they_can() {
    let mut l = listen(&"tcp://127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (server, mut raw) = common::raw_tcp(&mut l).await;
    let (header, frames) = device_message(&[0, 10, 200_000]);
    raw.write_all(&header).await.unwrap();
    for f in &frames {
        raw.write_all(f).await.unwrap();
    }
    let (channel, msg) = tokio::time::timeout(STEP, server.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(channel, 5);
    check_landed(&msg, &frames, "tcp");
}

/// The same over UCX from a raw `ucx-rs` peer, inlined (one UCX message) and framed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ucx_device_frames_land_where_they_can() {
    let mut l = listen(&"ucx://127.0.0.1:0".parse().unwrap()).await.unwrap();
    let ctx = ucx::Context::new().unwrap();
    let worker = ucx::Worker::new(&ctx, ucx::ProgressMode::Thread).unwrap();
    let (server, raw) = common::raw_ucx(&mut l, &worker).await;
    // Inlined: header and bytes in one UCX message.
    let (header, frames) = device_message(&[3, 100]);
    let mut one = header;
    one.extend(frames.concat());
    let (sent, got) = tokio::join!(raw.send(one, transport::UCX_TAG), server.recv());
    sent.0.unwrap();
    check_landed(&got.unwrap().1, &frames, "ucx inline");
    // Framed: the header, then one UCX message per frame.
    let (header, frames) = device_message(&[1 << 20, 0, 70_000]);
    let send = async {
        raw.send(header, transport::UCX_TAG).await.0?;
        for f in frames.clone() {
            raw.send(f, transport::UCX_TAG).await.0?;
        }
        Ok::<_, ucx::Error>(())
    };
    let (sent, got) = tokio::time::timeout(STEP, async { tokio::join!(send, server.recv()) })
        .await
        .unwrap();
    sent.unwrap();
    check_landed(&got.unwrap().1, &frames, "ucx framed");
}

/// Frames sent from device memory arrive in device memory with the same bytes (GPU only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_frames_round_trip_on_a_gpu() {
    let gpu = match ucx::cuda::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            test_support::skip_without_gpu(
                "device_frames::device_frames_round_trip_on_a_gpu",
                &e.to_string(),
            );
            return;
        }
    };
    let stream = gpu.default_stream();
    transport::cuda::land_on(stream.clone());
    for addr in [
        "inproc://device-frames",
        "tcp://127.0.0.1:0",
        "ucx://127.0.0.1:0",
    ] {
        let (server, client) = pair(addr).await;
        for sizes in [vec![1usize], vec![0, 4096, 3 << 20], vec![64 << 20]] {
            let host: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| pattern(n, i as u8 + 1))
                .collect();
            let frames: Vec<Frame> =
                std::iter::once(Frame::from(b"meta".to_vec()))
                    .chain(host.iter().map(|h| {
                        Frame::from(ucx::cuda::DeviceBuffer::from_host(&stream, h).unwrap())
                    }))
                    .collect();
            let msg = Message::from(frames);
            let (sent, got) = tokio::time::timeout(STEP, async {
                tokio::join!(client.send(9, msg), server.recv())
            })
            .await
            .unwrap();
            sent.unwrap();
            let (channel, got) = got.unwrap();
            assert_eq!(channel, 9);
            let expect: Vec<Vec<u8>> = std::iter::once(b"meta".to_vec()).chain(host).collect();
            check_landed(&got, &expect, addr);
        }
        eprintln!("{addr}: device frames round-tripped");
    }
}

/// What an allocator's receive buffers hold: memory of its own "pool" (here a device buffer).
struct Pooled(#[allow(dead_code)] ucx::cuda::DeviceBuffer);

/// The frame size the allocator below answers with a buffer too small (no other test sends it).
const TOO_SMALL: usize = 12_345;

/// With an allocator given (`transport::cuda::allocate_with`: RMM's, in the Python package),
/// device frames are received into its buffers, which the received frames hold; an allocator
/// that answers with too little memory ends the connection, saying why (GPU only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocator_makes_the_receive_buffers_of_device_frames() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use ucx::cuda::{cudarc::driver::CudaStream, DeviceBuffer};

    let gpu = match ucx::cuda::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            test_support::skip_without_gpu(
                "device_frames::an_allocator_makes_the_receive_buffers_of_device_frames",
                &e.to_string(),
            );
            return;
        }
    };
    let stream = gpu.default_stream();
    static MADE: AtomicUsize = AtomicUsize::new(0);
    let previous =
        transport::cuda::allocate_with(Some(Arc::new(|stream: &Arc<CudaStream>, size: usize| {
            MADE.fetch_add(1, Ordering::Relaxed);
            let have = if size == TOO_SMALL { size - 1 } else { size };
            let pool = DeviceBuffer::alloc(stream, have)?;
            let ptr = pool.device_ptr();
            // SAFETY: `pool` is device memory of `stream`'s context, `have` writable bytes,
            // owned by the buffer made here and used by nothing else.
            Ok(
                unsafe {
                    DeviceBuffer::lent_for_receive(stream, ptr, have, Box::new(Pooled(pool)))
                },
            )
        })));
    assert!(previous.is_none());
    for addr in ["tcp://127.0.0.1:0", "ucx://127.0.0.1:0"] {
        let (server, client) = pair(addr).await;
        let host = vec![pattern(10, 1), pattern(3 << 20, 2)];
        let before = MADE.load(Ordering::Relaxed);
        let frames: Vec<Frame> = host
            .iter()
            .map(|h| Frame::from(DeviceBuffer::from_host(&stream, h).unwrap()))
            .collect();
        let (sent, got) = tokio::time::timeout(STEP, async {
            tokio::join!(client.send(1, Message::from(frames)), server.recv())
        })
        .await
        .unwrap();
        sent.unwrap();
        let (_, got) = got.unwrap();
        assert_eq!(got.to_host().unwrap(), host, "{addr}: bytes");
        for f in &got.frames {
            let Frame::Cuda(d) = f else {
                panic!("{addr}: a host frame")
            };
            assert!(
                d.owner()
                    .is_some_and(|o| o.downcast_ref::<Pooled>().is_some()),
                "{addr}: not the allocator's buffer: {d:?}"
            );
        }
        assert!(
            MADE.load(Ordering::Relaxed) >= before + 2,
            "{addr}: the allocator was not asked"
        );
        // Too little memory: the connection ends, with the allocator's answer as the reason.
        let small = Frame::from(DeviceBuffer::from_host(&stream, &pattern(TOO_SMALL, 3)).unwrap());
        let _ = client.send(2, Message::from(vec![small])).await;
        let err = tokio::time::timeout(STEP, server.recv())
            .await
            .unwrap()
            .expect_err("a frame without room must end the connection");
        let why = err.to_string();
        assert!(why.contains("allocator gave"), "{addr}: {why}");
        eprintln!("{addr}: device frames in the allocator's buffers; too small: {why}");
    }
    transport::cuda::allocate_with(None);
}
