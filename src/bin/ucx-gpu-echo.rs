//! `ucx-gpu-echo`: echo device (or host) buffers between two processes and measure it.
//!
//! ```text
//! ucx-gpu-echo server [--bind ADDR] [--port P] [--memory cuda|host] [--gpu N] [--mode M] [--once]
//! ucx-gpu-echo client --connect HOST:PORT [--memory cuda|host] [--gpu N] [--sizes 8,1m,64m]
//!                     [--iters N] [--check] [--json] [--mode M] [--bw [--window W]]
//! ucx-gpu-echo info
//! ```
//! Every side takes `--stage-below BYTES` (device messages below it go through pinned host
//! memory; `max` stages all of them). `--check` sends fresh bytes every round trip and compares
//! every byte that comes back. `--bw` also streams `--iters` messages per size with `--window`
//! sends in flight (as `ucx_perftest -t tag_bw`). UCX options come from the environment (`UCX_TLS=...`).
//! The server prints `LISTENING <port>`; `info` prints how device buffers are moved.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use ucx::cuda::cudarc::driver::CudaStream;
use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};
use ucx_stack::cli::parse_size;
use ucx_stack::gpu::{self, Memory};
use ucx_stack::measure::mbps;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct Args {
    cmd: String,
    bind: String,
    port: u16,
    connect: Option<String>,
    sizes: Vec<usize>,
    iters: usize,
    mode: ProgressMode,
    memory: Memory,
    gpu: usize,
    stage_below: Option<usize>,
    once: bool,
    check: bool,
    json: bool,
    bw: bool,
    window: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: ucx-gpu-echo server [--bind ADDR] [--port P] [--memory cuda|host] [--gpu N] [--mode M] [--once] [--stage-below B]\n\
         \x20      ucx-gpu-echo client --connect HOST:PORT [--memory cuda|host] [--gpu N] [--sizes 8,1m,64m] [--iters N] [--check] [--json] [--mode M] [--stage-below B] [--bw] [--window W]\n\
         \x20      ucx-gpu-echo info"
    );
    std::process::exit(2)
}

fn parse() -> Args {
    let mut it = std::env::args().skip(1);
    let cmd = it.next().unwrap_or_else(|| usage());
    let mut a = Args {
        cmd,
        bind: "0.0.0.0".into(),
        port: 0,
        connect: None,
        sizes: vec![8, 1 << 20, 64 << 20],
        iters: 200,
        mode: ProgressMode::Polling,
        memory: Memory::Cuda,
        gpu: 0,
        stage_below: None,
        once: false,
        check: false,
        json: false,
        bw: false,
        window: 16,
    };
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--bind" => a.bind = val(),
            "--port" => a.port = val().parse().unwrap_or_else(|_| usage()),
            "--connect" => a.connect = Some(val()),
            "--sizes" => {
                a.sizes = val()
                    .split(',')
                    .map(|s| parse_size(s).unwrap_or_else(|| usage()))
                    .collect()
            }
            "--iters" => a.iters = val().parse().unwrap_or_else(|_| usage()),
            "--mode" => a.mode = val().parse().unwrap_or_else(|_| usage()),
            "--memory" => a.memory = Memory::parse(&val()).unwrap_or_else(|| usage()),
            "--gpu" => a.gpu = val().parse().unwrap_or_else(|_| usage()),
            "--stage-below" => {
                let v = val();
                let n = if v == "max" {
                    Some(usize::MAX)
                } else {
                    parse_size(&v)
                };
                a.stage_below = Some(n.unwrap_or_else(|| usage()));
            }
            "--once" => a.once = true,
            "--check" => a.check = true,
            "--json" => a.json = true,
            "--bw" => a.bw = true,
            "--window" => a.window = val().parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    a
}

fn main() {
    ucx_stack::cli::init_tracing();
    let args = parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = rt.block_on(async {
        match args.cmd.as_str() {
            "server" => server(&args).await,
            "client" => client(&args).await,
            "info" => info(&args),
            _ => usage(),
        }
    });
    if let Err(e) = result {
        eprintln!("ucx-gpu-echo {}: {e}", args.cmd);
        std::process::exit(1);
    }
}

fn context(a: &Args) -> Result<Context, BoxError> {
    let mut b = Context::builder();
    if let Some(n) = a.stage_below {
        b = b.cuda_stage_below(n);
    }
    Ok(b.build()?)
}

