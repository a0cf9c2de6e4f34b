//! Bags on text, JSON lines and records, on `Threaded` and on a `LocalCluster` of worker
//! processes, with timings: a word count, a JSON-lines filter and sum, the RSDS bag
//! benchmark (people, `filter`, `product`, `filter`, `pluck`, `map`, `sum`), and a groupby
//! of the JSON records (on the peer-to-peer shuffle, and as tasks).
//!
//! ```text
//! cargo run --release -p dask-collections --example bag_tour
//! ```
//!
//! Without arguments it writes a small data set to a temporary directory and runs every
//! workload on both schedulers. `--bench NAME --data DIR --scheduler threaded|cluster
//! [--rounds N]` runs one workload on the files `scripts/bag_compare.py` wrote and prints one
//! JSON line per round.

use std::time::Instant;

/// Bags make and drop many small items (a JSON record is a map of strings): mimalloc frees
/// them, across threads too, far faster than glibc's malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use dask_collections::ShuffleMethod;
use dask_collections::bag::{self, Bag, BagError, Item};
use dask_comm::{ClusterOptions, LocalCluster};
use dask_graph::{Scheduler, Threaded};

/// The item functions of these workloads, registered in every process (workers too).
fn register() {
    bag::register();
    bag::register_map("tour-count", |pair: &Item| {
        pair.at(1).cloned().unwrap_or_default()
    });
    bag::register_predicate("tour-x-gt-half", |r: &Item| {
        r.get("x").and_then(Item::as_f64).is_some_and(|x| x > 0.5)
    });
    bag::register_predicate("tour-over-30", |r: &Item| {
        r.get("age").is_some_and(|a| *a > Item::Int(30))
    });
    bag::register_predicate("tour-older-first", |pair: &Item| {
        let age = |i: i64| pair.at(i).and_then(|r| r.get("age"));
        matches!((age(0), age(1)), (Some(a), Some(b)) if a > b)
    });
    bag::register_map("tour-y", |r: &Item| r.get("y").cloned().unwrap_or_default());
    bag::register_map("tour-group-size", |pair: &Item| -> Result<Item, String> {
        match (pair.at(0), pair.at(1).and_then(Item::as_list)) {
            (Some(k), Some(items)) => Ok(Item::pair(k.clone(), items.len() as i64)),
            _ => Err(format!("not a group: {}", pair.to_json())),
        }
    });
    bag::register_map("tour-name-len", |r: &Item| -> Result<Item, String> {
        match r.get("name") {
            Some(Item::List(l)) => Ok(Item::Int(l.len() as i64)),
            Some(Item::Str(s)) => Ok(Item::Int(s.chars().count() as i64)),
            _ => Err(format!("a record without a name: {}", r.to_json())),
        }
    });
}

/// `read_text(...).str.split().flatten().frequencies().topk(10, key=1)`.
fn word_count(dir: &str, s: &dyn Scheduler) -> Result<Item, BagError> {
    let top = bag::read_text(&format!("{dir}/words-*.txt"), None)?
        .map(bag::STR_SPLIT)?
        .flatten()
        .frequencies(false)
        .topk_by(10, "tour-count")?;
    Ok(Item::list(top.compute(s)?))
}

/// `read_text(...).map(json.loads).filter(x > 0.5).pluck("y").sum()`.
fn json_lines(dir: &str, s: &dyn Scheduler) -> Result<Item, BagError> {
    bag::read_text(&format!("{dir}/records-*.jsonl"), None)?
        .map(bag::JSON_LOADS)?
        .filter("tour-x-gt-half")?
        .pluck("y")
        .sum()
        .compute(s)
}

/// `read_text(...).map(json.loads).groupby(lambda r: r["y"]).map(lambda g: [g[0], len(g[1])])`,
/// sorted by key.
fn groupby(dir: &str, method: ShuffleMethod, s: &dyn Scheduler) -> Result<Item, BagError> {
    let mut sizes = bag::read_text(&format!("{dir}/records-*.jsonl"), None)?
        .map(bag::JSON_LOADS)?
        .groupby_with("tour-y", None, method)?
        .map("tour-group-size")?
        .compute(s)?;
    sizes.sort();
    Ok(Item::list(sizes))
}

