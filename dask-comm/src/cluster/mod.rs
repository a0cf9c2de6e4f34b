//! A cluster on this machine: a scheduler, and workers as processes (the same binary,
//! re-executed in the worker role) or, for tests, tasks in this process over `inproc://`.
//!
//! Every process of a cluster must register the same functions. Worker processes run the
//! program's `main` again up to [`run_if_worker`], where they become workers and never return:
//! call it at the top of `main`, after registering functions, and do nothing before it that a
//! worker should not repeat. [`LocalCluster::new`] in a worker process is refused
//! ([`Error::Config`]) rather than starting a cluster of its own.
//!
//! Worker processes are supervised: one that dies (killed, crashed, or past its memory
//! `terminate` threshold) is restarted, and the scheduler reschedules its work; one that
//! exits cleanly (retired, or told to close) is not. Each worker gets a memory limit (by
//! default the machine's memory shared among the workers) and spills to a folder of the
//! cluster's, removed with it.
//!
//! ```no_run
//! use dask_comm::LocalCluster;
//! let inc = dask_graph::registry().register("inc", |x: i64| x + 1);
//! dask_comm::run_if_worker(); // worker processes stop here
//! let cluster = LocalCluster::new(2, 1).unwrap();
//! let client = cluster.client().unwrap();
//! let futures = client.blocking().map(inc, 0..10i64).unwrap();
//! let values = client.blocking().gather(&futures).unwrap();
//! assert_eq!(values[9].downcast_ref::<i64>(), Some(&10));
//! ```

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use transport::Address;

use crate::client::Client;
use crate::core::Config;
use crate::error::{Error, Result};
use crate::runtime::{block_on, Runtime};
use crate::scheduler::SchedulerServer;
use crate::security::Secret;
use crate::worker::{run_worker, MemoryLimit, WorkerOptions};

mod supervise;
mod worker_process;

pub(crate) use supervise::nanny;
use supervise::{supervise, Spawner, Supervised, QUICK_DEATHS};
pub use worker_process::run_if_worker;
use worker_process::*;

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
    /// Workers answer without running tasks (measuring the runtime alone): a benchmark's
    /// knob, not API.
    #[doc(hidden)]
    pub zero_work: bool,
    /// Each worker's memory limit (default: the machine's memory shared among the worker
    /// processes).
    pub memory_limit: MemoryLimit,
    /// Restart worker processes that die (default: yes).
    pub restart: bool,
    /// The scheduler's settings (work stealing, saturation, allowed failures, ...).
    pub scheduler: Config,
    /// Serve the scheduler's dashboard (`None`: no dashboard; see
    /// [`LocalCluster::dashboard_address`]).
    pub dashboard: Option<crate::dashboard::At>,
    /// Environment variables for the worker processes, on top of this process's (UCX's
    /// `UCX_*` settings, `RUST_LOG`, ...).
    pub worker_env: Vec<(String, String)>,
    /// GPUs to pin worker processes to, as `CUDA_VISIBLE_DEVICES` names them (`None`: the
    /// workers see what this process sees). Worker `i` sees this list rotated to start at
    /// its `i % len`-th entry, so its device 0 is a GPU of its own while there are as many
    /// GPUs as workers, as dask-cuda's `LocalCUDACluster` does; a restarted worker takes the
    /// GPU of the one it replaces. [`ClusterOptions::one_worker_per_gpu`] sets the worker
    /// count to match. Worker processes only.
    pub gpus: Option<Vec<usize>>,
    /// Each worker's device memory limit in bytes (`None`: none): see
    /// [`WorkerOptions::device_memory_limit`](crate::WorkerOptions::device_memory_limit).
    pub device_memory_limit: Option<u64>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            workers: 2,
            threads_per_worker: 1,
            protocol: Protocol::Tcp,
            processes: true,
            zero_work: false,
            memory_limit: MemoryLimit::Auto,
            restart: true,
            scheduler: Config::default(),
            dashboard: None,
            worker_env: Vec::new(),
            gpus: None,
            device_memory_limit: None,
        }
    }
}

impl ClusterOptions {
    /// One worker process per GPU of `gpus` (CUDA device ids), each pinned to its own
    /// (see [`ClusterOptions::gpus`]), over `ucx://`, where device frames move GPU to GPU.
    ///
    /// ```
    /// let o = dask_comm::ClusterOptions::one_worker_per_gpu(&[0, 1]);
    /// assert_eq!((o.workers, o.gpus.as_deref()), (2, Some(&[0, 1][..])));
    /// ```
    pub fn one_worker_per_gpu(gpus: &[usize]) -> ClusterOptions {
        ClusterOptions {
            workers: gpus.len(),
            protocol: Protocol::Ucx,
            gpus: Some(gpus.to_vec()),
            ..ClusterOptions::default()
        }
    }

