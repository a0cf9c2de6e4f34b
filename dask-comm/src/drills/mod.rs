//! Resilience drills on real worker processes: workers killed at random moments, workers
//! added and retired mid-computation, data several times the memory limit, a hundred
//! thousand root tasks, skewed placement. Each drill checks its answer and reports what
//! happened; `tests/resilience.rs` runs them small, `examples/resilience.rs` at full size.
//!
//! A program that runs drills must call [`register`] and then [`crate::run_if_worker`] at
//! the top of `main`: the drills' clusters re-execute it as their workers.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dask_graph::{registry, Arg, Graph, Key, Scheduler, Task, Value};
use rand::{Rng, SeedableRng};

mod freeze;
pub use freeze::{
    freeze_client, freeze_scheduler, freeze_worker, run_cli_if_asked, run_client_if_asked,
    FreezeClientReport, FreezeSchedulerReport, FreezeWorkerReport, Times,
};
mod starve;
pub use starve::{fd_limit, stalled_spill, FdLimitDrill, FdLimitReport, StalledSpillReport};
mod shuffle;
pub use shuffle::{
    blob_shuffle_graph, shuffle_chaos, shuffle_graph, shuffle_throughput, ShuffleChaosReport,
    ThroughputRound,
};

use crate::client::Client;
use crate::cluster::{ClusterOptions, LocalCluster};
use crate::core::{Config, Stats};
use crate::error::{Error, Result};
use crate::worker::MemoryLimit;

/// Registers the drills' functions (every process of a drill's cluster does).
pub fn register() {
    registry().register("drill-leaf", |i: i64| {
        std::thread::sleep(Duration::from_micros(300));
        i * i % 1_000_003
    });
    registry().register("drill-slow", |x: i64, ms: i64| {
        std::thread::sleep(Duration::from_millis(ms.max(0) as u64));
        x + 1
    });
    registry().register_variadic("drill-sum", |xs: Vec<i64>| xs.iter().sum::<i64>());
    // The first argument is the number of parts; value x goes to part x % parts.
    registry().register_variadic("drill-split", |xs: Vec<i64>| {
        let parts = xs[0].max(1) as usize;
        let mut out = vec![0i64; parts];
        for &x in &xs[1..] {
            out[x.rem_euclid(parts as i64) as usize] += x;
        }
        out
    });
    // Part `j` of every split, summed (the all-to-all of a shuffle).
    registry().register_values("drill-pick", |args: &[Value]| {
        let j = *args[0]
            .downcast_ref::<i64>()
            .ok_or("drill-pick: the part number is an i64")? as usize;
        let mut total = 0i64;
        for a in &args[1..] {
            let parts = a
                .downcast_ref::<Vec<i64>>()
                .ok_or("drill-pick: splits are Vec<i64>")?;
            total += parts.get(j).copied().unwrap_or(0);
        }
        Ok(Value::new(total))
    });
    registry().register("drill-blob", |i: i64, size: i64| {
        Bytes::from(vec![(i % 251) as u8; size.max(0) as usize])
    });
    registry().register_values("drill-bytesum", |args: &[Value]| {
        byte_sum("drill-bytesum", args).map(Value::new)
    });
    // A sum that first sleeps `args[0]` microseconds: tasks pile up on a worker faster than
    // its threads run them.
    registry().register_values("drill-slow-bytesum", |args: &[Value]| {
        let micros = args
            .first()
            .and_then(|a| a.downcast_ref::<i64>())
            .ok_or("drill-slow-bytesum: takes microseconds first")?;
        std::thread::sleep(Duration::from_micros((*micros).max(0) as u64));
        byte_sum("drill-slow-bytesum", &args[1..]).map(Value::new)
    });
    registry().register("drill-hog", |mb: i64| {
        let v = vec![1u8; (mb.max(0) as usize) << 20];
        std::thread::sleep(Duration::from_millis(1500));
        v.iter().map(|&x| x as i64).sum::<i64>()
    });
    shuffle::register();
}

