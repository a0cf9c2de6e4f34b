//! Device arrays on a cluster: two worker processes pinned to the GPUs (one each where there
//! are two; both on the one GPU otherwise), blocks made and computed in device memory and
//! moved worker to worker as device frames, every answer checked against the host.
//!
//! ```text
//! cargo run --release -p dask-collections --features cuda --example device_tour
//! # the transfer benchmark: device blocks fetched worker to worker, per pair, JSON lines
//! cargo run --release -p dask-collections --features cuda --example device_tour -- \
//!     --bench --protocols ucx,tcp --mib 64 --rounds 8
//! ```
//!
//! Without a GPU it prints why and exits successfully, unless `--require-gpu` (the GPU proof,
//! `scripts/gpu/prove.sh`, passes it).

use std::time::Instant;

use dask_collections::array::{self, BinaryOp, Chunk, DType, UnaryOp, device};
use dask_comm::{ClusterOptions, LocalCluster, Protocol, transfers};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn values(c: &Chunk) -> Vec<f64> {
    c.to_f64().into_iter().collect()
}

fn scalar(c: &Chunk) -> f64 {
    values(c)[0]
}

/// Relative agreement to `tol`.
fn close(what: &str, got: f64, want: f64, tol: f64) -> Result<()> {
    let ok = (got - want).abs() <= tol * want.abs().max(1.0);
    println!(
        "  {what:<34} device {got:<24.12} host {want:<24.12} {}",
        if ok { "ok" } else { "DIFFERS" }
    );
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: device {got}, host {want}").into())
    }
}

/// The GPUs to pin the workers to: those this process was given (`CUDA_VISIBLE_DEVICES`, by
/// number), else all `count`; `None` (no pinning) for a list of UUIDs.
fn visible(count: usize) -> Option<Vec<usize>> {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) if !v.trim().is_empty() => v.split(',').map(|d| d.trim().parse().ok()).collect(),
        _ => Some((0..count).collect()),
    }
}

fn cluster(protocol: Protocol, gpus: usize, device_limit: Option<u64>) -> Result<LocalCluster> {
    Ok(LocalCluster::with(ClusterOptions {
        workers: 2,
        protocol,
        gpus: visible(gpus),
        device_memory_limit: device_limit,
        ..ClusterOptions::default()
    })?)
}

/// Workers with less device memory than their blocks: the least recently used move to host
/// memory and come back when used, and the answers do not change.
fn check_device_limit(gpus: usize) -> Result<()> {
    let c = cluster(Protocol::Ucx, gpus, Some(8 << 20))?;
    let client = c.client()?;
    // 32 MiB of blocks over two workers with 8 MiB of device memory each.
    let x = device::random(5, &[2048, 2048], 512, DType::F64)?.persist(&client)?;
    let host = values(&x.compute(&client)?);
    let want: f64 = host.iter().map(|v| 2.0 * v).sum();
    let y = x.binary(BinaryOp::Add, &x)?.sum()?;
    close(
        "sum(x + x), 8 MiB device limit",
        scalar(&y.compute(&client)?),
        want,
        1e-9,
    )
}

