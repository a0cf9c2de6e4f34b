//! The seeds' dataframe listing (read a month of CSVs, group by user, mean), a merge and a
//! sort, on `Threaded` and on a `LocalCluster` of worker processes, with timings.
//!
//! ```text
//! cargo run --release -p dask-collections --example dataframe_tour
//! ```
//!
//! Without arguments it writes a small data set to a temporary directory and runs both
//! workloads on both schedulers (they must agree). `--bench NAME --data DIR --scheduler
//! threaded|cluster [--rounds N] [--protocol tcp|ucx] [--shuffle p2p|tasks]` runs one workload
//! on the files `scripts/frame_compare.py` wrote and prints one JSON line per round; on a
//! cluster the line also has the bytes the merge's peer-to-peer shuffle moved between the
//! workers and the rate of those deliveries (the workers' transfer logs).

use std::time::Instant;

use dask_collections::dataframe::{self, DataFrameError, How, ShuffleMethod};
use dask_comm::{ClusterOptions, LocalCluster, Protocol};
use dask_graph::{Scheduler, Threaded};
use polars::prelude::*;

/// `dd.read_csv("2015-*-*.csv").groupby("user_id").value.mean()`: the number of users and
/// the sum of their means.
fn groupby(dir: &str, s: &dyn Scheduler) -> Result<(usize, f64), DataFrameError> {
    let df = dataframe::read_csv(&format!("{dir}/2015-*-*.csv"))?;
    let means = df.groupby(&["user_id"])?.mean("value")?.compute(s)?;
    let total = means
        .column("value_mean")
        .ok()
        .and_then(|c| c.as_materialized_series().sum::<f64>().ok())
        .unwrap_or(f64::NAN);
    Ok((means.height(), total))
}

/// An inner merge of two parquet datasets on `key`: rows out and the sum of the right side's
/// `y`.
fn merge(
    dir: &str,
    s: &dyn Scheduler,
    method: ShuffleMethod,
) -> Result<(usize, f64), DataFrameError> {
    let left = dataframe::read_parquet(&format!("{dir}/left-*.parquet"))?;
    let right = dataframe::read_parquet(&format!("{dir}/right-*.parquet"))?;
    let m = left
        .merge_with(&right, &["key"], How::Inner, method)?
        .select(&["key", "y"])?;
    let out = m.compute(s)?;
    let total = out
        .column("y")
        .ok()
        .and_then(|c| c.as_materialized_series().sum::<f64>().ok())
        .unwrap_or(f64::NAN);
    Ok((out.height(), total))
}

/// The left merge dataset sorted by `x`: rows, and the sum of the 1,000 smallest `x` in the
/// order they come out (a check of both the values and their order).
fn sort(dir: &str, s: &dyn Scheduler) -> Result<(usize, f64), DataFrameError> {
    let left = dataframe::read_parquet(&format!("{dir}/left-*.parquet"))?;
    let out = left.sort_values("x")?.compute(s)?;
    let xs = out.column("x").map_err(|e| DataFrameError::Invalid {
        op: "sort",
        reason: e.to_string(),
    })?;
    let first: Vec<f64> = xs
        .as_materialized_series()
        .f64()
        .map(|c| c.into_no_null_iter().take(1000).collect())
        .unwrap_or_default();
    let total = first.iter().sum();
    Ok((out.height(), total))
}

fn run(
    name: &str,
    dir: &str,
    s: &dyn Scheduler,
    method: ShuffleMethod,
) -> Result<(f64, usize, f64), Box<dyn std::error::Error>> {
    let t0 = Instant::now();
    let (rows, total) = match name {
        "groupby" => groupby(dir, s)?,
        "merge" => merge(dir, s, method)?,
        "sort" => sort(dir, s)?,
        other => return Err(format!("no workload {other:?}").into()),
    };
    Ok((t0.elapsed().as_secs_f64(), rows, total))
}

