//! Graph optimisations, as pure functions: `cull` (keep what the requested keys need),
//! `inline` (constants and cheap functions into their users), `fuse` (linear chains into one
//! task). None changes what the requested keys compute.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::graph::{Graph, Structure};
use crate::key::{Key, Name};
use crate::task::{Arg, Node};

/// The part of `g` that `keys` need (keys outside `g` are left to the caller). Takes the graph
/// and gives back the same one when everything is needed.
///
/// ```
/// use dask_graph::{optimize::cull, Arg, Graph, Task, Value};
/// let mut g = Graph::new();
/// g.insert("a", Value::new(1i64));
/// g.insert("b", Task::new("inc", [Arg::key("a")]));
/// g.insert("unused", Task::new("inc", [Arg::key("a")]));
/// assert_eq!(cull(g, &["b".into()]).len(), 2);
/// ```
pub fn cull(g: Graph, keys: &[Key]) -> Graph {
    let s = g.structure();
    cull_with(g, &s, keys)
}

/// [`cull`] with the graph's structure already computed.
pub fn cull_with(g: Graph, s: &Structure, keys: &[Key]) -> Graph {
    let mut keep = vec![false; g.len()];
    let mut stack: Vec<usize> = keys.iter().filter_map(|k| g.position(k)).collect();
    let mut kept = 0;
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut keep[i], true) {
            continue;
        }
        kept += 1;
        stack.extend(s.deps(i).iter().map(|&d| d as usize).filter(|&d| !keep[d]));
    }
    if kept == g.len() {
        return g;
    }
    let (keys, nodes) = g.into_parts();
    let mut out = Graph::with_capacity(kept);
    for ((k, n), keep) in keys.into_iter().zip(nodes).zip(keep) {
        if keep {
            out.insert(k, n);
        }
    }
    out
}

/// Inlines into their users: keys holding values (constants), and tasks of the functions
/// `fast` says are cheap (they then run once per user). Keys in `keep` stay as they are.
pub fn inline(g: Graph, keep: &[Key], fast: impl Fn(Name) -> bool) -> Graph {
    let keep: FxHashSet<Key> = keep.iter().copied().collect();
    let s = g.structure();
    let order = crate::order::topological(&s).unwrap_or_default();
    // What each inlined key becomes, built in dependency order so nested inlining composes.
    let mut replace: FxHashMap<Key, Arg> = FxHashMap::default();
    let (keys, nodes) = g.into_parts();
    let mut out = Graph::with_capacity(keys.len());
    let mut nodes: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
    for &i in &order {
        let i = i as usize;
        let key = keys[i];
        let Some(mut node) = nodes[i].take() else {
            continue;
        };
        if let Node::Task(t) = &mut node {
            t.map_keys(&mut |k| replace.get(&k).cloned());
        }
        let has_users = !s.dependents(i).is_empty();
        let inlinable = has_users
            && !keep.contains(&key)
            && match &node {
                Node::Value(_) => true,
                Node::Task(t) => fast(t.func) && t.shuffle.is_none(),
            };
        if inlinable {
            let arg = match node {
                Node::Value(v) => Arg::Lit(v),
                Node::Task(mut t) => {
                    t.origin.get_or_insert(key);
                    Arg::Task(Box::new(t))
                }
            };
            replace.insert(key, arg);
        } else {
            nodes[i] = Some(node);
        }
    }
    for (k, n) in keys.into_iter().zip(nodes) {
        if let Some(n) = n {
            out.insert(k, n);
        }
    }
    out
}

/// Fuses linear chains: a task whose one user is a task that needs nothing else (and which is
/// not in `keep`) is nested into that user, up to `max_depth` tasks deep (deep nesting would
/// run recursively). Fan-ins stay as they are: fusing them would serialise their branches.
///
/// ```
/// use dask_graph::{optimize::fuse, Arg, Graph, Task, Value};
/// let mut g = Graph::new();
/// g.insert("a", Value::new(1i64));
/// g.insert("b", Task::new("inc", [Arg::key("a")]));
/// g.insert("c", Task::new("inc", [Arg::key("b")]));
/// let f = fuse(g, &["c".into()], 64);
/// assert_eq!(f.len(), 2); // a, and c = inc(inc(a))
/// ```
pub fn fuse(g: Graph, keep: &[Key], max_depth: usize) -> Graph {
    let s = g.structure();
    fuse_with(g, &s, keep, max_depth)
}

