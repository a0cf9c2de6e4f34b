//! The [`Scheduler`] trait and the local schedulers: [`Inline`] (one thread, in the caller; for
//! debugging) and [`Threaded`] (a pool of threads). Both validate the graph, cull it to the
//! requested keys, fuse linear chains, order it statically, run ready tasks lowest priority
//! first, and release intermediate values as soon as nothing needs them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex};

use crate::exec::{run, ComputeError, TaskFailure};
use crate::graph::{Graph, Structure};
use crate::key::Key;
use crate::task::Node;
use crate::value::Value;

/// Computes the values of keys of a graph. Collections compute through this trait, so the same
/// collection runs on [`Inline`], [`Threaded`] or a cluster's client.
pub trait Scheduler {
    /// Computes `keys` of `graph`; returns their values in the order of `keys`.
    fn get(&self, graph: Graph, keys: &[Key]) -> Result<Vec<Value>, ComputeError>;

    /// Computes `keys` of `graph` to be kept for later graphs (Dask's `persist`). Local
    /// schedulers return the values, for the caller to put in its next graphs; a cluster's
    /// client keeps them on its workers and returns a guard that holds them there while it
    /// lives (graphs then name the keys without defining them).
    fn persist(&self, graph: Graph, keys: &[Key]) -> Result<Persisted, ComputeError> {
        let values = self.get(graph, keys)?;
        Ok(Persisted::Values(
            keys.iter().copied().zip(values).collect(),
        ))
    }
}

/// A future a scheduler returns: boxed, `Send`, borrowing the scheduler and the keys.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A scheduler that computes without blocking the caller's thread: a cluster's client, whose
/// I/O runs on a runtime of its own. The collections' `compute_async` take one, for async
/// callers (their `compute` takes a [`Scheduler`] and blocks until the values are there).
pub trait AsyncScheduler: std::marker::Sync {
    /// Computes `keys` of `graph`; resolves to their values in the order of `keys`.
    fn get_async<'a>(
        &'a self,
        graph: Graph,
        keys: &'a [Key],
    ) -> BoxFuture<'a, Result<Vec<Value>, ComputeError>>;
}

/// What [`Scheduler::persist`] kept.
pub enum Persisted {
    /// The values, by key.
    Values(Vec<(Key, Value)>),
    /// Kept where they were computed while this guard lives.
    Held(Arc<dyn std::any::Any + Send + std::marker::Sync>),
}

impl std::fmt::Debug for Persisted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Persisted::Values(v) => write!(f, "Persisted::Values({} values)", v.len()),
            Persisted::Held(_) => write!(f, "Persisted::Held"),
        }
    }
}

/// Most tasks fused into one (deeper nesting would run recursively).
pub const FUSE_DEPTH: usize = 32;

/// A graph ready to run: validated, culled, fused, ordered.
#[derive(Debug)]
pub struct Plan {
    /// The graph.
    pub graph: Graph,
    /// Who needs whom.
    pub structure: Structure,
    /// Priorities by position (lower first).
    pub priority: Vec<u32>,
    /// Positions of the requested keys.
    pub wanted: Vec<usize>,
}

