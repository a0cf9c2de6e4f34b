//! The resilience drills at full size, with their figures (see `dask_comm::drills` and
//! `docs/resilience.md`):
//!
//! ```text
//! cargo run --release -p dask-comm --example resilience -- [chaos|elastic|spill|killer|queuing|stealing ...]
//! ```
//! With no argument, every drill runs. `--trials N` sets chaos's trials (default 100),
//! `--roots N` queuing's root tasks (default 100,000).

use std::time::Duration;

use dask_comm::drills;

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn main() {
    drills::register();
    dask_comm::run_if_worker();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let words: Vec<&str> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with("--") && (*i == 0 || !args[i - 1].starts_with("--")))
        .map(|(_, a)| a.as_str())
        .collect();
    let wants = |d: &str| words.is_empty() || words.contains(&d);
    if let Err(e) = run(wants, value("--trials"), value("--roots")) {
        eprintln!("resilience: {e}");
        std::process::exit(1);
    }
}

fn run(
    wants: impl Fn(&str) -> bool,
    trials: Option<u64>,
    roots: Option<u64>,
) -> dask_comm::Result<()> {
    if wants("chaos") {
        let trials = trials.unwrap_or(100) as usize;
        let r = drills::chaos(trials, 1450, 42, Duration::from_secs(120))?;
        println!(
            "chaos: {} trials of a {}-task graph on 3 worker processes, {} kill -9 ({} mid-run), \
             every answer equal to Inline's",
            r.trials, r.tasks, r.kills, r.kills_mid_run
        );
        println!(
            "  recomputed keys {}, rescheduled tasks {}, workers restarted {}, slowest trial \
             {:.2} s (undisturbed run {:.2} s)",
            r.stats.recomputed,
            r.stats.rescheduled,
            r.restarts,
            r.slowest.as_secs_f64(),
            r.undisturbed.as_secs_f64()
        );
    }
    if wants("elastic") {
        let r = drills::elastic(400, 20, Duration::from_secs(1), Duration::from_secs(1))?;
        println!(
            "elastic: 400 tasks of 20 ms on 1 worker, 3 added after 1 s, 2 retired 1 s later: \
             {:.2} s, tasks per worker {:?}, retired {:?}, recomputed {}",
            r.seconds, r.finished_by, r.retired, r.stats.recomputed
        );
    }
    if wants("spill") {
        let r = drills::spill(2, 96 << 20, 3, 1 << 20, 3, Duration::from_millis(5))?;
        println!(
            "spill: {:.0} MiB of data on 2 workers limited to {:.0} MiB each, each chunk \
             summed by a task of 5 ms: peak worker RSS \
             {:.1} MiB ({:.0}% of the limit), up to {} spill files, {} left after release, {} \
             restarts, {:.2} s; {} spill files corrupted, {} keys recomputed, answer right",
            mib(r.data),
            mib(r.limit),
            mib(r.peak_rss),
            100.0 * r.peak_rss as f64 / r.limit as f64,
            r.peak_files,
            r.files_after,
            r.restarts,
            r.seconds,
            r.corrupted,
            r.recomputed
        );
    }
    if wants("killer") {
        let r = drills::killer_task(96 << 20, 400)?;
        println!(
            "killer: a task allocating 400 MiB on workers limited to 96 MiB: {} after {} \
             restarts",
            r.failure, r.restarts
        );
    }
    if wants("queuing") {
        let roots = roots.unwrap_or(100_000) as u32;
        let on = drills::queuing(roots, 16 << 10, true)?;
        let off = drills::queuing(roots, 16 << 10, false)?;
        println!(
            "queuing: {roots} root tasks of 16 KiB summed 16 at a time, 2 workers: peak worker \
             RSS {:.1} MiB queued vs {:.1} MiB not ({:.1}x), {:.2} s vs {:.2} s",
            mib(on.peak_rss),
            mib(off.peak_rss),
            off.peak_rss as f64 / on.peak_rss.max(1) as f64,
            on.seconds,
            off.seconds
        );
    }
    if wants("stealing") {
        let on = drills::stealing(true, 40, 50)?;
        let off = drills::stealing(false, 40, 50)?;
        println!(
            "stealing: 40 tasks of 50 ms placed on one worker, a second joins: {:.2} s with \
             stealing ({} steals, {:?}) vs {:.2} s without: {:.2}x",
            on.seconds,
            on.steals,
            on.finished_by,
            off.seconds,
            off.seconds / on.seconds
        );
    }
    Ok(())
}