/// A small data set of each kind in `dir` (deterministic).
fn write_small(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let names = ["Alice", "Bob", "Charlie", "Dan", "Edith"];
    for day in 1..=5 {
        let n = 2_000usize;
        let mut df = df!(
            "user_id" => (0..n).map(|i| ((i * 7919 + day * 31) % 100) as i64).collect::<Vec<_>>(),
            "value" => (0..n).map(|i| ((i * 13 + day) % 1000) as f64 / 10.0).collect::<Vec<_>>(),
            "name" => (0..n).map(|i| names[(i + day) % 5]).collect::<Vec<_>>(),
        )?;
        let mut f = std::fs::File::create(dir.join(format!("2015-01-{day:02}.csv")))?;
        CsvWriter::new(&mut f).finish(&mut df)?;
    }
    for (side, offset, col) in [("left", 0i64, "x"), ("right", 700, "y")] {
        for p in 0..4i64 {
            let keys: Vec<i64> = (0..250).map(|i| offset + p * 250 + i).collect();
            let vals: Vec<f64> = keys.iter().map(|k| (*k % 97) as f64).collect();
            let mut df = df!("key" => keys, col => vals)?;
            let f = std::fs::File::create(dir.join(format!("{side}-{p}.parquet")))?;
            ParquetWriter::new(f).finish(&mut df)?;
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    dataframe::register();
    dask_comm::run_if_worker();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let protocol = match flag("--protocol").as_deref() {
        None | Some("tcp") => Protocol::Tcp,
        Some("ucx") => Protocol::Ucx,
        Some(other) => return Err(format!("--protocol tcp or ucx, not {other:?}").into()),
    };
    let method = match flag("--shuffle").as_deref() {
        None | Some("p2p") => ShuffleMethod::P2p,
        Some("tasks") => ShuffleMethod::Tasks,
        Some(other) => return Err(format!("--shuffle p2p or tasks, not {other:?}").into()),
    };
    let cluster = || {
        LocalCluster::with(ClusterOptions {
            workers: 2,
            threads_per_worker: 1,
            protocol,
            ..Default::default()
        })
    };
    if let Some(name) = flag("--bench") {
        let dir = flag("--data").ok_or("--bench needs --data DIR")?;
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
            let before = match &client {
                Some(cl) => cl.blocking().transfer_log()?,
                None => Vec::new(),
            };
            let (secs, rows, total) = run(&name, &dir, s, method)?;
            let after = match &client {
                Some(cl) => cl.blocking().transfer_log()?,
                None => Vec::new(),
            };
            let pairs = dask_comm::transfers::pair_rates(&before, &after);
            let (bytes, micros, count) = dask_comm::transfers::totals(&pairs);
            let rate = bytes as f64 / (micros as f64).max(1.0);
            let pairs: Vec<String> = pairs.iter().map(|p| p.to_json()).collect();
            println!(
                "{{\"workload\":\"{name}\",\"scheduler\":\"{sched}\",\"seconds\":{secs:.6},\"answer\":[{rows},{total}],\"moved_mb\":{:.3},\"deliveries\":{count},\"pair_mb_s\":{rate:.1},\"pairs\":[{}]}}",
                bytes as f64 / 1e6,
                pairs.join(",")
            );
        }
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("dataframe-tour-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    write_small(&dir)?;
    let d = dir.to_string_lossy().into_owned();
    let c = cluster()?;
    let client = c.client()?;
    client.set_progress(true); // a bar on a terminal while a wait takes over a second
    let threaded = Threaded::new(2);
    for name in ["groupby", "merge", "sort"] {
        let (t1, r1, v1) = run(name, &d, &threaded, method)?;
        let (t2, r2, v2) = run(name, &d, &client, method)?;
        if r1 != r2 || (v1 - v2).abs() > 1e-9 * v1.abs().max(1.0) {
            return Err(
                format!("{name}: threaded ({r1}, {v1}) but the cluster ({r2}, {v2})").into(),
            );
        }
        println!(
            "{name:<8} threaded {t1:>7.3} s   cluster (2 processes) {t2:>7.3} s   rows {r1}, total {v1}"
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