    /// The memory limit each worker gets (`None`: none).
    pub fn worker_memory_limit(&self) -> Option<u64> {
        match self.memory_limit {
            MemoryLimit::Bytes(0) | MemoryLimit::Unlimited => None,
            MemoryLimit::Bytes(m) => Some(m),
            MemoryLimit::Auto if self.processes => {
                crate::worker::memory::machine_memory().map(|m| m / self.workers.max(1) as u64)
            }
            MemoryLimit::Auto => None,
        }
    }
}

enum Workers {
    Processes {
        supervised: Arc<Mutex<Supervised>>,
        spawner: Spawner,
        watcher: Option<std::thread::JoinHandle<()>>,
    },
    InProcess(Vec<tokio::task::JoinHandle<Result<()>>>),
}

/// A scheduler and its workers on this machine. Dropping it shuts them down.
pub struct LocalCluster {
    scheduler: Option<SchedulerServer>,
    dashboard: Option<std::net::SocketAddr>,
    workers: Workers,
    address: Address,
    secret: Secret,
    rt: Runtime,
    opts: ClusterOptions,
    /// The certificate folder of a `tls://` cluster (removed on drop, after the workers).
    _tls_dir: Option<TlsDir>,
    /// The workers' local directory (spill files), removed on drop.
    local_dir: PathBuf,
}

/// A folder holding a cluster's certificate (`cert.pem`, and `key.pem` readable by this user
/// only), removed when dropped. This process uses the certificate too.
struct TlsDir(std::path::PathBuf);

impl TlsDir {
    fn generate() -> Result<TlsDir> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let tls = |e: transport::tls::TlsError| Error::from(transport::Error::from(e));
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

