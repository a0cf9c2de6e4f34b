//! A local cluster of worker processes with the scheduler's dashboard, under a steady load
//! to watch: rounds of short `sleep_ms` tasks spread over the workers, each round summed by
//! one task (so values move between workers: the red bars of the task stream).
//!
//! ```text
//! cargo run --release -p dask-comm --example dashboard -- --seconds 60
//! DASHBOARD http://127.0.0.1:8787/
//! ```
//!
//! Open the address in a browser (or run `dask-comm status --dashboard 127.0.0.1:8787`).
//! Options: `--seconds S` (30), `--workers N` (2), `--threads N` (2), `--dashboard-address
//! HOST:PORT` (loopback 8787, or another port when it is taken), `--protocol tcp|ucx`.

use std::time::{Duration, Instant};

use dask_comm::dashboard::At;
use dask_comm::{ClusterOptions, LocalCluster, Protocol};
use dask_graph::{registry, Arg};

fn usage() -> ! {
    eprintln!(
        "usage: dashboard [--seconds S] [--workers N] [--threads N] [--dashboard-address HOST:PORT] [--protocol tcp|ucx]"
    );
    std::process::exit(2)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let sleep_ms = registry().register("sleep_ms", |ms: i64| {
        std::thread::sleep(Duration::from_millis(ms.clamp(0, 10_000) as u64));
        ms
    });
    let total = registry().register_variadic("total", |xs: Vec<i64>| xs.iter().sum::<i64>());
    dask_comm::run_if_worker();

    let mut opts = ClusterOptions {
        threads_per_worker: 2,
        dashboard: Some(At::Default),
        ..Default::default()
    };
    let mut seconds = 30.0f64;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--seconds" => seconds = value.parse()?,
            "--workers" => opts.workers = value.parse()?,
            "--threads" => opts.threads_per_worker = value.parse()?,
            "--dashboard-address" => opts.dashboard = Some(At::Exactly(value.parse()?)),
            "--protocol" => opts.protocol = value.parse::<Protocol>()?,
            _ => usage(),
        }
    }
    let slots = (opts.workers * opts.threads_per_worker).max(1) as i64;
    let cluster = LocalCluster::with(opts)?;
    let at = cluster
        .dashboard_address()
        .ok_or("the cluster serves no dashboard")?;
    println!("DASHBOARD http://{at}/");
    let client = cluster.client()?;
    client.set_progress(true); // a bar on a terminal while a wait takes over a second
    let start = Instant::now();
    let (mut rounds, mut tasks) = (0u64, 0u64);
    while start.elapsed().as_secs_f64() < seconds {
        // Four tasks per thread of 5-40 ms, then their sum in one task.
        let ms: Vec<i64> = (0..4 * slots)
            .map(|i| 5 + (i * 7 + rounds as i64) % 36)
            .collect();
        let want: i64 = ms.iter().sum();
        let parts = client.blocking().map(sleep_ms, ms)?;
        let total = client
            .blocking()
            .submit(total, parts.iter().map(|f| Arg::Key(f.key())).collect())?;
        let got = *total
            .result_blocking()?
            .downcast_ref::<i64>()
            .ok_or("total returned a non-integer")?;
        if got != want {
            return Err(format!("round {rounds}: {got}, expected {want}").into());
        }
        rounds += 1;
        tasks += parts.len() as u64 + 1;
    }
    println!(
        "{rounds} rounds, {tasks} tasks in {:.1} s; every sum right",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("dashboard: {e}");
        std::process::exit(1);
    }
}
