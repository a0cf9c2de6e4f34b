//! The `dask-comm` command line: `scheduler`, `worker` and `bench`. A program with functions of
//! its own embeds it (`dask_comm::cli::main()` after registering them), so that its workers
//! know its functions.
//!
//! ```text
//! dask-comm scheduler [--listen tcp://127.0.0.1:8786] [--scheduler-file F] [--secret-file F]
//!                     [--no-work-stealing] [--allowed-failures 3]
//!                     [--heartbeat-timeout 60] [--client-timeout 60]
//!                     [--dashboard-address 127.0.0.1:8787 | --no-dashboard]
//! dask-comm status (--scheduler-file F | --dashboard HOST:PORT) [--window 10]
//! dask-comm worker (--scheduler-file F | --scheduler URI [--secret-file F]) [--nthreads N]
//!                  [--memory-limit 4GiB|auto|none] [--device-memory-limit 8GiB]
//!                  [--local-directory D] [--listen URI] [--name N]
//!                  [--no-nanny] [--scheduler-timeout 60]
//! mpirun -np N dask-comm mpi [--scheduler-file F] [--nthreads N] [--memory-limit SIZE|auto|none]
//!                            [--interface IF] [--address-family ipv4|ipv6]
//!                            [--protocol tcp|ucx] [--scheduler-rank R]
//!                            [--local-directory D]
//!                            [--dashboard-address 127.0.0.1:8787 | --no-dashboard]
//! dask-comm bench [--workload merge-10000,tree-12,chain-10000,roundtrip] [--workers 2]
//!                 [--threads 1] [--protocol tcp|ucx] [--zero-work] [--rounds 3]
//!                 [--scheduler-process] [--json]
//! ```
//! The scheduler listens on loopback unless told otherwise, generates the cluster's secret
//! (or reads it from `--secret-file` or `DASK_COMM_SECRET`), prints `LISTENING <address>`, and
//! writes the scheduler file (JSON: `address`, `secret`; readable by its owner only); it runs
//! until a client shuts the cluster down (`Client::shutdown`) or SIGINT/SIGTERM, then tells
//! the workers to close and removes the file. It serves the dashboard on loopback port 8787
//! (another free port when that one is taken; printed as `DASHBOARD <url>` and kept in the
//! scheduler file), which `dask-comm status` prints in the terminal.
//!
//! A worker's memory limit is by default the machine's memory (`auto`; `0`: none). The
//! worker runs under a nanny: this process starts it as a child and starts it again when it
//! dies (killed, crashed, or past its memory `terminate` threshold); `--no-nanny` runs it in
//! this process.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use transport::Address;

use crate::cluster::{ClusterOptions, Protocol};
use crate::error::{Error, Result};
use crate::scheduler::SchedulerServer;
use crate::security::Secret;
use crate::worker::{run_worker, MemoryLimit, WorkerOptions};

/// What a scheduler file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerFile {
    /// The scheduler's address.
    pub address: String,
    /// The cluster's secret (hex).
    pub secret: String,
    /// The scheduler's dashboard (`host:port`), when it serves one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dashboard: Option<String>,
    /// The launcher's job id, when a launched job wrote it ([`crate::launch`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

impl SchedulerFile {
    /// Reads a scheduler file.
    pub fn read(path: &Path) -> Result<SchedulerFile> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::os(format!("reading {}", path.display()), e))?;
        serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{} is not a scheduler file: {e}", path.display())))
    }

    /// Writes it atomically, readable by its owner only.
    pub fn write(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("tmp");
        let text = serde_json::to_string_pretty(self).expect("serialises");
        {
            use std::io::Write;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts
                .open(&tmp)
                .map_err(|e| Error::os(format!("writing {}", tmp.display()), e))?;
            f.write_all(text.as_bytes())
                .map_err(|e| Error::os(format!("writing {}", tmp.display()), e))?;
        }
        std::fs::rename(&tmp, path).map_err(|e| Error::os(format!("writing {}", path.display()), e))
    }
}

/// Parses a size: `4GiB`, `500MB`, `1e9`, `123` (bytes).
///
/// ```
/// assert_eq!(dask_comm::cli::parse_bytes("4GiB"), Some(4 << 30));
/// assert_eq!(dask_comm::cli::parse_bytes("500MB"), Some(500_000_000));
/// assert_eq!(dask_comm::cli::parse_bytes("12"), Some(12));
/// assert_eq!(dask_comm::cli::parse_bytes("lots"), None);
/// ```
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num.trim().parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        _ => return None,
    };
    (num >= 0.0).then_some((num * mult) as u64)
}