/// The sum of every byte of `args`, each a `Bytes` (the drill function `name` says which
/// argument was not).
fn byte_sum(name: &str, args: &[Value]) -> std::result::Result<i64, String> {
    let mut total = 0i64;
    for (i, a) in args.iter().enumerate() {
        let b = a
            .downcast_ref::<Bytes>()
            .ok_or_else(|| format!("{name}: argument {i} is not Bytes"))?;
        total += b.iter().map(|&x| x as i64).sum::<i64>();
    }
    Ok(total)
}

/// A tree sum (fan-in `fan`) over `keys`, named `name`; returns the root.
fn tree(g: &mut Graph, name: &str, mut keys: Vec<Key>, fan: usize) -> Key {
    let mut level = 0u32;
    while keys.len() > 1 {
        keys = keys
            .chunks(fan)
            .enumerate()
            .map(|(i, c)| {
                let k = Key::from((name, level, i as u32));
                g.insert(k, Task::new("drill-sum", c.iter().map(|&d| Arg::key(d))));
                k
            })
            .collect();
        level += 1;
    }
    keys[0]
}

/// The chaos graph: `leaves` leaf tasks; a tree sum over them (fan-in 4); a shuffle
/// (`splits` tasks each splitting a slice of the leaves into `splits` parts, and `splits`
/// tasks each taking its part of every split: all-to-all); and one task summing both. Keys
/// end in `tag`. Returns the graph and its final key.
pub fn chaos_graph(tag: &str, leaves: u32, splits: u32) -> (Graph, Key) {
    let mut g = Graph::new();
    let leaf = format!("leaf-{tag}");
    let leaf_keys: Vec<Key> = (0..leaves)
        .map(|i| {
            let k = Key::from((leaf.as_str(), i));
            g.insert(k, Task::new("drill-leaf", [Arg::lit(i as i64)]));
            k
        })
        .collect();
    let tree_root = tree(&mut g, &format!("tree-{tag}"), leaf_keys.clone(), 4);
    let splits = splits.max(1);
    let per = (leaves as usize).div_ceil(splits as usize).max(1);
    let split = format!("split-{tag}");
    let split_keys: Vec<Key> = leaf_keys
        .chunks(per)
        .enumerate()
        .map(|(i, c)| {
            let k = Key::from((split.as_str(), i as u32));
            let args =
                std::iter::once(Arg::lit(splits as i64)).chain(c.iter().map(|&d| Arg::key(d)));
            g.insert(k, Task::new("drill-split", args));
            k
        })
        .collect();
    let pick = format!("pick-{tag}");
    let pick_keys: Vec<Key> = (0..splits)
        .map(|j| {
            let k = Key::from((pick.as_str(), j));
            let args =
                std::iter::once(Arg::lit(j as i64)).chain(split_keys.iter().map(|&s| Arg::key(s)));
            g.insert(k, Task::new("drill-pick", args));
            k
        })
        .collect();
    let total = Key::name_only(&format!("total-{tag}"));
    g.insert(
        total,
        Task::new(
            "drill-sum",
            std::iter::once(Arg::key(tree_root)).chain(pick_keys.iter().map(|&p| Arg::key(p))),
        ),
    );
    (g, total)
}

/// `n` tasks named `name` making `size`-byte blobs (`drill-blob`); returns their keys.
fn blobs(g: &mut Graph, name: &str, n: u32, size: usize) -> Vec<Key> {
    (0..n)
        .map(|i| {
            let k = Key::from((name, i));
            g.insert(
                k,
                Task::new("drill-blob", [Arg::lit(i as i64), Arg::lit(size as i64)]),
            );
            k
        })
        .collect()
}

fn int(v: &Value) -> Result<i64> {
    v.downcast_ref::<i64>()
        .copied()
        .ok_or_else(|| Error::Unexpected(format!("expected an i64, got {v:?}")))
}

/// Gathers `key` of `graph` on `client`, failing after `limit` (a drill never hangs).
fn compute_within(client: &Client, graph: Graph, key: Key, limit: Duration) -> Result<i64> {
    let fs = client.blocking().persist(graph, &[key])?;
    gather_within(client, fs, limit)
}

