//! A cluster on this machine: a scheduler, and workers as processes (the same binary,
//! re-executed in the worker role) or, for tests, tasks in this process over `inproc://`.
//!
//! Every process of a cluster must register the same functions. Worker processes run the
//! program's `main` again up to [`LocalCluster::new`] (or [`run_if_worker`]), where they become
//! workers and never return: register functions first, and do nothing there that a worker
//! should not repeat.
//!
//! ```no_run
//! use dask_comm::LocalCluster;
//! dask_graph::registry().register("inc", |x: i64| x + 1);
//! let cluster = LocalCluster::new(2, 1).unwrap(); // worker processes stop here
//! let client = cluster.client().unwrap();
//! let futures = client.map_blocking("inc", 0..10i64).unwrap();
//! let values = client.gather_blocking(&futures).unwrap();
//! assert_eq!(values[9].downcast_ref::<i64>(), Some(&10));
//! ```

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use transport::Address;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::runtime::{block_on, Runtime};
use crate::scheduler::SchedulerServer;
use crate::security::Secret;
use crate::worker::{run_worker, WorkerOptions};

const ENV_ROLE: &str = "DASK_COMM_WORKER";
const ENV_SCHEDULER: &str = "DASK_COMM_SCHEDULER";
const ENV_SECRET: &str = "DASK_COMM_SECRET";
const ENV_THREADS: &str = "DASK_COMM_NTHREADS";
const ENV_NAME: &str = "DASK_COMM_NAME";
const ENV_ZERO: &str = "DASK_COMM_ZERO_WORK";
const ENV_MEMORY: &str = "DASK_COMM_MEMORY_LIMIT";

/// The network a local cluster uses between its processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// `tcp://127.0.0.1`.
    #[default]
    Tcp,
    /// `ucx://127.0.0.1`.
    Ucx,
    /// `tls://127.0.0.1`, with a certificate generated for the cluster (the workers read it
    /// from a folder only this user can read, removed with the cluster).
    Tls,
    /// `inproc://` (in-process workers only).
    Inproc,
}

impl std::str::FromStr for Protocol {
    type Err = Error;
    fn from_str(s: &str) -> Result<Protocol> {
        match s {
            "tcp" => Ok(Protocol::Tcp),
            "ucx" => Ok(Protocol::Ucx),
            "tls" => Ok(Protocol::Tls),
            "inproc" => Ok(Protocol::Inproc),
            _ => Err(Error::Config(format!(
                "protocol {s:?}: expected tcp, ucx or inproc"
            ))),
        }
    }
}

/// How to build a [`LocalCluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Number of workers.
    pub workers: usize,
    /// Threads per worker.
    pub threads_per_worker: usize,
    /// The network between them.
    pub protocol: Protocol,
    /// Workers as processes (true) or as tasks in this process (inproc only).
    pub processes: bool,
    /// Workers answer without running tasks (measuring the runtime alone).
    pub zero_work: bool,
    /// Each worker's memory limit in bytes (0: none).
    pub memory_limit: u64,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            workers: 2,
            threads_per_worker: 1,
            protocol: Protocol::Tcp,
            processes: true,
            zero_work: false,
            memory_limit: 0,
        }
    }
}

enum Workers {
    Processes(Vec<Child>),
    InProcess(Vec<tokio::task::JoinHandle<Result<()>>>),
}

/// A scheduler and its workers on this machine. Dropping it shuts them down.
pub struct LocalCluster {
    scheduler: Option<SchedulerServer>,
    workers: Workers,
    address: Address,
    secret: Secret,
    rt: Runtime,
    /// The certificate folder of a `tls://` cluster (removed on drop, after the workers).
    _tls_dir: Option<TlsDir>,
}

/// A folder holding a cluster's certificate (`cert.pem`, and `key.pem` readable by this user
/// only), removed when dropped. This process uses the certificate too.
struct TlsDir(std::path::PathBuf);

