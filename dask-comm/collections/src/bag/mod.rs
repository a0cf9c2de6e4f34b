//! A bag: an unordered-in-spirit, partitioned collection of semi-structured items (text lines,
//! JSON records, tuples), as `dask.bag`, for simple parallel computations over them.
//!
//! Items are [`Item`]s (JSON's values, with integers kept apart from floats). Functions over
//! items are registered by name in every process ([`register_map`], [`register_predicate`],
//! ...; the built-ins such as [`STR_SPLIT`] and [`JSON_LOADS`] need no registering), so a
//! graph names them and never ships code. Element-wise steps (`map`, `filter`, `flatten`,
//! `pluck`, `map_partitions`) run inside the task that reads the partition, so a chain of
//! them costs one task per partition and no intermediate lists.
//!
//! ```
//! use dask_collections::bag::{self, Item};
//! use dask_graph::Threaded;
//! let lines = ["the quick brown fox", "the lazy dog", "the end"];
//! let b = bag::from_sequence(lines.iter().map(|&l| Item::from(l)), 2)?;
//! bag::register_map("bag-doc-count", |p: &Item| p.at(1).cloned().unwrap_or_default());
//! let top = b.map(bag::STR_SPLIT)?.flatten().frequencies(false).topk_by(1, "bag-doc-count")?;
//! let got = top.compute(&Threaded::new(2))?;
//! assert_eq!(got, vec![Item::pair("the", 3)]);
//! # Ok::<(), bag::BagError>(())
//! ```
//!
//! Every process that runs bag tasks must have the bag's functions registered: call
//! [`register`] (and register your own item functions) at the top of `main`, before
//! `dask_comm::run_if_worker` in a program that starts a `LocalCluster` of processes.

mod aggregations;
mod builtins;
mod create;
mod functions;
mod item;
mod kernels;
mod reduce;
mod shuffle;
mod steps;
mod text;

use std::path::PathBuf;
use std::sync::Arc;

use dask_graph::{Arg, ComputeError, FailureKind, Graph, Key, Scheduler, Task};

use crate::layers::{Layers, fresh_name, graph_for, stack};
use serde::{Deserialize, Serialize};

pub use builtins::{
    ADD, IDENTITY, JSON_DUMPS, JSON_LOADS, LEN, NOT_BLANK, STR_LOWER, STR_SPLIT, STR_STRIP,
    STR_UPPER, TRUTHY,
};
pub use create::{from_sequence, range, read_json, read_text};
pub use functions::{
    BagFn, BagFunction, Kind, Outcome, kind, register_aggregate, register_binary, register_map,
    register_partition, register_predicate,
};
pub use item::Item;
pub use kernels::register;
pub use steps::Field;

use steps::{Step, Steps};

/// The default number of partial results combined by one task of a reduction tree (Dask's).
pub const SPLIT_EVERY: usize = 8;

/// A partition's items, as a task value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Part(pub Vec<Item>);

dask_graph::serde_data!(
    Part,
    nbytes = |p: &Part| 24 + p.0.iter().map(Item::nbytes).sum::<usize>()
);

/// Why a bag operation was refused, or its computation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BagError {
    /// A function name that no bag function is registered under (in this process).
    #[error("no bag function {name:?} is registered (expected {expected})")]
    UnknownFunction {
        /// The name.
        name: String,
        /// The kind the operation needs.
        expected: Kind,
    },
    /// A function registered as another kind than the operation needs.
    #[error("bag function {name:?} is {registered}, the operation needs {expected}")]
    WrongKind {
        /// The name.
        name: String,
        /// The kind the operation needs.
        expected: Kind,
        /// The kind it was registered as.
        registered: Kind,
    },
    /// A file pattern that is malformed (or an output pattern without exactly one `*`).
    #[error("pattern {pattern:?}: {reason}")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A pattern that matches no file.
    #[error("no file matches {pattern:?}")]
    NoFiles {
        /// The pattern.
        pattern: String,
    },
    /// A file that could not be read or listed while building the bag.
    #[error("{}: {reason}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        reason: String,
    },
    /// A bag of no partitions where one is needed, or `npartitions` of 0.
    #[error("{what}: a bag needs at least one partition")]
    NoPartitions {
        /// The operation.
        what: &'static str,
    },
    /// A reduction with no item to start from (`min`, `max`, `mean`, `fold` without an
    /// initial value, of an empty bag).
    #[error("{key}: {op} of an empty bag")]
    Empty {
        /// The reduction.
        op: String,
        /// Its task.
        key: Key,
    },
    /// A value of an unexpected type where a partition or a result was expected.
    #[error("{key}: expected {expected}, the task produced {got}")]
    NotABag {
        /// The key.
        key: Key,
        /// What was expected.
        expected: &'static str,
        /// The value's type.
        got: String,
    },
    /// The computation failed: a task erred (an item function's error, a bad item for a
    /// step, a file that could not be read), or the cluster went away.
    #[error(transparent)]
    Compute(#[from] ComputeError),
}