fn gather_within(client: &Client, fs: Vec<crate::client::DFuture>, limit: Duration) -> Result<i64> {
    let (tx, rx) = std::sync::mpsc::channel();
    let c = client.clone();
    std::thread::spawn(move || {
        let r = c.blocking().gather(&fs);
        let _ = tx.send(r);
    });
    match rx.recv_timeout(limit) {
        Ok(r) => int(&r?[0]),
        Err(_) => Err(Error::Timeout(format!("no answer within {limit:?}"))),
    }
}

/// The process ids of `n` workers that run under `cluster`'s supervisor, have registered
/// with the scheduler (as `client` last heard), and are not in `killed`, waiting at most
/// `limit`. A kill drill picks its victim among these: a restarted worker killed before it
/// registered, or one killed twice (the supervisor and the client may not have noticed the
/// first kill yet), would be a kill the scheduler never counts as a death.
fn registered_pids(
    cluster: &LocalCluster,
    client: &Client,
    n: usize,
    killed: &[u32],
    limit: Duration,
) -> Result<Vec<u32>> {
    let deadline = Instant::now() + limit;
    loop {
        let known: Vec<u32> = client.workers().iter().map(|w| w.pid).collect();
        let pids: Vec<u32> = cluster
            .worker_pids()
            .into_iter()
            .filter(|p| known.contains(p) && !killed.contains(p))
            .collect();
        if pids.len() >= n {
            return Ok(pids);
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout(format!(
                "{} of {n} worker processes registered after {limit:?}",
                pids.len()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What [`kill_trials`] did.
struct Kills {
    trials: usize,
    kills: usize,
    kills_mid_run: usize,
    slowest: Duration,
}

/// The scheduler's stats once the last kill is counted: the supervisor has replaced `kills`
/// workers and the scheduler has seen them lost (it learns of a death from the connection,
/// which under load can come after the supervisor's restart), or after 30 s.
fn settled_stats(cluster: &LocalCluster, kills: u64) -> Result<Stats> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = cluster.scheduler_stats()?.0;
        let counted = cluster.restarts() >= kills && stats.workers_lost >= kills;
        if counted || Instant::now() >= deadline {
            return Ok(stats);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `trials` trials of a kill drill on `cluster`'s 3 workers: each persists `make(trial)`'s
/// graph, kills a random registered worker with SIGKILL after a random wait under `window` µs, and
/// gathers the answer within `limit`, checked against `answer` (a wrong or late one is an
/// error with the scheduler's view attached).
#[allow(clippy::too_many_arguments)]
fn kill_trials(
    cluster: &LocalCluster,
    client: &Client,
    seed: u64,
    trials: usize,
    window: u64,
    answer: i64,
    limit: Duration,
    make: impl Fn(usize) -> (Graph, Key),
) -> Result<Kills> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut k = Kills {
        trials: 0,
        kills: 0,
        kills_mid_run: 0,
        slowest: Duration::ZERO,
    };
    let mut killed = Vec::with_capacity(trials);
    for trial in 0..trials {
        // A pid the supervisor no longer lists was reaped, and may be reused by a new worker.
        let running = cluster.worker_pids();
        killed.retain(|p| running.contains(p));
        let pids = registered_pids(cluster, client, 3, &killed, Duration::from_secs(30))?;
        let (graph, key) = make(trial);
        let start = Instant::now();
        let fs = client.blocking().persist(graph, &[key])?;
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..window)));
        k.kills_mid_run += !fs[0].done() as usize;
        let victim = pids[rng.gen_range(0..pids.len())];
        kill9(victim)?;
        killed.push(victim);
        k.kills += 1;
        let got = gather_within(client, fs, limit).map_err(|e| {
            let (stats, workers) = cluster.scheduler_stats().unwrap_or_default();
            Error::Unexpected(format!(
                "trial {trial}: {e}\nworkers: {workers:#?}\nstats: {stats:?}\npending:\n{}",
                cluster.describe_pending().unwrap_or_default().join("\n")
            ))
        })?;
        if got != answer {
            return Err(Error::Unexpected(format!(
                "trial {trial}: {got}, Inline says {answer}"
            )));
        }
        k.slowest = k.slowest.max(start.elapsed());
        k.trials += 1;
    }
    Ok(k)
}

fn kill9(pid: u32) -> Result<()> {
    // SAFETY: kill only sends a signal to another process; no memory is shared.
    let r = unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    if r == 0 {
        Ok(())
    } else {
        Err(Error::os(
            format!("kill -9 {pid}"),
            std::io::Error::last_os_error(),
        ))
    }
}

/// Resident memory of process `pid` in bytes (0 when it is gone).
pub fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Samples the peak RSS of a cluster's worker processes every 10 ms until dropped.
struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(pids: Vec<u32>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let (s, p) = (Arc::clone(&stop), Arc::clone(&peak));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                for &pid in &pids {
                    p.fetch_max(rss_of(pid), Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Sampler {
            stop,
            peak,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

/// Files under `dir`, recursively.
pub fn files_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                files_under(&p)
            } else {
                1
            }
        })
        .sum()
}

/// Spill files (`*.spill`) under `dir`, recursively.
fn spill_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(spill_files(&p));
        } else if p.extension().is_some_and(|x| x == "spill") {
            out.push(p);
        }
    }
    out
}

