//! The worker processes' side of a [`LocalCluster`](super::LocalCluster): what their
//! environment says (the same binary, re-executed with `DASK_COMM_WORKER` set), and
//! [`run_if_worker`], where such a process becomes a worker and exits.

use std::path::PathBuf;
use std::time::Duration;

use transport::Address;

use crate::error::{Error, Result};
use crate::security::Secret;
use crate::worker::{run_worker, WorkerOptions};

pub(super) const ENV_ROLE: &str = "DASK_COMM_WORKER";
pub(super) const ENV_SCHEDULER: &str = "DASK_COMM_SCHEDULER";
pub(super) const ENV_SECRET: &str = "DASK_COMM_SECRET";
pub(super) const ENV_THREADS: &str = "DASK_COMM_NTHREADS";
pub(super) const ENV_NAME: &str = "DASK_COMM_NAME";
pub(super) const ENV_ZERO: &str = "DASK_COMM_ZERO_WORK";
pub(super) const ENV_MEMORY: &str = "DASK_COMM_MEMORY_LIMIT";
pub(super) const ENV_DEVICE_MEMORY: &str = "DASK_COMM_DEVICE_MEMORY_LIMIT";
pub(super) const ENV_LOCAL_DIR: &str = "DASK_COMM_LOCAL_DIRECTORY";
pub(super) const ENV_LISTEN: &str = "DASK_COMM_LISTEN";
/// Set for a worker whose supervisor is its parent (its process id): it dies with the parent.
pub(super) const ENV_PARENT: &str = "DASK_COMM_PARENT";
/// The cluster's folders, which the workers remove if their parent died without doing so.
pub(super) const ENV_CLUSTER_DIRS: &str = "DASK_COMM_CLUSTER_DIRS";

/// Whether this worker process's supervisor (named by [`ENV_PARENT`]) is gone: it was
/// reparented.
pub(super) fn parent_gone() -> bool {
    let Some(parent) = std::env::var(ENV_PARENT)
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
    else {
        return false;
    };
    std::os::unix::process::parent_id() != parent
}

/// If this process was started as a worker of a [`LocalCluster`](crate::LocalCluster), runs the worker and exits
/// the process; otherwise returns at once. Call it at the top of `main`, after registering
/// functions, in every program that starts a cluster of worker processes.
pub fn run_if_worker() {
    if std::env::var_os(ENV_ROLE).is_none() {
        return;
    }
    // A worker's warnings (a stalled spill directory, refused connections, …) go to its
    // standard error, which it shares with the cluster's process; `RUST_LOG` tunes them.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let r = worker_from_env();
    if let Err(e) = &r {
        eprintln!("dask-comm worker: {e}");
    }
    let code = crate::worker::exit_code(&r);
    // A parent that dies closes its sockets before its children are handed to another: a
    // worker that lost its scheduler with its parent gives the parent a moment to be gone.
    if code != 0 && std::env::var_os(ENV_CLUSTER_DIRS).is_some() {
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while !parent_gone() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    if parent_gone() {
        // The cluster's process died without cleaning up (killed): the last of its workers
        // to go removes the cluster's folders. The first is the spill root, where each
        // worker's own folder goes with it: it can be removed (it is empty) only once every
        // worker that spills has left; then the others (the certificate's) go too.
        let dirs: Vec<PathBuf> = std::env::var_os(ENV_CLUSTER_DIRS)
            .map(|d| std::env::split_paths(&d).collect())
            .unwrap_or_default();
        if let Some((root, rest)) = dirs.split_first() {
            if std::fs::remove_dir(root).is_ok() {
                for d in rest {
                    let _ = std::fs::remove_dir_all(d);
                }
            }
        }
    }
    std::process::exit(code);
}

fn worker_from_env() -> Result<()> {
    crate::worker::raise_descriptor_limit();
    let var = |k: &str| {
        std::env::var(k).map_err(|_| Error::Config(format!("worker process without {k}")))
    };
    let scheduler: Address = var(ENV_SCHEDULER)?
        .parse()
        .map_err(transport::Error::from)?;
    let secret = Secret::from_hex(&var(ENV_SECRET)?)?;
    let nthreads = var(ENV_THREADS)?
        .parse()
        .map_err(|_| Error::Config(format!("{ENV_THREADS} is not a number")))?;
    let mut opts = WorkerOptions::new(scheduler, secret, nthreads);
    opts.handle_signals = true;
    opts.parent = std::env::var(ENV_PARENT)
        .ok()
        .and_then(|p| p.parse::<u32>().ok());
    if parent_gone() {
        return Err(Error::Disconnected(
            "the process that started this worker is gone".into(),
        ));
    }
    opts.name = var(ENV_NAME)?;
    opts.local_directory = std::env::var_os(ENV_LOCAL_DIR).map(PathBuf::from);
    opts.listen = std::env::var(ENV_LISTEN)
        .ok()
        .map(|l| l.parse::<Address>())
        .transpose()
        .map_err(transport::Error::from)?;
    opts.zero_work = std::env::var_os(ENV_ZERO).is_some();
    // 0 (or nothing): no limit.
    opts.memory_limit = std::env::var(ENV_MEMORY)
        .ok()
        .and_then(|m| m.parse().ok())
        .filter(|&m: &u64| m > 0);
    opts.device_memory_limit = std::env::var(ENV_DEVICE_MEMORY)
        .ok()
        .and_then(|m| m.parse().ok());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::os("starting the worker's runtime", e))?;
    rt.block_on(run_worker(opts))
}
