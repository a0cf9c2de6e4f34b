//! A small hand-built graph, in the spirit of `dask.delayed`: `inc` and `add` over a few
//! numbers, then a `sum`, computed on the single-threaded scheduler, the thread pool, and a
//! `LocalCluster` of worker processes. The graph does not change; the answer does not either.
//!
//! ```text
//! cargo run --release -p dask-comm --example delayed
//! ```

use dask_comm::LocalCluster;
use dask_graph::{registry, Arg, Func, Graph, Key, Scheduler, Threaded, Variadic};

/// The functions, registered once per process; their handles name them in the graph.
struct Funcs {
    inc: Func<(i64,), i64>,
    add: Func<(i64, i64), i64>,
    sum: Func<Variadic<i64>, i64>,
}

fn register() -> Funcs {
    Funcs {
        inc: registry().register("inc", |x: i64| x + 1),
        add: registry().register("add", |x: i64, y: i64| x + y),
        sum: registry().register_variadic("sum", |xs: Vec<i64>| xs.iter().sum::<i64>()),
    }
}

fn graph(f: &Funcs) -> (Graph, Key) {
    // inc(i) for i in 0..8, add pairs of them, sum the pairs:
    //   sum(add(inc(0), inc(1)), add(inc(2), inc(3)), ...)
    let mut g = Graph::new();
    for i in 0..8u32 {
        g.insert(("inc", i), f.inc.task([Arg::lit(i as i64)]));
    }
    for j in 0..4u32 {
        g.insert(
            ("add", j),
            f.add
                .task([Arg::key(("inc", 2 * j)), Arg::key(("inc", 2 * j + 1))]),
        );
    }
    g.insert("total", f.sum.task((0..4).map(|j| Arg::key(("add", j)))));
    (g, Key::name_only("total"))
}

fn total(f: &Funcs, s: &dyn Scheduler) -> Result<i64, Box<dyn std::error::Error>> {
    let (g, key) = graph(f);
    let values = s.get(g, &[key])?;
    Ok(*values[0]
        .downcast_ref::<i64>()
        .ok_or("sum returned a non-i64")?)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let f = register();
    dask_comm::run_if_worker();

    let expected: i64 = (1..=8).sum();
    let on_sync = total(&f, &dask_graph::Inline)?;
    println!("Inline:       total = {on_sync}");
    let on_threads = total(&f, &Threaded::new(4))?;
    println!("Threaded(4):  total = {on_threads}");
    let cluster = LocalCluster::new(2, 1)?;
    let client = cluster.client()?;
    client.set_progress(true); // a bar on a terminal while a wait takes over a second
    let on_cluster = total(&f, &client)?;
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
