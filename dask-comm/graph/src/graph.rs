//! Graphs: keys and what each holds, with the structure (who needs whom) computed on demand,
//! and validation against the function registry before anything runs.

use rustc_hash::FxHashMap;

use crate::key::Key;
use crate::registry::{registry, Params};
use crate::task::{Arg, Node, Task};
use crate::value::{Expect, List, TypeInfo};

/// Why a graph was refused. Each error names the key, and where it concerns a call, the
/// function and what it expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// A task names a function this process has not registered.
    #[error("task {key}: unknown function `{function}` (register it in every process: dask_graph::registry().register(...))")]
    UnknownFunction {
        /// The task.
        key: Key,
        /// The name it gave.
        function: String,
    },
    /// A task passes the wrong number of arguments.
    #[error("task {key}: `{function}` takes {expected} arguments, the task passes {got}")]
    Arity {
        /// The task.
        key: Key,
        /// The function.
        function: String,
        /// Arguments passed.
        got: usize,
        /// Parameters.
        expected: usize,
    },
    /// A task passes a value of the wrong type.
    #[error("task {key}: argument {argument} of `{function}` should be {expected}, the task passes {got}")]
    Type {
        /// The task.
        key: Key,
        /// The function.
        function: String,
        /// The argument's position.
        argument: usize,
        /// What the parameter accepts.
        expected: String,
        /// What the argument is.
        got: String,
    },
    /// A task needs a key that is neither in the graph nor already computed.
    #[error("task {key} needs {missing}, which is not in the graph")]
    MissingDependency {
        /// The task.
        key: Key,
        /// The key it needs.
        missing: Key,
    },
    /// A requested key is not in the graph.
    #[error("{0} was requested but is not in the graph")]
    MissingKey(Key),
    /// The graph has a cycle through this key.
    #[error("the graph has a cycle through {0}")]
    Cycle(Key),
    /// A key with more indices than allowed.
    #[error(
        "key `{name}` has {got} indices, at most {} allowed",
        crate::key::MAX_INDICES
    )]
    TooManyIndices {
        /// The key's name.
        name: String,
        /// Its number of indices.
        got: usize,
    },
}

/// A task graph: each key holds a task or a value.
///
/// ```
/// use dask_graph::{Arg, Graph, Key, Task, Value};
/// let mut g = Graph::new();
/// g.insert(Key::name_only("x"), Value::new(1i64));
/// g.insert(Key::name_only("y"), Task::new("add", [Arg::key("x"), Arg::lit(2i64)]));
/// assert_eq!(g.len(), 2);
/// assert_eq!(g.dependencies(&Key::name_only("y")), vec![Key::name_only("x")]);
/// ```
#[derive(Clone, Default, Debug)]
pub struct Graph {
    keys: Vec<Key>,
    nodes: Vec<Node>,
    index: FxHashMap<Key, u32>,
}

/// Who needs whom, by position in the graph (compressed adjacency lists).
#[derive(Debug, Clone)]
pub struct Structure {
    dep_start: Vec<u32>,
    deps: Vec<u32>,
    dependent_start: Vec<u32>,
    dependents: Vec<u32>,
    /// Node `i` is referred to more than once by one of its dependents.
    repeated: Vec<bool>,
}

impl Structure {
    /// The positions of the nodes node `i` needs (each once).
    pub fn deps(&self, i: usize) -> &[u32] {
        &self.deps[self.dep_start[i] as usize..self.dep_start[i + 1] as usize]
    }

    /// The positions of the nodes that need node `i`.
    pub fn dependents(&self, i: usize) -> &[u32] {
        &self.dependents[self.dependent_start[i] as usize..self.dependent_start[i + 1] as usize]
    }