fn typed_failure(e: ComputeError) -> BagError {
    if let Some(c) = e.cause()
        && c.kind == FailureKind::Error
        && c.function.starts_with("dask-bag-")
        && let Some(rest) = c.message.strip_prefix(reduce::EMPTY)
    {
        let op = rest.split(' ').next().unwrap_or("reduction").to_string();
        return BagError::Empty { op, key: c.key };
    }
    BagError::Compute(e)
}

/// A bag: `npartitions` partitions of [`Item`]s, built lazily as a task graph.
#[derive(Debug, Clone)]
pub struct Bag {
    /// The layer whose partitions are `(name, i)`.
    name: String,
    npartitions: usize,
    /// Element-wise steps not yet made into tasks (run by whichever task reads a partition).
    steps: Vec<Step>,
    /// Where a task that reads partition `i` takes it from.
    source: Source,
    layers: Layers,
    split_every: usize,
}

/// Where the tasks that read a bag's partitions take them from.
#[derive(Debug, Clone)]
enum Source {
    /// Its layer's partition `i`.
    Layer,
    /// The pairs of partition `i / m` of the first bag and `i % m` of the second (`m` the
    /// second's partitions), made as they are read: a `product` followed by steps and a
    /// reduction never holds its pairs.
    Product(Arc<(Bag, Bag)>),
}

/// One item computed from a bag (a reduction's result), lazily: Dask's `Item`.
#[derive(Debug, Clone)]
pub struct Scalar {
    key: Key,
    layers: Layers,
}

impl Scalar {
    /// The key of the result.
    pub fn key(&self) -> Key {
        self.key
    }

    /// Computes the item on `scheduler`.
    pub fn compute(&self, scheduler: &dyn Scheduler) -> Result<Item, BagError> {
        let g = graph_for(&self.layers, &[self.key]);
        let v = scheduler.get(g, &[self.key]).map_err(typed_failure)?;
        self.item(v)
    }

    /// [`Scalar::compute`] for async callers, on a scheduler that does not block their
    /// thread (a `dask_comm::Client`).
    pub async fn compute_async(
        &self,
        scheduler: &dyn dask_graph::AsyncScheduler,
    ) -> Result<Item, BagError> {
        let g = graph_for(&self.layers, &[self.key]);
        let keys = [self.key];
        let v = scheduler.get_async(g, &keys).await.map_err(typed_failure)?;
        self.item(v)
    }

    fn item(&self, v: Vec<dask_graph::Value>) -> Result<Item, BagError> {
        let v = v.into_iter().next().expect("one value per key");
        v.downcast_ref::<Item>()
            .cloned()
            .ok_or_else(|| BagError::NotABag {
                key: self.key,
                expected: "an item",
                got: v.type_info().name().to_string(),
            })
    }
}

impl Bag {
    fn new(name: String, npartitions: usize, inputs: &[&Layers], layer: Graph) -> Bag {
        let layers = stack(inputs, &name, layer);
        Bag {
            name,
            npartitions,
            steps: Vec::new(),
            source: Source::Layer,
            layers,
            split_every: SPLIT_EVERY,
        }
    }

    /// Partitions.
    pub fn npartitions(&self) -> usize {
        self.npartitions
    }

    /// The reductions of the bag returned combine `n` partial results per task (at least 2;
    /// [`SPLIT_EVERY`] by default).
    pub fn split_every(&self, n: usize) -> Bag {
        Bag {
            split_every: n.max(2),
            ..self.clone()
        }
    }

    fn with_step(&self, step: Step) -> Result<Bag, BagError> {
        Steps::check(&step)?;
        let mut b = self.clone();
        b.steps.push(step);
        Ok(b)
    }

    /// `f` applied to every item ([`Kind::Map`]).
    pub fn map(&self, f: impl BagFunction<kind::Map>) -> Result<Bag, BagError> {
        self.with_step(Step::Map(f.bag_name().to_string()))
    }