/// What [`chaos`] saw.
#[derive(Debug, Clone)]
pub struct ChaosReport {
    /// Trials run (each gave the same answer as `Inline`).
    pub trials: usize,
    /// Tasks in each trial's graph.
    pub tasks: usize,
    /// Workers killed (one per trial).
    pub kills: usize,
    /// Kills that landed while the trial's graph was still running.
    pub kills_mid_run: usize,
    /// The scheduler's counts over all trials (recomputed keys, rescheduled tasks, ...).
    pub stats: Stats,
    /// Workers the supervisor started again.
    pub restarts: u64,
    /// The longest trial, kill and recovery included.
    pub slowest: Duration,
    /// A trial without a kill, for scale.
    pub undisturbed: Duration,
}

/// Chaos: `trials` runs of the chaos graph (2,001 tasks for 1,450 leaves) on 3 worker
/// processes; in each, one worker is killed with SIGKILL at a random moment within the
/// length of an undisturbed run, and the supervisor starts a new one. Every trial must give
/// `Inline`'s answer within `trial_limit`.
pub fn chaos(trials: usize, leaves: u32, seed: u64, trial_limit: Duration) -> Result<ChaosReport> {
    let (g, _) = chaos_graph("sync", leaves, 32);
    let tasks = g.len();
    let answer = int(&dask_graph::Inline.get(g, &[Key::name_only("total-sync")])?[0])?;
    let cluster = LocalCluster::with(ClusterOptions {
        workers: 3,
        threads_per_worker: 1,
        ..Default::default()
    })?;
    let client = cluster.client()?;
    let t0 = Instant::now();
    let (g, key) = chaos_graph("warm", leaves, 32);
    let got = compute_within(&client, g, key, trial_limit)?;
    let undisturbed = t0.elapsed();
    if got != answer {
        return Err(Error::Unexpected(format!(
            "undisturbed: {got}, Inline says {answer}"
        )));
    }
    let mut report = ChaosReport {
        trials: 0,
        tasks,
        kills: 0,
        kills_mid_run: 0,
        stats: Stats::default(),
        restarts: 0,
        slowest: Duration::ZERO,
        undisturbed,
    };
    let window = undisturbed.as_micros().max(1000) as u64;
    let k = kill_trials(
        &cluster,
        &client,
        seed,
        trials,
        window,
        answer,
        trial_limit,
        |trial| chaos_graph(&format!("t{trial}"), leaves, 32),
    )?;
    (report.trials, report.kills, report.kills_mid_run) = (k.trials, k.kills, k.kills_mid_run);
    report.slowest = k.slowest;
    report.stats = settled_stats(&cluster, report.kills as u64)?;
    report.restarts = cluster.restarts();
    Ok(report)
}

