//! The shuffle drill: a peer-to-peer shuffle on worker processes, one of them killed with
//! SIGKILL at a random moment in each trial; the shuffle restarts and the answer must be
//! `Inline`'s.

use std::time::{Duration, Instant};

use dask_graph::shuffle::{self, ShuffleId, ShuffleRole};
use dask_graph::{registry, Arg, Graph, Key, Scheduler, Task, Value};

use super::{gather_within, int, kill_trials, registered_pids};
use crate::cluster::{ClusterOptions, LocalCluster};
use crate::core::Stats;
use crate::error::{Error, Result};

/// Registers the drill's functions (with [`super::register`]).
pub(super) fn register() {
    register_blobs();
    // Input `i`: the numbers i*1000 .. i*1000+999, piece j of `parts` holding those with
    // x % parts == j; sent after `ms` milliseconds of "work".
    registry().register(
        "drill-shuffle-transfer",
        |input: i64, parts: i64, id: String, ms: i64| -> Result<(), String> {
            std::thread::sleep(Duration::from_millis(ms.max(0) as u64));
            let parts = parts.max(1);
            let mut pieces = vec![Vec::new(); parts as usize];
            for x in input * 1000..input * 1000 + 1000 {
                pieces[x.rem_euclid(parts) as usize].push(x);
            }
            let pieces = pieces
                .into_iter()
                .enumerate()
                .map(|(j, p)| (j as u32, Value::new(p)))
                .collect();
            shuffle::send(ShuffleId::new(&id), input as u32, pieces).map_err(|e| e.to_string())
        },
    );
    // Output `part`: every input's piece, checked (each x belongs here), summed.
    registry().register(
        "drill-shuffle-unpack",
        |_barrier: Value, id: String, part: i64, parts: i64, inputs: i64| -> Result<i64, String> {
            let pieces = shuffle::receive(ShuffleId::new(&id), part as u32, inputs as u32)
                .map_err(|e| e.to_string())?;
            let mut total = 0i64;
            for p in pieces {
                let xs = p
                    .downcast_ref::<Vec<i64>>()
                    .ok_or("a piece of the wrong type")?;
                if let Some(x) = xs.iter().find(|x| x.rem_euclid(parts) != part) {
                    return Err(format!("{x} is not in part {part}"));
                }
                total += xs.iter().sum::<i64>();
            }
            Ok(total * (part + 1))
        },
    );
}

/// Registers the throughput graph's functions (with [`super::register`]).
fn register_blobs() {
    // Input `i`: `parts` pieces of `size` bytes each (byte value (i + j) % 251), made once
    // per process and shared: the drill measures moving bytes, not making them.
    registry().register(
        "drill-shuffle-blobs",
        |input: i64, parts: i64, size: i64, id: String| -> Result<(), String> {
            let pieces = (0..parts.max(1))
                .map(|j| (j as u32, Value::new(blob(((input + j) % 251) as u8, size))))
                .collect();
            shuffle::send(ShuffleId::new(&id), input as u32, pieces).map_err(|e| e.to_string())
        },
    );
    // Output `part`: the bytes of every piece, checked, counted.
    registry().register(
        "drill-shuffle-count",
        |_barrier: Value, id: String, part: i64, inputs: i64| -> Result<i64, String> {
            let pieces = shuffle::receive(ShuffleId::new(&id), part as u32, inputs as u32)
                .map_err(|e| e.to_string())?;
            let mut total = 0i64;
            for (i, p) in pieces.iter().enumerate() {
                let b = p
                    .downcast_ref::<bytes::Bytes>()
                    .ok_or("a piece of the wrong type")?;
                let want = ((i as i64 + part) % 251) as u8;
                if b.iter().any(|&x| x != want) {
                    return Err(format!("the piece from input {i} holds the wrong bytes"));
                }
                total += b.len() as i64;
            }
            Ok(total)
        },
    );
}

/// `size` bytes of value `byte`, made once per process.
fn blob(byte: u8, size: i64) -> bytes::Bytes {
    type Blobs = std::sync::Mutex<rustc_hash::FxHashMap<(u8, i64), bytes::Bytes>>;
    static BLOBS: std::sync::OnceLock<Blobs> = std::sync::OnceLock::new();
    let mut blobs = BLOBS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    blobs
        .entry((byte, size))
        .or_insert_with(|| bytes::Bytes::from(vec![byte; size.max(0) as usize]))
        .clone()
}

