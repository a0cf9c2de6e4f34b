//! The seed's first program: `client.map(is_prime, range)` and `gather`, on a `LocalCluster`
//! of worker processes (this binary, re-executed as workers).
//!
//! ```text
//! cargo run --release -p dask-comm --example primes -- 100000000 100001000
//! 54 primes between 100000000 and 100001000 (1000 tasks on 2 workers × 1 thread in 7.8ms)
//! ```
//!
//! Options after the range: `--workers N`, `--threads N`, `--protocol tcp|ucx`.

use std::time::Instant;

use dask_comm::{ClusterOptions, LocalCluster, Protocol};
use dask_graph::registry;

/// Trial division by 2, 3 and 6k ± 1: plain CPU work per number.
fn is_prime(n: u64) -> bool {
    if n < 4 {
        return n >= 2;
    }
    if n.is_multiple_of(2) || n.is_multiple_of(3) {
        return false;
    }
    let mut d = 5u64;
    while d * d <= n {
        if n.is_multiple_of(d) || n.is_multiple_of(d + 2) {
            return false;
        }
        d += 6;
    }
    true
}

fn usage() -> ! {
    eprintln!("usage: primes LO HI [--workers N] [--threads N] [--protocol tcp|ucx]");
    std::process::exit(2)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    // Every process registers the same functions; worker processes then become workers here.
    // The handle keeps the wire name and the type: `map` below checks the items are u64.
    let is_prime = registry().register("is_prime", is_prime);
    dask_comm::run_if_worker();

    let mut args = std::env::args().skip(1);
    let lo: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| usage());
    let hi: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| usage());
    if hi < lo {
        usage();
    }
    let mut opts = ClusterOptions::default();
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--workers" => opts.workers = value.parse()?,
            "--threads" => opts.threads_per_worker = value.parse()?,
            "--protocol" => opts.protocol = value.parse::<Protocol>()?,
            _ => usage(),
        }
    }
    let (workers, threads) = (opts.workers, opts.threads_per_worker);
    let cluster = LocalCluster::with(opts)?;
    let client = cluster.client()?;
    client.set_progress(true); // a bar on a terminal while a wait takes over a second

    let t0 = Instant::now();
    let futures = client.blocking().map(is_prime, lo..hi)?;
    let flags = client.blocking().gather(&futures)?;
    let elapsed = t0.elapsed();
    let mut count = 0;
    for f in &flags {
        count += usize::from(
            *f.downcast_ref::<bool>()
                .ok_or("is_prime returned a non-bool")?,
        );
    }
    println!(
        "{count} primes between {lo} and {hi} ({} tasks on {workers} workers × {threads} thread{} in {elapsed:.1?})",
        hi - lo,
        if threads == 1 { "" } else { "s" },
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
