//! `transport-echo`: an echo server and a ping-pong client over any `transport` address.
//!
//! ```text
//! transport-echo server --listen ucx://0.0.0.0:0 [--once] [UCX flags]
//! transport-echo client --connect tcp://10.0.0.1:5000 [--sizes 8,1m,64m] [--iters N] [--frames K] [UCX flags]
//! transport-echo client --connect ... --stream [--window W] [--batch B] [--sizes ...] [--count N]
//! transport-echo server|client --raw-tcp ...     # tcp:// only: plain tokio sockets, no framing
//! transport-echo topology                          # GPUs, NICs and what is near each GPU
//! transport-echo tls-generate DIR [NAME...]        # a cluster certificate: DIR/cert.pem, DIR/key.pem
//! UCX flags: --ucx-tcp --ucx-no-shm --ucx-net-devices DEV --ucx-progress polling|blocking|thread
//!            --ucx-direct (move to endpoints by worker address: Options::ucx_direct, both sides)
//! TCP flags: --tcp-spin-us US (Options::tcp_spin; default 50, 0: park at once)
//! Security flags: --tls-dir DIR (tls://: DIR/cert.pem presented and trusted, DIR/key.pem)
//!                 --secret-file F (64 hex digits: the shared-secret challenge on any scheme)
//! ```
//! The server prints `LISTENING <address>` and echoes every message on its channel, except on
//! [`SINK`], whose messages it counts, and [`COUNT`], which it answers with that count. The
//! client prints one JSON line per size: median and p99 one-way latency (half a round trip) and
//! bandwidth from the median, after checking the first and last echo byte for byte. With
//! `--stream` it sends `N` messages of each size to the sink instead (default: 4 × iters, at
//! most 2 GiB of them, at least 20) (`W` sends in flight, or batches
//! of `B` through `Connection::send_batch`, two in flight), asks for the count, checks it, and
//! prints messages per second and bandwidth.

use std::io::Write;
use std::time::{Duration, Instant};

use transport::{configure_ucx, connect_with, listen_with, Address, Message, Options, UcxIntent};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Channel whose messages the server counts instead of echoing.
const SINK: u32 = 0xFFFF_0001;
/// Channel on which the server answers with the count of [`SINK`] messages so far (8 bytes,
/// little-endian), and resets it.
const COUNT: u32 = 0xFFFF_0002;

struct Args {
    cmd: String,
    addr: Option<String>,
    sizes: Vec<usize>,
    iters: usize,
    frames: usize,
    once: bool,
    intent: UcxIntent,
    tls_dir: Option<String>,
    secret_file: Option<String>,
    tcp_spin: std::time::Duration,
    ucx_direct: bool,
    raw_tcp: bool,
    stream: bool,
    window: usize,
    batch: usize,
    count: Option<usize>,
}

fn usage() -> ! {
    eprintln!(
        "usage: transport-echo server --listen URI [--once] [UCX flags]\n\
         \x20      transport-echo client --connect URI [--sizes 8,1m,64m] [--iters N] [--frames K] [UCX flags]\n\
         \x20      transport-echo tls-generate DIR [NAME...]\n\
         UCX flags: --ucx-tcp --ucx-no-shm --ucx-net-devices DEV --ucx-progress polling|blocking|thread --ucx-direct\n\
         Security flags: --tls-dir DIR --secret-file FILE"
    );
    std::process::exit(2)
}

fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

fn parse() -> Args {
    let mut it = std::env::args().skip(1);
    let cmd = it.next().unwrap_or_else(|| usage());
    let mut a = Args {
        cmd,
        addr: None,
        sizes: vec![8, 1 << 20, 64 << 20],
        iters: 1000,
        frames: 1,
        once: false,
        intent: UcxIntent::default(),
        tls_dir: None,
        secret_file: None,
        tcp_spin: transport::DEFAULT_TCP_SPIN,
        ucx_direct: false,
        raw_tcp: false,
        stream: false,
        window: 16,
        batch: 0,
        count: None,
    };
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--listen" | "--connect" => a.addr = Some(val()),
            "--sizes" => {
                a.sizes = val()
                    .split(',')
                    .map(|s| parse_size(s).unwrap_or_else(|| usage()))
                    .collect()
            }
            "--iters" => a.iters = val().parse().unwrap_or_else(|_| usage()),
            "--frames" => a.frames = val().parse().unwrap_or_else(|_| usage()),
            "--once" => a.once = true,
            "--ucx-tcp" => a.intent.tcp = true,
            "--ucx-no-shm" => a.intent.shared_memory = false,
            "--ucx-net-devices" => a.intent.net_devices = Some(val()),
            "--ucx-direct" => a.ucx_direct = true,
            "--raw-tcp" => a.raw_tcp = true,
            "--stream" => a.stream = true,
            "--window" => a.window = val().parse().unwrap_or_else(|_| usage()),
            "--batch" => a.batch = val().parse().unwrap_or_else(|_| usage()),
            "--count" => a.count = Some(val().parse().unwrap_or_else(|_| usage())),
            "--ucx-progress" => a.intent.progress = val().parse().unwrap_or_else(|_| usage()),
            "--tls-dir" => a.tls_dir = Some(val()),
            "--secret-file" => a.secret_file = Some(val()),
            "--tcp-spin-us" => {
                a.tcp_spin =
                    std::time::Duration::from_micros(val().parse().unwrap_or_else(|_| usage()))
            }
            _ => usage(),
        }
    }
    a
}