/// The people records of `people.jsonl` (read before timing, as Dask's `make_people`
/// makes them in memory).
fn people(dir: &str) -> Result<Vec<Item>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(format!("{dir}/people.jsonl"))?;
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| Item::from_json(l).map_err(Into::into))
        .collect()
}

/// RSDS's `bench_bag`: over-30s, their product with themselves, pairs whose first is older,
/// the second's name length, summed.
fn rsds_bag(records: &[Item], partitions: usize, s: &dyn Scheduler) -> Result<Item, BagError> {
    let b: Bag = bag::from_sequence(records.iter().cloned(), partitions)?;
    let p1 = b.filter("tour-over-30")?;
    p1.product(&p1)
        .filter("tour-older-first")?
        .pluck(1)
        .map("tour-name-len")?
        .sum()
        .compute(s)
}

fn run(
    name: &str,
    dir: &str,
    s: &dyn Scheduler,
) -> Result<(f64, Item), Box<dyn std::error::Error>> {
    let recs = if name == "rsds-bag" {
        people(dir)?
    } else {
        Vec::new()
    };
    let t0 = Instant::now();
    let answer = match name {
        "word-count" => word_count(dir, s)?,
        "json-lines" => json_lines(dir, s)?,
        "rsds-bag" => rsds_bag(&recs, 50, s)?,
        "groupby" => groupby(dir, ShuffleMethod::P2p, s)?,
        "groupby-tasks" => groupby(dir, ShuffleMethod::Tasks, s)?,
        other => return Err(format!("no workload {other:?}").into()),
    };
    Ok((t0.elapsed().as_secs_f64(), answer))
}

/// A small data set of each kind in `dir` (deterministic).
fn write_small(dir: &std::path::Path) -> std::io::Result<()> {
    let words = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    ];
    let mut seed = 7u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    };
    for f in 0..4 {
        let mut text = String::new();
        let mut recs = String::new();
        for line in 0..2_000 {
            for w in 0..8 {
                // A skewed choice: low indices far more often.
                let r = next() as usize;
                let i = (r % 8).min((r >> 8) % 8).min((r >> 16) % 8);
                text.push_str(words[i]);
                text.push(if w == 7 { '\n' } else { ' ' });
            }
            let x = (next() % 1000) as f64 / 1000.0;
            recs.push_str(&format!(
                "{{\"x\": {x}, \"y\": {}, \"name\": \"r{f}-{line}\"}}\n",
                next() % 100
            ));
        }
        std::fs::write(dir.join(format!("words-{f:02}.txt")), text)?;
        std::fs::write(dir.join(format!("records-{f:02}.jsonl")), recs)?;
    }
    let mut people = String::new();
    for i in 0..600 {
        people.push_str(&format!(
            "{{\"age\": {}, \"name\": [\"First{i}\", \"Last{i}\"], \"occupation\": \"job{}\"}}\n",
            16 + next() % 51,
            next() % 20
        ));
    }
    std::fs::write(dir.join("people.jsonl"), people)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    register();
    dask_comm::run_if_worker();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let cluster = || {
        LocalCluster::with(ClusterOptions {
            workers: 2,
            threads_per_worker: 1,
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
            let (secs, answer) = run(&name, &dir, s)?;
            println!(
                "{{\"workload\":\"{name}\",\"scheduler\":\"{sched}\",\"seconds\":{secs:.6},\"answer\":{}}}",
                answer.to_json()
            );
        }
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("bag-tour-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    write_small(&dir)?;
    let d = dir.to_string_lossy().into_owned();
    let c = cluster()?;
    let client = c.client()?;
    client.set_progress(true); // a bar on a terminal while a wait takes over a second
    let threaded = Threaded::new(2);
    for name in [
        "word-count",
        "json-lines",
        "rsds-bag",
        "groupby",
        "groupby-tasks",
    ] {
        let (t1, v1) = run(name, &d, &threaded)?;
        let (t2, v2) = run(name, &d, &client)?;
        if v1 != v2 {
            return Err(format!("{name}: threaded {v1} but the cluster {v2}").into());
        }
        println!("{name:<11} threaded {t1:>7.3} s   cluster (2 processes) {t2:>7.3} s");
        println!("            answer {}", v1.to_json());
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
