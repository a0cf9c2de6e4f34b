//! Starvation drills: a worker alive and heartbeating but short of a resource, the kind of
//! failure that leaves a "healthy" worker useless.
//!
//! - [`stalled_spill`]: a worker's spill directory stops answering (its next spill file is a
//!   FIFO no one reads, so the spill thread's `open` blocks as on a hung network mount) while
//!   the worker holds more than its memory target. The worker must go on computing with its
//!   values in memory, heartbeating, serving its peers: the answer arrives, exact, and the
//!   worker is not removed.
//! - [`fd_limit`]: a worker's file-descriptor limit (`RLIMIT_NOFILE`, lowered on the live
//!   process) filled by a flood of connections to its data server during a wide shuffle. The
//!   answer arrives, exact, and a new connection is admitted with the flood still there (the
//!   accept loop goes on past `EMFILE`, closing silent connections to make room), or, where the process's transport did not survive
//!   (UCX's own listener at `EMFILE`, see `docs/resilience.md`), the worker finds itself cut
//!   off, exits with [`EXIT_REMOVED`](crate::EXIT_REMOVED) and is started afresh.
//!
//! Each reports its times; the callers assert the answers and bounds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dask_graph::{Arg, Graph, Key, Task};
use rand::{Rng, SeedableRng};

use super::freeze::{signal, wait_for, Times};
use super::{blobs, gather_within, int, registered_pids, tree};
use crate::cluster::{ClusterOptions, LocalCluster, Protocol};
use crate::error::{Error, Result};
use crate::worker::MemoryLimit;

/// What [`stalled_spill`] saw.
#[derive(Debug, Clone)]
pub struct StalledSpillReport {
    /// Trials run; each answer was exact.
    pub trials: usize,
    /// From the persist to the stalled worker's spill thread blocked in `open`.
    pub stalled_after: Times,
    /// From the stall to the answer.
    pub answered: Times,
    /// An undisturbed run of the same graph, for scale.
    pub undisturbed: Duration,
    /// Workers the scheduler removed while their spill directory stalled (it must not).
    pub removed_while_stalled: u64,
    /// Stalled workers that exited past their memory limit meanwhile (to be restarted).
    pub memory_exits: usize,
}