struct Args {
    words: Vec<String>,
}

impl Args {
    fn flag(&mut self, name: &str) -> bool {
        let before = self.words.len();
        self.words.retain(|w| w != name);
        before != self.words.len()
    }

    fn value(&mut self, name: &str) -> Result<Option<String>> {
        let Some(i) = self.words.iter().position(|w| w == name) else {
            return Ok(None);
        };
        if i + 1 >= self.words.len() {
            return Err(Error::Config(format!("{name} needs a value")));
        }
        let v = self.words.remove(i + 1);
        self.words.remove(i);
        Ok(Some(v))
    }

    fn done(&self) -> Result<()> {
        match self.words.first() {
            Some(w) => Err(Error::Config(format!("unexpected argument {w:?}"))),
            None => Ok(()),
        }
    }
}

fn address(text: &str) -> Result<Address> {
    Ok(text.parse().map_err(transport::Error::from)?)
}

fn secret_from(file: Option<String>) -> Result<Option<Secret>> {
    if let Some(f) = file {
        let text = std::fs::read_to_string(&f).map_err(|e| Error::os(format!("reading {f}"), e))?;
        return Ok(Some(Secret::from_hex(&text)?));
    }
    match std::env::var("DASK_COMM_SECRET") {
        Ok(s) => Ok(Some(Secret::from_hex(&s)?)),
        Err(_) => Ok(None),
    }
}

const USAGE: &str = "usage: dask-comm scheduler [--listen URI] [--scheduler-file F] [--secret-file F] [--no-work-stealing] [--allowed-failures N] [--heartbeat-timeout S] [--client-timeout S] [--dashboard-address HOST:PORT | --no-dashboard]
       dask-comm status (--scheduler-file F | --dashboard HOST:PORT) [--window SECONDS]
       dask-comm worker (--scheduler-file F | --scheduler URI [--secret-file F]) [--nthreads N] [--memory-limit SIZE|auto|none] [--device-memory-limit SIZE] [--local-directory D] [--listen URI] [--name N] [--no-nanny] [--scheduler-timeout S]
       mpirun -np N dask-comm mpi [--scheduler-file F] [--nthreads N] [--memory-limit SIZE|auto|none] [--interface IF] [--address-family ipv4|ipv6] [--protocol tcp|ucx] [--scheduler-rank R] [--local-directory D] [--dashboard-address HOST:PORT | --no-dashboard]
       dask-comm bench [--workload W[,W...]] [--workers N] [--threads N] [--protocol tcp|ucx] [--zero-work] [--rounds N] [--scheduler-process] [--json]";

/// Registers the functions of `dask-comm bench` (`inc`, `add`, `sum`, ...): the `dask-comm`
/// program does before [`main`]; a program embedding the command line registers its own
/// functions instead (and may call this too, if it has none of those names).
#[doc(hidden)]
pub fn register_bench_functions() {
    crate::bench::register();
}

/// Runs the command line (the process's arguments); returns the exit status.
pub fn main() -> i32 {
    crate::cluster::run_if_worker();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    // The scheduler's and the workers' processes are this program's own.
    crate::worker::raise_descriptor_limit();
    let mut words: Vec<String> = std::env::args().skip(1).collect();
    if words.is_empty() {
        eprintln!("{USAGE}");
        return 2;
    }
    let cmd = words.remove(0);
    let args = Args { words };
    let r = match cmd.as_str() {
        "scheduler" => scheduler(args),
        "worker" => worker(args),
        "mpi" => mpi(args),
        "status" => status(args),
        "bench" => crate::benchcli::bench(args.words),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(Error::Config(format!("unknown command {other:?}\n{USAGE}"))),
    };
    if let (true, Err(e)) = (cmd == "worker", &r) {
        // A worker's exit code says why it ended, for whatever supervises it.
        eprintln!("dask-comm worker: {e}");
        return crate::worker::exit_code(&r);
    }
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("dask-comm {cmd}: {e}");
            1
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::os("starting a tokio runtime", e))
}