/// [`fuse`] with the graph's structure already computed.
pub fn fuse_with(g: Graph, s: &Structure, keep: &[Key], max_depth: usize) -> Graph {
    let keep: FxHashSet<Key> = keep.iter().copied().collect();
    let order = crate::order::topological(s).unwrap_or_default();
    let user_is_task: Vec<bool> = (0..g.len())
        .map(|i| matches!(g.node_at(i), Node::Task(_)))
        .collect();
    let (keys, nodes) = g.into_parts();
    let mut nodes: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
    // Tasks taken into their one user, by key.
    let mut taken: FxHashMap<Key, Arg> = FxHashMap::default();
    for &i in &order {
        let i = i as usize;
        let key = keys[i];
        let Some(Node::Task(mut t)) = nodes[i].take_if(|n| matches!(n, Node::Task(_))) else {
            continue;
        };
        t.map_keys(&mut |k| taken.remove(&k));
        let users = s.dependents(i);
        // One user, which needs only this key, once (twice would need the result twice).
        // A shuffle's tasks keep their keys: the scheduler places them by role.
        let single_user = t.shuffle.is_none()
            && users.len() == 1
            && s.deps(users[0] as usize).len() == 1
            && !s.repeated(i)
            && !keep.contains(&key)
            && t.depth() < max_depth
            && user_is_task[users[0] as usize];
        if single_user {
            t.origin.get_or_insert(key);
            taken.insert(key, Arg::Task(Box::new(t)));
        } else {
            nodes[i] = Some(Node::Task(t));
        }
    }
    let mut out = Graph::with_capacity(keys.len());
    for (k, n) in keys.into_iter().zip(nodes) {
        if let Some(n) = n {
            out.insert(k, n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Task, Value};

    fn diamond() -> Graph {
        let mut g = Graph::new();
        g.insert("x", Value::new(1i64));
        g.insert("a", Task::new("inc", [Arg::key("x")]));
        g.insert("b", Task::new("inc", [Arg::key("a")]));
        g.insert("c", Task::new("inc", [Arg::key("a")]));
        g.insert("d", Task::new("add", [Arg::key("b"), Arg::key("c")]));
        g
    }

    #[test]
    fn cull_keeps_only_what_is_needed() {
        let g = diamond();
        let c = cull(g, &["b".into()]);
        let mut keys: Vec<String> = c.keys().iter().map(|k| k.to_string()).collect();
        keys.sort();
        assert_eq!(keys, ["a", "b", "x"]);
    }

    #[test]
    fn inline_constants_and_fast_functions() {
        let g = diamond();
        let inc = Name::new("inc");
        let i = inline(g.clone(), &["d".into()], |f| f == inc);
        // x, a, b, c inlined into d.
        assert_eq!(i.keys(), &[Key::name_only("d")]);
        let Node::Task(d) = i.get(&"d".into()).unwrap() else {
            panic!()
        };
        assert_eq!(format!("{d:?}"), "add(inc(inc(1)), inc(inc(1)))");
        // Kept keys stay.
        let i = inline(g, &["a".into(), "d".into()], |_| false);
        assert!(i.contains(&"a".into()) && !i.contains(&"x".into()));
    }

    #[test]
    fn fuse_nests_linear_chains_only() {
        let g = diamond();
        let f = fuse(g, &["d".into()], 64);
        // a has two users, and d needs two keys: nothing is a linear chain but x -> a.
        let mut keys: Vec<String> = f.keys().iter().map(|k| k.to_string()).collect();
        keys.sort();
        assert_eq!(keys, ["a", "b", "c", "d", "x"]);
        let mut g = Graph::new();
        g.insert("x", Value::new(1i64));
        g.insert("a", Task::new("inc", [Arg::key("x")]));
        g.insert("b", Task::new("inc", [Arg::key("a")]));
        g.insert("c", Task::new("inc", [Arg::key("b")]));
        let f = fuse(g, &["c".into()], 64);
        let Node::Task(c) = f.get(&"c".into()).unwrap() else {
            panic!()
        };
        assert_eq!(format!("{c:?}"), "inc(inc(inc(x)))");
        // A long chain stops at the depth limit.
        let mut g = Graph::new();
        g.insert(("c", 0), Value::new(0i64));
        for i in 1..=100u32 {
            g.insert(("c", i), Task::new("inc", [Arg::key(("c", i - 1))]));
        }
        let f = fuse(g, &[("c", 100).into()], 10);
        assert!(f.iter().all(|(_, n)| match n {
            Node::Task(t) => t.depth() <= 10,
            Node::Value(_) => true,
        }));
        assert!(f.len() > 1 && f.len() < 30, "{}", f.len());
        // A task used twice by its user is not fused into it.
        let mut g = Graph::new();
        g.insert("x", Value::new(1i64));
        g.insert("b", Task::new("inc", [Arg::key("x")]));
        g.insert("d", Task::new("add", [Arg::key("b"), Arg::key("b")]));
        assert!(fuse(g, &["d".into()], 64).contains(&"b".into()));
    }
}