/// `trials` trials on 2 worker processes over `protocol`, each with a memory limit of
/// `limit`: each trial persists blobs of `chunk` bytes, three quarters of the limit per
/// worker (more than the target, 0.6), after planting FIFOs as the next spill files of one
/// worker (fresh each trial); waits until its spill thread blocks opening one; sums the
/// blobs (checked against the formula) within `trial_limit`; then kills the stalled worker
/// (its disk never comes back) and waits for its replacement.
pub fn stalled_spill(
    protocol: Protocol,
    trials: usize,
    limit: u64,
    chunk: usize,
    seed: u64,
    trial_limit: Duration,
) -> Result<StalledSpillReport> {
    let cluster = LocalCluster::with(ClusterOptions {
        workers: 2,
        threads_per_worker: 1,
        memory_limit: MemoryLimit::Bytes(limit),
        protocol,
        ..Default::default()
    })?;
    let client = cluster.client()?;
    let n = (limit * 3 / 2).div_ceil(chunk as u64) as u32;
    let answer: i64 = (0..n as i64).map(|i| (i % 251) * chunk as i64).sum();
    let graph = |tag: &str| {
        let mut g = Graph::new();
        let bs = blobs(&mut g, &format!("stall-blob-{tag}"), n, chunk);
        let mut sums = Graph::new();
        let ks: Vec<Key> = bs
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                let k = Key::from((format!("stall-sum-{tag}").as_str(), i as u32));
                sums.insert(k, Task::new("drill-bytesum", [Arg::key(b)]));
                k
            })
            .collect();
        let root = tree(&mut sums, &format!("stall-total-{tag}"), ks, 8);
        (g, bs, sums, root)
    };
    let run = |tag: &str, before_sums: &mut dyn FnMut() -> Result<()>| -> Result<i64> {
        let (g, bs, sums, root) = graph(tag);
        let held = client.blocking().persist(g, &bs)?;
        before_sums()?;
        let fs = client.blocking().persist(sums, &[root])?;
        let got = gather_within(&client, fs, trial_limit);
        drop(held);
        got
    };
    let t0 = Instant::now();
    let got = run("warm", &mut || Ok(()))?;
    let undisturbed = t0.elapsed();
    if got != answer {
        return Err(Error::Unexpected(format!(
            "undisturbed: {got}, expected {answer}"
        )));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut r = StalledSpillReport {
        trials: 0,
        stalled_after: Times::default(),
        answered: Times::default(),
        undisturbed,
        removed_while_stalled: 0,
        memory_exits: 0,
    };
    let mut killed: Vec<u32> = Vec::new();
    for trial in 0..trials {
        let running = cluster.worker_pids();
        killed.retain(|p| running.contains(p));
        let pids = registered_pids(&cluster, &client, 2, &killed, Duration::from_secs(30))?;
        let victim = pids[rng.gen_range(0..pids.len())];
        let dir = spill_dir_of(cluster.local_directory(), victim).ok_or_else(|| {
            Error::Unexpected(format!("trial {trial}: no spill directory for {victim}"))
        })?;
        plant_fifos(&dir, 4096)?;
        let lost_before = cluster.scheduler_stats()?.0.workers_lost;
        let started = Instant::now();
        let mut stalled = None;
        let got = run(&format!("t{trial}"), &mut || {
            let at = wait_for(trial_limit, || Ok(spill_thread_blocked(victim))).map_err(|e| {
                Error::Unexpected(format!(
                    "trial {trial}: the spill thread of {victim} never blocked: {e}"
                ))
            })?;
            stalled = Some(at);
            Ok(())
        })
        .map_err(|e| Error::Unexpected(format!("trial {trial}: {e}")))?;
        let stalled = stalled.expect("set before the sums");
        r.answered.0.push(stalled.elapsed());
        r.stalled_after.0.push(stalled.duration_since(started));
        if got != answer {
            return Err(Error::Unexpected(format!(
                "trial {trial}: {got}, expected {answer}"
            )));
        }
        let memory_exit = cluster
            .worker_exits()
            .iter()
            .any(|&(p, c)| p == victim && c == Some(crate::worker::memory::EXIT_MEMORY));
        r.memory_exits += memory_exit as usize;
        let lost = cluster.scheduler_stats()?.0.workers_lost - lost_before;
        r.removed_while_stalled += lost.saturating_sub(memory_exit as u64);
        // Its disk does not come back: the process is replaced.
        if cluster.worker_pids().contains(&victim) {
            signal(victim, libc::SIGKILL)?;
        }
        killed.push(victim);
        r.trials += 1;
    }
    Ok(r)
}

/// The spill directory of worker process `pid` under `root` (`dask-comm-spill-<pid>-*`,
/// searched a few levels down).
fn spill_dir_of(root: &Path, pid: u32) -> Option<PathBuf> {
    let prefix = format!("dask-comm-spill-{pid}-");
    let mut dirs = vec![(root.to_path_buf(), 0)];
    while let Some((d, depth)) = dirs.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let p = e.path();
            if !p.is_dir() {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                return Some(p);
            }
            if depth < 3 {
                dirs.push((p, depth + 1));
            }
        }
    }
    None
}

/// FIFOs at the names of the next `n` spill files in `dir` (`1.spill` on; a fresh worker
/// has written none), so that opening one for writing blocks until a reader comes, which
/// none does.
fn plant_fifos(dir: &Path, n: u32) -> Result<()> {
    for i in 1..=n {
        let p = dir.join(format!("{i}.spill"));
        if p.exists() {
            continue;
        }
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
            .map_err(|e| Error::Unexpected(format!("a path with a NUL: {e}")))?;
        // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(Error::os(
                format!("mkfifo {}", p.display()),
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// Whether worker process `pid`'s spill thread is blocked in `openat` (reads
/// `/proc/<pid>/task/*/comm` and `syscall`).
fn spill_thread_blocked(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        // Thread names are cut to 15 bytes: "dask-worker-spill" reads "dask-worker-spi".
        comm.trim() == "dask-worker-spi"
            && std::fs::read_to_string(t.path().join("syscall"))
                .is_ok_and(|s| s.split_whitespace().next() == Some(&libc::SYS_openat.to_string()))
    })
}

/// What [`fd_limit`] saw.
#[derive(Debug, Clone)]
pub struct FdLimitReport {
    /// Trials run; each answer was `Inline`'s.
    pub trials: usize,
    /// Trials in which the victim's descriptor table was full (the limit reached) during the
    /// shuffle.
    pub filled: usize,
    /// From the shuffle's start (the flood in place) to its answer.
    pub answered: Times,
    /// From a new connection's start, the flood still there, to its admission by the
    /// victim's data server.
    pub recovered: Times,
    /// Victims that found themselves cut off instead (their transport broken) and exited
    /// with [`EXIT_REMOVED`](crate::EXIT_REMOVED) to be started afresh, and were.
    pub replaced: usize,
    /// Workers the scheduler counted lost beyond the replaced victims (it must not).
    pub removed: u64,
    /// The scheduler's shuffle restarts over all trials.
    pub shuffle_restarts: u64,
    /// An undisturbed run, for scale.
    pub undisturbed: Duration,
}