    /// A cluster as `opts` says. Refused in a worker process of another cluster (one started
    /// by this program, whose `main` did not call [`run_if_worker`] first).
    pub fn with(opts: ClusterOptions) -> Result<LocalCluster> {
        if std::env::var_os(ENV_ROLE).is_some() {
            return Err(Error::Config(
                "this process is a worker of a LocalCluster, and would start a cluster of its \
                 own: call dask_comm::run_if_worker() at the top of main, after registering \
                 functions"
                    .into(),
            ));
        }
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
        match &opts.gpus {
            Some(_) if !opts.processes => return Err(Error::Config(
                "pinning workers to GPUs needs worker processes (one process sees one set of GPUs)"
                    .into(),
            )),
            Some(g) if g.is_empty() => {
                return Err(Error::Config(
                    "an empty list of GPUs to pin workers to".into(),
                ))
            }
            _ => {}
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
        .map_err(transport::Error::from)?;
        let s = secret.clone();
        let cfg = opts.scheduler.clone();
        let dashboard_at = opts.dashboard;
        let (scheduler, dashboard) = block_on(rt.run(async move {
            let mut server = SchedulerServer::start(&listen, s, cfg).await?;
            let dashboard = match dashboard_at {
                Some(at) => Some(crate::dashboard::start(&mut server, at).await?),
                None => None,
            };
            Ok::<_, Error>((server, dashboard))
        }))??;
        let address = scheduler.address().clone();
        let local_dir = std::env::temp_dir().join(format!(
            "dask-comm-cluster-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&local_dir)
            .map_err(|e| Error::os(format!("creating {}", local_dir.display()), e))?;
        let memory_limit = opts.worker_memory_limit();
        let workers = if opts.processes {
            let exe = std::env::current_exe().map_err(|e| Error::os("finding this program", e))?;
            let mut env: Vec<(String, std::ffi::OsString)> = vec![
                (ENV_SCHEDULER.into(), address.to_string().into()),
                (ENV_SECRET.into(), secret.to_hex().into()),
                (
                    ENV_THREADS.into(),
                    opts.threads_per_worker.to_string().into(),
                ),
                (
                    ENV_MEMORY.into(),
                    memory_limit.unwrap_or(0).to_string().into(),
                ),
                (ENV_LOCAL_DIR.into(), local_dir.clone().into()),
                (ENV_PARENT.into(), std::process::id().to_string().into()),
            ];
            env.extend(
                opts.worker_env
                    .iter()
                    .map(|(k, v)| (k.clone(), std::ffi::OsString::from(v))),
            );
            let mut dirs = vec![local_dir.clone()];
            if let Some(dir) = &tls_dir {
                env.push((crate::net::ENV_TLS_DIR.into(), dir.0.clone().into()));
                dirs.push(dir.0.clone());
            }
            if let Ok(dirs) = std::env::join_paths(dirs) {
                env.push((ENV_CLUSTER_DIRS.into(), dirs));
            }
            if opts.zero_work {
                env.push((ENV_ZERO.into(), "1".into()));
            }
            if let Some(d) = opts.device_memory_limit {
                env.push((ENV_DEVICE_MEMORY.into(), d.to_string().into()));
            }
            let spawner = Spawner {
                exe,
                args: std::env::args_os().skip(1).collect(),
                env,
                local_dir: local_dir.clone(),
                gpus: opts.gpus.clone().unwrap_or_default(),
            };
            let supervised = Arc::new(Mutex::new(Supervised::default()));
            {
                let mut s = supervised.lock().unwrap_or_else(|e| e.into_inner());
                for i in 0..opts.workers {
                    let name = format!("local-{i}");
                    let child = spawner.spawn(&name, i)?;
                    s.children.push((child, name, Instant::now(), i));
                }
                s.next_name = opts.workers;
            }
            let watcher = {
                let (sup, sp, restart) = (Arc::clone(&supervised), spawner.clone(), opts.restart);
                std::thread::Builder::new()
                    .name("dask-supervisor".into())
                    .spawn(move || supervise(sup, sp, restart))
                    .map_err(|e| Error::os("starting the supervisor thread", e))?
            };
            Workers::Processes {
                supervised,
                spawner,
                watcher: Some(watcher),
            }
        } else {
            let mut tasks = Vec::with_capacity(opts.workers);
            for i in 0..opts.workers {
                tasks.push(rt.handle().spawn(run_worker(in_process_worker(
                    &address, &secret, &opts, &local_dir, i,
                ))));
            }
            Workers::InProcess(tasks)
        };
        let mut cluster = LocalCluster {
            scheduler: Some(scheduler),
            dashboard,
            workers,
            address,
            secret,
            rt,
            opts: opts.clone(),
            _tls_dir: tls_dir,
            local_dir,
        };
        cluster.wait_for_workers(opts.workers)?;
        tracing::info!(address = %cluster.address, workers = opts.workers, "local cluster ready");
        Ok(cluster)
    }

    /// Starts `n` more workers (processes, or tasks for an in-process cluster); they get work
    /// as soon as they join. Returns once they have.
    pub fn add_workers(&mut self, n: usize) -> Result<()> {
        let before = self.client()?.workers().len();
        match &mut self.workers {
            Workers::Processes {
                supervised,
                spawner,
                ..
            } => {
                let mut s = supervised.lock().unwrap_or_else(|e| e.into_inner());
                for _ in 0..n {
                    // The next place among the live workers (restarts keep theirs).
                    let slot = s.children.len();
                    let name = format!("local-{}", s.next_name);
                    s.next_name += 1;
                    let child = spawner.spawn(&name, slot)?;
                    s.children.push((child, name, Instant::now(), slot));
                }
            }
            Workers::InProcess(tasks) => {
                for _ in 0..n {
                    let i = tasks.len();
                    let o = in_process_worker(
                        &self.address,
                        &self.secret,
                        &self.opts,
                        &self.local_dir,
                        i,
                    );
                    tasks.push(self.rt.handle().spawn(run_worker(o)));
                }
            }
        }
        self.wait_for_workers(before + n)
    }

    /// The process ids of the worker processes running now (empty for in-process workers).
    pub fn worker_pids(&self) -> Vec<u32> {
        match &self.workers {
            Workers::Processes { supervised, .. } => supervised
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .children
                .iter()
                .map(|(c, ..)| c.id())
                .collect(),
            Workers::InProcess(_) => Vec::new(),
        }
    }

    /// Worker processes that ended while the cluster ran (the latest 1,024): process id and
    /// exit code (`None` for a death by signal), e.g. [`EXIT_REMOVED`](crate::EXIT_REMOVED)
    /// for one the scheduler removed.
    pub fn worker_exits(&self) -> Vec<(u32, Option<i32>)> {
        match &self.workers {
            Workers::Processes { supervised, .. } => supervised
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .exits
                .iter()
                .copied()
                .collect(),
            Workers::InProcess(_) => Vec::new(),
        }
    }

    /// Worker processes the supervisor restarted after they died.
    pub fn restarts(&self) -> u64 {
        match &self.workers {
            Workers::Processes { supervised, .. } => {
                supervised
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .restarts
            }
            Workers::InProcess(_) => 0,
        }
    }

    /// What the scheduler counted since it started (workers lost and retired, tasks
    /// rescheduled and recomputed, steals, retries, tasks per worker), and its workers now.
    pub fn scheduler_stats(&self) -> Result<(crate::core::Stats, Vec<crate::core::WorkerSummary>)> {
        let s = self
            .scheduler
            .as_ref()
            .ok_or_else(|| Error::Disconnected("the cluster is shut down".into()))?;
        block_on(self.rt.run(s.stats()))?
    }

    /// Up to 50 tasks the scheduler holds that are not done, one line each (for diagnosing a
    /// computation that does not finish).
    pub fn describe_pending(&self) -> Result<Vec<String>> {
        let s = self
            .scheduler
            .as_ref()
            .ok_or_else(|| Error::Disconnected("the cluster is shut down".into()))?;
        block_on(self.rt.run(s.describe_pending()))?
    }

    /// The workers' local directory (their spill folders are made in it).
    pub fn local_directory(&self) -> &std::path::Path {
        &self.local_dir
    }

    fn wait_for_workers(&mut self, n: usize) -> Result<()> {
        let client = self.client()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if client.workers().len() >= n {
                return Ok(());
            }
            if let Workers::Processes { supervised, .. } = &self.workers {
                let s = supervised.lock().unwrap_or_else(|e| e.into_inner());
                if s.quick_deaths >= QUICK_DEATHS || (!self.opts.restart && s.children.len() < n) {
                    return Err(Error::Config(
                        "worker processes exit at start (see their messages above)".into(),
                    ));
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

    /// Where the scheduler's dashboard listens (`http://{it}/`), when
    /// [`ClusterOptions::dashboard`] asked for one.
    pub fn dashboard_address(&self) -> Option<std::net::SocketAddr> {
        self.dashboard
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
        // The supervisor first: workers that exit from here on are not replaced.
        if let Workers::Processes {
            supervised,
            watcher,
            ..
        } = &mut self.workers
        {
            supervised
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .stopping = true;
            if let Some(w) = watcher.take() {
                let _ = w.join();
            }
        }
        if let Some(s) = self.scheduler.take() {
            block_on(async {
                let _ = self.rt.run(s.shutdown()).await;
            });
        }
        match &mut self.workers {
            Workers::Processes {
                supervised,
                spawner,
                ..
            } => {
                let mut s = supervised.lock().unwrap_or_else(|e| e.into_inner());
                // Told to close by the scheduler; give them a moment, then make sure.
                let deadline = Instant::now() + Duration::from_secs(5);
                for (c, ..) in s.children.iter_mut() {
                    while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    if matches!(c.try_wait(), Ok(None)) {
                        tracing::warn!(pid = c.id(), "a worker did not exit: killed");
                        let _ = c.kill();
                    }
                    let _ = c.wait();
                    spawner.clean_after(c.id());
                }
                s.children.clear();
            }
            Workers::InProcess(tasks) => {
                for t in tasks.drain(..) {
                    t.abort();
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.local_dir);
    }
}

/// Options for in-process worker number `i`.
fn in_process_worker(
    address: &Address,
    secret: &Secret,
    opts: &ClusterOptions,
    local_dir: &std::path::Path,
    i: usize,
) -> WorkerOptions {
    let mut o = WorkerOptions::new(address.clone(), secret.clone(), opts.threads_per_worker);
    o.name = format!("inproc-{i}");
    o.zero_work = opts.zero_work;
    o.memory_limit = opts.worker_memory_limit();
    o.device_memory_limit = opts.device_memory_limit;
    o.local_directory = Some(local_dir.to_path_buf());
    // One process for all: its RSS is not one worker's.
    o.process_memory = false;
    o
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn memory_limits_say_what_each_worker_gets() {
        let with = |memory_limit, processes| ClusterOptions {
            memory_limit,
            processes,
            workers: 4,
            ..ClusterOptions::default()
        };
        assert_eq!(
            with(MemoryLimit::Bytes(1 << 30), true).worker_memory_limit(),
            Some(1 << 30)
        );
        // 0 bytes is no limit, as it always was.
        assert_eq!(
            with(MemoryLimit::Bytes(0), true).worker_memory_limit(),
            None
        );
        assert_eq!(
            with(MemoryLimit::Unlimited, true).worker_memory_limit(),
            None
        );
        // In-process workers share one process: no automatic limit.
        assert_eq!(with(MemoryLimit::Auto, false).worker_memory_limit(), None);
        let machine = crate::worker::memory::machine_memory();
        assert_eq!(
            with(MemoryLimit::Auto, true).worker_memory_limit(),
            machine.map(|m| m / 4)
        );
    }

    use super::supervise::cuda_visible_devices;
    use super::{ClusterOptions, MemoryLimit};

    #[test]
    fn each_worker_sees_its_own_gpu_first() {
        let gpus = [2, 4, 6];
        assert_eq!(cuda_visible_devices(0, &gpus), "2,4,6");
        assert_eq!(cuda_visible_devices(1, &gpus), "4,6,2");
        assert_eq!(cuda_visible_devices(5, &gpus), "6,2,4");
        assert_eq!(cuda_visible_devices(1, &[0]), "0");
    }
}
