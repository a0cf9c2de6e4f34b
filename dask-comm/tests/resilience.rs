//! Resilience on real worker processes (see `dask_comm::drills`): workers killed with SIGKILL
//! at random moments, workers joining and retiring mid-graph, data three times the memory
//! limit, a task that takes its workers past their memory limit, root-task queuing, work
//! stealing, a peer-to-peer shuffle losing a worker. Every drill checks its answer and is
//! bounded in time.
//!
//! Its own `main` (no test harness): worker processes re-execute this binary. `chaos` and
//! `shuffle_chaos` are drills (`-- --ignored`). Sizes are CI's;
//! `cargo run --release --example resilience` runs them at full size and prints the figures.

use std::time::Duration;

use dask_comm::drills;
use dask_graph::FailureKind;

fn chaos() {
    let trials = std::env::var("DASK_COMM_CHAOS_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(100);
    let r = drills::chaos(trials, 1450, 7, Duration::from_secs(120)).unwrap();
    println!("  {r:?}");
    assert_eq!((r.trials, r.kills), (trials, trials));
    assert!(r.tasks >= 1900, "a graph of about 2,000 tasks: {}", r.tasks);
    assert!(r.kills_mid_run > 0, "some kills landed mid-run");
    assert!(
        r.restarts >= trials as u64,
        "every killed worker was replaced"
    );
    assert_eq!(r.stats.workers_lost, trials as u64);
}

fn elastic() {
    let r = drills::elastic(
        160,
        20,
        Duration::from_millis(600),
        Duration::from_millis(600),
    )
    .unwrap();
    println!("  {r:?}");
    assert_eq!(r.retired.len(), 2);
    assert_eq!(r.stats.workers_retired, 2);
    assert_eq!(r.stats.recomputed, 0, "retiring loses nothing");
    let added_ran = r
        .finished_by
        .iter()
        .filter(|(name, n)| name != "local-0" && *n > 0)
        .count();
    assert_eq!(
        added_ran, 3,
        "each added worker ran tasks: {:?}",
        r.finished_by
    );
}

fn spill() {
    let limit = 96u64 << 20;
    let r = drills::spill(2, limit, 3, 1 << 20, 3, Duration::from_millis(5)).unwrap();
    println!("  {r:?}");
    assert!(r.data >= 3 * 2 * limit);
    assert!(r.peak_files > 0, "values were spilled");
    assert_eq!(r.files_after, 0, "spill files go with their keys");
    assert_eq!(r.corrupted, 3);
    assert!(
        r.recomputed >= 3,
        "corrupt spill files were recomputed: {}",
        r.recomputed
    );
    // The bound is the design's: a worker whose RSS passes its `terminate` threshold (0.95 of
    // the limit) exits and is restarted, so no restart means none went past it; the sampled
    // peak (every 10 ms) must be under the limit itself.
    println!(
        "  worker peak RSS {:.1} MiB, limit {:.1} MiB ({:.2} of it)",
        r.peak_rss as f64 / (1 << 20) as f64,
        limit as f64 / (1 << 20) as f64,
        r.peak_rss as f64 / limit as f64
    );
    assert_eq!(r.restarts, 0, "no worker went past its limit");
    assert!(
        r.peak_rss < limit,
        "worker RSS {} stayed under the limit {limit}",
        r.peak_rss
    );
}

fn killer_task() {
    let r = drills::killer_task(96 << 20, 400).unwrap();
    println!("  {r:?}");
    assert_eq!(r.failure.kind, FailureKind::KilledWorker);
    assert!(
        r.failure.message.contains("3 workers"),
        "{}",
        r.failure.message
    );
    // The third worker's replacement may start after the failure is reported.
    assert!(
        r.restarts >= 2,
        "the dead workers were replaced: {}",
        r.restarts
    );
}

fn queuing() {
    let on = drills::queuing(20_000, 4096, true).unwrap();
    let off = drills::queuing(20_000, 4096, false).unwrap();
    println!("  queuing on {on:?}\n  queuing off {off:?}");
}

fn stealing() {
    let on = drills::stealing(true, 24, 50).unwrap();
    let off = drills::stealing(false, 24, 50).unwrap();
    println!("  stealing on {on:?}\n  stealing off {off:?}");
    assert!(on.steals > 0);
    assert!(
        on.finished_by
            .iter()
            .any(|(name, n)| name == "local-1" && *n > 0),
        "the joining worker stole: {:?}",
        on.finished_by
    );
    assert_eq!(off.steals, 0);
}

fn shuffle_chaos() {
    let r = drills::shuffle_chaos(20, 24, 6, 11, Duration::from_secs(120)).unwrap();
    println!("  {r:?}");
    assert_eq!((r.trials, r.kills), (20, 20));
    assert!(
        r.stats.shuffle_restarts > 0,
        "a kill mid-shuffle restarts it: {r:?}"
    );
    assert_eq!(r.stats.workers_lost, 20);
}

fn main() {
    drills::register();
    dask_comm::run_if_worker();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .try_init();
    test_support::Tests::new()
        .fast("stealing", stealing)
        .fast("elastic", elastic)
        .fast("spill", spill)
        .fast("killer_task", killer_task)
        .fast("queuing", queuing)
        .drill(
            "chaos",
            "100 workers killed with SIGKILL, one a trial",
            chaos,
        )
        .drill(
            "shuffle_chaos",
            "20 workers killed mid-shuffle",
            shuffle_chaos,
        )
        .run();
}