impl TlsDir {
    fn generate() -> Result<TlsDir> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let tls = |e: transport::tls::TlsError| Error::from(transport::TransportError::from(e));
        // One certificate per process: its tls:// clusters share it, since the process's own
        // connections (scheduler, clients) use one configuration.
        static PAIR: std::sync::OnceLock<transport::tls::ClusterCertificate> =
            std::sync::OnceLock::new();
        let mut fresh = false;
        let pair = match PAIR.get() {
            Some(p) => p,
            None => {
                let generated = transport::tls::ClusterCertificate::generate(&[]).map_err(tls)?;
                fresh = PAIR.set(generated).is_ok();
                PAIR.get().expect("just set")
            }
        };
        if fresh {
            crate::net::set_tls(transport::tls::TlsConfig::cluster(pair).map_err(tls)?).map_err(
                |_| {
                    Error::Config(
                        "this process set its own TLS configuration; a tls:// LocalCluster \
                         makes its own certificate"
                            .into(),
                    )
                },
            )?;
        }
        let dir = std::env::temp_dir().join(format!(
            "dask-comm-tls-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let io = |e| Error::os("writing the cluster's certificate", e);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io)?;
        std::fs::write(dir.join("cert.pem"), &pair.cert_pem).map_err(io)?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join("key.pem"))
            .and_then(|mut f| f.write_all(pair.key_pem.as_bytes()))
            .map_err(io)?;
        Ok(TlsDir(dir))
    }
}

impl Drop for TlsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCluster")
            .field("address", &self.address)
            .finish()
    }
}

/// If this process was started as a worker of a [`LocalCluster`], runs the worker and exits
/// the process; otherwise returns at once. [`LocalCluster::new`] calls it first; call it
/// yourself at the top of `main` (after registering functions) to keep worker processes from
/// running anything else.
pub fn run_if_worker() {
    if std::env::var_os(ENV_ROLE).is_none() {
        return;
    }
    let code = match worker_from_env() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("dask-comm worker: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn worker_from_env() -> Result<()> {
    let var = |k: &str| {
        std::env::var(k).map_err(|_| Error::Config(format!("worker process without {k}")))
    };
    let scheduler: Address = var(ENV_SCHEDULER)?
        .parse()
        .map_err(transport::TransportError::from)?;
    let secret = Secret::from_hex(&var(ENV_SECRET)?)?;
    let nthreads = var(ENV_THREADS)?
        .parse()
        .map_err(|_| Error::Config(format!("{ENV_THREADS} is not a number")))?;
    let mut opts = WorkerOptions::new(scheduler, secret, nthreads);
    opts.name = var(ENV_NAME)?;
    opts.zero_work = std::env::var_os(ENV_ZERO).is_some();
    opts.memory_limit = std::env::var(ENV_MEMORY)
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::os("starting the worker's runtime", e))?;
    rt.block_on(run_worker(opts))
}

impl LocalCluster {
    /// A scheduler and `workers` worker processes of `threads_per_worker` threads, over TCP
    /// on loopback.
    pub fn new(workers: usize, threads_per_worker: usize) -> Result<LocalCluster> {
        LocalCluster::with(ClusterOptions {
            workers,
            threads_per_worker,
            ..Default::default()
        })
    }

