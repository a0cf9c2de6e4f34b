//! The benchmark workloads (RSDS's and Dask's own, see `docs/scheduler.md`), as graphs with
//! their expected answers, and the functions they use.

use dask_graph::{registry, Arg, Graph, Key, Task};

/// Registers `inc`, `add` and `sum` (every process of a benchmark cluster does).
pub fn register() {
    registry().register("inc", |x: i64| x + 1);
    registry().register("add", |x: i64, y: i64| x + y);
    registry().register_variadic("sum", |xs: Vec<i64>| xs.iter().sum::<i64>());
}

/// A workload: a graph, the key to compute, its answer, and how many tasks it has.
#[derive(Debug)]
pub struct Workload {
    /// The graph.
    pub graph: Graph,
    /// The key to compute.
    pub key: Key,
    /// The value it must have.
    pub answer: i64,
    /// Tasks in the graph.
    pub tasks: usize,
}

/// The workload named `name`: `merge-N` (N independent `inc` tasks into one `sum`), `tree-E`
/// (a binary tree of `add` over 2^E `inc` leaves), `chain-N` (N `inc` tasks, each needing the
/// one before). Its keys' names end in `-{tag}`, so runs with different tags do not share
/// keys.
pub fn workload(name: &str, tag: &str) -> Option<Workload> {
    let (kind, n) = name.split_once('-')?;
    let n: u32 = n.parse().ok()?;
    let mut g = Graph::new();
    let (x, total, t, c) = (
        format!("x-{tag}"),
        format!("total-{tag}"),
        format!("t-{tag}"),
        format!("c-{tag}"),
    );
    let (x, t, c) = (x.as_str(), t.as_str(), c.as_str());
    match kind {
        "merge" => {
            for i in 0..n {
                g.insert((x, i), Task::new("inc", [Arg::lit(i as i64)]));
            }
            g.insert(
                total.as_str(),
                Task::new("sum", (0..n).map(|i| Arg::key((x, i)))),
            );
            let n = n as i64;
            Some(Workload {
                graph: g,
                key: total.as_str().into(),
                answer: n * (n + 1) / 2,
                tasks: n as usize + 1,
            })
        }
        "tree" => {
            if n > 24 {
                return None;
            }
            let leaves = 1u32 << n;
            for i in 0..leaves {
                g.insert(Key::new(t, &[0, i]), Task::new("inc", [Arg::lit(i as i64)]));
            }
            let mut width = leaves;
            let mut level = 0;
            while width > 1 {
                for i in 0..width / 2 {
                    g.insert(
                        Key::new(t, &[level + 1, i]),
                        Task::new(
                            "add",
                            [
                                Arg::Key(Key::new(t, &[level, 2 * i])),
                                Arg::Key(Key::new(t, &[level, 2 * i + 1])),
                            ],
                        ),
                    );
                }
                width /= 2;
                level += 1;
            }
            let l = leaves as i64;
            Some(Workload {
                graph: g,
                key: Key::new(t, &[level, 0]),
                answer: l * (l + 1) / 2,
                tasks: 2 * leaves as usize - 1,
            })
        }
        "chain" => {
            if n == 0 {
                return None;
            }
            g.insert((c, 0), Task::new("inc", [Arg::lit(0i64)]));
            for i in 1..n {
                g.insert((c, i), Task::new("inc", [Arg::key((c, i - 1))]));
            }
            Some(Workload {
                graph: g,
                key: (c, n - 1).into(),
                answer: n as i64,
                tasks: n as usize,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dask_graph::Scheduler;

    #[test]
    fn workloads_compute_their_answers_locally() {
        register();
        for name in ["merge-1000", "tree-8", "chain-500"] {
            let w = workload(name, "test").unwrap();
            assert_eq!(w.graph.len(), w.tasks, "{name}");
            let out = dask_graph::Threaded::new(2).get(w.graph, &[w.key]).unwrap();
            assert_eq!(out[0].downcast_ref::<i64>(), Some(&w.answer), "{name}");
        }
        assert!(workload("merge-x", "t").is_none());
        assert!(workload("nope-3", "t").is_none());
    }
}
