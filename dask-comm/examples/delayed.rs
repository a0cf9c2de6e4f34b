//! A small hand-built graph, in the spirit of `dask.delayed`: `inc` and `add` over a few
//! numbers, then a `sum`, computed on the single-threaded scheduler, the thread pool, and a
//! `LocalCluster` of worker processes. The graph does not change; the answer does not either.
//!
//! ```text
//! cargo run --release -p dask-comm --example delayed
//! ```

use dask_comm::LocalCluster;
use dask_graph::{registry, Arg, Graph, Key, Scheduler, Task, Threaded};

fn graph() -> (Graph, Key) {
    // inc(i) for i in 0..8, add pairs of them, sum the pairs:
    //   sum(add(inc(0), inc(1)), add(inc(2), inc(3)), ...)
    let mut g = Graph::new();
    for i in 0..8u32 {
        g.insert(("inc", i), Task::new("inc", [Arg::lit(i as i64)]));
    }
    for j in 0..4u32 {
        g.insert(
            ("add", j),
            Task::new(
                "add",
                [Arg::key(("inc", 2 * j)), Arg::key(("inc", 2 * j + 1))],
            ),
        );
    }
    g.insert(
        "total",
        Task::new("sum", (0..4).map(|j| Arg::key(("add", j)))),
    );
    (g, Key::name_only("total"))
}

fn total(s: &dyn Scheduler) -> Result<i64, Box<dyn std::error::Error>> {
    let (g, key) = graph();
    let values = s.get(g, &[key])?;
    Ok(*values[0]
        .downcast_ref::<i64>()
        .ok_or("sum returned a non-i64")?)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    registry().register("inc", |x: i64| x + 1);
    registry().register("add", |x: i64, y: i64| x + y);
    registry().register_variadic("sum", |xs: Vec<i64>| xs.iter().sum::<i64>());
    dask_comm::run_if_worker();

    let expected: i64 = (1..=8).sum();
    let on_sync = total(&dask_graph::Sync)?;
    println!("Sync:         total = {on_sync}");
    let on_threads = total(&Threaded::new(4))?;
    println!("Threaded(4):  total = {on_threads}");
    let cluster = LocalCluster::new(2, 1)?;
    let client = cluster.client()?;
    let on_cluster = total(&client)?;
    println!("LocalCluster: total = {on_cluster}");
    if [on_sync, on_threads, on_cluster] != [expected; 3] {
        return Err(format!("expected {expected} everywhere").into());
    }
    println!("same answer on every scheduler: {expected}");
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