/// Device computations on the cluster, each against the host's answer.
fn check(gpus: usize) -> Result<()> {
    let c = cluster(Protocol::Ucx, gpus, None)?;
    let client = c.client()?;
    let (n, b) = (2048, 512);
    let t0 = Instant::now();
    let x = device::random(7, &[n, n], b, DType::F64)?.persist(&client)?;
    // The draws are the host twin's, bit for bit (the PTX's integer hash, checked).
    let host = x.compute(&client)?;
    let Chunk::F64(h) = &host else {
        return Err("random float64 blocks came back as another type".into());
    };
    let grid = n / b;
    for bi in 0..grid {
        for bj in 0..grid {
            let want = device::uniform_block(7, (bi * grid + bj) as u64, &[b, b], DType::F64);
            let got = h.slice(ndarray::s![bi * b..(bi + 1) * b, bj * b..(bj + 1) * b]);
            if Chunk::from(got.to_owned().into_dyn()) != want {
                return Err(format!("block ({bi}, {bj}) differs from the host's draws").into());
            }
        }
    }
    println!(
        "  random blocks: {} of {b}x{b}, bit for bit the host's",
        grid * grid
    );
    let hv = values(&host);
    // 3x + x, then the tree reductions.
    let y = x
        .scalar(BinaryOp::Mul, 3.0, false)?
        .binary(BinaryOp::Add, &x)?;
    let want: Vec<f64> = hv.iter().map(|v| v * 3.0 + v).collect();
    let sum: f64 = want.iter().sum();
    close(
        "sum(3x + x)",
        scalar(&y.sum()?.compute(&client)?),
        sum,
        1e-9,
    )?;
    close(
        "mean(3x + x)",
        scalar(&y.mean()?.compute(&client)?),
        sum / want.len() as f64,
        1e-9,
    )?;
    let min = want.iter().copied().fold(f64::INFINITY, f64::min);
    let max = want.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    close("min(3x + x)", scalar(&y.min()?.compute(&client)?), min, 0.0)?;
    close("max(3x + x)", scalar(&y.max()?.compute(&client)?), max, 0.0)?;
    // Elementwise, every element: sqrt(|x - 0.5|) floor'd after scaling, as float32.
    let z = x
        .scalar(BinaryOp::Sub, 0.5, false)?
        .unary(UnaryOp::Abs)?
        .unary(UnaryOp::Sqrt)?
        .scalar(BinaryOp::Mul, 100.0, false)?
        .unary(UnaryOp::Floor)?
        .astype(DType::F32)?;
    let zh = values(&z.compute(&client)?);
    let zw: Vec<f64> = hv
        .iter()
        .map(|v| f64::from(((v - 0.5).abs().sqrt() * 100.0).floor() as f32))
        .collect();
    let differ = zh.iter().zip(&zw).filter(|(a, b)| a != b).count();
    println!(
        "  floor(100 sqrt|x - 0.5|) as float32: {differ} of {} elements differ",
        zh.len()
    );
    if differ > 0 {
        return Err("elementwise results differ from the host's".into());
    }
    // Integers: int32 blocks, an int64 sum.
    let i = device::full(&[100_000], 30_000, DType::I32, 3.0)?
        .scalar(BinaryOp::Mul, 7.0, false)?
        .binary(
            BinaryOp::Maximum,
            &device::full(&[100_000], 30_000, DType::I32, 5.0)?,
        )?;
    let total = i.sum()?.compute(&client)?;
    if total.dtype() != DType::I64 || scalar(&total) != 2_100_000.0 {
        return Err(format!("int32 sum: {total:?}").into());
    }
    println!(
        "  sum(max(3 * 7, 5)) over 100,000 int32: {} (int64)",
        scalar(&total)
    );
    // Matmul with cuBLAS, blocks moving between the workers.
    let a = device::random(8, &[1024, 768], 256, DType::F64)?;
    let m = device::random(9, &[768, 512], 256, DType::F64)?;
    let got = a.matmul(&m)?.compute(&client)?;
    let (ah, mh) = (a.compute(&client)?, m.compute(&client)?);
    let (Chunk::F64(ah), Chunk::F64(mh), Chunk::F64(gh)) = (&ah, &mh, &got) else {
        return Err("matmul blocks of another type".into());
    };
    let want = ah
        .view()
        .into_dimensionality::<ndarray::Ix2>()?
        .dot(&mh.view().into_dimensionality::<ndarray::Ix2>()?);
    let worst = gh
        .iter()
        .zip(want.iter())
        .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
        .fold(0.0, f64::max);
    println!("  matmul 1024x768 . 768x512 (cuBLAS): largest relative difference {worst:.2e}");
    if worst > 1e-12 {
        return Err("matmul differs from the host's".into());
    }
    // Blocks that crossed between the workers, as device frames.
    let pairs = transfers::pair_rates(&[], &client.blocking().transfer_log()?);
    let (moved, _, n) = transfers::totals(&pairs);
    println!(
        "  {n} fetches between the workers moved {moved} bytes; all checks in {:.1?}",
        t0.elapsed()
    );
    if n == 0 {
        return Err(
            "no block moved between the workers: the check proved nothing about transfers".into(),
        );
    }
    Ok(())
}

/// Device blocks of `mib` MiB fetched worker to worker over `protocol`: each round makes two
/// blocks (on the two workers, as two idle one-thread workers take them) and adds them, so
/// one crosses; prints the per-pair rates of those fetches as one JSON line.
fn bench(protocol: Protocol, gpus: usize, mib: usize, rounds: usize) -> Result<()> {
    let c = cluster(protocol, gpus, None)?;
    let client = c.client()?;
    let n = (mib << 20) / 8;
    let before = client.blocking().transfer_log()?;
    for r in 0..rounds as u64 {
        let a = device::random(2 * r, &[n], n, DType::F64)?;
        let b = device::random(2 * r + 1, &[n], n, DType::F64)?;
        let s = a.binary(BinaryOp::Add, &b)?.sum()?.compute(&client)?;
        let want = 0.5 * 2.0 * n as f64;
        if (scalar(&s) - want).abs() > 0.01 * want {
            return Err(format!("round {r}: a sum of {} for about {want}", scalar(&s)).into());
        }
    }
    let after = client.blocking().transfer_log()?;
    // The blocks' fetches only (not the small partial results of the sums).
    let big = |logs: Vec<(String, Vec<dask_comm::Transfer>)>| {
        logs.into_iter()
            .map(|(w, e)| {
                (
                    w,
                    e.into_iter()
                        .filter(|t| t.bytes >= (mib << 20) as u64)
                        .collect(),
                )
            })
            .collect::<Vec<_>>()
    };
    let pairs = transfers::pair_rates(&big(before), &big(after));
    let rows: Vec<String> = pairs.iter().map(|p| p.to_json()).collect();
    println!(
        "{{\"protocol\":\"{}\",\"mib\":{mib},\"rounds\":{rounds},\"pairs\":[{}]}}",
        format!("{protocol:?}").to_lowercase(),
        rows.join(",")
    );
    if pairs.is_empty() {
        return Err("no block crossed between the workers".into());
    }
    Ok(())
}

fn main() -> Result<()> {
    array::register();
    dask_comm::run_if_worker();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let opt = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let gpus = match ucx::cuda::open(0) {
        Ok(_) => ucx::cuda::cudarc::driver::CudaContext::device_count()? as usize,
        Err(e) if flag("--require-gpu") => return Err(format!("no GPU: {e}").into()),
        Err(e) => {
            println!("skipped: {e}");
            return Ok(());
        }
    };
    if flag("--bench") {
        let mib: usize = opt("--mib").map_or(Ok(64), |v| v.parse())?;
        let rounds: usize = opt("--rounds").map_or(Ok(8), |v| v.parse())?;
        for p in opt("--protocols")
            .unwrap_or_else(|| "ucx,tcp".into())
            .split(',')
        {
            bench(p.parse()?, gpus, mib, rounds)?;
        }
        return Ok(());
    }
    println!("device arrays on two worker processes over ucx://, {gpus} GPU(s):");
    check(gpus)?;
    check_device_limit(gpus)?;
    println!("device_tour: every check passed");
    Ok(())
}
