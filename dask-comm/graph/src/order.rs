//! Static, deterministic ordering, in the spirit of `dask.order`: depth-first from the results,
//! finishing each branch before starting the next, and among the dependencies of a task
//! starting with the ones that need the least work (so their results, and the memory they
//! free, come soonest). Ties go to the earlier key of the graph.
//!
//! The priorities are a total order; schedulers run ready tasks lowest priority first.

use crate::graph::{Graph, Structure};

/// Positions in an order that puts every node after the nodes it needs, or the position of a
/// node on a cycle.
pub fn topological(s: &Structure) -> Result<Vec<u32>, usize> {
    let n = s.len();
    let mut waiting: Vec<u32> = (0..n).map(|i| s.deps(i).len() as u32).collect();
    let mut ready: Vec<u32> = (0..n as u32)
        .filter(|&i| waiting[i as usize] == 0)
        .collect();
    let mut out = Vec::with_capacity(n);
    while let Some(i) = ready.pop() {
        out.push(i);
        for &d in s.dependents(i as usize) {
            waiting[d as usize] -= 1;
            if waiting[d as usize] == 0 {
                ready.push(d);
            }
        }
    }
    if out.len() < n {
        let on_cycle = waiting.iter().position(|&w| w > 0).unwrap_or(0);
        return Err(on_cycle);
    }
    Ok(out)
}

/// The priority of every node of `g` (indexed by position; lower runs first).
///
/// ```
/// use dask_graph::{order, Arg, Graph, Task, Value};
/// let mut g = Graph::new();
/// g.insert("a", Value::new(1i64));
/// g.insert("b", Task::new("inc", [Arg::key("a")]));
/// let p = order::order(&g, &g.structure());
/// assert!(p[0] < p[1]);
/// ```
pub fn order(g: &Graph, s: &Structure) -> Vec<u32> {
    let n = g.len();
    // Work each node needs: itself plus what its dependencies need (shared work counted
    // more than once; it only breaks ties between siblings).
    let mut total = vec![1u64; n];
    if let Ok(topo) = topological(s) {
        for &i in &topo {
            let i = i as usize;
            total[i] = s
                .deps(i)
                .iter()
                .fold(1u64, |acc, &d| acc.saturating_add(total[d as usize]));
        }
    }
    let by_work = |a: &u32, b: &u32| (total[*a as usize], *a).cmp(&(total[*b as usize], *b));
    let mut sinks: Vec<u32> = (0..n as u32)
        .filter(|&i| s.dependents(i as usize).is_empty())
        .collect();
    sinks.sort_by(by_work);
    let mut priority = vec![u32::MAX; n];
    let mut next = 0u32;
    let mut visited = vec![false; n];
    // Post-order walk with an explicit stack: (node, its dependencies sorted, next one).
    let mut stack: Vec<(u32, Vec<u32>, usize)> = Vec::new();
    for root in sinks.into_iter().chain(0..n as u32) {
        if visited[root as usize] {
            continue;
        }
        visited[root as usize] = true;
        let mut deps = s.deps(root as usize).to_vec();
        deps.sort_by(by_work);
        stack.push((root, deps, 0));
        while let Some(top) = stack.last_mut() {
            if let Some(&d) = top.1.get(top.2) {
                top.2 += 1;
                if !visited[d as usize] {
                    visited[d as usize] = true;
                    let mut dd = s.deps(d as usize).to_vec();
                    dd.sort_by(by_work);
                    stack.push((d, dd, 0));
                }
                continue;
            }
            let (node, _, _) = stack.pop().expect("the stack has a top");
            priority[node as usize] = next;
            next += 1;
        }
    }
    priority
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arg, Task, Value};

    fn chain(n: usize) -> Graph {
        let mut g = Graph::new();
        g.insert(("c", 0), Value::new(0i64));
        for i in 1..n as u32 {
            g.insert(("c", i), Task::new("inc", [Arg::key(("c", i - 1))]));
        }
        g
    }

    #[test]
    fn dependencies_come_first_and_deep_chains_do_not_recurse() {
        let g = chain(100_000);
        let p = order(&g, &g.structure());
        assert!(p.windows(2).all(|w| w[0] < w[1]));
    }

    /// Two branches into one sum: each branch finishes before the other starts (depth first),
    /// the smaller first.
    #[test]
    fn branches_finish_one_at_a_time_smaller_first() {
        let mut g = Graph::new();
        for i in 0..3 {
            g.insert(("big", i), Value::new(1i64));
        }
        g.insert(
            "big-sum",
            Task::new("sum", (0..3).map(|i| Arg::key(("big", i)))),
        );
        g.insert(("small", 0), Value::new(1i64));
        g.insert("small-sum", Task::new("sum", [Arg::key(("small", 0))]));
        g.insert(
            "total",
            Task::new("add", [Arg::key("big-sum"), Arg::key("small-sum")]),
        );
        let s = g.structure();
        let p = order(&g, &s);
        let at = |k: crate::Key| p[g.position(&k).unwrap()];
        assert!(at("small-sum".into()) < at(("big", 0).into()));
        assert!(at("big-sum".into()) < at("total".into()));
        let mut seen: Vec<u32> = p.clone();
        seen.sort();
        assert_eq!(
            seen,
            (0..g.len() as u32).collect::<Vec<_>>(),
            "a total order"
        );
        // Deterministic.
        assert_eq!(order(&g, &s), p);
    }

    #[test]
    fn cycles_are_found() {
        let mut g = Graph::new();
        g.insert("a", Task::new("inc", [Arg::key("b")]));
        g.insert("b", Task::new("inc", [Arg::key("a")]));
        assert!(topological(&g.structure()).is_err());
    }
}
