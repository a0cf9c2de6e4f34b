//! How a worker runs: [`WorkerOptions`].

use std::path::PathBuf;
use std::time::Duration;

use transport::Address;

use super::liveness::scheduler_timeout_from_env;
use super::memory::MemoryThresholds;
use crate::security::Secret;

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The scheduler's address.
    pub scheduler: Address,
    /// The cluster's secret.
    pub secret: Secret,
    /// Where this worker serves data (default: loopback, port chosen by the system, in the
    /// scheduler's scheme).
    pub listen: Option<Address>,
    /// Threads that run tasks.
    pub nthreads: usize,
    /// Memory limit in bytes (`None`: none; `Some(0)` is taken for none too): the store
    /// spills, and the worker pauses and exits, at fractions of it (see [`memory`]).
    pub memory_limit: Option<u64>,
    /// The fractions of the memory limit where the worker spills, pauses and exits.
    pub thresholds: MemoryThresholds,
    /// Device (GPU) memory the worker's values may hold, in bytes (`None`: no limit): above
    /// it, the least recently used ones move to host memory, and from there to disk as host
    /// memory fills, as dask-cuda's `device_memory_limit` (values count their device bytes
    /// with `Data::device_nbytes`).
    pub device_memory_limit: Option<u64>,
    /// Where spilled values go (a folder of their own is made there, and removed when the
    /// worker stops; default: the system's temporary directory).
    pub local_directory: Option<PathBuf>,
    /// The process is this worker's alone: its RSS is checked against the spill, pause and
    /// terminate thresholds (default). Off for workers sharing a process (then only the
    /// `target` applies, to the bytes of values).
    pub process_memory: bool,
    /// A name for logs.
    pub name: String,
    /// Answer every task at once without running it or fetching its inputs (to measure the
    /// runtime alone, like RSDS's zero worker). Values are `()`. A benchmark's knob, not API.
    #[doc(hidden)]
    pub zero_work: bool,
    /// A scheduler that answers no heartbeat for this long is taken for lost: the worker
    /// ends with [`Error::Disconnected`] (a process exits with [`EXIT_SCHEDULER_LOST`]).
    /// Default: [`DEFAULT_SCHEDULER_TIMEOUT`], or `DASK_COMM_SCHEDULER_TIMEOUT` (seconds).
    pub scheduler_timeout: Duration,
    /// The worker stops (cleanly, removing its folders) once the process with this id is no
    /// longer its parent: a supervisor's workers do not outlive it, however it ends.
    pub parent: Option<u32>,
    /// The worker is its process's own: SIGTERM stops it cleanly (and SIGINT, unless it has
    /// a parent to follow). Off for workers inside another program, whose signals are that
    /// program's (default: off; the worker processes of `LocalCluster`, the nanny, the
    /// command line and the launchers set it).
    pub handle_signals: bool,
}

/// Each worker's memory limit, as [`ClusterOptions`](crate::ClusterOptions) and
/// [`LaunchOptions`](crate::launch::LaunchOptions) take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryLimit {
    /// The machine's memory shared among the workers on it (default; in-process workers,
    /// which share one process, get no limit).
    #[default]
    Auto,
    /// No limit: workers never spill, pause or exit for memory.
    Unlimited,
    /// This many bytes per worker (0: none, as [`MemoryLimit::Unlimited`]).
    Bytes(u64),
}

impl WorkerOptions {
    /// Options for a worker of `scheduler` with `nthreads` threads.
    pub fn new(scheduler: Address, secret: Secret, nthreads: usize) -> WorkerOptions {
        WorkerOptions {
            scheduler,
            secret,
            listen: None,
            nthreads,
            memory_limit: None,
            thresholds: MemoryThresholds::default(),
            device_memory_limit: None,
            local_directory: None,
            process_memory: true,
            name: format!("worker-{}", std::process::id()),
            zero_work: false,
            scheduler_timeout: scheduler_timeout_from_env(),
            parent: None,
            handle_signals: false,
        }
    }
}

/// Where a worker of `scheduler` serves data unless told: loopback, a port the system picks,
/// in the scheduler's scheme.
pub(super) fn default_listen(scheduler: &Address) -> Address {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    match scheduler {
        Address::Inproc(name) => Address::Inproc(format!(
            "{name}-worker-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        )),
        Address::Tcp { .. } => Address::Tcp {
            host: "127.0.0.1".into(),
            port: 0,
        },
        Address::Ucx { .. } => Address::Ucx {
            host: "127.0.0.1".into(),
            port: 0,
        },
        Address::Tls { .. } => Address::Tls {
            host: "127.0.0.1".into(),
            port: 0,
        },
    }
}

/// Raises this process's soft limit on open descriptors to its hard limit (as Go's runtime
/// does at start): a wide shuffle holds a few descriptors per peer, and the common soft
/// default of 1,024 is what a worker runs out of, while UCX's listener does not survive
/// running out (see `docs/resilience.md`). For the processes `dask-comm` owns (its command
/// line, `LocalCluster`'s workers), never a host program's. Returns the limit now in force.
pub(crate) fn raise_descriptor_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a live `rlimit` for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur >= lim.rlim_max {
        return Some(lim.rlim_cur);
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: `raised` is a live `rlimit` for the call's duration.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        tracing::debug!(soft = lim.rlim_cur, hard = lim.rlim_max, error = %std::io::Error::last_os_error(), "raising the descriptor limit");
        return Some(lim.rlim_cur);
    }
    tracing::debug!(
        from = lim.rlim_cur,
        to = lim.rlim_max,
        "raised the descriptor limit"
    );
    Some(lim.rlim_max)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_descriptor_limit_is_raised_to_the_hard_one() {
        let now = super::raise_descriptor_limit().expect("getrlimit works here");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a live `rlimit` for the call's duration.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!((now, lim.rlim_cur), (lim.rlim_max, lim.rlim_max));
    }
}
