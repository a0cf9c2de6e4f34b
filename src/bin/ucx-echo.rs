//! `ucx-echo`: an echo server and a measuring client over UCX, across processes.
//!
//! ```text
//! ucx-echo server [--bind ADDR] [--port P] [--mode polling|blocking|thread] [--cpu N] [--once]
//! ucx-echo client --connect HOST:PORT [--sizes 8,1048576] [--iters N [--exact]] [--mode M]
//!                 [--cpu N] [--bw] [--json] [--direct]
//! ucx-echo demo   [--sizes ...] [--iters N] [--mode M] [--direct]   # two processes
//! ```
//! `--direct` measures on an endpoint connected by worker address (exchanged over the first
//! connection) instead of the client-server one: on one host that endpoint uses shared memory
//! alone, as `ucx_perftest` does, while client-server endpoints also carry TCP lanes.
//! `--iters N` is scaled down for large sizes (a sweep of the defaults takes seconds);
//! `--exact` runs N round trips (and streams N messages with `--bw`) at every size, as the
//! comparison scripts do, so every row measures as many round trips as `ucx_perftest`.
//! UCX options come from the environment (`UCX_TLS=tcp`, ...). The server prints
//! `LISTENING <port>` once it accepts connections.

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};
use ucx_stack::cli::parse_size;
use ucx_stack::echo;
use ucx_stack::measure::{mbps, pin_to_cpu};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct Args {
    cmd: String,
    bind: String,
    port: u16,
    connect: Option<String>,
    sizes: Vec<usize>,
    iters: usize,
    /// `--iters` round trips (and streamed messages) at every size, not scaled down by size.
    exact: bool,
    mode: ProgressMode,
    cpu: Option<usize>,
    once: bool,
    bw: bool,
    json: bool,
    direct: bool,
    window: usize,
    batch: bool,
    op: echo::Op,
    /// Measure in the runtime's `block_on` future rather than a spawned task.
    block_on: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: ucx-echo server [--bind ADDR] [--port P] [--mode polling|blocking|thread] [--cpu N] [--once]\n\
         \x20      ucx-echo client --connect HOST:PORT [--sizes 8,1048576] [--iters N [--exact]] [--mode M] [--cpu N] [--bw] [--window N] [--batch] [--json] [--direct] [--test tag|stream|am|put|get] [--block-on]\n\
         \x20      ucx-echo demo [--sizes ...] [--iters N] [--mode M] [--direct] [--block-on]"
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
        iters: 2000,
        exact: false,
        mode: ProgressMode::Polling,
        cpu: None,
        once: false,
        bw: false,
        json: false,
        direct: false,
        window: 16,
        batch: false,
        op: echo::Op::Tag,
        block_on: false,
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
            "--exact" => a.exact = true,
            "--mode" => a.mode = val().parse().unwrap_or_else(|_| usage()),
            "--cpu" => a.cpu = Some(val().parse().unwrap_or_else(|_| usage())),
            "--once" => a.once = true,
            "--bw" => a.bw = true,
            "--json" => a.json = true,
            "--direct" => a.direct = true,
            "--test" => a.op = echo::Op::parse(&val()).unwrap_or_else(|| usage()),
            "--window" => a.window = val().parse().unwrap_or_else(|_| usage()),
            "--batch" => a.batch = true,
            "--block-on" => a.block_on = true,
            _ => usage(),
        }
    }
    a
}

fn main() {
    ucx_stack::cli::init_tracing();
    let args = parse();
    if let Some(cpu) = args.cpu {
        if let Err(e) = pin_to_cpu(cpu) {
            eprintln!("warning: could not pin to CPU {cpu}: {e}");
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = rt.block_on(async {
        match args.cmd.as_str() {
            "server" => server(&args).await,
            "client" => client(&args).await,
            "demo" => demo(&args).await,
            _ => usage(),
        }
    });
    if let Err(e) = result {
        eprintln!("ucx-echo {}: {e}", args.cmd);
        std::process::exit(1);
    }
}

async fn server(a: &Args) -> Result<(), BoxError> {
    let ctx = Context::new()?;
    let worker = Worker::new(&ctx, a.mode)?;
    let addr: SocketAddr = format!("{}:{}", a.bind, a.port)
        .parse()
        .or_else(|_| format!("[{}]:{}", a.bind, a.port).parse())?;
    let listener = Listener::bind(&worker, addr)?;
    println!("LISTENING {}", listener.port());
    std::io::stdout().flush()?;
    // Spawned, not run by block_on: a polling future re-schedules itself on every poll, which
    // costs a system call when it is the block_on future but not when it is a task.
    let once = a.once;
    tokio::spawn(accept_loop(listener, once)).await?;
    Ok(())
}

async fn accept_loop(mut listener: Listener, once: bool) {
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(ep) => {
                    tasks.spawn(async move {
                        match echo::serve(ep).await {
                            Ok(n) => tracing::info!(commands = n, "client done"),
                            Err(e) => tracing::warn!(error = %e, "client failed"),
                        }
                    });
                }
                Err(e) => eprintln!("rejected a connection: {e}"),
            },
            Some(_) = tasks.join_next(), if once && !tasks.is_empty() => return,
        }
    }
}

async fn client(a: &Args) -> Result<(), BoxError> {
    let target = a
        .connect
        .clone()
        .ok_or("client needs --connect HOST:PORT")?;
    let ctx = Context::new()?;
    let worker = Worker::new(&ctx, a.mode)?;
    let ep = Endpoint::connect(&worker, target.as_str()).await?;
    measure_in_task(ep, a.clone()).await
}

