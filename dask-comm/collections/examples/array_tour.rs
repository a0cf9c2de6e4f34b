//! The seed slides' array examples in Rust, on `Threaded` and on a `LocalCluster` of worker
//! processes, with timings; `--bench NAME --scheduler threaded|cluster [--rounds N]` prints
//! one JSON line per run for `scripts/array_compare.py`.
//!
//! ```text
//! cargo run --release -p dask-collections --example array_tour
//! cargo run --release -p dask-collections --example array_tour -- --small
//! ```

use std::sync::Arc;
use std::time::Instant;

use dask_collections::array::{
    self, Array, ArrayError, Boundary, Chunk, DType, Index, UnaryOp, random,
};
use dask_comm::{ClusterOptions, LocalCluster};
use dask_graph::{Scheduler, Threaded};

/// The mean of each element's 3×3 neighbourhood, inside a 2-d block (its edge elements,
/// which `map_overlap` trims, are left as they are).
fn mean3x3(block: Arc<Chunk>) -> Result<Chunk, String> {
    let Chunk::F64(b) = &*block else {
        return Err("mean3x3 takes f64 blocks".into());
    };
    let b = b
        .view()
        .into_dimensionality::<ndarray::Ix2>()
        .map_err(|e| e.to_string())?;
    let (r, c) = b.dim();
    let mut out = b.to_owned();
    if r >= 3 && c >= 3 {
        let mut acc = ndarray::Array2::<f64>::zeros((r - 2, c - 2));
        for i in 0..3 {
            for j in 0..3 {
                acc += &b.slice(ndarray::s![i..r - 2 + i, j..c - 2 + j]);
            }
        }
        out.slice_mut(ndarray::s![1..r - 1, 1..c - 1])
            .assign(&(acc / 9.0));
    }
    Ok(Chunk::from(out.into_dyn()))
}

/// sin(0.37 i + 0.11 j) on an n × n grid in blocks of c × c.
fn waves(n: usize, c: usize) -> Result<Array, ArrayError> {
    let i = array::arange(0.0, n as f64, 1.0, c, DType::F64)?.reshape(&[n, 1])?;
    let j = array::arange(0.0, n as f64, 1.0, c, DType::F64)?.reshape(&[1, n])?;
    (&(&i * 0.37)? + &(&j * 0.11)?)?.unary(UnaryOp::Sin)
}

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
        // x.map_overlap(mean3x3, depth=1, boundary="reflect") * x, summed; x = waves 8000 x 8000
        "overlap" => {
            let (n, c) = if small { (1600, 200) } else { (8000, 1000) };
            let x = waves(n, c)?;
            let m = x.map_overlap("tour-mean3x3", &[1], &[Boundary::Reflect], DType::F64)?;
            (&m * &x)?.sum(&[], false)
        }
        // cholesky(ones((n, n)) + n * eye(n)).sum(), n = 4000, chunks 1000 or 250
        "cholesky" | "cholesky-250" => {
            let n = if small { 800 } else { 4000 };
            let c = match (name, small) {
                ("cholesky", false) => 1000,
                ("cholesky", true) => 200,
                (_, false) => 250,
                (_, true) => 50,
            };
            let a = (&array::ones(&[n, n], c, DType::F64)?
                + &(&array::eye(n, c, 0, DType::F64)? * n as f64)?)?;
            array::linalg::cholesky(&a, true)?.sum(&[], false)
        }
        // svd(x)[1].sum(), x = sin(0.00037 i (j + 1)) of 2,000,000 x 20 in 100,000-row blocks
        "svd" => {
            let (n, c) = if small {
                (200_000, 10_000)
            } else {
                (2_000_000, 100_000)
            };
            let i = array::arange(0.0, n as f64, 1.0, c, DType::F64)?.reshape(&[n, 1])?;
            let j = array::arange(1.0, 21.0, 1.0, 20, DType::F64)?.reshape(&[1, 20])?;
            let x = (&(&i * &j)? * 0.00037)?.unary(UnaryOp::Sin)?;
            array::linalg::svd(&x)?.1.sum(&[], false)
        }
        other => panic!(
            "unknown workload {other} (xxt, exp-slice, random-mean, rechunk, matmul, overlap, \
             cholesky, cholesky-250, svd)"
        ),
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
    dask_graph::registry().register("tour-mean3x3", mean3x3);
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
    // A .npy stack for NumPy to check (`--npy-write DIR`), or one NumPy wrote to read back
    // (`--npy-read DIR`, prints the sum).
    if let Some(dir) = flag("--npy-write") {
        let x = array::arange(0.0, 60.0, 1.0, 60, DType::I64)?.reshape(&[6, 10])?;
        x.rechunk(vec![vec![2, 3, 1], vec![10]])?
            .to_npy_stack(&dir, 0, &Threaded::new(2))?;
        return Ok(());
    }
    if let Some(dir) = flag("--npy-read") {
        let x = array::from_npy_stack(&dir)?;
        let v = x
            .astype(DType::F64)?
            .sum(&[], false)?
            .compute(&Threaded::new(2))?;
        println!(
            "{{\"shape\":{:?},\"sum\":{}}}",
            x.shape(),
            v.to_f64().iter().next().copied().unwrap_or(f64::NAN)
        );
        return Ok(());
    }
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
            println!(
                "{{\"workload\":\"{name}\",\"scheduler\":\"{sched}\",\"seconds\":{secs:.6},\"answer\":{answer}}}"
            );
        }
        return Ok(());
    }
    let c = cluster()?;
    let client = c.client()?;
    client.set_progress(true); // a bar on a terminal while a wait takes over a second
    let threaded = Threaded::new(2);
    for name in [
        "xxt",
        "exp-slice",
        "random-mean",
        "rechunk",
        "matmul",
        "overlap",
    ] {
        let (t1, v1) = run(name, small, &threaded)?;
        let (t2, v2) = run(name, small, &client)?;
        println!(
            "{name:<12} threaded {t1:>8.3} s   cluster (2 processes) {t2:>8.3} s   answer {v1} / {v2}"
        );
    }
    Ok(())
}
