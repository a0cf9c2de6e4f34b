//! The seed slides' array examples in Rust, on `Threaded` and on a `LocalCluster` of worker
//! processes, with timings; `--bench NAME --scheduler threaded|cluster [--rounds N]` prints
//! one JSON line per run for `scripts/array_compare.py`.
//!
//! ```text
//! cargo run --release -p dask-collections --example array_tour
//! cargo run --release -p dask-collections --example array_tour -- --small
//! ```

use std::time::Instant;

use dask_collections::array::{self, random, Array, ArrayError, DType, Index, UnaryOp};
use dask_comm::{ClusterOptions, LocalCluster};
use dask_graph::{Scheduler, Threaded};

/// A workload: the expression, and how to read its answer as one number.
fn build(name: &str, small: bool) -> Result<Array, ArrayError> {
    let (n, c) = if small { (2000, 200) } else { (10000, 1000) };
    match name {
        // (x + x.T - x.mean(axis=0)).sum()
        "xxt" => {
            let x = array::ones(&[n, n], c, DType::F64)?;
            (&(&x + &x.t()?)? - &x.mean(&[0], false)?)?.sum(&[], false)
        }
        // exp(ones((10000, 10000), chunks=100))[1:100, 1:100].sum()
        "exp-slice" => array::ones(&[n, n], c / 10, DType::F64)?
            .unary(UnaryOp::Exp)?
            .slice(&[Index::from(1..100), Index::from(1..100)])?
            .sum(&[], false),
        // random((20000, 20000), chunks=2000).mean()
        "random-mean" => random::random(0, &[2 * n, 2 * n], 2 * c)?.mean(&[], false),
        // random((20000, 20000), chunks=(20000, 100)).rechunk((100, 20000)).sum()
        "rechunk" => {
            let (l, w) = if small { (4000, 20) } else { (20000, 100) };
            random::random(0, &[l, l], [l, w])?
                .rechunk([w, l])?
                .sum(&[], false)
        }
        // (a @ b).sum() for ones 4000 x 4000 in chunks of 1000
        "matmul" => {
            let (m, k) = if small { (800, 200) } else { (4000, 1000) };
            let a = array::ones(&[m, m], k, DType::F64)?;
            a.matmul(&a)?.sum(&[], false)
        }
        other => panic!("unknown workload {other} (xxt, exp-slice, random-mean, rechunk, matmul)"),
    }
}

fn run(name: &str, small: bool, s: &dyn Scheduler) -> Result<(f64, f64), ArrayError> {
    let t0 = Instant::now();
    let a = build(name, small)?;
    let v = a.compute(s)?.to_f64();
    Ok((
        t0.elapsed().as_secs_f64(),
        v.iter().next().copied().unwrap_or(f64::NAN),
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    array::register();
    dask_comm::run_if_worker();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let small = args.iter().any(|a| a == "--small");
    let cluster = || {
        LocalCluster::with(ClusterOptions {
            workers: 2,
            threads_per_worker: 1,
            ..Default::default()
        })
    };
    if let Some(name) = flag("--bench") {
        let rounds: usize = flag("--rounds").map_or(Ok(1), |r| r.parse())?;
        let sched = flag("--scheduler").unwrap_or_else(|| "threaded".into());
        let c = (sched == "cluster").then(cluster).transpose()?;
        let client = c.as_ref().map(LocalCluster::client).transpose()?;
        let threaded = Threaded::new(2);
        let s: &dyn Scheduler = match &client {
            Some(cl) => cl,
            None => &threaded,
        };
        for _ in 0..rounds {
            let (secs, answer) = run(&name, small, s)?;
            println!("{{\"workload\":\"{name}\",\"scheduler\":\"{sched}\",\"seconds\":{secs:.6},\"answer\":{answer}}}");
        }
        return Ok(());
    }
    let c = cluster()?;
    let client = c.client()?;
    let threaded = Threaded::new(2);
    for name in ["xxt", "exp-slice", "random-mean", "rechunk", "matmul"] {
        let (t1, v1) = run(name, small, &threaded)?;
        let (t2, v2) = run(name, small, &client)?;
        println!("{name:<12} threaded {t1:>8.3} s   cluster (2 processes) {t2:>8.3} s   answer {v1} / {v2}");
    }
    Ok(())
}
