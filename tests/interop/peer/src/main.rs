//! `ucxx-peer`: the Rust side of the UCXX interop tests (`tests/interop/ucxx_peer.py` is the
//! Python side, on the real UCXX package). Both run the same script; see that file.
//!
//! ```text
//! ucxx-peer server [--closer client|server] [--steps a,b,...] [--memory host|cuda]   # prints LISTENING <port>
//! ucxx-peer client --port P [--closer ...] [--steps ...] [--memory host|cuda]
//! ucxx-peer bench-server --bytes N --iters K [--mode M]   # the server side of UCXX's send_recv benchmark
//! ```
//! `bench-server` answers UCXX's `python -m ucxx.benchmarks.send_recv --client-only` (TAG API,
//! one buffer): `K` times receive `N` bytes with no tag and send them back, then close.
//! Exit status 0 when every step checked out; prints `OK <step>` per step.
//!
//! `--memory cuda` (built with `--features cuda`, on a GPU): the tagless arrays are sent from and
//! received into device memory (`DeviceBuffer`s on GPU 0), as the Python side does with CuPy.

use std::io::Write;
use std::time::Duration;

use ucx::{Context, Endpoint, Error, Listener, ProgressMode, Tag, Worker};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SIZES: [usize; 4] = [1, 1000, 65536, 16 << 20];
/// As in the Python script (-2 is left out: Python hashes -1 and -2 alike).
const TAGS: [i128; 8] = [
    0,
    1,
    12345,
    -1,
    -123456789,
    (1 << 61) - 2,
    (1 << 63) + 5,
    -(1 << 70),
];
const FORCED: u64 = 0xC0FFEE;
const MULTI: [usize; 3] = [1, 3, 150];
const AM_SIZES: [usize; 2] = [100, 1 << 20];
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
const FLOATS: usize = 4099;

struct Args {
    role: String,
    port: u16,
    bytes: usize,
    iters: usize,
    mode: ProgressMode,
    closer: String,
    steps: Vec<String>,
    cuda: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: ucxx-peer server|client [--port P] [--closer client|server] [--steps tagless,tags,forced,obj,multi,am] [--memory host|cuda]\n\
         \x20      ucxx-peer bench-server [--port P] --bytes N --iters K [--mode polling|blocking|thread]"
    );
    std::process::exit(2)
}

fn parse() -> Args {
    let mut it = std::env::args().skip(1);
    let role = it.next().unwrap_or_else(|| usage());
    if !["server", "client", "bench-server"].contains(&role.as_str()) {
        usage();
    }
    let mut a = Args {
        role,
        port: 0,
        bytes: 8,
        iters: 1000,
        mode: ProgressMode::Blocking,
        closer: "client".into(),
        steps: "tagless,tags,forced,obj,multi,am"
            .split(',')
            .map(String::from)
            .collect(),
        cuda: false,
    };
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--port" => a.port = val().parse().unwrap_or_else(|_| usage()),
            "--bytes" => a.bytes = val().parse().unwrap_or_else(|_| usage()),
            "--iters" => a.iters = val().parse().unwrap_or_else(|_| usage()),
            "--mode" => a.mode = val().parse().unwrap_or_else(|_| usage()),
            "--closer" => a.closer = val(),
            "--memory" => {
                a.cuda = match val().as_str() {
                    "host" => false,
                    "cuda" => true,
                    _ => usage(),
                }
            }
            "--steps" => {
                a.steps = val()
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            }
            _ => usage(),
        }
    }
    a
}

/// The Python script's `data(n, seed)`.
fn data(n: usize, seed: u64) -> Vec<u8> {
    (0..n as u64)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed)) % 251) as u8)
        .collect()
}

fn wire(t: i128) -> u64 {
    t as u64
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), BoxError> {
    if ok {
        Ok(())
    } else {
        Err(what().into())
    }
}