/// A shuffle of bytes alone (no work around it): `inputs` transfer tasks each sending
/// `parts` pieces of `size` bytes, `parts` unpack tasks checking and counting them, and the
/// total. Keys end in `tag`.
pub fn blob_shuffle_graph(tag: &str, inputs: u32, parts: u32, size: i64) -> (Graph, Key) {
    p2p_graph(
        &format!("drill-blobs-{tag}"),
        inputs,
        parts,
        |id, i| {
            Task::new(
                "drill-shuffle-blobs",
                [
                    Arg::lit(i as i64),
                    Arg::lit(parts as i64),
                    Arg::lit(size),
                    Arg::lit(id.as_str().to_string()),
                ],
            )
        },
        |id, barrier, j| {
            Task::new(
                "drill-shuffle-count",
                [
                    Arg::key(barrier),
                    Arg::lit(id.as_str().to_string()),
                    Arg::lit(j as i64),
                    Arg::lit(inputs as i64),
                ],
            )
        },
    )
}

/// A shuffle named `name` of `inputs` transfer tasks (`transfer(id, i)`), a barrier,
/// `parts` unpack tasks (`unpack(id, barrier, j)`) and the sum of their results (keys
/// `name-transfer`, `name-barrier`, `name-unpack`, `name-total`). Returns the graph and the
/// sum's key.
fn p2p_graph(
    name: &str,
    inputs: u32,
    parts: u32,
    transfer: impl Fn(ShuffleId, u32) -> Task,
    unpack: impl Fn(ShuffleId, Key, u32) -> Task,
) -> (Graph, Key) {
    let id = ShuffleId::new(name);
    let mut g = Graph::new();
    let transfers: Vec<Key> = (0..inputs)
        .map(|i| Key::new(&format!("{name}-transfer"), &[i]))
        .collect();
    for (i, &k) in (0..inputs).zip(&transfers) {
        g.insert(
            k,
            transfer(id, i).with_shuffle(ShuffleRole::Transfer { id, input: i }),
        );
    }
    let barrier = Key::name_only(&format!("{name}-barrier"));
    g.insert(barrier, shuffle::barrier(id, transfers));
    let outputs: Vec<Key> = (0..parts)
        .map(|j| Key::new(&format!("{name}-unpack"), &[j]))
        .collect();
    for (j, &k) in (0..parts).zip(&outputs) {
        g.insert(
            k,
            unpack(id, barrier, j).with_shuffle(ShuffleRole::Unpack { id, part: j }),
        );
    }
    let total = Key::name_only(&format!("{name}-total"));
    g.insert(
        total,
        Task::new("drill-sum", outputs.into_iter().map(Arg::Key)),
    );
    (g, total)
}

/// What [`shuffle_throughput`] measured, per round.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ThroughputRound {
    /// The whole shuffle, from submission to the total.
    pub seconds: f64,
    /// Bytes delivered worker to worker (from the workers' transfer logs).
    pub moved: u64,
    /// Deliveries.
    pub deliveries: u64,
    /// Bytes delivered over the time the deliveries took (MB/s): the per-pair rate.
    pub pair_mb_s: f64,
    /// The round's deliveries per worker pair (quartiles of their rates).
    pub pairs: Vec<crate::transfers::PairRates>,
}

/// `rounds` shuffles of bytes alone on `client`'s cluster: `inputs` × `parts` pieces of
/// `size` bytes each; the answer is checked each round.
pub fn shuffle_throughput(
    client: &crate::Client,
    inputs: u32,
    parts: u32,
    size: i64,
    rounds: usize,
) -> Result<Vec<ThroughputRound>> {
    let want = inputs as i64 * parts as i64 * size;
    let mut out = Vec::with_capacity(rounds);
    for r in 0..rounds {
        let logs_before = client.blocking().transfer_log()?;
        let (g, key) = blob_shuffle_graph(
            &format!("r{r}-{}", rand::random::<u32>()),
            inputs,
            parts,
            size,
        );
        let t0 = Instant::now();
        let got = int(&client.blocking().compute(g, &[key])?[0])?;
        let seconds = t0.elapsed().as_secs_f64();
        if got != want {
            return Err(Error::Unexpected(format!(
                "{got} bytes shuffled, not {want}"
            )));
        }
        let logs_after = client.blocking().transfer_log()?;
        // The shuffle's deliveries, not the fetches of its other tasks.
        let pairs = crate::transfers::pair_rates(
            &crate::transfers::deliveries(logs_before),
            &crate::transfers::deliveries(logs_after),
        );
        let (moved, micros, deliveries) = crate::transfers::totals(&pairs);
        out.push(ThroughputRound {
            seconds,
            moved,
            deliveries,
            pair_mb_s: moved as f64 / (micros as f64).max(1.0),
            pairs,
        });
    }
    Ok(out)
}