fn topology() -> Result<(), BoxError> {
    use transport::topology::{GpuRef, Locality, Topology};
    let topo = Topology::load()?;
    println!("cpus allowed: {}", topo.allowed_cpus());
    println!("network devices: {:?}", topo.network_devices());
    let gpus = topo.gpus();
    if gpus.is_empty() {
        if let Locality::Unknown(why) = topo.gpu(GpuRef::Index(0)) {
            println!("gpu 0: unknown ({why})");
        }
    }
    for i in 0..gpus.len() {
        match topo.gpu(GpuRef::Index(i)) {
            Locality::Known(g) => println!(
                "gpu {i}: pci {} cpus {} numa {} nics (nearest first) {:?}",
                g.pci,
                g.cpus,
                g.numa_nodes,
                g.nics.iter().map(|n| (&n.name, n.hops)).collect::<Vec<_>>()
            ),
            Locality::Unknown(why) => println!("gpu {i}: unknown ({why})"),
        }
    }
    Ok(())
}

/// The connection options the security flags ask for.
fn options(a: &Args) -> Result<Options, BoxError> {
    let mut opts = Options {
        tcp_spin: a.tcp_spin,
        ucx_direct: a.ucx_direct,
        ..Options::default()
    };
    if let Some(f) = &a.secret_file {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
        opts.secret = Some(transport::auth::Secret::from_hex(&text)?);
    }
    if let Some(dir) = &a.tls_dir {
        let dir = std::path::Path::new(dir);
        let cert = dir.join("cert.pem");
        opts.tls = Some(transport::tls::TlsConfig::from_pem_files(
            &cert,
            dir.join("key.pem"),
            &cert,
        )?);
    }
    Ok(opts)
}

/// Writes a fresh cluster certificate into `dir` (the key readable by its owner only).
fn tls_generate(dir: &str, names: &[String]) -> Result<(), BoxError> {
    use std::os::unix::fs::OpenOptionsExt;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let pair = transport::tls::ClusterCertificate::generate(&names)?;
    let dir = std::path::Path::new(dir);
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("cert.pem"), &pair.cert_pem)?;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(dir.join("key.pem"))?
        .write_all(pair.key_pem.as_bytes())?;
    println!("{}", dir.join("cert.pem").display());
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("tls-generate") {
        let Some(dir) = args.get(2) else { usage() };
        if let Err(e) = tls_generate(dir, &args[3..]) {
            eprintln!("transport-echo tls-generate: {e}");
            std::process::exit(1);
        }
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("topology") {
        if let Err(e) = topology() {
            eprintln!("transport-echo topology: {e}");
            std::process::exit(1);
        }
        return;
    }
    let a = parse();
    // One thread, as ucx-echo: with polling progress, the cheapest wake-ups.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let r = rt.block_on(async move {
        let addr: Address = a.addr.clone().ok_or("an address is needed")?.parse()?;
        let opts = options(&a)?;
        if matches!(addr, Address::Ucx { .. }) {
            eprintln!("UCX: {}", configure_ucx(a.intent.clone())?);
        }
        if a.raw_tcp {
            let Address::Tcp { host, port } = &addr else {
                return Err("--raw-tcp needs a tcp:// address".into());
            };
            let at = format!("{host}:{port}");
            return match a.cmd.as_str() {
                "server" => raw::server(&at).await,
                "client" => raw::client(&at, &a.sizes, a.iters).await,
                _ => usage(),
            };
        }
        // Spawned: polling-mode UCX futures reschedule themselves cheaply as tasks.
        match a.cmd.as_str() {
            "server" => tokio::spawn(server(addr, opts, a.once)).await?,
            "client" if a.stream => {
                let s = Stream {
                    window: a.window.max(1),
                    batch: a.batch,
                    count: a.count,
                    iters: a.iters,
                };
                tokio::spawn(stream(addr, opts, a.sizes, s)).await?
            }
            "client" => tokio::spawn(client(addr, opts, a.sizes, a.iters, a.frames)).await?,
            _ => usage(),
        }
    });
    if let Err(e) = r {
        eprintln!("transport-echo: {e}");
        std::process::exit(1);
    }
}