async fn initiator(ep: &Endpoint, steps: &[String], gpu: &Gpu) -> Result<(), BoxError> {
    let has = |s: &str| steps.iter().any(|x| x == s);
    if has("tagless") && gpu.is_some() {
        device::initiator_tagless(ep, gpu).await?;
        println!("OK tagless (device memory)");
    } else if has("tagless") {
        for (i, &n) in SIZES.iter().enumerate() {
            let out = data(n, i as u64);
            let ((s, out), (r, back)) = futures::join!(
                ep.send(out, Tag::Default),
                ep.recv(Vec::with_capacity(n), Tag::Default)
            );
            s?;
            r?;
            check(back == out, || format!("tagless {n} B differs"))?;
        }
        let floats: Vec<u8> = (0..FLOATS)
            .flat_map(|i| (i as f64 * 1.5 - 7.25).to_ne_bytes())
            .collect();
        let ((s, out), (r, back)) = futures::join!(
            ep.send(floats, Tag::Default),
            ep.recv(Vec::with_capacity(FLOATS * 8), Tag::Default)
        );
        s?;
        r?;
        check(back == out, || "float64 differs".into())?;
        println!("OK tagless");
    }
    if has("tags") {
        for &t in TAGS.iter().rev() {
            let (r, _) = ep.send(wire(t).to_ne_bytes().to_vec(), Tag::User(t)).await;
            r?;
        }
        for &t in &TAGS {
            let (r, back) = ep.recv(Vec::with_capacity(8), Tag::User(t)).await;
            check(r? == 8, || format!("tag {t}: short"))?;
            let got = u64::from_ne_bytes(back[..8].try_into().expect("8 bytes"));
            check(got == wire(t) ^ 0xFF, || format!("tag {t}: got {got}"))?;
        }
        println!("OK tags");
    }
    if has("forced") {
        let out = data(4096, 7);
        let ((s, out), (r, back)) = futures::join!(
            ep.send(out, Tag::Forced(FORCED)),
            ep.recv(Vec::with_capacity(4096), Tag::Forced(FORCED + 1))
        );
        s?;
        r?;
        check(back == out, || "forced tag echo differs".into())?;
        println!("OK forced");
    }
    if has("obj") {
        let out = data(100_000, 3);
        let ((s, out), back) =
            futures::join!(ep.send_obj(out, Tag::Default), ep.recv_obj(Tag::Default));
        s?;
        check(back? == out, || "obj differs".into())?;
        println!("OK obj");
    }
    if has("multi") {
        for k in MULTI {
            let frames: Vec<Vec<u8>> = (0..k).map(|j| data(17 * j + 1, j as u64)).collect();
            let ((s, frames), back) = futures::join!(
                ep.send_multi(frames, Tag::Default),
                ep.recv_multi(Tag::Default)
            );
            s?;
            check(back? == frames, || format!("multi {k} differs"))?;
        }
        println!("OK multi");
    }
    if has("am") {
        for n in AM_SIZES {
            let out = data(n, 11);
            let ((s, out), back) = futures::join!(ep.am_send(out), ep.am_recv());
            s?;
            check(back? == out, || format!("am {n} differs"))?;
        }
        println!("OK am");
    }
    Ok(())
}