/// What [`elastic`] saw.
#[derive(Debug, Clone)]
pub struct ElasticReport {
    /// Tasks each worker finished, by name (`local-0` started alone).
    pub finished_by: Vec<(String, u64)>,
    /// Workers retired.
    pub retired: Vec<String>,
    /// The scheduler's counts.
    pub stats: Stats,
    /// How long it took.
    pub seconds: f64,
}

/// Elastic: a graph of `leaves` tasks of `ms` milliseconds starts on 1 worker; 3 join after
/// `add_after`, and 2 of them are retired `retire_after` later, before the end.
pub fn elastic(
    leaves: u32,
    ms: i64,
    add_after: Duration,
    retire_after: Duration,
) -> Result<ElasticReport> {
    let cluster = LocalCluster::with(ClusterOptions {
        workers: 1,
        threads_per_worker: 1,
        ..Default::default()
    })?;
    let mut cluster = cluster;
    let client = cluster.client()?;
    let mut g = Graph::new();
    let keys: Vec<Key> = (0..leaves)
        .map(|i| {
            let k = Key::from(("elastic", i));
            g.insert(
                k,
                Task::new("drill-slow", [Arg::lit(i as i64), Arg::lit(ms)]),
            );
            k
        })
        .collect();
    let root = tree(&mut g, "elastic-sum", keys, 8);
    let answer: i64 = (1..=leaves as i64).sum();
    let t0 = Instant::now();
    let fs = client.blocking().persist(g, &[root])?;
    std::thread::sleep(add_after);
    let before: Vec<u32> = client.workers().iter().map(|w| w.id.0).collect();
    cluster.add_workers(3)?;
    std::thread::sleep(retire_after);
    let mut added: Vec<_> = client
        .workers()
        .into_iter()
        .filter(|w| !before.contains(&w.id.0))
        .collect();
    added.sort_by_key(|w| w.id);
    let leaving: Vec<String> = added.iter().take(2).map(|w| w.address.clone()).collect();
    let retired = client.blocking().retire_workers(&leaving)?;
    let limit = Duration::from_millis(ms as u64 * leaves as u64 + 60_000);
    let got = gather_within(&client, fs, limit)?;
    if got != answer {
        return Err(Error::Unexpected(format!(
            "elastic: {got}, expected {answer}"
        )));
    }
    let seconds = t0.elapsed().as_secs_f64();
    let stats = cluster.scheduler_stats()?.0;
    Ok(ElasticReport {
        finished_by: stats.finished_by.clone().into_iter().collect(),
        retired,
        stats,
        seconds,
    })
}

/// What [`spill`] saw.
#[derive(Debug, Clone)]
pub struct SpillReport {
    /// Each worker's memory limit.
    pub limit: u64,
    /// Bytes of intermediate data.
    pub data: u64,
    /// The highest RSS of a worker process, sampled every 10 ms.
    pub peak_rss: u64,
    /// The most spill files seen at once.
    pub peak_files: usize,
    /// Spill files left once the data was released.
    pub files_after: usize,
    /// Spill files overwritten with garbage before the sum (their keys must be recomputed).
    pub corrupted: usize,
    /// Keys the scheduler recomputed.
    pub recomputed: u64,
    /// Worker processes restarted (0: none went past `terminate`).
    pub restarts: u64,
    /// How long it took.
    pub seconds: f64,
}