async fn server(addr: Address, opts: Options, once: bool) -> Result<(), BoxError> {
    let mut listener = listen_with(&addr, &opts).await?;
    println!("LISTENING {}", listener.local_addr());
    std::io::stdout().flush()?;
    loop {
        let conn = listener.accept().await?;
        let serve = async move {
            let mut sunk = 0u64;
            // Whatever has arrived at once (one call for a burst of small messages).
            while let Ok(batch) = conn.recv_many(256).await {
                for (channel, msg) in batch {
                    let r = match channel {
                        SINK => {
                            sunk += 1;
                            Ok(())
                        }
                        COUNT => {
                            let n = std::mem::take(&mut sunk);
                            conn.send(COUNT, Message::from(vec![n.to_le_bytes().to_vec()]))
                                .await
                        }
                        _ => conn.send(channel, msg).await,
                    };
                    if r.is_err() {
                        return;
                    }
                }
            }
        };
        if once {
            serve.await;
            return Ok(());
        }
        tokio::spawn(serve);
    }
}

async fn client(
    addr: Address,
    opts: Options,
    sizes: Vec<usize>,
    iters: usize,
    frames: usize,
) -> Result<(), BoxError> {
    let conn = connect_with(&addr, &opts).await?;
    for size in sizes {
        let per = size / frames.max(1);
        let msg = Message::from(
            (0..frames.max(1))
                .map(|f| payload(per, |i| ((i * 31 + f * 7) % 251) as u8))
                .collect::<Vec<Vec<u8>>>(),
        );
        let warmup = iters.div_ceil(10).max(2);
        let mut rts = Vec::with_capacity(iters);
        // Each round trip sends on what the last one brought back, as the server does and
        // as `ucx_perftest` reuses its buffer: the loop times the transport, not a copy of
        // the message per round trip. The first and the last echo are checked against the
        // message itself, so every hop in between carried its bytes unchanged.
        let mut out = msg.clone();
        for i in 0..warmup + iters {
            let t0 = Instant::now();
            conn.send(1, out).await?;
            let (channel, back) = conn.recv().await?;
            let rt = t0.elapsed();
            if (i == 0 || i + 1 == warmup + iters)
                && (channel != 1 || back.to_host()? != msg.to_host()?)
            {
                return Err(format!("the echo of {size} bytes came back different").into());
            }
            if i >= warmup {
                rts.push(rt);
            }
            out = back;
        }
        report(&addr.to_string(), per * frames.max(1), frames.max(1), rts);
    }
    conn.close().await?;
    Ok(())
}

/// A message's bytes, `byte(i)` at `i`, in memory as `ucx_perftest`'s buffers are: huge pages
/// from 2 MiB up ([`transport::host_buffer`]).
fn payload(len: usize, byte: impl Fn(usize) -> u8) -> Vec<u8> {
    let mut v = transport::host_buffer(len);
    for (i, b) in v.iter_mut().enumerate() {
        *b = byte(i);
    }
    v
}

/// How `--stream` sends.
struct Stream {
    /// Sends in flight (single sends).
    window: usize,
    /// Messages per `send_batch` (0: single sends).
    batch: usize,
    /// Messages per size (`None`: from `iters`).
    count: Option<usize>,
    iters: usize,
}

/// `--stream`: per size, messages to the server's sink after a short untimed run, then the
/// count asked back and checked; prints messages per second and bandwidth.
async fn stream(
    addr: Address,
    opts: Options,
    sizes: Vec<usize>,
    how: Stream,
) -> Result<(), BoxError> {
    let conn = connect_with(&addr, &opts).await?;
    for size in sizes {
        let msg = Message::from(vec![payload(size, |i| (i % 251) as u8)]);
        let count = how
            .count
            .unwrap_or_else(|| (4 * how.iters).min((2usize << 30) / size.max(1)).max(20));
        sink(&conn, &msg, (4 * how.window).max(64), &how).await?;
        let t0 = Instant::now();
        sink(&conn, &msg, count, &how).await?;
        let secs = t0.elapsed().as_secs_f64().max(1e-9);
        println!(
            "{{\"address\":\"{addr}\",\"bytes\":{size},\"messages\":{count},\"batch\":{},\"window\":{},\"msgs_per_s\":{:.0},\"stream_MBps\":{:.1}}}",
            how.batch,
            how.window,
            count as f64 / secs,
            (size * count) as f64 / secs / 1e6
        );
    }
    conn.close().await?;
    Ok(())
}

