//! Device buffers across two real processes: an `ucx-gpu-echo server` child and an
//! `ucx-gpu-echo client` child, every byte of every round trip checked.
//!
//! Without a GPU (CI) the device runs are skipped with the reason printed, and the same two
//! processes echo host memory, so the protocol and the tool are still exercised.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_support::{listening_port, START_LIMIT};

/// The echo binary: `GPU_ECHO_BIN` where the suite runs away from its build (the GPU proof
/// carries both, scripts/gpu/prove.sh), else the one cargo built beside it.
fn bin() -> String {
    std::env::var("GPU_ECHO_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_ucx-gpu-echo").to_string())
}

struct Server(Child, u16);

impl Server {
    fn spawn(memory: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(bin())
            .args([
                "server",
                "--bind",
                "127.0.0.1",
                "--once",
                "--memory",
                memory,
            ])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn ucx-gpu-echo server");
        let port = listening_port(&mut child, START_LIMIT).expect("server port");
        Server(child, port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the client against a fresh server; returns the JSON rows it printed.
fn echo(
    server_mem: &str,
    client_mem: &str,
    sizes: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Vec<String> {
    let server = Server::spawn(server_mem, extra, env);
    let out = Command::new("timeout")
        .args(["300", &bin(), "client", "--connect"])
        .arg(format!("127.0.0.1:{}", server.1))
        .args(["--memory", client_mem, "--sizes", sizes, "--iters", "2"])
        .args(["--check", "--json", "--bw", "--window", "4"])
        .args(extra)
        .envs(env.iter().copied())
        .output()
        .expect("run ucx-gpu-echo client");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{server_mem} server, {client_mem} client: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(server);
    let rows: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(str::to_string)
        .collect();
    assert_eq!(rows.len(), sizes.split(',').count(), "{stdout}");
    for r in &rows {
        assert!(
            r.contains("\"checked\":2"),
            "not every round trip was checked: {r}"
        );
    }
    rows
}

fn gpu(test: &str) -> Option<String> {
    if !ucx::cuda::gpu_available() {
        let why = ucx::cuda::open(0).err().map(|e| e.to_string());
        test_support::skip_without_gpu(
            &format!("cuda::{test}: the device runs"),
            &why.unwrap_or_default(),
        );
        return None;
    }
    Some("present".into())
}

/// The GPU's stream, from one context opened once per process (after UCX's context) and kept.
fn stream() -> std::sync::Arc<ucx::cuda::cudarc::driver::CudaStream> {
    static GPU: std::sync::OnceLock<std::sync::Arc<ucx::cuda::cudarc::driver::CudaContext>> =
        std::sync::OnceLock::new();
    GPU.get_or_init(|| ucx::cuda::open(0).expect("GPU"))
        .default_stream()
}

/// Runs `f` to completion on a current-thread runtime.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Two workers of one process joined by a listener and a client endpoint:
/// (client endpoint, accepted endpoint).
async fn in_process_pair(
    ctx: &ucx::Context,
    mode: ucx::ProgressMode,
) -> (ucx::Endpoint, ucx::Endpoint) {
    let a = ucx::Worker::new(ctx, mode).unwrap();
    let b = ucx::Worker::new(ctx, mode).unwrap();
    let mut l = ucx::Listener::bind(&a, "127.0.0.1:0".parse().unwrap()).unwrap();
    let port = l.port();
    let server = tokio::spawn(async move { l.accept().await });
    let ep = ucx::Endpoint::connect(&b, ("127.0.0.1", port))
        .await
        .unwrap();
    (ep, server.await.unwrap().unwrap())
}

/// Host memory on both sides: runs everywhere, so the tool and protocol are always tested.
#[test]
fn host_echo_across_processes() {
    echo("host", "host", "0,1,8,4096,1000003,4194304", &[], &[]);
}

/// device→device, host→device and device→host, 1 B to 64 MiB, on the path this machine's UCX
/// takes (zero-copy with CUDA transports, staged otherwise) and with staging forced.
#[test]
fn device_echo_across_processes() {
    let Some(name) = gpu("device_echo_across_processes") else {
        return;
    };
    eprintln!("GPU: {name}");
    let sizes = "1,8,4096,65536,1000003,16777216,67108864";
    for extra in [
        &[][..],
        &["--stage-below", "max"][..],
        &["--stage-below", "0"][..],
    ] {
        for (s, c) in [("cuda", "cuda"), ("cuda", "host"), ("host", "cuda")] {
            echo(s, c, sizes, extra, &[]);
        }
    }
}

/// A device receive into a buffer too small for the message fails with a clear error on both
/// paths, and the server stays healthy for the next client.
#[test]
fn device_receive_truncation_is_an_error() {
    if gpu("device_receive_truncation_is_an_error").is_none() {
        return;
    }
    for extra in [&["--stage-below", "max"][..], &["--stage-below", "0"][..]] {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let stage = if extra[1] == "max" { usize::MAX } else { 0 };
            let ctx = ucx::Context::builder()
                .cuda_stage_below(stage)
                .build()
                .unwrap();
            let stream = stream();
            let (ep, peer) = in_process_pair(&ctx, ucx::ProgressMode::Thread).await;
            let (r, _) = ep.send(vec![5u8; 4096], 7).await;
            r.unwrap();
            let small = ucx::cuda::DeviceBuffer::alloc(&stream, 1024).unwrap();
            let (r, _) = peer.recv(small, 7).await;
            assert!(
                matches!(r, Err(ucx::Error::Truncated { buffer: 1024, .. })),
                "{r:?}"
            );
            // The endpoint still works afterwards.
            let data = ucx::cuda::DeviceBuffer::from_host(&stream, &[9u8; 100]).unwrap();
            let (r, _) = ep.send(data, 8).await;
            r.unwrap();
            let (n, got) = peer
                .recv(ucx::cuda::DeviceBuffer::alloc(&stream, 100).unwrap(), 8)
                .await;
            assert_eq!(n.unwrap(), 100);
            assert_eq!(got.to_host().unwrap(), vec![9u8; 100]);
        });
    }
}

/// Active messages from device memory land in device memory with a device allocator.
#[test]
fn device_active_messages() {
    if gpu("device_active_messages").is_none() {
        return;
    }
    block_on(async {
        let ctx = ucx::Context::new().unwrap();
        let stream = stream();
        let (ep, peer) = in_process_pair(&ctx, ucx::ProgressMode::Thread).await;
        peer.worker().set_am_allocator(
            ucx::MemoryType::Cuda,
            std::sync::Arc::new(ucx::cuda::DeviceAllocator::new(&stream)),
        );
        for size in [16usize, 1 << 20, 8 << 20] {
            let data: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
            let dev = ucx::cuda::DeviceBuffer::from_host(&stream, &data).unwrap();
            eprintln!("am {size}: sending");
            let (sent, got) = futures::join!(ep.am_send(dev), peer.am_recv_buf());
            sent.0.unwrap();
            eprintln!("am {size}: received");
            let got = got.unwrap();
            assert_eq!(got.sender_memory, ucx::MemoryType::Cuda);
            assert_eq!(got.buffer.memory_type(), ucx::MemoryType::Cuda, "{size}");
            assert_eq!(got.len, size);
            // Back through a device→host tag message (both posted together: a rendezvous send
            // completes only once the receive is there).
            let ((r, _), (n, back)) =
                futures::join!(peer.send(got.buffer, 3), ep.recv(vec![0u8; size], 3));
            r.unwrap();
            assert_eq!(n.unwrap(), size);
            assert!(
                back == data,
                "{size}-byte active message came back different"
            );
        }
    });
}

/// Two workers of one process exchange device buffers by rendezvous (8 MiB, zero-copy where
/// UCX has CUDA transports), polling mode.
#[test]
fn device_rendezvous_in_one_process_polling() {
    rendezvous_in_one_process(ucx::ProgressMode::Polling);
}

/// As above, with progress threads.
#[test]
fn device_rendezvous_in_one_process_thread() {
    rendezvous_in_one_process(ucx::ProgressMode::Thread);
}

fn rendezvous_in_one_process(mode: ucx::ProgressMode) {
    if gpu("rendezvous_in_one_process").is_none() {
        return;
    }
    block_on(async {
        let ctx = ucx::Context::new().unwrap();
        let stream = stream();
        let (ep, peer) = in_process_pair(&ctx, mode).await;
        let size = 8 << 20;
        let data: Vec<u8> = (0..size).map(|i| (i % 241) as u8).collect();
        let dev = ucx::cuda::DeviceBuffer::from_host(&stream, &data).unwrap();
        let ((s, _), (n, got)) = futures::join!(
            ep.send(dev, 4),
            peer.recv(ucx::cuda::DeviceBuffer::alloc(&stream, size).unwrap(), 4)
        );
        s.unwrap();
        assert_eq!(n.unwrap(), size);
        assert!(got.to_host().unwrap() == data);
    });
}

/// A second lent view of `owned`'s memory, for the checks that it is never written.
fn unsafe_lent_copy(
    stream: &std::sync::Arc<ucx::cuda::cudarc::driver::CudaStream>,
    ptr: u64,
    size: usize,
    owned: &std::sync::Arc<ucx::cuda::DeviceBuffer>,
) -> ucx::cuda::DeviceBuffer {
    // SAFETY: `owned`'s allocation of `size` bytes at `ptr` on `stream`'s device is kept alive
    // by the clone the buffer holds; it is never written through this buffer.
    unsafe {
        ucx::cuda::DeviceBuffer::lent(stream, ptr, size, Box::new(std::sync::Arc::clone(owned)))
    }
}

/// Lent device memory (`DeviceBuffer::lent`: another owner's allocation, as a CuPy array's)
/// travels like owned memory, and its owner is dropped, not the memory freed, once the send
/// has let go of it.
#[test]
fn lent_device_memory_is_sent_and_its_owner_dropped() {
    if gpu("lent_device_memory_is_sent_and_its_owner_dropped").is_none() {
        return;
    }
    block_on(async {
        let ctx = ucx::Context::new().unwrap();
        let stream = stream();
        let (ep, peer) = in_process_pair(&ctx, ucx::ProgressMode::Thread).await;
        for size in [16usize, 1 << 20, 8 << 20] {
            let data: Vec<u8> = (0..size).map(|i| (i % 239) as u8).collect();
            // The "other library's" allocation: an owned buffer, kept by the owner.
            let owned =
                std::sync::Arc::new(ucx::cuda::DeviceBuffer::from_host(&stream, &data).unwrap());
            let (ptr, owner) = (owned.device_ptr(), std::sync::Arc::clone(&owned));
            // SAFETY: `owner` keeps `owned`'s allocation of `size` bytes alive on `stream`'s
            // device; nothing writes it meanwhile.
            let lent =
                unsafe { ucx::cuda::DeviceBuffer::lent(&stream, ptr, size, Box::new(owner)) };
            assert!(lent.is_lent() && lent.len() == size);
            let mut written = unsafe_lent_copy(&stream, ptr, size, &owned);
            assert!(
                written.copy_from_host(&[0u8; 4]).is_err(),
                "a lent buffer is not written"
            );
            assert_eq!(ucx::IoBufMut::bytes_total(&written), 0, "nor received into");
            drop(written);
            let ((s, lent), (n, got)) = futures::join!(
                ep.send(lent, 5),
                peer.recv(ucx::cuda::DeviceBuffer::alloc(&stream, size).unwrap(), 5)
            );
            s.unwrap();
            assert_eq!(n.unwrap(), size);
            assert!(
                got.to_host().unwrap() == data,
                "{size} bytes came back different"
            );
            assert_eq!(
                std::sync::Arc::strong_count(&owned),
                2,
                "the lent buffer holds its owner"
            );
            drop(lent);
            assert_eq!(
                std::sync::Arc::strong_count(&owned),
                1,
                "dropping it drops the owner"
            );
            assert!(
                owned.to_host().unwrap() == data,
                "the owner's memory is untouched"
            );
        }
    });
}