    /// Whether some dependent refers to node `i` more than once (`add(x, x)`).
    pub fn repeated(&self, i: usize) -> bool {
        self.repeated[i]
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.dep_start.len() - 1
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// An empty graph with room for `n` keys.
    pub fn with_capacity(n: usize) -> Graph {
        Graph {
            keys: Vec::with_capacity(n),
            nodes: Vec::with_capacity(n),
            index: FxHashMap::with_capacity_and_hasher(n, Default::default()),
        }
    }

    /// Sets what `key` holds (replacing what it held).
    pub fn insert(&mut self, key: impl Into<Key>, node: impl Into<Node>) {
        let key = key.into();
        let node = node.into();
        match self.index.get(&key) {
            Some(&i) => self.nodes[i as usize] = node,
            None => {
                let i = u32::try_from(self.keys.len()).expect("fewer than 2^32 tasks");
                self.index.insert(key, i);
                self.keys.push(key);
                self.nodes.push(node);
            }
        }
    }

    /// Adds every key of `other` (its nodes replace ours for keys in both).
    pub fn extend(&mut self, other: Graph) {
        for (k, n) in other.keys.into_iter().zip(other.nodes) {
            self.insert(k, n);
        }
    }

    /// What `key` holds.
    pub fn get(&self, key: &Key) -> Option<&Node> {
        self.index.get(key).map(|&i| &self.nodes[i as usize])
    }

    /// Whether `key` is in the graph.
    pub fn contains(&self, key: &Key) -> bool {
        self.index.contains_key(key)
    }

    /// The position of `key`.
    pub fn position(&self, key: &Key) -> Option<usize> {
        self.index.get(key).map(|&i| i as usize)
    }

    /// The key at position `i`.
    pub fn key_at(&self, i: usize) -> Key {
        self.keys[i]
    }

    /// The node at position `i`.
    pub fn node_at(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the graph is empty.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys, in insertion order.
    pub fn keys(&self) -> &[Key] {
        &self.keys
    }

    /// Keys and nodes, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&Key, &Node)> {
        self.keys.iter().zip(&self.nodes)
    }

    /// Takes the graph apart into keys and nodes.
    pub fn into_parts(self) -> (Vec<Key>, Vec<Node>) {
        (self.keys, self.nodes)
    }

    /// The keys `key` needs.
    pub fn dependencies(&self, key: &Key) -> Vec<Key> {
        self.get(key).map(Node::dependencies).unwrap_or_default()
    }

    /// Who needs whom. Keys outside the graph are not part of it: `missing` gets each task's
    /// missing dependencies (its position and the key).
    pub fn structure_with(&self, mut missing: impl FnMut(usize, Key)) -> Structure {
        let n = self.len();
        let mut dep_start = Vec::with_capacity(n + 1);
        let mut deps = Vec::with_capacity(n);
        let mut counts = vec![0u32; n];
        let mut repeated = vec![false; n];
        // The last node (plus one) that listed each node: dedups in linear time.
        let mut listed_by = vec![0u32; n];
        dep_start.push(0);
        for (i, node) in self.nodes.iter().enumerate() {
            if let Node::Task(t) = node {
                t.for_each_key(&mut |k| match self.index.get(&k) {
                    Some(&d) => {
                        if listed_by[d as usize] == i as u32 + 1 {
                            repeated[d as usize] = true;
                        } else {
                            listed_by[d as usize] = i as u32 + 1;
                            deps.push(d);
                            counts[d as usize] += 1;
                        }
                    }
                    None => missing(i, k),
                });
            }
            dep_start.push(deps.len() as u32);
        }
        let mut dependent_start = Vec::with_capacity(n + 1);
        let mut acc = 0u32;
        dependent_start.push(0);
        for c in &counts {
            acc += c;
            dependent_start.push(acc);
        }
        let mut fill = dependent_start.clone();
        let mut dependents = vec![0u32; acc as usize];
        for i in 0..n {
            for &d in &deps[dep_start[i] as usize..dep_start[i + 1] as usize] {
                dependents[fill[d as usize] as usize] = i as u32;
                fill[d as usize] += 1;
            }
        }
        Structure {
            dep_start,
            deps,
            dependent_start,
            dependents,
            repeated,
        }
    }

    /// [`structure_with`](Self::structure_with), ignoring keys outside the graph.
    pub fn structure(&self) -> Structure {
        self.structure_with(|_, _| {})
    }

    /// Checks the graph before it runs: requested keys present, every dependency in the graph
    /// (or `external`: already computed elsewhere, with its type when known), no cycle, every
    /// function registered, every argument of the type its parameter takes.
    pub fn validate(
        &self,
        wanted: &[Key],
        external: &dyn Fn(&Key) -> Option<Option<TypeInfo>>,
    ) -> Result<Structure, GraphError> {
        if let Some(k) = wanted
            .iter()
            .find(|k| !self.contains(k) && external(k).is_none())
        {
            return Err(GraphError::MissingKey(*k));
        }
        let mut first_missing = None;
        let structure = self.structure_with(|i, k| {
            if first_missing.is_none() && external(&k).is_none() {
                first_missing = Some((self.keys[i], k));
            }
        });
        if let Some((key, missing)) = first_missing {
            return Err(GraphError::MissingDependency { key, missing });
        }
        crate::order::topological(&structure).map_err(|i| GraphError::Cycle(self.keys[i]))?;
        let type_of = |k: &Key| -> Option<TypeInfo> {
            match self.get(k) {
                Some(Node::Value(v)) => Some(v.type_info()),
                Some(Node::Task(t)) => registry().get(t.func).and_then(|f| f.returns()),
                None => external(k).flatten(),
            }
        };
        for (key, node) in self.iter() {
            if let Node::Task(t) = node {
                check_task(*key, t, &type_of)?;
            }
        }
        Ok(structure)
    }
}

/// What an argument is known to be before running.
enum ArgType {
    Unknown,
    Known(TypeInfo),
    List(Vec<ArgType>),
}

impl ArgType {
    fn describe(&self) -> String {
        match self {
            ArgType::Unknown => "a value of unknown type".into(),
            ArgType::Known(t) => t.name().to_string(),
            ArgType::List(items) => format!(
                "a list of [{}]",
                items
                    .iter()
                    .map(ArgType::describe)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    fn fits(&self, e: &Expect) -> bool {
        match (self, e) {
            (ArgType::Unknown, _) | (_, Expect::Any) => true,
            (ArgType::Known(t), Expect::Exactly(u)) => t == u,
            (ArgType::Known(t), Expect::Seq { whole, .. }) => t == whole,
            (ArgType::List(_), Expect::Exactly(u)) => *u == TypeInfo::of::<List>(),
            (ArgType::List(items), Expect::Seq { item, .. }) => {
                items.iter().all(|a| a.fits(&Expect::Exactly(*item)))
            }
        }
    }
}

fn arg_type(a: &Arg, type_of: &dyn Fn(&Key) -> Option<TypeInfo>) -> ArgType {
    match a {
        Arg::Key(k) => type_of(k).map_or(ArgType::Unknown, ArgType::Known),
        Arg::Lit(v) => ArgType::Known(v.type_info()),
        Arg::List(items) => ArgType::List(items.iter().map(|a| arg_type(a, type_of)).collect()),
        Arg::Task(t) => registry()
            .get(t.func)
            .and_then(|f| f.returns())
            .map_or(ArgType::Unknown, ArgType::Known),
    }
}

fn check_task(
    key: Key,
    t: &Task,
    type_of: &dyn Fn(&Key) -> Option<TypeInfo>,
) -> Result<(), GraphError> {
    let function = t.func.as_str().to_string();
    let Some(f) = registry().get(t.func) else {
        return Err(GraphError::UnknownFunction { key, function });
    };
    let expect = |i: usize| -> Expect {
        match f.params() {
            Params::Fixed(ps) => ps[i].clone(),
            Params::Variadic(e) => e.clone(),
        }
    };
    if let Params::Fixed(ps) = f.params() {
        if ps.len() != t.args.len() {
            return Err(GraphError::Arity {
                key,
                function,
                got: t.args.len(),
                expected: ps.len(),
            });
        }
    }
    for (i, a) in t.args.iter().enumerate() {
        if let Arg::Task(nested) = a {
            check_task(key, nested, type_of)?;
        }
        let got = arg_type(a, type_of);
        let want = expect(i);
        if !got.fits(&want) {
            return Err(GraphError::Type {
                key,
                function,
                argument: i,
                expected: want.to_string(),
                got: got.describe(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn none(_: &Key) -> Option<Option<TypeInfo>> {
        None
    }

    #[test]
    fn structure_is_both_ways_and_dedups() {
        let mut g = Graph::new();
        g.insert("a", Value::new(1i64));
        g.insert(
            "b",
            Task::new("graph-test-add", [Arg::key("a"), Arg::key("a")]),
        );
        g.insert(
            "c",
            Task::new("graph-test-add", [Arg::key("a"), Arg::key("b")]),
        );
        let s = g.structure();
        assert_eq!(s.deps(1), &[0]);
        assert_eq!(s.deps(2), &[0, 1]);
        assert_eq!(s.dependents(0), &[1, 2]);
        assert!(s.dependents(2).is_empty());
    }

    #[test]
    fn validation_names_key_function_and_expectation() {
        registry().register("graph-test-add", |a: i64, b: i64| a + b);
        registry().register("graph-test-text", |s: String| s.len() as i64);
        let mut g = Graph::new();
        g.insert("x", Value::new(1i64));
        g.insert(
            "y",
            Task::new("graph-test-add", [Arg::key("x"), Arg::lit(2i64)]),
        );
        assert!(g.validate(&["y".into()], &none).is_ok());

        let mut bad = g.clone();
        bad.insert("z", Task::new("graph-test-text", [Arg::key("y")]));
        let e = bad.validate(&["z".into()], &none).unwrap_err();
        assert!(
            matches!(&e, GraphError::Type { key, function, argument: 0, expected, got }
                if key == &Key::name_only("z") && function == "graph-test-text"
                && expected.contains("String") && got == "i64"),
            "{e:?}"
        );
        assert!(e.to_string().contains("task z"), "{e}");

        let mut bad = g.clone();
        bad.insert("z", Task::new("no-such-function", [Arg::key("y")]));
        assert!(matches!(
            bad.validate(&[], &none),
            Err(GraphError::UnknownFunction { .. })
        ));
        let mut bad = g.clone();
        bad.insert("z", Task::new("graph-test-add", [Arg::key("y")]));
        assert!(matches!(
            bad.validate(&[], &none),
            Err(GraphError::Arity {
                got: 1,
                expected: 2,
                ..
            })
        ));
        let mut bad = g.clone();
        bad.insert(
            "z",
            Task::new("graph-test-add", [Arg::key("y"), Arg::key("w")]),
        );
        assert!(matches!(
            bad.validate(&[], &none),
            Err(GraphError::MissingDependency { .. })
        ));
        // Known elsewhere (a future on a cluster): fine, and its type is checked.
        let ext = |k: &Key| (k == &Key::name_only("w")).then_some(Some(TypeInfo::of::<i64>()));
        assert!(bad.validate(&[], &ext).is_ok());
        assert!(matches!(
            g.validate(&["nope".into()], &none),
            Err(GraphError::MissingKey(_))
        ));
    }

    #[test]
    fn cycles_are_refused() {
        registry().register("graph-test-id", |a: i64| a);
        let mut g = Graph::new();
        g.insert("a", Task::new("graph-test-id", [Arg::key("b")]));
        g.insert("b", Task::new("graph-test-id", [Arg::key("a")]));
        assert!(matches!(
            g.validate(&[], &|_: &Key| None),
            Err(GraphError::Cycle(_))
        ));
    }

    #[test]
    fn lists_are_checked_item_by_item() {
        registry().register("graph-test-sum", |xs: Vec<i64>| xs.iter().sum::<i64>());
        let mut g = Graph::new();
        g.insert("a", Value::new(1i64));
        g.insert(
            "s",
            Task::new(
                "graph-test-sum",
                [Arg::List(vec![Arg::key("a"), Arg::lit(2i64)])],
            ),
        );
        assert!(g.validate(&[], &|_: &Key| None).is_ok());
        g.insert(
            "t",
            Task::new(
                "graph-test-sum",
                [Arg::List(vec![Arg::key("a"), Arg::lit(true)])],
            ),
        );
        assert!(matches!(
            g.validate(&[], &|_: &Key| None),
            Err(GraphError::Type { .. })
        ));
    }
}
