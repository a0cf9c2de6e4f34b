//! Worker processes killed (SIGKILL) in the middle of a bag's `groupby` and a dataframe's
//! `merge`, both on the peer-to-peer shuffle: every answer must still be the one `Inline`
//! gives, and the scheduler must have restarted the shuffle. Real processes (a
//! `LocalCluster` of 3 worker processes, 1 thread each; the supervisor starts a new worker
//! after each kill), so this is a test binary of its own (`harness = false`): the workers
//! are this binary started again.
//!
//! A drill:
//!
//! ```text
//! cargo test -p dask-collections --test shuffle_loss -- --ignored
//! ```

use std::sync::mpsc;
use std::time::{Duration, Instant};

use dask_collections::bag::{self, Item};
use dask_collections::{ShuffleMethod, dataframe};
use dask_comm::{Client, ClusterOptions, LocalCluster};
use dask_graph::Scheduler;
use polars::prelude::*;
use rand::{Rng, SeedableRng};

/// Trials of each collection.
const TRIALS: usize = 4;
/// The longest a trial may take (a restart included) before the test fails.
const TRIAL_LIMIT: Duration = Duration::from_secs(120);

/// The item functions, in every process (the workers too).
fn register() {
    bag::register();
    dataframe::register();
    bag::register_map("loss-mod", |x: &Item| -> Result<Item, String> {
        let x = x.as_i64().ok_or("an integer expected")?;
        // Slow enough that a kill lands while the transfers run: 20 µs an item.
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(20) {
            std::hint::spin_loop();
        }
        Ok(Item::Int(x % 97))
    });
    // A group as one number that changes with any item in the wrong group.
    bag::register_map("loss-check", |g: &Item| -> Result<Item, String> {
        let k = g.at(0).and_then(Item::as_i64).ok_or("no key")?;
        let items = g.at(1).and_then(Item::as_list).ok_or("no items")?;
        let mut h: i64 = k;
        for x in items.iter() {
            let x = x.as_i64().ok_or("an integer expected")?;
            h = h.wrapping_mul(1_000_003).wrapping_add(x);
        }
        Ok(Item::Int(h & 0xffff_ffff))
    });
}

/// The bag: 6,000 integers in 24 partitions grouped by `x % 97` into 6 outputs on the
/// peer-to-peer shuffle, each group hashed, the hashes summed.
fn groupby_sum(s: &dyn Scheduler) -> Result<Item, bag::BagError> {
    bag::range(6_000, 24)?
        .groupby_with("loss-mod", Some(6), ShuffleMethod::P2p)?
        .map("loss-check")?
        .sum()
        .compute(s)
}

/// Two frames of 12 partitions merged (inner, on `key`) on the peer-to-peer shuffle; the
/// rows sorted so that any scheduler's answer compares equal.
fn merged(s: &dyn Scheduler) -> Result<DataFrame, dataframe::DataFrameError> {
    let n = 240_000i64;
    let left = df!("key" => (0..n).map(|i| i * 7 % 50_000).collect::<Vec<_>>(),
                   "x" => (0..n).collect::<Vec<_>>())
    .expect("a frame");
    let right = df!("key" => (0..n / 2).map(|i| i * 3).collect::<Vec<_>>(),
                    "y" => (0..n / 2).map(|i| i as f64 / 2.0).collect::<Vec<_>>())
    .expect("a frame");
    let l = dataframe::from_polars(left, 12)?;
    let r = dataframe::from_polars(right, 12)?;
    let m = l.merge_with(&r, &["key"], dataframe::How::Inner, ShuffleMethod::P2p)?;
    let got = m.compute(s)?;
    Ok(got
        .sort(["key", "x"], SortMultipleOptions::default())
        .expect("sortable"))
}

/// Runs `f` on the cluster while a worker is killed `delay` after it starts; the answer, or
/// an error after [`TRIAL_LIMIT`].
fn with_a_kill<T: Send + 'static>(
    cluster: &LocalCluster,
    client: &Client,
    delay: Duration,
    f: fn(&dyn Scheduler) -> T,
) -> T {
    let (tx, rx) = mpsc::channel();
    let c = client.clone();
    std::thread::spawn(move || {
        let _ = tx.send(f(&c));
    });
    std::thread::sleep(delay);
    let pids = cluster.worker_pids();
    let victim =
        pids[rand::rngs::StdRng::seed_from_u64(delay.as_micros() as u64).gen_range(0..pids.len())];
    let killed = std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success(), "kill -9 {victim}");
    rx.recv_timeout(TRIAL_LIMIT)
        .unwrap_or_else(|_| panic!("no answer within {TRIAL_LIMIT:?} after a kill"))
}

fn wait_for_workers(client: &Client, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while client.workers().len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} workers",
            client.workers().len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    register();
    dask_comm::run_if_worker();
    test_support::Tests::new()
        .drill(
            "shuffle_loss",
            "8 workers killed with SIGKILL mid-shuffle",
            shuffle_loss,
        )
        .run();
}

fn shuffle_loss() {
    let want_bag = groupby_sum(&dask_graph::Inline).expect("Inline's groupby");
    let want_frame = merged(&dask_graph::Inline).expect("Inline's merge");
    let cluster = LocalCluster::with(ClusterOptions {
        workers: 3,
        threads_per_worker: 1,
        ..Default::default()
    })
    .expect("a cluster");
    let client = cluster.client().expect("a client");
    wait_for_workers(&client, 3);
    // Undisturbed first: each answer, and how long a run takes (the window the kills fall in).
    let t0 = Instant::now();
    assert_eq!(groupby_sum(&client).expect("groupby"), want_bag);
    let bag_window = t0.elapsed();
    let t0 = Instant::now();
    assert!(merged(&client).expect("merge").equals(&want_frame));
    let frame_window = t0.elapsed();
    println!("undisturbed: groupby {bag_window:.1?}, merge {frame_window:.1?}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(30);
    for trial in 0..TRIALS {
        // From a tenth to four fifths of an undisturbed run: mostly while buckets move.
        let at = |w: Duration, rng: &mut rand::rngs::StdRng| w.mul_f64(rng.gen_range(0.1..0.8));
        wait_for_workers(&client, 3);
        let delay = at(bag_window, &mut rng);
        let got = with_a_kill(&cluster, &client, delay, groupby_sum).expect("groupby");
        assert_eq!(
            got, want_bag,
            "trial {trial}: groupby with a kill after {delay:?}"
        );
        wait_for_workers(&client, 3);
        let delay = at(frame_window, &mut rng);
        let got = with_a_kill(&cluster, &client, delay, merged).expect("merge");
        assert!(
            got.equals(&want_frame),
            "trial {trial}: merge with a kill after {delay:?}"
        );
        println!("trial {trial}: both answers right after their kills");
    }
    let (stats, _) = cluster.scheduler_stats().expect("stats");
    println!(
        "workers lost {}, shuffle restarts {}",
        stats.workers_lost, stats.shuffle_restarts
    );
    assert!(
        stats.shuffle_restarts > 0,
        "no kill restarted a shuffle: {stats:?}"
    );
}
