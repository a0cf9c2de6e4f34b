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
        .unwrap_or(60);
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

/// Trials per freeze drill and protocol: `DASK_COMM_FREEZE_TRIALS` (CI runs 5; the issue's
/// proof is 50).
fn freeze_trials() -> usize {
    std::env::var("DASK_COMM_FREEZE_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(5)
}

/// Trials per starvation drill (`stalled_spill`, `fd_limit`) and protocol:
/// `DASK_COMM_STARVE_TRIALS` (CI runs 3; the figures in `docs/resilience.md` are from 50).
fn starve_trials() -> usize {
    std::env::var("DASK_COMM_STARVE_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(3)
}

/// The protocols the freeze drills run over: `DASK_COMM_FREEZE_PROTOCOLS` (`tcp,ucx` unless
/// told).
fn freeze_protocols() -> Vec<dask_comm::Protocol> {
    std::env::var("DASK_COMM_FREEZE_PROTOCOLS")
        .unwrap_or_else(|_| "tcp,ucx".into())
        .split(',')
        .map(|p| p.trim().parse().expect("tcp or ucx"))
        .collect()
}

/// Workers stopped with SIGSTOP mid-computation, over tcp:// and ucx://: removed after the
/// heartbeat timeout, the answer exact, the thawed process exits (removed) and is replaced.
/// A worker whose spill directory stalls (its next spill file a FIFO no one reads) while it
/// holds more than its target, over tcp:// and ucx://: the answer exact, the worker not
/// removed (its runtime, heartbeats and data server do not wait for the disk).
fn stalled_spill() {
    for protocol in freeze_protocols() {
        let trials = starve_trials();
        let r = drills::stalled_spill(
            protocol,
            trials,
            96 << 20,
            1 << 20,
            13,
            Duration::from_secs(120),
        )
        .unwrap();
        println!(
            "  {protocol:?}: {} trials, undisturbed {:.2} s, memory exits {}",
            r.trials,
            r.undisturbed.as_secs_f64(),
            r.memory_exits
        );
        println!(
            "    spill thread blocked after the persist: {}",
            r.stalled_after
        );
        println!("    answer after the stall:                 {}", r.answered);
        assert_eq!(r.trials, trials);
        assert_eq!(r.removed_while_stalled, 0, "no stalled worker was removed");
    }
}

/// A worker's descriptor limit filled by a flood of connections to its data server during a
/// shuffle, over tcp:// and ucx://: the answer exact, no worker lost, and the data server
/// admits a new connection with the flood still there (or the worker, its transport broken,
/// was replaced: UCX's listener does not survive `EMFILE`).
fn fd_limit() {
    for protocol in freeze_protocols() {
        let trials = starve_trials();
        let r = drills::fd_limit(
            protocol,
            drills::FdLimitDrill {
                trials,
                inputs: 24,
                parts: 24,
                headroom: 8,
                flood: 64,
                hold: Duration::from_secs(1),
            },
            17,
            Duration::from_secs(120),
        )
        .unwrap();
        println!(
            "  {protocol:?}: {} trials ({} with the descriptor table full), {} victims replaced, shuffle restarts {}, undisturbed {:.2} s",
            r.trials,
            r.filled,
            r.replaced,
            r.shuffle_restarts,
            r.undisturbed.as_secs_f64()
        );
        println!("    answer after the flood:          {}", r.answered);
        println!("    new connection under the flood:  {}", r.recovered);
        assert_eq!(r.trials, trials);
        assert_eq!(r.filled, trials, "every flood filled the table");
        assert_eq!(r.removed, 0, "no flooded worker was removed");
    }
}

fn freeze_worker() {
    let timeout = Duration::from_secs(2);
    for protocol in freeze_protocols() {
        let trials = freeze_trials();
        let r = drills::freeze_worker(protocol, trials, 1450, timeout, 11, Duration::from_secs(60))
            .unwrap();
        println!(
            "  {protocol:?}: {} trials ({} mid-run), heartbeat timeout {timeout:?}",
            r.trials, r.mid_run
        );
        println!("    removed after the stop: {}", r.detected);
        println!("    answer after the stop:  {}", r.answered);
        println!("    exit after the thaw:    {}", r.exited);
        assert_eq!(r.trials, trials);
        assert!(
            r.restarts >= trials as u64,
            "every thawed worker was replaced"
        );
        // Removal needs the timeout to pass since the last heartbeat, which came up to an
        // eighth of it before the stop; the upper bound leaves a loaded machine room (the
        // scheduler checks every 100 ms).
        assert!(
            r.detected.quantile(0.0) >= timeout * 3 / 4,
            "removed before the timeout: {}",
            r.detected
        );
        assert!(r.detected.max() < timeout * 5, "{}", r.detected);
    }
}

/// The scheduler process stopped with SIGSTOP mid-computation, over tcp:// and ucx://: its
/// workers exit with EXIT_SCHEDULER_LOST and the client's gather fails, each within a bound.
fn freeze_scheduler() {
    let timeout = Duration::from_secs(2);
    for protocol in freeze_protocols() {
        let trials = freeze_trials();
        let r =
            drills::freeze_scheduler(protocol, trials, timeout, Duration::from_secs(30)).unwrap();
        println!(
            "  {protocol:?}: {} trials, scheduler timeout {timeout:?}",
            r.trials
        );
        println!("    workers exited after the stop: {}", r.workers_exited);
        println!("    client failed after the stop:  {}", r.client_failed);
        assert_eq!(r.trials, trials);
        assert!(
            r.exit_codes
                .iter()
                .all(|&c| c == dask_comm::EXIT_SCHEDULER_LOST),
            "{:?}",
            r.exit_codes
        );
        // Silence is counted from the last answer, which came up to a heartbeat (a quarter
        // of the timeout) before the stop.
        assert!(
            r.workers_exited.quantile(0.0) >= timeout / 2,
            "{}",
            r.workers_exited
        );
        assert!(r.workers_exited.max() < timeout * 5, "{}", r.workers_exited);
        assert!(
            r.client_failed.quantile(0.0) >= timeout / 2,
            "{}",
            r.client_failed
        );
        assert!(r.client_failed.max() < timeout * 5, "{}", r.client_failed);
    }
}

/// A client process stopped with SIGSTOP mid-gather, over tcp:// and ucx://: the scheduler
/// drops it after the client timeout while serving another client, and the continued client
/// hears it was dropped.
fn freeze_client() {
    let timeout = Duration::from_secs(2);
    for protocol in freeze_protocols() {
        let trials = freeze_trials();
        let r = drills::freeze_client(protocol, trials, timeout, Duration::from_secs(30)).unwrap();
        println!(
            "  {protocol:?}: {} trials, client timeout {timeout:?}, {} graphs served meanwhile",
            r.trials, r.served
        );
        println!("    dropped after the stop: {}", r.dropped);
        assert_eq!(r.trials, trials);
        assert!(r.served >= trials, "another client was served");
        assert!(r.dropped.quantile(0.0) >= timeout / 2, "{}", r.dropped);
        assert!(r.dropped.max() < timeout * 5, "{}", r.dropped);
    }
}

fn main() {
    drills::register();
    drills::run_cli_if_asked();
    drills::run_client_if_asked();
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
            "60 workers killed with SIGKILL, one a trial (`DASK_COMM_CHAOS_TRIALS`)",
            chaos,
        )
        .drill(
            "freeze_worker",
            "workers stopped with SIGSTOP, 5 trials per protocol",
            freeze_worker,
        )
        .drill(
            "freeze_client",
            "client processes stopped with SIGSTOP mid-gather, 5 trials per protocol",
            freeze_client,
        )
        .drill(
            "freeze_scheduler",
            "schedulers stopped with SIGSTOP, 5 trials per protocol",
            freeze_scheduler,
        )
        .drill(
            "stalled_spill",
            "spill directories stalled under memory pressure, 3 trials per protocol",
            stalled_spill,
        )
        .drill(
            "fd_limit",
            "data servers flooded to their descriptor limit mid-shuffle, 3 trials per protocol",
            fd_limit,
        )
        .drill(
            "shuffle_chaos",
            "20 workers killed mid-shuffle",
            shuffle_chaos,
        )
        .run();
}