/// Spill: `workers` workers with memory limit `limit` each hold `factor` × their total limit
/// of data (chunks of `chunk` bytes, kept by futures); `corrupt` spill files are then
/// overwritten with garbage, a sum over every byte is computed and checked (the corrupted
/// keys are recomputed), the futures released, and the spill files counted.
///
/// Each chunk's sum first sleeps `sum_delay`, so the scheduler's sum tasks wait on the
/// workers in hundreds while one thread each runs them: a worker must not read all their
/// spilled inputs back at once (it would go past its limit).
pub fn spill(
    workers: usize,
    limit: u64,
    factor: u64,
    chunk: usize,
    corrupt: usize,
    sum_delay: Duration,
) -> Result<SpillReport> {
    let cluster = LocalCluster::with(ClusterOptions {
        workers,
        threads_per_worker: 1,
        memory_limit: MemoryLimit::Bytes(limit),
        ..Default::default()
    })?;
    let client = cluster.client()?;
    let n = (factor * limit * workers as u64).div_ceil(chunk as u64) as u32;
    let sampler = Sampler::start(cluster.worker_pids());
    let t0 = Instant::now();
    let mut g = Graph::new();
    let blobs = blobs(&mut g, "spill-blob", n, chunk);
    let held = client.blocking().persist(g, &blobs)?;
    let mut peak_files = 0;
    let deadline = Instant::now() + Duration::from_secs(600);
    while held.iter().any(|f| !f.done()) {
        peak_files = peak_files.max(files_under(cluster.local_directory()));
        if Instant::now() > deadline {
            return Err(Error::Timeout(
                "the spill drill's data did not finish".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    peak_files = peak_files.max(files_under(cluster.local_directory()));
    let mut corrupted = 0;
    for f in spill_files(cluster.local_directory())
        .into_iter()
        .take(corrupt)
    {
        if std::fs::write(&f, b"not what was spilled").is_ok() {
            corrupted += 1;
        }
    }
    let mut g = Graph::new();
    let sums: Vec<Key> = blobs
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            let k = Key::from(("spill-sum", i as u32));
            g.insert(
                k,
                Task::new(
                    "drill-slow-bytesum",
                    [Arg::lit(sum_delay.as_micros() as i64), Arg::key(b)],
                ),
            );
            k
        })
        .collect();
    let root = tree(&mut g, "spill-total", sums, 8);
    let got = compute_within(&client, g, root, Duration::from_secs(600))?;
    let answer: i64 = (0..n as i64).map(|i| (i % 251) * chunk as i64).sum();
    if got != answer {
        return Err(Error::Unexpected(format!(
            "spill: {got}, expected {answer}"
        )));
    }
    let seconds = t0.elapsed().as_secs_f64();
    let peak_rss = sampler.finish();
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut files_after = files_under(cluster.local_directory());
    while files_after > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        files_after = files_under(cluster.local_directory());
    }
    let recomputed = cluster.scheduler_stats()?.0.recomputed;
    Ok(SpillReport {
        limit,
        data: n as u64 * chunk as u64,
        peak_rss,
        peak_files,
        files_after,
        corrupted,
        recomputed,
        restarts: cluster.restarts(),
        seconds,
    })
}

/// What [`queuing`] saw.
#[derive(Debug, Clone)]
pub struct QueuingReport {
    /// The highest RSS of a worker process.
    pub peak_rss: u64,
    /// How long it took.
    pub seconds: f64,
}

/// Root-task queuing: `roots` root tasks of `size` bytes each, summed 16 at a time and then
/// in a tree, on 2 single-thread workers, with the scheduler's queuing on (saturation 1.1)
/// or off (every root sent at once).
pub fn queuing(roots: u32, size: usize, queue: bool) -> Result<QueuingReport> {
    let mut scheduler = Config::default();
    if !queue {
        scheduler.saturation = f64::INFINITY;
        scheduler.max_saturation = f64::INFINITY;
    }
    let cluster = LocalCluster::with(ClusterOptions {
        workers: 2,
        threads_per_worker: 1,
        memory_limit: MemoryLimit::Unlimited,
        scheduler,
        ..Default::default()
    })?;
    let client = cluster.client()?;
    let sampler = Sampler::start(cluster.worker_pids());
    let t0 = Instant::now();
    let mut g = Graph::new();
    let blobs = blobs(&mut g, "q-blob", roots, size);
    let sums: Vec<Key> = blobs
        .chunks(16)
        .enumerate()
        .map(|(i, c)| {
            let k = Key::from(("q-sum", i as u32));
            g.insert(
                k,
                Task::new("drill-bytesum", c.iter().map(|&b| Arg::key(b))),
            );
            k
        })
        .collect();
    let root = tree(&mut g, "q-total", sums, 16);
    let got = compute_within(&client, g, root, Duration::from_secs(1800))?;
    let answer: i64 = (0..roots as i64).map(|i| (i % 251) * size as i64).sum();
    if got != answer {
        return Err(Error::Unexpected(format!(
            "queuing: {got}, expected {answer}"
        )));
    }
    Ok(QueuingReport {
        seconds: t0.elapsed().as_secs_f64(),
        peak_rss: sampler.finish(),
    })
}

/// What [`stealing`] saw.
#[derive(Debug, Clone)]
pub struct StealingReport {
    /// How long the skewed graph took.
    pub seconds: f64,
    /// Steals confirmed.
    pub steals: u64,
    /// Tasks each worker finished.
    pub finished_by: Vec<(String, u64)>,
}

/// Skewed placement: `tasks` tasks of `ms` milliseconds, all needing one value on the only
/// worker, so all are placed there; a second worker joins at once. With stealing it takes
/// about half of them; without, it idles.
pub fn stealing(on: bool, tasks: u32, ms: i64) -> Result<StealingReport> {
    let mut cluster = LocalCluster::with(ClusterOptions {
        workers: 1,
        threads_per_worker: 1,
        scheduler: Config {
            work_stealing: on,
            ..Config::default()
        },
        ..Default::default()
    })?;
    let client = cluster.client()?;
    let mut g = Graph::new();
    let seed = Key::name_only("skew-seed");
    g.insert(seed, Task::new("drill-leaf", [Arg::lit(3i64)]));
    let seed_future = client.blocking().persist(g, &[seed])?;
    client.blocking().wait(&seed_future)?;
    let t0 = Instant::now();
    let mut g = Graph::new();
    let keys: Vec<Key> = (0..tasks)
        .map(|i| {
            let k = Key::from(("skew", i));
            g.insert(k, Task::new("drill-slow", [Arg::key(seed), Arg::lit(ms)]));
            k
        })
        .collect();
    let root = tree(&mut g, "skew-sum", keys, 8);
    let fs = client.blocking().persist(g, &[root])?;
    cluster.add_workers(1)?;
    let got = gather_within(&client, fs, Duration::from_secs(600))?;
    if got != 10 * tasks as i64 {
        return Err(Error::Unexpected(format!(
            "stealing: {got}, expected {}",
            10 * tasks
        )));
    }
    let seconds = t0.elapsed().as_secs_f64();
    let stats = cluster.scheduler_stats()?.0;
    Ok(StealingReport {
        seconds,
        steals: stats.steals_done,
        finished_by: stats.finished_by.into_iter().collect(),
    })
}

/// What [`killer_task`] saw.
#[derive(Debug, Clone)]
pub struct KillerReport {
    /// The failure the task's future ended with.
    pub failure: dask_graph::TaskFailure,
    /// Worker processes restarted after the task took them past `terminate`.
    pub restarts: u64,
}

/// A task that allocates `mb` MiB on workers whose memory limit is `limit`: each worker that
/// runs it exits past its `terminate` threshold and is restarted, until the task errs with
/// `KilledWorker`.
pub fn killer_task(limit: u64, mb: i64) -> Result<KillerReport> {
    let cluster = LocalCluster::with(ClusterOptions {
        workers: 2,
        threads_per_worker: 1,
        memory_limit: MemoryLimit::Bytes(limit),
        ..Default::default()
    })?;
    let client = cluster.client()?;
    let f = client.blocking().submit("drill-hog", vec![Arg::lit(mb)])?;
    let (tx, rx) = std::sync::mpsc::channel();
    let c = client.clone();
    std::thread::spawn(move || {
        let _ = tx.send(c.blocking().gather(&[f]).map(|_| ()));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(120))
        .map_err(|_| Error::Timeout("the killer task did not end".into()))?;
    match r {
        Err(Error::Compute(dask_graph::ComputeError::Failed { cause, .. })) => Ok(KillerReport {
            failure: (*cause).clone(),
            restarts: cluster.restarts(),
        }),
        Ok(()) => Err(Error::Unexpected("the killer task succeeded".into())),
        Err(e) => Err(e),
    }
}