/// The GPU stream for device buffers; `None` for host memory.
fn stream(a: &Args) -> Result<Option<Arc<CudaStream>>, BoxError> {
    match a.memory {
        Memory::Host => Ok(None),
        Memory::Cuda => Ok(Some(ucx::cuda::open(a.gpu)?.default_stream())),
    }
}

fn info(a: &Args) -> Result<(), BoxError> {
    let ctx = context(a)?;
    println!("ucx {}", ctx.version());
    println!("cuda_support {:?}", ctx.cuda_support());
    match ucx::cuda::open(a.gpu) {
        Ok(gpu) => println!("gpu {}", gpu.name().unwrap_or_default()),
        Err(e) => println!("gpu none ({e})"),
    }
    Ok(())
}

async fn server(a: &Args) -> Result<(), BoxError> {
    let ctx = context(a)?;
    let stream = stream(a)?;
    let worker = Worker::new(&ctx, a.mode)?;
    let addr: SocketAddr = format!("{}:{}", a.bind, a.port)
        .parse()
        .or_else(|_| format!("[{}]:{}", a.bind, a.port).parse())?;
    let mut listener = Listener::bind(&worker, addr)?;
    println!("LISTENING {}", listener.port());
    std::io::stdout().flush()?;
    let (memory, once) = (a.memory, a.once);
    // Spawned, not run by block_on (polling futures re-schedule themselves cheaply as tasks).
    tokio::spawn(async move {
        loop {
            let ep = match listener.accept().await {
                Ok(ep) => ep,
                Err(e) => {
                    eprintln!("rejected a connection: {e}");
                    continue;
                }
            };
            let s = stream.clone();
            let serving = async move {
                match gpu::serve(&ep, memory, s.as_ref()).await {
                    Ok(n) => tracing::info!(commands = n, "client done"),
                    Err(e) => eprintln!("client failed: {e}"),
                }
            };
            if once {
                serving.await;
                return;
            }
            tokio::spawn(serving);
        }
    })
    .await?;
    Ok(())
}

async fn client(a: &Args) -> Result<(), BoxError> {
    let target = a
        .connect
        .clone()
        .ok_or("client needs --connect HOST:PORT")?;
    let ctx = context(a)?;
    let stream = stream(a)?;
    let worker = Worker::new(&ctx, a.mode)?;
    let ep = Endpoint::connect(&worker, target.as_str()).await?;
    let a = a.clone();
    let support = ctx.cuda_support();
    tokio::spawn(async move {
        for &size in &a.sizes {
            let (warmup, iters) = if a.check {
                (0, a.iters.max(1))
            } else {
                (a.iters.div_ceil(10).max(2), a.iters.max(1))
            };
            let run = gpu::pingpong(
                &ep,
                a.memory,
                stream.as_ref(),
                size,
                warmup,
                iters,
                a.check,
            )
            .await?;
            let s = run.summary;
            let streamed = if a.bw {
                gpu::stream_bandwidth(&ep, a.memory, stream.as_ref(), size, iters, a.window)
                    .await?
            } else {
                0.0
            };
            if a.json {
                println!(
                    "{{\"size\":{},\"iters\":{},\"median_us\":{:.3},\"p99_us\":{:.3},\"mbps\":{:.1},\"checked\":{},\"memory\":\"{:?}\",\"cuda_support\":\"{:?}\",\"stream_mbps\":{:.1}}}",
                    size,
                    s.iters,
                    s.median.as_secs_f64() * 1e6,
                    s.p99.as_secs_f64() * 1e6,
                    s.bandwidth / 1e6,
                    run.checked,
                    a.memory,
                    support,
                    streamed / 1e6
                );
            } else {
                println!(
                    "{size:>11} B  one-way median {:>10.2} us  p99 {:>10.2} us  {:>10} MB/s  checked {} round trips{}",
                    s.median.as_secs_f64() * 1e6,
                    s.p99.as_secs_f64() * 1e6,
                    mbps(s.bandwidth),
                    run.checked,
                    if a.bw { format!("  streamed {} MB/s", mbps(streamed)) } else { String::new() }
                );
            }
        }
        ep.close().await?;
        Ok::<(), BoxError>(())
    })
    .await??;
    Ok(())
}