async fn responder(ep: &Endpoint, steps: &[String], gpu: &Gpu) -> Result<(), BoxError> {
    let has = |s: &str| steps.iter().any(|x| x == s);
    if has("tagless") && gpu.is_some() {
        device::responder_tagless(ep, gpu).await?;
        println!("OK tagless (device memory)");
    } else if has("tagless") {
        for n in SIZES.into_iter().chain([FLOATS * 8]) {
            let (r, buf) = ep.recv(Vec::with_capacity(n), Tag::Default).await;
            check(r? == n, || format!("tagless: expected {n} bytes"))?;
            let (s, _) = ep.send(buf, Tag::Default).await;
            s?;
        }
        println!("OK tagless");
    }
    if has("tags") {
        for &t in &TAGS {
            let (r, buf) = ep.recv(Vec::with_capacity(8), Tag::User(t)).await;
            check(r? == 8, || format!("tag {t}: short"))?;
            let got = u64::from_ne_bytes(buf[..8].try_into().expect("8 bytes"));
            check(got == wire(t), || format!("tag {t}: got {got}"))?;
            let (s, _) = ep
                .send((got ^ 0xFF).to_ne_bytes().to_vec(), Tag::User(t))
                .await;
            s?;
        }
        println!("OK tags");
    }
    if has("forced") {
        let (r, buf) = ep.recv(Vec::with_capacity(4096), Tag::Forced(FORCED)).await;
        r?;
        let (s, _) = ep.send(buf, Tag::Forced(FORCED + 1)).await;
        s?;
        println!("OK forced");
    }
    if has("obj") {
        let obj = ep.recv_obj(Tag::Default).await?;
        let (s, _) = ep.send_obj(obj, Tag::Default).await;
        s?;
        println!("OK obj");
    }
    if has("multi") {
        for k in MULTI {
            let frames = ep.recv_multi(Tag::Default).await?;
            check(frames.len() == k, || {
                format!("multi: {} frames, expected {k}", frames.len())
            })?;
            let (s, _) = ep.send_multi(frames, Tag::Default).await;
            s?;
        }
        println!("OK multi");
    }
    if has("am") {
        for _ in AM_SIZES {
            let msg = ep.am_recv().await?;
            let (s, _) = ep.am_send(msg).await;
            s?;
        }
        println!("OK am");
    }
    Ok(())
}

/// The closer closes; the other side's pending receive must fail.
async fn finish(ep: &Endpoint, closer: &str, me: &str) -> Result<(), BoxError> {
    if closer == me {
        tokio::time::sleep(Duration::from_millis(500)).await;
        ep.close().await?;
        println!("OK close (closed)");
        return Ok(());
    }
    match tokio::time::timeout(STEP_TIMEOUT, ep.recv(Vec::with_capacity(8), Tag::Default)).await {
        Err(_) => Err("pending receive still waiting after the peer closed".into()),
        Ok((Ok(n), _)) => {
            Err(format!("pending receive completed ({n} bytes) after the peer closed").into())
        }
        Ok((Err(e), _)) => {
            println!("OK close (pending receive failed: {e})");
            Ok(())
        }
    }
}

async fn run(a: Args) -> Result<(), BoxError> {
    let ctx = Context::new()?;
    // After the UCX context, once, kept for the whole run.
    let gpu = device::open(a.cuda)?;
    let worker = Worker::new(&ctx, a.mode)?;
    let limit = STEP_TIMEOUT * 5;
    if a.role == "bench-server" {
        let mut listener = Listener::bind(&worker, format!("127.0.0.1:{}", a.port).parse()?)?;
        println!("LISTENING {}", listener.port());
        std::io::stdout().flush()?;
        let ep = tokio::time::timeout(limit, listener.accept())
            .await
            .map_err(|_| "no client")??;
        let mut buf = Vec::with_capacity(a.bytes);
        for _ in 0..a.iters {
            let (r, b) = ep.recv(buf, Tag::Default).await;
            check(r? == a.bytes, || format!("expected {} bytes", a.bytes))?;
            let (s, b) = ep.send(b, Tag::Default).await;
            s?;
            buf = b;
        }
        // The client closes when it is done; wait for that, as UCXX's server does.
        let _ =
            tokio::time::timeout(Duration::from_secs(10), ep.recv(Vec::new(), Tag::Default)).await;
    } else if a.role == "server" {
        let mut listener = Listener::bind(&worker, "127.0.0.1:0".parse()?)?;
        println!("LISTENING {}", listener.port());
        std::io::stdout().flush()?;
        // The first connection that completes the handshake (bad handshakes are rejected and
        // logged by the listener, which keeps serving).
        let accept = async {
            loop {
                match listener.accept().await {
                    Ok(ep) => return ep,
                    Err(e) => eprintln!("rejected a connection: {e}"),
                }
            }
        };
        let ep = tokio::time::timeout(limit, accept)
            .await
            .map_err(|_| "no client")?;
        tokio::time::timeout(limit, responder(&ep, &a.steps, &gpu))
            .await
            .map_err(|_| Error::Timeout(limit))??;
        finish(&ep, &a.closer, "server").await?;
    } else {
        let ep = Endpoint::connect(&worker, ("127.0.0.1", a.port)).await?;
        tokio::time::timeout(limit, initiator(&ep, &a.steps, &gpu))
            .await
            .map_err(|_| Error::Timeout(limit))??;
        finish(&ep, &a.closer, "client").await?;
    }
    Ok(())
}