fn scheduler(mut a: Args) -> Result<()> {
    let listen = address(
        &a.value("--listen")?
            .unwrap_or_else(|| "tcp://127.0.0.1:8786".into()),
    )?;
    let file = a.value("--scheduler-file")?.map(PathBuf::from);
    let secret = secret_from(a.value("--secret-file")?)?.unwrap_or_else(Secret::generate);
    let mut cfg = crate::core::Config {
        work_stealing: !a.flag("--no-work-stealing"),
        ..Default::default()
    };
    if let Some(t) = seconds(&mut a, "--heartbeat-timeout")? {
        cfg.heartbeat_timeout = t;
    }
    if let Some(t) = seconds(&mut a, "--client-timeout")? {
        cfg.client_timeout = t;
    }
    if let Some(n) = a.value("--allowed-failures")? {
        cfg.allowed_failures = n.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            Error::Config(format!("--allowed-failures {n:?}: a count of at least 1"))
        })?;
    }
    let dashboard = dashboard_choice(&mut a)?;
    a.done()?;
    runtime()?.block_on(async {
        let mut server = SchedulerServer::start(&listen, secret.clone(), cfg).await?;
        let dashboard = match dashboard {
            Some(at) => Some(crate::dashboard::start(&mut server, at).await?),
            None => None,
        };
        if let Some(f) = &file {
            SchedulerFile {
                address: server.address().to_string(),
                secret: secret.to_hex(),
                dashboard: dashboard.map(|d| d.to_string()),
                job: None,
            }
            .write(f)?;
        }
        // LISTENING first: starters read up to it and may then close the pipe.
        announce(&format!("LISTENING {}", server.address()));
        if let Some(d) = dashboard {
            announce(&format!("DASHBOARD http://{d}/"));
        }
        // Until a client shuts the cluster down, or a signal.
        let ended = server.serve_until_signalled().await;
        if let Some(f) = &file {
            let _ = std::fs::remove_file(f);
        }
        ended
    })
}

/// `flag SECONDS` (fractions allowed, more than 0), if given.
fn seconds(a: &mut Args, flag: &str) -> Result<Option<Duration>> {
    a.value(flag)?
        .map(|t| {
            t.parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0)
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .ok_or_else(|| Error::Config(format!("{flag} {t:?}: seconds, more than 0")))
        })
        .transpose()
}

fn worker(mut a: Args) -> Result<()> {
    let file = a.value("--scheduler-file")?.map(PathBuf::from);
    let sched = a.value("--scheduler")?;
    let secret_file = a.value("--secret-file")?;
    let nthreads: usize = a
        .value("--nthreads")?
        .map(|n| {
            n.parse()
                .map_err(|_| Error::Config(format!("--nthreads {n:?}")))
        })
        .transpose()?
        .unwrap_or(1);
    let memory_limit = match a.value("--memory-limit")?.as_deref() {
        None | Some("auto") => crate::worker::memory::machine_memory(),
        Some("none") => None,
        Some(m) => {
            Some(parse_bytes(m).ok_or_else(|| Error::Config(format!("--memory-limit {m:?}")))?)
                .filter(|&m| m > 0)
        }
    };
    let device_memory_limit = a
        .value("--device-memory-limit")?
        .map(|m| {
            parse_bytes(&m).ok_or_else(|| Error::Config(format!("--device-memory-limit {m:?}")))
        })
        .transpose()?;
    let local_dir = a.value("--local-directory")?.map(PathBuf::from);
    let listen = a.value("--listen")?.map(|l| address(&l)).transpose()?;
    let name = a.value("--name")?;
    let zero_work = a.flag("--zero-work");
    let nanny = !a.flag("--no-nanny");
    let scheduler_timeout = seconds(&mut a, "--scheduler-timeout")?;
    a.done()?;
    let (scheduler, secret) = match (file, sched) {
        (Some(f), None) => {
            let sf = wait_for_file(&f, Duration::from_secs(60))?;
            (address(&sf.address)?, Secret::from_hex(&sf.secret)?)
        }
        (None, Some(s)) => (
            address(&s)?,
            secret_from(secret_file)?.ok_or_else(|| {
                Error::Config("no secret: --secret-file F or DASK_COMM_SECRET".into())
            })?,
        ),
        _ => {
            return Err(Error::Config(format!(
                "give one of --scheduler-file, --scheduler\n{USAGE}"
            )))
        }
    };
    if let Some(d) = &local_dir {
        std::fs::create_dir_all(d)
            .map_err(|e| Error::os(format!("creating {}", d.display()), e))?;
    }
    let mut opts = WorkerOptions::new(scheduler, secret, nthreads);
    opts.handle_signals = true;
    opts.memory_limit = memory_limit;
    opts.device_memory_limit = device_memory_limit;
    opts.listen = listen;
    opts.zero_work = zero_work;
    opts.local_directory = local_dir;
    if let Some(t) = scheduler_timeout {
        opts.scheduler_timeout = t;
    }
    if let Some(n) = name {
        opts.name = n;
    }
    if nanny {
        return crate::cluster::nanny(&opts);
    }
    runtime()?.block_on(run_worker(opts))
}