impl Plan {
    /// Validates `graph` and prepares it to compute `keys`.
    pub fn new(graph: Graph, keys: &[Key]) -> Result<Plan, ComputeError> {
        let structure = graph.validate(keys, &|_| None)?;
        let n = graph.len();
        let graph = crate::optimize::cull_with(graph, &structure, keys);
        let structure = if graph.len() == n {
            structure
        } else {
            graph.structure()
        };
        let graph = crate::optimize::fuse_with(graph, &structure, keys, FUSE_DEPTH);
        let structure = graph.structure();
        let priority = crate::order::order(&graph, &structure);
        let wanted = keys
            .iter()
            .map(|k| graph.position(k).ok_or(crate::GraphError::MissingKey(*k)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Plan {
            graph,
            structure,
            priority,
            wanted,
        })
    }

    /// The first requested key that needs position `failed` (itself, or a dependent).
    fn needed_by(&self, failed: usize) -> Key {
        let mut seen = vec![false; self.graph.len()];
        let mut stack = vec![failed];
        while let Some(i) = stack.pop() {
            if self.wanted.contains(&i) {
                return self.graph.key_at(i);
            }
            for &d in self.structure.dependents(i) {
                if !std::mem::replace(&mut seen[d as usize], true) {
                    stack.push(d as usize);
                }
            }
        }
        self.graph.key_at(failed)
    }

    /// The shuffles the plan's tasks take part in.
    pub fn shuffles(&self) -> Vec<crate::ShuffleId> {
        let mut ids: Vec<crate::ShuffleId> = self
            .graph
            .iter()
            .filter_map(|(_, n)| match n {
                Node::Task(t) => t.shuffle.map(|r| r.id()),
                Node::Value(_) => None,
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    fn failed(&self, at: usize, cause: Box<TaskFailure>) -> ComputeError {
        ComputeError::Failed {
            key: self.needed_by(at),
            cause: Arc::from(cause),
        }
    }
}

/// A computation's shuffles leave nothing in the process's in-memory service when it ends,
/// however it ends (pieces of a failed computation would otherwise stay).
impl Drop for Plan {
    fn drop(&mut self) {
        for id in self.shuffles() {
            crate::shuffle::forget_local(id);
        }
    }
}

/// Bookkeeping shared by the local schedulers: values held, and how many users each still has.
struct Store {
    values: Vec<Option<Value>>,
    users_left: Vec<u32>,
    keep: Vec<bool>,
}

impl Store {
    fn new(plan: &Plan) -> Store {
        let n = plan.graph.len();
        let mut keep = vec![false; n];
        plan.wanted.iter().for_each(|&i| keep[i] = true);
        Store {
            values: vec![None; n],
            users_left: (0..n)
                .map(|i| plan.structure.dependents(i).len() as u32)
                .collect(),
            keep,
        }
    }

    /// Node `i`'s dependencies' values (cloned `Arc`s), by key.
    fn inputs(&self, plan: &Plan, i: usize) -> Inputs {
        plan.structure
            .deps(i)
            .iter()
            .filter_map(|&d| {
                let d = d as usize;
                self.values[d].clone().map(|v| (plan.graph.key_at(d), v))
            })
            .collect()
    }

    /// Records node `i`'s value and releases dependencies nothing needs any more.
    fn finish(&mut self, plan: &Plan, i: usize, v: Value) {
        self.values[i] = Some(v);
        for &d in plan.structure.deps(i) {
            let d = d as usize;
            self.users_left[d] -= 1;
            if self.users_left[d] == 0 && !self.keep[d] {
                self.values[d] = None;
            }
        }
    }

    fn results(&mut self, plan: &Plan) -> Vec<Value> {
        plan.wanted
            .iter()
            .map(|&i| {
                self.values[i]
                    .clone()
                    .expect("every requested key was computed")
            })
            .collect()
    }
}

/// A task's inputs, by key.
type Inputs = rustc_hash::FxHashMap<Key, Value>;

/// Runs node `i` given its inputs.
fn compute(plan: &Plan, i: usize, inputs: &Inputs) -> Result<Value, Box<TaskFailure>> {
    let key = plan.graph.key_at(i);
    match plan.graph.node_at(i) {
        Node::Value(v) => Ok(v.clone()),
        Node::Task(t) => run(t, key, &|k| inputs.get(k).cloned()),
    }
}

/// One thread, the caller's: tasks run one after another in priority order. A failing task's
/// error names its key and function, and a panic carries its backtrace.
///
/// ```
/// use dask_graph::{registry, Arg, Graph, Scheduler, Inline, Task, Value};
/// registry().register("inc-sync-doc", |x: i64| x + 1);
/// let mut g = Graph::new();
/// g.insert("x", Value::new(1i64));
/// g.insert("y", Task::new("inc-sync-doc", [Arg::key("x")]));
/// let out = Inline.get(g, &["y".into()]).unwrap();
/// assert_eq!(out[0].downcast_ref::<i64>(), Some(&2));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Inline;

impl Scheduler for Inline {
    fn get(&self, graph: Graph, keys: &[Key]) -> Result<Vec<Value>, ComputeError> {
        let plan = Plan::new(graph, keys)?;
        let mut by_priority: Vec<usize> = (0..plan.graph.len()).collect();
        by_priority.sort_by_key(|&i| plan.priority[i]);
        let mut store = Store::new(&plan);
        for i in by_priority {
            let inputs = store.inputs(&plan, i);
            match compute(&plan, i, &inputs) {
                Ok(v) => store.finish(&plan, i, v),
                Err(f) => return Err(plan.failed(i, f)),
            }
        }
        Ok(store.results(&plan))
    }
}

/// A pool of `n` threads (the caller's among them): ready tasks run lowest priority first. The
/// first failure of a task a requested key needs ends the computation.
#[derive(Debug, Clone, Copy)]
pub struct Threaded {
    threads: usize,
}

impl Threaded {
    /// A pool of `threads` threads (at least 1).
    pub fn new(threads: usize) -> Threaded {
        Threaded {
            threads: threads.max(1),
        }
    }

    /// As many threads as the machine has.
    pub fn per_core() -> Threaded {
        Threaded::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

struct Shared {
    store: Store,
    ready: BinaryHeap<Reverse<(u32, u32)>>,
    waiting: Vec<u32>,
    done: usize,
    failure: Option<ComputeError>,
}

impl Scheduler for Threaded {
    fn get(&self, graph: Graph, keys: &[Key]) -> Result<Vec<Value>, ComputeError> {
        let plan = Plan::new(graph, keys)?;
        let n = plan.graph.len();
        let waiting: Vec<u32> = (0..n)
            .map(|i| plan.structure.deps(i).len() as u32)
            .collect();
        let ready = (0..n)
            .filter(|&i| waiting[i] == 0)
            .map(|i| Reverse((plan.priority[i], i as u32)))
            .collect();
        let state = Mutex::new(Shared {
            store: Store::new(&plan),
            ready,
            waiting,
            done: 0,
            failure: None,
        });
        let wake = Condvar::new();
        let work = || loop {
            let (i, inputs) = {
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if s.failure.is_some() || s.done == n {
                        return;
                    }
                    if let Some(Reverse((_, i))) = s.ready.pop() {
                        let inputs = s.store.inputs(&plan, i as usize);
                        break (i as usize, inputs);
                    }
                    s = wake.wait(s).unwrap_or_else(|e| e.into_inner());
                }
            };
            let r = compute(&plan, i, &inputs);
            drop(inputs);
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            match r {
                Ok(v) => {
                    s.store.finish(&plan, i, v);
                    s.done += 1;
                    for &d in plan.structure.dependents(i) {
                        s.waiting[d as usize] -= 1;
                        if s.waiting[d as usize] == 0 {
                            let p = plan.priority[d as usize];
                            s.ready.push(Reverse((p, d)));
                        }
                    }
                }
                Err(f) => {
                    if s.failure.is_none() {
                        s.failure = Some(plan.failed(i, f));
                    }
                }
            }
            wake.notify_all();
        };
        std::thread::scope(|scope| {
            for _ in 1..self.threads.min(n.max(1)) {
                scope.spawn(work);
            }
            work();
        });
        let mut s = state.into_inner().unwrap_or_else(|e| e.into_inner());
        match s.failure.take() {
            Some(e) => Err(e),
            None => Ok(s.store.results(&plan)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{registry, Arg, FailureKind, Task};

    fn setup() {
        registry().register("local-inc", |x: i64| x + 1);
        registry().register("local-add", |x: i64, y: i64| x + y);
        registry().register_variadic("local-sum", |xs: Vec<i64>| xs.iter().sum::<i64>());
        registry().register("local-fail", |x: i64| -> i64 {
            if x == 3 {
                panic!("three is bad")
            }
            x
        });
    }

    fn tree(leaves: u32) -> (Graph, Key) {
        let mut g = Graph::new();
        for i in 0..leaves {
            g.insert(("leaf", i), Value::new(i as i64));
        }
        let mut level = 0u32;
        let mut width = leaves;
        while width > 1 {
            for i in 0..width / 2 {
                let (a, b) = if level == 0 {
                    (Key::new("leaf", &[2 * i]), Key::new("leaf", &[2 * i + 1]))
                } else {
                    (
                        Key::new("node", &[level - 1, 2 * i]),
                        Key::new("node", &[level - 1, 2 * i + 1]),
                    )
                };
                g.insert(
                    Key::new("node", &[level, i]),
                    Task::new("local-add", [Arg::Key(a), Arg::Key(b)]),
                );
            }
            width /= 2;
            level += 1;
        }
        (g, Key::new("node", &[level - 1, 0]))
    }

    #[test]
    fn both_schedulers_agree_on_a_tree_and_a_merge() {
        setup();
        let (g, root) = tree(1024);
        let want = (0..1024i64).sum::<i64>();
        for out in [
            Inline.get(g.clone(), &[root]).unwrap(),
            Threaded::new(4).get(g.clone(), &[root]).unwrap(),
        ] {
            assert_eq!(out[0].downcast_ref::<i64>(), Some(&want));
        }
        let mut m = Graph::new();
        for i in 0..1000u32 {
            m.insert(("x", i), Task::new("local-inc", [Arg::lit(i as i64)]));
        }
        m.insert(
            "total",
            Task::new("local-sum", (0..1000).map(|i| Arg::key(("x", i)))),
        );
        let want = (1..=1000i64).sum::<i64>();
        let out = Threaded::new(3)
            .get(m, &["total".into(), ("x", 5).into()])
            .unwrap();
        assert_eq!(out[0].downcast_ref::<i64>(), Some(&want));
        assert_eq!(out[1].downcast_ref::<i64>(), Some(&6));
    }

    #[test]
    fn a_failure_names_the_failed_task_and_the_requested_key() {
        setup();
        let mut g = Graph::new();
        for i in 0..6u32 {
            g.insert(("f", i), Task::new("local-fail", [Arg::lit(i as i64)]));
        }
        g.insert(
            "all",
            Task::new("local-sum", (0..6).map(|i| Arg::key(("f", i)))),
        );
        for sched in [&Inline as &dyn Scheduler, &Threaded::new(2)] {
            let e = sched.get(g.clone(), &["all".into()]).unwrap_err();
            let ComputeError::Failed { key, cause } = &e else {
                panic!("{e:?}")
            };
            assert_eq!(*key, Key::name_only("all"));
            assert_eq!(cause.key, Key::new("f", &[3]));
            assert_eq!(cause.kind, FailureKind::Panic);
            assert_eq!(cause.message, "three is bad");
            assert!(cause.backtrace.is_some());
        }
    }

    #[test]
    fn long_chains_and_bad_graphs() {
        setup();
        let mut g = Graph::new();
        g.insert(("c", 0), Value::new(0i64));
        for i in 1..=20_000u32 {
            g.insert(("c", i), Task::new("local-inc", [Arg::key(("c", i - 1))]));
        }
        let out = Threaded::new(2)
            .get(g.clone(), &[("c", 20_000).into()])
            .unwrap();
        assert_eq!(out[0].downcast_ref::<i64>(), Some(&20_000));
        let out = Inline.get(g, &[("c", 20_000).into()]).unwrap();
        assert_eq!(out[0].downcast_ref::<i64>(), Some(&20_000));
        let mut bad = Graph::new();
        bad.insert("y", Task::new("local-inc", [Arg::lit("text".to_string())]));
        assert!(matches!(
            Inline.get(bad, &["y".into()]),
            Err(ComputeError::Graph(crate::GraphError::Type { .. }))
        ));
    }
}