fn main() {
    ucx_stack::cli::init_tracing();
    let a = parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(run(a)) {
        Ok(()) => println!("DONE"),
        Err(e) => {
            println!("FAIL {e}");
            std::process::exit(1);
        }
    }
}

/// GPU 0's context and stream under `--memory cuda`, else nothing.
#[cfg(feature = "cuda")]
type Gpu = Option<(
    std::sync::Arc<ucx::cuda::cudarc::driver::CudaContext>,
    std::sync::Arc<ucx::cuda::cudarc::driver::CudaStream>,
)>;
#[cfg(not(feature = "cuda"))]
type Gpu = Option<std::convert::Infallible>;

/// The tagless step with device buffers on our side (the Python side uses CuPy arrays).
#[cfg(feature = "cuda")]
mod device {
    use super::*;
    use ucx::cuda::DeviceBuffer;

    pub fn open(cuda: bool) -> Result<Gpu, BoxError> {
        if !cuda {
            return Ok(None);
        }
        let ctx = ucx::cuda::open(0)?;
        let stream = ctx.default_stream();
        Ok(Some((ctx, stream)))
    }

    fn stream(gpu: &Gpu) -> &std::sync::Arc<ucx::cuda::cudarc::driver::CudaStream> {
        &gpu.as_ref().expect("called with a GPU").1
    }

    pub async fn initiator_tagless(ep: &Endpoint, gpu: &Gpu) -> Result<(), BoxError> {
        let floats: Vec<u8> = (0..FLOATS)
            .flat_map(|i| (i as f64 * 1.5 - 7.25).to_ne_bytes())
            .collect();
        let arrays = SIZES
            .iter()
            .enumerate()
            .map(|(i, &n)| data(n, i as u64))
            .chain([floats]);
        for out in arrays {
            let n = out.len();
            let dev = DeviceBuffer::from_host(stream(gpu), &out)?;
            let back = DeviceBuffer::alloc(stream(gpu), n)?;
            let ((s, _), (r, back)) =
                futures::join!(ep.send(dev, Tag::Default), ep.recv(back, Tag::Default));
            s?;
            r?;
            check(back.to_host()? == out, || {
                format!("tagless {n} B differs (device)")
            })?;
        }
        Ok(())
    }

    pub async fn responder_tagless(ep: &Endpoint, gpu: &Gpu) -> Result<(), BoxError> {
        for n in SIZES.into_iter().chain([FLOATS * 8]) {
            let (r, buf) = ep
                .recv(DeviceBuffer::alloc(stream(gpu), n)?, Tag::Default)
                .await;
            check(r? == n, || format!("tagless: expected {n} bytes (device)"))?;
            let (s, _) = ep.send(buf, Tag::Default).await;
            s?;
        }
        Ok(())
    }
}

#[cfg(not(feature = "cuda"))]
mod device {
    use super::*;

    pub fn open(cuda: bool) -> Result<Gpu, BoxError> {
        if cuda {
            return Err("--memory cuda needs a build with --features cuda".into());
        }
        Ok(None)
    }

    // Never called: `open` returns no GPU in builds without the feature.
    pub async fn initiator_tagless(_: &Endpoint, _: &Gpu) -> Result<(), BoxError> {
        Err("device memory needs a build with --features cuda".into())
    }

    pub async fn responder_tagless(_: &Endpoint, _: &Gpu) -> Result<(), BoxError> {
        Err("device memory needs a build with --features cuda".into())
    }
}