/// The dashboard's address from `--dashboard-address A` (`host:port`, or `:port` for
/// loopback) and `--no-dashboard`: `None` for none, else where to try.
fn dashboard_choice(a: &mut Args) -> Result<Option<crate::dashboard::At>> {
    let off = a.flag("--no-dashboard");
    let asked = a.value("--dashboard-address")?;
    match (off, asked) {
        (true, Some(_)) => Err(Error::Config(
            "--no-dashboard and --dashboard-address together".into(),
        )),
        (true, None) => Ok(None),
        (false, None) => Ok(Some(crate::dashboard::At::Default)),
        (false, Some(text)) => {
            let text = if text.starts_with(':') {
                format!("127.0.0.1{text}")
            } else {
                text
            };
            let at = text.parse().map_err(|_| {
                Error::Config(format!("--dashboard-address {text:?}: expected host:port"))
            })?;
            Ok(Some(crate::dashboard::At::Exactly(at)))
        }
    }
}

/// `status`: what the dashboard shows, in the terminal.
fn status(mut a: Args) -> Result<()> {
    let file = a.value("--scheduler-file")?.map(PathBuf::from);
    let direct = a.value("--dashboard")?;
    let window: f64 = a
        .value("--window")?
        .map(|w| {
            w.parse()
                .map_err(|_| Error::Config(format!("--window {w:?}")))
        })
        .transpose()?
        .unwrap_or(10.0);
    a.done()?;
    let at = match (file, direct) {
        (Some(f), None) => SchedulerFile::read(&f)?.dashboard.ok_or_else(|| {
            Error::Config(format!(
                "{}: the scheduler serves no dashboard",
                f.display()
            ))
        })?,
        (None, Some(d)) => d
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string(),
        _ => {
            return Err(Error::Config(format!(
                "give one of --scheduler-file, --dashboard\n{USAGE}"
            )))
        }
    };
    let snapshot = crate::dashboard::fetch(&at, window)?;
    print!("{}", crate::dashboard::summary(&snapshot));
    Ok(())
}

/// `mpi`: under a launcher, the scheduler's rank runs the scheduler (until a client shuts
/// the cluster down) and every other rank a worker ([`crate::launch`]).
fn mpi(mut a: Args) -> Result<()> {
    let mut opts = crate::launch::LaunchOptions {
        scheduler_file: a.value("--scheduler-file")?.map(PathBuf::from),
        interface: a.value("--interface")?,
        local_directory: a.value("--local-directory")?.map(PathBuf::from),
        dashboard: dashboard_choice(&mut a)?,
        ..Default::default()
    };
    if let Some(n) = a.value("--nthreads")? {
        opts.nthreads = n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| Error::Config(format!("--nthreads {n:?}")))?;
    }
    if let Some(r) = a.value("--scheduler-rank")? {
        opts.scheduler_rank = r
            .parse()
            .map_err(|_| Error::Config(format!("--scheduler-rank {r:?}")))?;
    }
    if let Some(p) = a.value("--protocol")? {
        opts.protocol = p.parse()?;
    }
    if let Some(f) = a.value("--address-family")? {
        opts.address_family = f.parse()?;
    }
    opts.memory_limit = match a.value("--memory-limit")?.as_deref() {
        None | Some("auto") => MemoryLimit::Auto,
        Some("none") => MemoryLimit::Unlimited,
        Some(m) => match parse_bytes(m) {
            Some(0) => MemoryLimit::Unlimited,
            Some(b) => MemoryLimit::Bytes(b),
            None => return Err(Error::Config(format!("--memory-limit {m:?}"))),
        },
    };
    a.done()?;
    crate::launch::serve_ranks(&opts)
}

/// Prints a line for whoever started this process (a `LISTENING` or `DASHBOARD` address). A
/// reader that stopped reading (its pipe closed) must not end the scheduler: write errors are
/// ignored, where `println!` would panic.
pub(crate) fn announce(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Waits for a scheduler file to appear (the scheduler may start after the workers).
pub fn wait_for_file(path: &Path, limit: Duration) -> Result<SchedulerFile> {
    let deadline = Instant::now() + limit;
    loop {
        if path.exists() {
            return SchedulerFile::read(path);
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout(format!(
                "no scheduler file at {} after {limit:?}",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Options for a local cluster from bench arguments.
pub(crate) fn cluster_options(
    workers: usize,
    threads: usize,
    protocol: Protocol,
    zero_work: bool,
) -> ClusterOptions {
    ClusterOptions {
        workers,
        threads_per_worker: threads,
        protocol,
        processes: true,
        zero_work,
        ..Default::default()
    }
}