    /// The items for which `predicate` is true ([`Kind::Predicate`]).
    pub fn filter(&self, predicate: impl BagFunction<kind::Predicate>) -> Result<Bag, BagError> {
        self.with_step(Step::Filter(predicate.bag_name().to_string()))
    }

    /// The items for which `predicate` is false.
    pub fn remove(&self, predicate: impl BagFunction<kind::Predicate>) -> Result<Bag, BagError> {
        self.with_step(Step::Remove(predicate.bag_name().to_string()))
    }

    /// The elements of every item, which must be a list (a string item fails the task).
    pub fn flatten(&self) -> Bag {
        let mut b = self.clone();
        b.steps.push(Step::Flatten);
        b
    }

    /// The field `field` of every item (a map's field by name, a list's element by
    /// position); an item without it fails the task.
    ///
    /// ```
    /// use dask_collections::bag::{self, Item};
    /// let recs = [r#"{"name": "Ada", "age": 36}"#, r#"{"name": "Alan", "age": 41}"#];
    /// let b = bag::from_sequence(recs.iter().map(|r| Item::from_json(r).unwrap()), 2)?;
    /// assert_eq!(b.pluck("age").sum().compute(&dask_graph::Inline)?, Item::Int(77));
    /// # Ok::<(), bag::BagError>(())
    /// ```
    pub fn pluck(&self, field: impl Into<Field>) -> Bag {
        let mut b = self.clone();
        b.steps.push(Step::Pluck {
            field: field.into(),
            default: None,
        });
        b
    }

    /// The field `field` of every item, or `default` where it has none.
    pub fn pluck_or(&self, field: impl Into<Field>, default: Item) -> Bag {
        let mut b = self.clone();
        b.steps.push(Step::Pluck {
            field: field.into(),
            default: Some(default),
        });
        b
    }

    /// `f` applied to every partition's list of items ([`Kind::Partition`]).
    pub fn map_partitions(&self, f: impl BagFunction<kind::Partition>) -> Result<Bag, BagError> {
        self.with_step(Step::Partition(f.bag_name().to_string()))
    }

    /// The argument a task reads partition `i` from (before the pending steps).
    fn input_arg(&self, i: usize) -> Arg {
        match &self.source {
            Source::Layer => Arg::key(Key::new(&self.name, &[i as u32])),
            Source::Product(ab) => shuffle::pair_input(&ab.0, &ab.1, i),
        }
    }

    /// The task that yields partition `i` with the pending steps run.
    fn part_task(&self, i: usize) -> Arg {
        match (&self.source, self.steps.is_empty()) {
            (Source::Layer, true) => self.input_arg(i),
            _ => {
                let [p, s] = self.input_args(i);
                Arg::Task(Box::new(Task::new(kernels::PIPELINE, [p, s])))
            }
        }
    }

    /// What a task that reads partition `i` takes: its input and the pending steps.
    fn input_args(&self, i: usize) -> [Arg; 2] {
        [self.input_arg(i), Arg::lit(Steps(self.steps.clone()))]
    }

    /// The bag with its pending steps made into tasks of their own (one per partition).
    fn materialized(&self) -> Bag {
        if self.steps.is_empty() {
            // A product's layer holds its pairs as tasks.
            return Bag {
                source: Source::Layer,
                ..self.clone()
            };
        }
        let name = fresh_name("map");
        let mut g = Graph::new();
        for i in 0..self.npartitions {
            let [p, s] = self.input_args(i);
            g.insert(
                Key::new(&name, &[i as u32]),
                Task::new(kernels::PIPELINE, [p, s]),
            );
        }
        Bag::new(name, self.npartitions, &[&self.layers], g)
    }

    /// The bag as a graph and the keys of its partitions, in order (to submit it yourself,
    /// or to look at it).
    pub fn to_graph(&self) -> (Graph, Vec<Key>) {
        let b = self.materialized();
        let keys: Vec<Key> = (0..b.npartitions)
            .map(|i| Key::new(&b.name, &[i as u32]))
            .collect();
        (graph_for(&b.layers, &keys), keys)
    }

    fn get_parts(&self, which: &[usize], scheduler: &dyn Scheduler) -> Result<Vec<Item>, BagError> {
        let b = self.materialized();
        let keys: Vec<Key> = which
            .iter()
            .map(|&i| Key::new(&b.name, &[i as u32]))
            .collect();
        let values = scheduler
            .get(graph_for(&b.layers, &keys), &keys)
            .map_err(typed_failure)?;
        Self::items(keys, values)
    }

