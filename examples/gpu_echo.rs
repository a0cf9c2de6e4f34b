//! GPU echo: UCX-Py's "Send/Recv with CuPy" demo in Rust. The client sends device buffers; the
//! server receives each into device memory, increments every byte with a CUDA kernel, and sends
//! it back; the client checks every byte. Server and client run in one process (two workers),
//! as in the host `echo` example; the bytes move GPU to GPU through UCX (zero-copy where the
//! loaded UCX has CUDA transports, staged through pinned host memory where not).
//!
//! ```text
//! cargo run --release --features cuda --example gpu_echo
//! ```
//!
//! Without a CUDA driver or GPU it prints why and exits successfully.

use std::sync::Arc;

use ucx::cuda::cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use ucx::cuda::cudarc::nvrtc::Ptx;
use ucx::cuda::{self, DeviceBuffer};
use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};

/// The sizes both sides agree on, as in the Python demo (`n_bytes`).
const SIZES: [usize; 5] = [1, 1000, 100_000, 1 << 20, 16 << 20];
const TAG: u64 = 3;

/// `increment(p, n)`: `p[i] += 1` for `i < n`, one thread per byte. Hand-written PTX, so
/// neither NVRTC nor nvcc is needed; the driver compiles it for the GPU at load time.
const INCREMENT_PTX: &str = r#"
.version 7.0
.target sm_50
.address_size 64

.visible .entry increment(.param .u64 p, .param .u64 n)
{
    .reg .pred %done;
    .reg .b16 %byte<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd0, [p];
    ld.param.u64 %rd1, [n];
    mov.u32 %r0, %ctaid.x;
    mov.u32 %r1, %ntid.x;
    mov.u32 %r2, %tid.x;
    mad.lo.u32 %r3, %r0, %r1, %r2;
    cvt.u64.u32 %rd2, %r3;
    setp.ge.u64 %done, %rd2, %rd1;
    @%done bra EXIT;
    cvta.to.global.u64 %rd3, %rd0;
    add.u64 %rd4, %rd3, %rd2;
    ld.global.u8 %byte0, [%rd4];
    add.u16 %byte1, %byte0, 1;
    st.global.u8 [%rd4], %byte1;
EXIT:
    ret;
}
"#;

/// Adds one to every byte of `buf` on its stream.
fn increment(
    f: &CudaFunction,
    stream: &Arc<CudaStream>,
    buf: &mut DeviceBuffer,
) -> ucx::Result<()> {
    let (ptr, n) = (buf.device_ptr(), buf.len() as u64);
    if n == 0 {
        return Ok(());
    }
    let cfg = LaunchConfig::for_num_elems(buf.len() as u32);
    let mut launch = stream.launch_builder(f);
    launch.arg(&ptr).arg(&n);
    // SAFETY: the kernel takes (u8* p, u64 n) and writes only p[0..n); `ptr` is this buffer's
    // device allocation of at least `n` bytes, which nothing else uses while the stream runs it
    // (UCX touches it only after the stream is synchronised before the next send).
    unsafe { launch.launch(cfg) }
        .map_err(|e| ucx::Error::Cuda(format!("increment kernel: {e}")))?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ucx::Result<()> {
    let ctx = Context::new()?;
    // Open the GPU once, after the UCX context, and keep it for the whole run.
    let gpu = match cuda::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("skipped: {e}");
            return Ok(());
        }
    };
    println!("device path: {:?}", ctx.cuda_support());
    let module = gpu
        .load_module(Ptx::from_src(INCREMENT_PTX))
        .map_err(|e| ucx::Error::Cuda(format!("loading the kernel: {e}")))?;
    let kernel = module
        .load_function("increment")
        .map_err(|e| ucx::Error::Cuda(format!("finding the kernel: {e}")))?;

    let server_worker = Worker::new(&ctx, ProgressMode::Polling)?;
    let client_worker = Worker::new(&ctx, ProgressMode::Polling)?;
    let mut listener = Listener::bind(&server_worker, "127.0.0.1:0".parse().unwrap())?;
    let port = listener.port();

    let server_stream = gpu
        .new_stream()
        .map_err(|e| ucx::Error::Cuda(e.to_string()))?;
    let server = async move {
        let ep = listener.accept().await?;
        for size in SIZES {
            // Receive into device memory, increment on the GPU, send back.
            let (n, mut buf) = ep
                .recv(DeviceBuffer::alloc(&server_stream, size)?, TAG)
                .await;
            if n? != size {
                return Err(ucx::Error::InvalidArgument(format!(
                    "expected {size} bytes"
                )));
            }
            increment(&kernel, &server_stream, &mut buf)?;
            let (r, _) = ep.send(buf, TAG).await;
            r?;
        }
        Ok::<_, ucx::Error>(ep)
    };

    let client_stream = gpu.default_stream();
    let client = async {
        let ep = Endpoint::connect(&client_worker, ("127.0.0.1", port)).await?;
        for size in SIZES {
            let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let t0 = std::time::Instant::now();
            let (r, _) = ep
                .send(DeviceBuffer::from_host(&client_stream, &data)?, TAG)
                .await;
            r?;
            let (n, back) = ep
                .recv(DeviceBuffer::alloc(&client_stream, size)?, TAG)
                .await;
            n?;
            let elapsed = t0.elapsed();
            let back = back.to_host()?;
            let wrong = data
                .iter()
                .zip(&back)
                .filter(|(a, b)| a.wrapping_add(1) != **b)
                .count();
            if back.len() != size || wrong != 0 {
                return Err(ucx::Error::InvalidArgument(format!(
                    "{size} bytes: {wrong} bytes not incremented"
                )));
            }
            println!(
                "{size:>9} bytes: sent, incremented on the GPU, back and checked in {elapsed:?}"
            );
        }
        Ok::<_, ucx::Error>(ep)
    };
    let (server, client) = tokio::join!(server, client);
    client?.close().await?;
    drop(server?);
    Ok(())
}