    /// A cluster as `opts` says.
    pub fn with(opts: ClusterOptions) -> Result<LocalCluster> {
        run_if_worker();
        if opts.workers == 0 || opts.threads_per_worker == 0 {
            return Err(Error::Config(format!(
                "a local cluster needs at least one worker with at least one thread \
                 (asked for {} workers × {} threads)",
                opts.workers, opts.threads_per_worker
            )));
        }
        if opts.processes && opts.protocol == Protocol::Inproc {
            return Err(Error::Config(
                "inproc:// works only with in-process workers".into(),
            ));
        }
        let rt = Runtime::new("dask-cluster")?;
        let secret = Secret::generate();
        let tls_dir = match opts.protocol {
            Protocol::Tls => Some(TlsDir::generate()?),
            _ => None,
        };
        let listen: Address = match opts.protocol {
            Protocol::Tcp => "tcp://127.0.0.1:0".parse(),
            Protocol::Ucx => "ucx://127.0.0.1:0".parse(),
            Protocol::Tls => "tls://127.0.0.1:0".parse(),
            Protocol::Inproc => format!("inproc://cluster-{:016x}", rand::random::<u64>()).parse(),
        }
        .map_err(transport::TransportError::from)?;
        let s = secret.clone();
        let scheduler =
            block_on(rt.run(async move {
                SchedulerServer::start(&listen, s, Default::default()).await
            }))??;
        let address = scheduler.address().clone();
        let workers = if opts.processes {
            let exe = std::env::current_exe().map_err(|e| Error::os("finding this program", e))?;
            let mut children = Vec::with_capacity(opts.workers);
            for i in 0..opts.workers {
                let mut cmd = Command::new(&exe);
                cmd.args(std::env::args_os().skip(1))
                    .env(ENV_ROLE, "1")
                    .env(ENV_SCHEDULER, address.to_string())
                    .env(ENV_SECRET, secret.to_hex())
                    .env(ENV_THREADS, opts.threads_per_worker.to_string())
                    .env(ENV_NAME, format!("local-{i}"))
                    .env(ENV_MEMORY, opts.memory_limit.to_string());
                if let Some(dir) = &tls_dir {
                    cmd.env(crate::net::ENV_TLS_DIR, &dir.0);
                }
                if opts.zero_work {
                    cmd.env(ENV_ZERO, "1");
                }
                children.push(
                    cmd.spawn()
                        .map_err(|e| Error::os("starting a worker process", e))?,
                );
            }
            Workers::Processes(children)
        } else {
            let mut tasks = Vec::with_capacity(opts.workers);
            for i in 0..opts.workers {
                let mut o =
                    WorkerOptions::new(address.clone(), secret.clone(), opts.threads_per_worker);
                o.name = format!("inproc-{i}");
                o.zero_work = opts.zero_work;
                o.memory_limit = opts.memory_limit;
                tasks.push(rt.handle().spawn(run_worker(o)));
            }
            Workers::InProcess(tasks)
        };
        let mut cluster = LocalCluster {
            scheduler: Some(scheduler),
            workers,
            address,
            secret,
            rt,
            _tls_dir: tls_dir,
        };
        cluster.wait_for_workers(opts.workers)?;
        tracing::info!(address = %cluster.address, workers = opts.workers, "local cluster ready");
        Ok(cluster)
    }

    fn wait_for_workers(&mut self, n: usize) -> Result<()> {
        let client = self.client()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if client.workers().len() >= n {
                return Ok(());
            }
            if let Workers::Processes(children) = &mut self.workers {
                for c in children.iter_mut() {
                    if let Ok(Some(status)) = c.try_wait() {
                        return Err(Error::Config(format!(
                            "a worker process exited at start ({status})"
                        )));
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "{} of {n} workers joined within 60 s",
                    client.workers().len()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The scheduler's address.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// The cluster's secret.
    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    /// A new client of this cluster.
    pub fn client(&self) -> Result<Client> {
        Client::connect_blocking(&self.address, self.secret.clone())
    }

    /// Stops the workers and the scheduler (also done on drop).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(s) = self.scheduler.take() {
            block_on(async {
                let _ = self.rt.run(s.shutdown()).await;
            });
        }
        match &mut self.workers {
            Workers::Processes(children) => {
                // Told to close by the scheduler; give them a moment, then make sure.
                let deadline = Instant::now() + Duration::from_secs(5);
                for c in children.iter_mut() {
                    while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    if matches!(c.try_wait(), Ok(None)) {
                        tracing::warn!(pid = c.id(), "a worker did not exit: killed");
                        let _ = c.kill();
                    }
                    let _ = c.wait();
                }
                children.clear();
            }
            Workers::InProcess(tasks) => {
                for t in tasks.drain(..) {
                    t.abort();
                }
            }
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
    }
}