/// Sends `count` copies of `msg` to the sink, then checks the server counted them all.
async fn sink(
    conn: &transport::Connection,
    msg: &Message,
    count: usize,
    how: &Stream,
) -> Result<(), BoxError> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let mut inflight = FuturesUnordered::new();
    let mut left = count;
    let per = if how.batch > 0 { how.batch } else { 1 };
    let most = if how.batch > 0 { 2 } else { how.window };
    while left > 0 || !inflight.is_empty() {
        while left > 0 && inflight.len() < most {
            let n = left.min(per);
            left -= n;
            inflight.push(async move {
                if how.batch > 0 {
                    conn.send_batch(SINK, vec![msg.clone(); n]).await
                } else {
                    conn.send(SINK, msg.clone()).await
                }
            });
        }
        inflight.next().await.expect("sends in flight")?;
    }
    conn.send(COUNT, Message::from(Vec::<Vec<u8>>::new()))
        .await?;
    let (channel, back) = conn.recv().await?;
    let got = back.to_host()?.concat();
    let n = <[u8; 8]>::try_from(&got[..]).ok().map(u64::from_le_bytes);
    if channel != COUNT || n != Some(count as u64) {
        return Err(format!("the server counted {n:?} of {count} messages").into());
    }
    Ok(())
}

/// Prints one size's JSON line from its round trips: median and p99 one-way latency (half a
/// round trip) and bandwidth from the median.
fn report(addr: &str, bytes: usize, frames: usize, mut rts: Vec<Duration>) {
    rts.sort_unstable();
    let pick = |q: f64| rts[((rts.len() - 1) as f64 * q).round() as usize] / 2;
    let median: Duration = pick(0.5);
    println!(
        "{{\"address\":\"{addr}\",\"bytes\":{bytes},\"frames\":{frames},\"iters\":{},\"median_us\":{:.3},\"p99_us\":{:.3},\"mbps\":{:.1}}}",
        rts.len(),
        median.as_secs_f64() * 1e6,
        pick(0.99).as_secs_f64() * 1e6,
        bytes as f64 / median.as_secs_f64().max(1e-12) / 1e6
    );
}

/// `--raw-tcp`: the floor of what tokio's TCP does on this machine, for the comparison. No
/// framing: per size, the client announces the size (8 bytes, little-endian), then both sides
/// move exactly that many bytes back and forth with `read_exact`/`write_all` (Nagle off).
mod raw {
    use std::io::Write;
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::BoxError;

    /// The largest size a client may announce.
    const MAX: u64 = 1 << 30;

    pub async fn server(at: &str) -> Result<(), BoxError> {
        let listener = tokio::net::TcpListener::bind(at).await?;
        let local = listener.local_addr()?;
        println!("LISTENING tcp://{}:{}", local.ip(), local.port());
        std::io::stdout().flush()?;
        let (mut s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        let mut announced = [0u8; 16];
        while s.read_exact(&mut announced).await.is_ok() {
            let size = u64::from_le_bytes(announced[..8].try_into().expect("8 bytes"));
            let count = u64::from_le_bytes(announced[8..].try_into().expect("8 bytes"));
            if size > MAX {
                return Err(format!("a client announced {size} bytes (at most {MAX})").into());
            }
            let mut buf = transport::host_buffer(size as usize);
            for _ in 0..count {
                s.read_exact(&mut buf).await?;
                s.write_all(&buf).await?;
            }
        }
        Ok(())
    }

    pub async fn client(at: &str, sizes: &[usize], iters: usize) -> Result<(), BoxError> {
        let mut s = tokio::net::TcpStream::connect(at).await?;
        s.set_nodelay(true)?;
        for &size in sizes {
            let warmup = iters.div_ceil(10).max(2);
            let total = warmup + iters;
            let announce = [(size as u64).to_le_bytes(), (total as u64).to_le_bytes()].concat();
            s.write_all(&announce).await?;
            let mut out = super::payload(size, |i| (i % 251) as u8);
            let mut back = transport::host_buffer(size);
            let mut rts = Vec::with_capacity(iters);
            for i in 0..total {
                // A fresh stamp every round, checked on its way back.
                let stamp = (i as u64).to_le_bytes();
                let k = size.min(8);
                out[..k].copy_from_slice(&stamp[..k]);
                let t0 = Instant::now();
                s.write_all(&out).await?;
                s.read_exact(&mut back).await?;
                let rt = t0.elapsed();
                if back[..k] != out[..k] || ((i == 0 || i + 1 == total) && back != out) {
                    return Err(format!("the echo of {size} bytes came back different").into());
                }
                if i >= warmup {
                    rts.push(rt);
                }
            }
            super::report(&format!("tcp://{at}"), size, 1, rts);
        }
        Ok(())
    }
}