/// The drill's graph: `inputs` transfer tasks of `ms` milliseconds each, `parts` unpack
/// tasks, and their sum (weighted by part, so a piece in the wrong output shows). Keys end
/// in `tag`. Returns the graph and its final key.
pub fn shuffle_graph(tag: &str, inputs: u32, parts: u32, ms: i64) -> (Graph, Key) {
    p2p_graph(
        &format!("drill-shuffle-{tag}"),
        inputs,
        parts,
        |id, i| {
            Task::new(
                "drill-shuffle-transfer",
                [
                    Arg::lit(i as i64),
                    Arg::lit(parts as i64),
                    Arg::lit(id.as_str().to_string()),
                    Arg::lit(ms),
                ],
            )
        },
        |id, barrier, j| {
            Task::new(
                "drill-shuffle-unpack",
                [
                    Arg::key(barrier),
                    Arg::lit(id.as_str().to_string()),
                    Arg::lit(j as i64),
                    Arg::lit(parts as i64),
                    Arg::lit(inputs as i64),
                ],
            )
        },
    )
}

/// What [`shuffle_chaos`] saw.
#[derive(Debug, Clone)]
pub struct ShuffleChaosReport {
    /// Trials run, each with the right answer.
    pub trials: usize,
    /// Workers killed (one per trial).
    pub kills: usize,
    /// Kills that landed before the trial's answer was in.
    pub kills_mid_run: usize,
    /// The scheduler's counts (`shuffle_restarts` among them).
    pub stats: Stats,
    /// The slowest trial.
    pub slowest: Duration,
    /// A trial without a kill, for scale.
    pub undisturbed: Duration,
}

/// `trials` runs of a shuffle of `inputs` × `parts` on 3 worker processes; in each, one
/// worker is killed with SIGKILL at a random moment within the length of an undisturbed run
/// (the supervisor starts a new one). Every trial must give `Inline`'s answer within
/// `trial_limit`.
pub fn shuffle_chaos(
    trials: usize,
    inputs: u32,
    parts: u32,
    seed: u64,
    trial_limit: Duration,
) -> Result<ShuffleChaosReport> {
    let ms = 20;
    let (g, key) = shuffle_graph("sync", inputs, parts, 0);
    let answer = int(&dask_graph::Inline.get(g, &[key])?[0])?;
    let cluster = LocalCluster::with(ClusterOptions {
        workers: 3,
        threads_per_worker: 1,
        ..Default::default()
    })?;
    let client = cluster.client()?;
    registered_pids(&cluster, &client, 3, &[], Duration::from_secs(30))?;
    let t0 = Instant::now();
    let (g, key) = shuffle_graph("warm", inputs, parts, ms);
    let fs = client.blocking().persist(g, &[key])?;
    let got = gather_within(&client, fs, trial_limit)?;
    let undisturbed = t0.elapsed();
    if got != answer {
        return Err(Error::Unexpected(format!(
            "undisturbed: {got}, Inline says {answer}"
        )));
    }
    let mut report = ShuffleChaosReport {
        trials: 0,
        kills: 0,
        kills_mid_run: 0,
        stats: Stats::default(),
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
        |trial| shuffle_graph(&format!("t{trial}"), inputs, parts, ms),
    )?;
    (report.trials, report.kills, report.kills_mid_run) = (k.trials, k.kills, k.kills_mid_run);
    report.slowest = k.slowest;
    report.stats = super::settled_stats(&cluster, report.kills as u64)?;
    Ok(report)
}