/// The sizes of an [`fd_limit`] drill.
#[derive(Debug, Clone, Copy)]
pub struct FdLimitDrill {
    /// Trials.
    pub trials: usize,
    /// The shuffle's inputs and outputs.
    pub inputs: u32,
    /// The shuffle's outputs.
    pub parts: u32,
    /// Descriptors the victim may open beyond those open when its limit is lowered.
    pub headroom: u64,
    /// Connections opened to its data server.
    pub flood: usize,
    /// How long the table stays full before the shuffle starts.
    pub hold: Duration,
}

/// `trials` trials on 3 worker processes over `protocol`: in each, one worker's soft
/// `RLIMIT_NOFILE` is lowered to its open descriptors plus `headroom`, `flood` connections
/// are opened to its data server (each holding a descriptor there until it is closed) and
/// held for `hold`, and a shuffle of `inputs` × `parts` runs (answer checked against `Inline`'s within `trial_limit`);
/// then the flood is closed, the limit restored, and a new data connection must be admitted.
pub fn fd_limit(
    protocol: Protocol,
    d: FdLimitDrill,
    seed: u64,
    trial_limit: Duration,
) -> Result<FdLimitReport> {
    let FdLimitDrill {
        trials,
        inputs,
        parts,
        headroom,
        flood,
        hold,
    } = d;
    let (g, key) = super::shuffle_graph("sync", inputs, parts, 0);
    let answer = int(&dask_graph::Scheduler::get(&dask_graph::Inline, g, &[key])?[0])?;
    let cluster = LocalCluster::with(ClusterOptions {
        workers: 3,
        threads_per_worker: 1,
        protocol,
        // UCX's listener retries a failed accept at once and logs each failure: at `EMFILE`
        // that is a busy loop writing millions of lines a minute.
        worker_env: vec![("UCX_LOG_LEVEL".into(), "fatal".into())],
        ..Default::default()
    })?;
    let client = cluster.client()?;
    registered_pids(&cluster, &client, 3, &[], Duration::from_secs(30))?;
    let t0 = Instant::now();
    let (g, key) = super::shuffle_graph("warm", inputs, parts, 0);
    let got = gather_within(&client, client.blocking().persist(g, &[key])?, trial_limit)?;
    let undisturbed = t0.elapsed();
    if got != answer {
        return Err(Error::Unexpected(format!(
            "undisturbed: {got}, Inline says {answer}"
        )));
    }
    let stats_before = cluster.scheduler_stats()?.0;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::os("a runtime for the drill", e))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut r = FdLimitReport {
        trials: 0,
        filled: 0,
        answered: Times::default(),
        recovered: Times::default(),
        replaced: 0,
        removed: 0,
        shuffle_restarts: 0,
        undisturbed,
    };
    let mut gone: Vec<u32> = Vec::new();
    for trial in 0..trials {
        let pids = registered_pids(&cluster, &client, 3, &gone, Duration::from_secs(30))?;
        let workers = client.workers();
        let victim = pids[rng.gen_range(0..pids.len())];
        let address = workers
            .iter()
            .find(|w| w.pid == victim)
            .map(|w| w.address.clone())
            .ok_or_else(|| Error::Unexpected(format!("trial {trial}: {victim} unknown")))?;
        let socket = socket_of(&address)?;
        let old = nofile(victim, None)?;
        let lowered = open_fds(victim) + headroom;
        nofile(victim, Some((lowered, old.1)))?;
        let restore = Restore { pid: victim, old };
        // The flood: until the victim's listen queue is full too (a connect that fails or
        // times out), each connection a descriptor there once accepted.
        let mut conns = Vec::with_capacity(flood);
        for _ in 0..flood {
            match std::net::TcpStream::connect_timeout(&socket, Duration::from_millis(500)) {
                Ok(s) => conns.push(s),
                Err(_) => break,
            }
        }
        let filled = wait_for(Duration::from_secs(10), || Ok(open_fds(victim) >= lowered)).is_ok();
        r.filled += filled as usize;
        // Held a while, as a real burst is: the shuffle starts into it.
        std::thread::sleep(hold);
        let (g, key) = super::shuffle_graph(&format!("t{trial}"), inputs, parts, 0);
        let flooded = Instant::now();
        let got = gather_within(&client, client.blocking().persist(g, &[key])?, trial_limit)
            .map_err(|e| Error::Unexpected(format!("trial {trial}: {e}")))?;
        if got != answer {
            return Err(Error::Unexpected(format!(
                "trial {trial}: {got}, Inline says {answer}"
            )));
        }
        r.answered.0.push(flooded.elapsed());
        // A new data connection, the flood still there: the server closes flood connections
        // short of the challenge to make room (or the victim, cut off, is gone).
        let released = Instant::now();
        let addr: transport::Address = address
            .parse()
            .map_err(|e| Error::Unexpected(format!("{address}: {e}")))?;
        let secret = cluster.secret().clone();
        // A new data connection admitted, or the victim gone (it found itself cut off).
        let admitted = rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if !cluster.worker_pids().contains(&victim) {
                    return Ok(None);
                }
                let hello = crate::protocol::Hello::Data {
                    name: "fd-limit-drill".into(),
                };
                match tokio::time::timeout(
                    Duration::from_secs(5),
                    crate::net::dial(&addr, &secret, hello),
                )
                .await
                {
                    Ok(Ok(conn)) => {
                        let _ = conn.close().await;
                        return Ok(Some(Instant::now()));
                    }
                    Ok(Err(e)) if Instant::now() > deadline => return Err(e),
                    Err(_) if Instant::now() > deadline => {
                        return Err(Error::Timeout("no data connection admitted".into()))
                    }
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        let admitted = admitted.map_err(|e| {
            Error::Unexpected(format!(
                "trial {trial}: the data server of {victim} admits nothing after the flood: {e}"
            ))
        })?;
        drop(conns);
        drop(restore);
        match admitted {
            Some(at) => r.recovered.0.push(at.duration_since(released)),
            None => {
                // It must have exited to be started afresh, and been.
                let code = wait_for(Duration::from_secs(30), || {
                    Ok(cluster.worker_exits().iter().any(|&(p, _)| p == victim))
                })
                .ok()
                .and_then(|_| {
                    let exits = cluster.worker_exits();
                    exits
                        .iter()
                        .find(|&&(p, _)| p == victim)
                        .and_then(|&(_, c)| c)
                });
                if code != Some(crate::worker::EXIT_REMOVED) {
                    return Err(Error::Unexpected(format!(
                        "trial {trial}: the flooded worker {victim} exited with {code:?}, not EXIT_REMOVED"
                    )));
                }
                registered_pids(&cluster, &client, 3, &[victim], Duration::from_secs(30))
                    .map_err(|e| Error::Unexpected(format!("trial {trial}: not replaced: {e}")))?;
                r.replaced += 1;
                gone.push(victim);
            }
        }
        r.trials += 1;
    }
    let stats = cluster.scheduler_stats()?.0;
    r.removed = (stats.workers_lost - stats_before.workers_lost).saturating_sub(r.replaced as u64);
    r.shuffle_restarts = stats.shuffle_restarts - stats_before.shuffle_restarts;
    Ok(r)
}

/// The socket address of a `tcp://` or `ucx://` worker address.
fn socket_of(address: &str) -> Result<std::net::SocketAddr> {
    let hostport = address
        .split_once("://")
        .map_or(address, |(_, rest)| rest)
        .trim_end_matches('/');
    use std::net::ToSocketAddrs;
    hostport
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::Unexpected(format!("not a socket address: {address}")))
}

/// Descriptors open in process `pid`.
fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// Process `pid`'s `RLIMIT_NOFILE` (soft, hard), set to `new` when given (the old one is
/// returned).
fn nofile(pid: u32, new: Option<(u64, u64)>) -> Result<(u64, u64)> {
    let set = new.map(|(soft, hard)| libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    });
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: both pointers are to live `rlimit`s (or null for "do not set") for the call.
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            set.as_ref().map_or(std::ptr::null(), |s| s as *const _),
            &mut old,
        )
    };
    if rc != 0 {
        return Err(Error::os(
            format!("prlimit {pid} RLIMIT_NOFILE"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok((old.rlim_cur, old.rlim_max))
}

/// Puts a process's descriptor limit back when dropped (a failed trial too).
struct Restore {
    pid: u32,
    old: (u64, u64),
}

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = nofile(self.pid, Some(self.old));
    }
}