    /// [`Bag::compute`] for async callers, on a scheduler that does not block their thread
    /// (a `dask_comm::Client`).
    pub async fn compute_async(
        &self,
        scheduler: &dyn dask_graph::AsyncScheduler,
    ) -> Result<Vec<Item>, BagError> {
        let b = self.materialized();
        let keys: Vec<Key> = (0..self.npartitions)
            .map(|i| Key::new(&b.name, &[i as u32]))
            .collect();
        let values = scheduler
            .get_async(graph_for(&b.layers, &keys), &keys)
            .await
            .map_err(typed_failure)?;
        Self::items(keys, values)
    }

    /// The items of computed partitions (`values`, of `keys`), in order.
    fn items(keys: Vec<Key>, values: Vec<dask_graph::Value>) -> Result<Vec<Item>, BagError> {
        let mut out = Vec::new();
        for (v, k) in values.into_iter().zip(keys) {
            match v.downcast_ref::<Part>() {
                Some(p) => out.extend(p.0.iter().cloned()),
                None => {
                    return Err(BagError::NotABag {
                        key: k,
                        expected: "a partition",
                        got: v.type_info().name().to_string(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Computes every partition on `scheduler`: the items, partition after partition.
    pub fn compute(&self, scheduler: &dyn Scheduler) -> Result<Vec<Item>, BagError> {
        let all: Vec<usize> = (0..self.npartitions).collect();
        self.get_parts(&all, scheduler)
    }

    /// The first `k` items: computes the first partition, then twice as many more at a time
    /// until it has `k` items or there are no more partitions (Dask looks only at the
    /// first partition unless told otherwise; this never returns fewer than `k` while there
    /// are more).
    ///
    /// ```
    /// use dask_collections::bag;
    /// let b = bag::range(100, 10)?;
    /// assert_eq!(b.take(15, &dask_graph::Inline)?.len(), 15);
    /// # Ok::<(), bag::BagError>(())
    /// ```
    pub fn take(&self, k: usize, scheduler: &dyn Scheduler) -> Result<Vec<Item>, BagError> {
        let mut out = Vec::new();
        let (mut next, mut batch) = (0usize, 1usize);
        while out.len() < k && next < self.npartitions {
            let end = (next + batch).min(self.npartitions);
            let which: Vec<usize> = (next..end).collect();
            out.extend(self.get_parts(&which, scheduler)?);
            next = end;
            batch *= 2;
        }
        out.truncate(k);
        Ok(out)
    }

    /// Writes every partition to a text file, one line per item (strings as they are,
    /// anything else as JSON); the `*` in `pattern` becomes the partition's number
    /// (zero-padded), and a name ending in `.gz` is gzip-compressed. Returns the files.
    ///
    /// ```
    /// use dask_collections::bag::{self, Item};
    /// let dir = std::env::temp_dir().join(format!("bag-doc-write-{}", std::process::id()));
    /// let b = bag::from_sequence((0..5).map(Item::Int), 2)?;
    /// let files = b.to_textfiles(&format!("{}/part-*.txt.gz", dir.display()), &dask_graph::Inline)?;
    /// assert_eq!(files.len(), 2);
    /// let back = bag::read_text(&format!("{}/*.gz", dir.display()), None)?.map(bag::JSON_LOADS)?;
    /// assert_eq!(back.compute(&dask_graph::Inline)?, (0..5).map(Item::Int).collect::<Vec<_>>());
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), bag::BagError>(())
    /// ```
    pub fn to_textfiles(
        &self,
        pattern: &str,
        scheduler: &dyn Scheduler,
    ) -> Result<Vec<PathBuf>, BagError> {
        let names = text::names(pattern, self.npartitions)?;
        let name = fresh_name("to-textfiles");
        let mut g = Graph::new();
        for (i, path) in names.iter().enumerate() {
            let [p, s] = self.input_args(i);
            g.insert(
                Key::new(&name, &[i as u32]),
                Task::new(kernels::WRITE, [p, s, Arg::lit(path.clone())]),
            );
        }
        let layers = stack(&[&self.layers], &name, g);
        let keys: Vec<Key> = (0..names.len())
            .map(|i| Key::new(&name, &[i as u32]))
            .collect();
        scheduler
            .get(graph_for(&layers, &keys), &keys)
            .map_err(typed_failure)?;
        Ok(names.into_iter().map(PathBuf::from).collect())
    }
}
