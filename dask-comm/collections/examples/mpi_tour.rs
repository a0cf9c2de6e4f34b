//! A cluster started by a job launcher (`dask_comm::initialize`, as dask-mpi's): every rank
//! runs this program; rank 0 becomes the scheduler, ranks 2 and up workers, and rank 1 runs
//! the rest of `main` with a client: the seed's primes and a chunked-array sum, each checked
//! against the same computation here. When `main` ends the cluster shuts down and every rank
//! exits.
//!
//! ```text
//! cargo build --release -p dask-collections --example mpi_tour
//! mpirun -np 6 target/release/examples/mpi_tour            # Open MPI (as root: --allow-run-as-root --oversubscribe)
//! mpiexec.mpich -n 6 target/release/examples/mpi_tour      # MPICH
//! srun -n 6 target/release/examples/mpi_tour               # Slurm
//! ```
//!
//! Options: `--protocol tcp|ucx`, `--interface IF`, `--address-family ipv4|ipv6`,
//! `--scheduler-file F`, `--nthreads N`.
//! `--connect F` runs no ranks: it is a plain client of the cluster whose scheduler file is
//! `F` (one started by `mpirun -np N dask-comm mpi --scheduler-file F`), computes with the
//! functions `dask-comm` registers once `--workers N` (1) have joined, and shuts that cluster
//! down.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use dask_collections::array::{self, DType};
use dask_comm::{Client, LaunchOptions, Protocol, Secret};
use dask_graph::{Arg, registry};

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
    eprintln!(
        "usage: mpi_tour [--protocol tcp|ucx] [--interface IF] [--address-family ipv4|ipv6] [--scheduler-file F] [--nthreads N]\n       mpi_tour --connect SCHEDULER_FILE [--workers N]"
    );
    std::process::exit(2)
}

type Failure = Box<dyn std::error::Error>;

/// The seed's primes and a chunked-array sum on the launched cluster; false when an answer
/// is wrong.
fn tour(client: &Client) -> Result<bool, Failure> {
    let (lo, hi) = (1_000_000u64, 1_020_000u64);
    let t0 = Instant::now();
    let futures = client.blocking().map("is_prime", lo..hi)?;
    let flags = client.blocking().gather(&futures)?;
    let primes = flags
        .iter()
        .filter(|f| f.downcast_ref::<bool>() == Some(&true))
        .count();
    let want = (lo..hi).filter(|&n| is_prime(n)).count();
    println!(
        "primes between {lo} and {hi}: {primes} ({} tasks in {:.1?}; expected {want})",
        hi - lo,
        t0.elapsed()
    );
    let n = 10_000_000i64;
    let t0 = Instant::now();
    let total = array::arange(0.0, n as f64, 1.0, 500_000, DType::I64)?
        .sum(&[], false)?
        .compute(client)?
        .to_f64();
    let got = total.iter().next().copied().unwrap_or(f64::NAN) as i64;
    let want_sum = n * (n - 1) / 2;
    println!(
        "sum of arange({n}) in 20 chunks: {got} (in {:.1?}; expected {want_sum})",
        t0.elapsed()
    );
    Ok(primes == want && got == want_sum)
}

/// As a plain client of a cluster started by `dask-comm mpi` (or `dask-comm scheduler` and
/// `worker`): `inc` of 0..1000 spread over the workers, then one `sum` task of them all (so
/// the values held elsewhere move to the worker that sums), then shut the cluster down. The
/// functions are those the `dask-comm` command registers.
fn connected(file: PathBuf, workers: usize) -> Result<bool, Failure> {
    let sf = dask_comm::cli::wait_for_file(&file, Duration::from_secs(60))?;
    let client = Client::connect_blocking(&sf.address.parse()?, Secret::from_hex(&sf.secret)?)?;
    client
        .blocking()
        .wait_for_workers(workers, Duration::from_secs(60))?;
    let n = 1000i64;
    let incs = client.blocking().map("inc", 0..n)?;
    client.blocking().wait(&incs)?;
    let mut holders: Vec<String> = client
        .blocking()
        .holders(&incs)?
        .into_iter()
        .flat_map(|(_, h)| h)
        .collect();
    holders.sort();
    holders.dedup();
    let total = client
        .blocking()
        .submit("sum", incs.iter().map(|f| Arg::Key(f.key())).collect())?;
    let got = *total
        .result_blocking()?
        .downcast_ref::<i64>()
        .ok_or("sum returned a non-integer")?;
    let want = n * (n + 1) / 2;
    println!(
        "connected to {} workers; inc results held by {holders:?}; their sum on one worker = {got} (expected {want})",
        client.workers().len()
    );
    client.blocking().shutdown(Duration::from_secs(10))?;
    println!("cluster shut down");
    Ok(got == want && holders.len() >= workers.min(2))
}

fn main() {
    // Logs to standard error, as RUST_LOG says (warnings by default).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    // Every rank registers the same functions before taking its part.
    registry().register("is_prime", is_prime);
    dask_comm::bench::register();
    array::register();

    let mut opts = LaunchOptions::default();
    let mut connect = None;
    let mut workers = 1;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--protocol" => opts.protocol = value.parse::<Protocol>().unwrap_or_else(|_| usage()),
            "--interface" => opts.interface = Some(value),
            "--address-family" => opts.address_family = value.parse().unwrap_or_else(|_| usage()),
            "--scheduler-file" => opts.scheduler_file = Some(value.into()),
            "--nthreads" => opts.nthreads = value.parse().unwrap_or_else(|_| usage()),
            "--connect" => connect = Some(PathBuf::from(value)),
            "--workers" => workers = value.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    let ok = match connect {
        Some(file) => connected(file, workers),
        None => match dask_comm::initialize(opts) {
            Ok(cluster) => {
                let r = cluster.rank();
                let threads: Vec<u32> = cluster
                    .client()
                    .workers()
                    .iter()
                    .map(|w| w.nthreads)
                    .collect();
                println!(
                    "rank {} of {} ({:?}): a client of {} workers, threads {threads:?}",
                    r.rank,
                    r.size,
                    r.launcher,
                    cluster.workers()
                );
                // Dropping `cluster` shuts every rank down.
                tour(cluster.client())
            }
            Err(e) => Err(e.into()),
        },
    };
    match ok {
        Ok(true) => println!("all answers right"),
        Ok(false) => {
            eprintln!("mpi_tour: a wrong answer");
            std::process::exit(1)
        }
        Err(e) => {
            eprintln!("mpi_tour: {e}");
            std::process::exit(1)
        }
    }
}
