//! Builds a merge graph of a million tasks (the `merge-N` workload: N independent tasks feeding
//! one sum), validates and orders it, and computes it on the threaded scheduler; prints the time
//! of each step and the peak memory of the process.
//!
//! ```text
//! cargo run --release -p dask-graph --example million [-- N]
//! ```

use std::time::Instant;

use dask_graph::{registry, Arg, Graph, Key, Scheduler, Task, Threaded};

/// Peak resident memory of this process (Linux), in MiB.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    registry().register("inc", |x: i64| x + 1);
    registry().register_variadic("sum", |xs: Vec<i64>| xs.iter().sum::<i64>());
    let t = Instant::now();
    let mut g = Graph::with_capacity(n as usize + 1);
    for i in 0..n {
        g.insert(("x", i), Task::new("inc", [Arg::lit(i as i64)]));
    }
    g.insert(
        "total",
        Task::new("sum", (0..n).map(|i| Arg::key(("x", i)))),
    );
    let built = t.elapsed();
    let rss_built = peak_rss_mib();
    let t = Instant::now();
    let plan = dask_graph::Plan::new(g.clone(), &[Key::name_only("total")]).expect("valid");
    let planned = t.elapsed();
    drop(plan);
    let t = Instant::now();
    let out = Threaded::per_core()
        .get(g, &[Key::name_only("total")])
        .expect("computed");
    let computed = t.elapsed();
    let want = (1..=n as i64).sum::<i64>();
    assert_eq!(out[0].downcast_ref::<i64>(), Some(&want));
    println!(
        "{n} tasks: built in {built:.2?} ({rss_built:.0} MiB peak), validated + culled + fused + \
         ordered in {planned:.2?}, computed in {computed:.2?}; peak {:.0} MiB",
        peak_rss_mib()
    );
}