/// Runs the measurements as a task (see `server` for why not in block_on), or with
/// `--block-on` in the caller.
async fn measure_in_task(ep: Endpoint, a: Args) -> Result<(), BoxError> {
    // `--block-on`: as an application that awaits in `block_on` does (the runtime polls that
    // future only when its queue is empty or every few dozen tasks, so a progress task that
    // keeps itself queued delays it).
    if a.block_on {
        return measure_on(ep, &a).await;
    }
    tokio::spawn(async move { measure_on(ep, &a).await }).await?
}

/// Measures on `ep`, or with `--direct` on an endpoint connected by worker address (the
/// client-server endpoint is closed first, so its TCP lanes stop being progressed).
async fn measure_on(ep: Endpoint, a: &Args) -> Result<(), BoxError> {
    if !a.direct {
        let r = run_client(&ep, a).await;
        ep.close().await?;
        return r;
    }
    let direct = echo::direct(&ep).await?;
    ep.close().await?;
    let r = run_client(&direct, a).await;
    echo::bye(&direct).await?;
    // After BYE the server closes its side and may exit before our close's flush is
    // acknowledged: a disconnect here is the normal end, not a failure.
    match direct.close().await {
        Err(e) if !e.is_disconnect() => Err(e.into()),
        _ => r,
    }
}

async fn run_client(ep: &Endpoint, a: &Args) -> Result<(), BoxError> {
    if !a.json {
        println!(
            "{:>10} {:>8} {:>11} {:>11} {:>11} {:>11} {:>11} {:>12}",
            "bytes", "iters", "p50(us)", "p90(us)", "p99(us)", "p99.9(us)", "mean(us)", "MB/s"
        );
    }
    for &size in &a.sizes {
        // Scaled down for large sizes (a sweep of the defaults takes seconds), unless --exact
        // (the comparison scripts, so every row runs as many round trips as ucx_perftest).
        let iters = if a.exact {
            a.iters.max(1)
        } else {
            echo::iterations_for(size, a.iters)
        };
        let s = tokio::time::timeout(
            echo::STEP_LIMIT,
            echo::time_op(ep, a.op, size, (iters / 10).max(2), iters),
        )
        .await
        .map_err(|_| "ping-pong timed out")??;
        let bw = if a.bw {
            let count = if a.exact {
                a.iters.max(1)
            } else {
                echo::iterations_for(size, a.iters * 4).max(20)
            };
            Some(
                tokio::time::timeout(
                    echo::STEP_LIMIT,
                    echo::stream_bandwidth(ep, size, count, a.window, a.batch),
                )
                .await
                .map_err(|_| "bandwidth run timed out")??,
            )
        } else {
            None
        };
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        if a.json {
            println!(
                "{{\"test\":\"{:?}\",\"mode\":\"{:?}\",\"bytes\":{},\"iters\":{},\"median_us\":{:.3},\"p90_us\":{:.3},\"p99_us\":{:.3},\"p999_us\":{:.3},\"mean_us\":{:.3},\"pingpong_MBps\":{:.1}{}}}",
                a.op, a.mode, size, s.iters, us(s.median), us(s.p90), us(s.p99), us(s.p999), us(s.mean), s.bandwidth / 1e6,
                bw.map(|b| format!(
                    ",\"stream_MBps\":{:.1},\"stream_msgs_per_s\":{:.0}",
                    b / 1e6,
                    b / size.max(1) as f64
                ))
                .unwrap_or_default()
            );
        } else {
            println!(
                "{:>10} {:>8} {:>11.3} {:>11.3} {:>11.3} {:>11.3} {:>11.3} {:>12}{}",
                size,
                s.iters,
                us(s.median),
                us(s.p90),
                us(s.p99),
                us(s.p999),
                us(s.mean),
                mbps(s.bandwidth),
                bw.map(|b| format!(
                    "   stream {} MB/s, {:.0} msg/s",
                    mbps(b),
                    b / size.max(1) as f64
                ))
                .unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// The main job: an echo server in a child process (CPU 0) and this process as client (CPU 1).
async fn demo(a: &Args) -> Result<(), BoxError> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args([
            "server",
            "--bind",
            "127.0.0.1",
            "--cpu",
            "0",
            "--once",
            "--mode",
        ])
        .arg(format!("{:?}", a.mode).to_lowercase())
        .stdout(Stdio::piped())
        .spawn()?;
    let port = test_support::listening_port(&mut child, test_support::START_LIMIT)?;
    // The child is killed on every early return below (a std Child is not killed on drop).
    let mut child = KillOnDrop(child);
    if let Err(e) = pin_to_cpu(1) {
        eprintln!("warning: could not pin the client: {e}");
    }
    println!(
        "UCX {} | echo server pid {} on 127.0.0.1:{port} | progress mode {:?} | UCX_TLS={}",
        ucx::version(),
        child.0.id(),
        a.mode,
        std::env::var("UCX_TLS").unwrap_or_else(|_| "(default)".into())
    );
    let ctx = Context::new()?;
    let worker = Worker::new(&ctx, a.mode)?;
    let ep = Endpoint::connect(&worker, ("127.0.0.1", port)).await?;
    let args = Args {
        bw: true,
        ..a.clone()
    };
    let r = measure_in_task(ep, args).await;
    r?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.0.try_wait()? {
            break st;
        }
        if std::time::Instant::now() > deadline {
            return Err("echo server did not exit after the client closed".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    if !status.success() {
        return Err(format!("echo server exited with {status}").into());
    }
    Ok(())
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
