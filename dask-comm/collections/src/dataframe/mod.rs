//! A dataframe: a stack of polars `DataFrame`s (Dask scales pandas; this scales polars),
//! built lazily as a task graph and computed on any `Scheduler`.
//!
//! ```
//! use dask_collections::dataframe::{self, col, lit, Agg};
//! use polars::prelude::*;
//! let df = df!("user" => [1i64, 2, 1, 3, 2, 1], "value" => [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
//! let d = dataframe::from_polars(df, 3)?;
//! let means = d.filter(col("value").gt(lit(1.5)))?.groupby(&["user"])?.agg(&[("value", Agg::Mean)])?;
//! let got = means.compute(&dask_graph::Threaded::new(2))?;
//! assert_eq!(got.column("value_mean").unwrap().f64().unwrap().to_vec(),
//!            vec![Some(4.5), Some(3.5), Some(4.0)]);
//! # Ok::<(), dataframe::DataFrameError>(())
//! ```
//!
//! Row-wise operations (`filter`, `assign`, `select`, `map_partitions`) run inside the task
//! that reads a partition, as one polars query: reading a CSV file parses only the columns
//! the query needs. Group-bys, `value_counts`, `drop_duplicates` and `describe` are trees of
//! partial results; `merge` broadcasts a one-partition side or shuffles both by key hash, and
//! `sort_values` partitions by range, both on the peer-to-peer shuffle.

mod aggregate;
mod create;
mod expr;
mod frame;
mod index;
mod kernels;
mod merge;
mod ops;
mod sort;

use std::path::PathBuf;
use std::sync::Arc;

use dask_graph::{Arg, ComputeError, Graph, Key, Scheduler, Task};
use polars::prelude::{DataFrame as PlFrame, IntoLazy, Schema};

use crate::bag::SPLIT_EVERY;
use crate::layers::{Layers, fresh_name, graph_for, stack};

pub use aggregate::Agg;
pub use create::{from_polars, read_csv, read_parquet};
pub use expr::{BinOp, Expr, Lit, col, lit};
pub use frame::{ColumnType, Columns, Frame};
pub use kernels::register;
pub use merge::{How, RIGHT_SUFFIX, ShuffleMethod};
pub use ops::register_partition;

use aggregate::Spec;
use ops::{Op, Ops, Scan};

/// Why a dataframe operation was refused, or its computation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DataFrameError {
    /// A column the dataframe does not have.
    #[error("no column {name:?} (the columns are {columns:?})")]
    NoColumn {
        /// The name asked for.
        name: String,
        /// The columns there are.
        columns: Vec<String>,
    },
    /// An operation polars refuses on these columns (a type mismatch, say), found when the
    /// operation was built.
    #[error("{op}: {reason}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// polars' reason.
        reason: String,
    },
    /// No partition function registered under this name (in this process).
    #[error("no dataframe partition function {name:?} is registered")]
    UnknownFunction {
        /// The name.
        name: String,
    },
    /// Join keys of different types on the two sides.
    #[error("join key {key:?} is {left:?} on the left and {right:?} on the right")]
    KeyTypes {
        /// The key.
        key: String,
        /// Its type on the left.
        left: ColumnType,
        /// Its type on the right.
        right: ColumnType,
    },
    /// A pattern that matches no file, or a malformed one.
    #[error("pattern {pattern:?}: {reason}")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// What is wrong.
        reason: String,
    },
    /// A file that could not be read while building the dataframe (its schema).
    #[error("{}: {reason}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The reason.
        reason: String,
    },
    /// `npartitions` of 0.
    #[error("{what}: a dataframe needs at least one partition")]
    NoPartitions {
        /// The operation.
        what: &'static str,
    },
    /// A value of another type where a partition was expected.
    #[error("{key}: expected a dataframe partition, the task produced {got}")]
    NotAFrame {
        /// The key.
        key: Key,
        /// The value's type.
        got: String,
    },
    /// An operation that needs an index ([`DataFrame::set_index`]) on a dataframe without
    /// one.
    #[error("{op} needs an index (set_index first)")]
    NoIndex {
        /// The operation.
        op: &'static str,
    },
    /// The computation failed (a task erred, or the cluster went away).
    #[error(transparent)]
    Compute(#[from] ComputeError),
}

/// Where the tasks that read a dataframe's partitions take them from.
#[derive(Debug, Clone)]
enum Source {
    /// Its layer's partition `i`.
    Layer,
    /// File `i`, scanned by the reading task itself (so its query reaches into the reader).
    Scans(Arc<Vec<Scan>>),
}

/// A dataframe: `npartitions` polars data frames with the same columns.
#[derive(Debug, Clone)]
pub struct DataFrame {
    name: String,
    npartitions: usize,
    source: Source,
    ops: Vec<Op>,
    /// The columns after `ops` (built here, by running the operations on no rows).
    schema: Arc<Schema>,
    layers: Layers,
    /// The index, after `set_index` (kept by the row-wise operations that keep its column).
    index: Option<index::Index>,
}

impl DataFrame {
    /// Partitions.
    pub fn npartitions(&self) -> usize {
        self.npartitions
    }

    /// The column names, in order.
    pub fn columns(&self) -> Vec<String> {
        self.schema.iter_names().map(|n| n.to_string()).collect()
    }

    /// The polars schema of the partitions.
    pub fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn check_columns<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), DataFrameError> {
        for n in names {
            if self.schema.get(n).is_none() {
                return Err(DataFrameError::NoColumn {
                    name: n.to_string(),
                    columns: self.columns(),
                });
            }
        }
        Ok(())
    }

    /// The dataframe with `op` pending; the schema after it is found by running it on no
    /// rows (so a type error is found here, not on a worker).
    fn with_op(&self, op: Op, what: &'static str) -> Result<DataFrame, DataFrameError> {
        let empty = PlFrame::empty_with_schema(&self.schema);
        let schema = ops::apply(empty.lazy(), std::slice::from_ref(&op))
            .and_then(|mut lf| lf.collect_schema().map_err(|e| e.to_string()))
            .map_err(|reason| DataFrameError::Invalid { op: what, reason })?;
        let mut d = self.clone();
        d.index = d.index.filter(|i| i.kept_by(&op));
        d.ops.push(op);
        d.schema = schema;
        Ok(d)
    }

    /// The rows where `predicate` is true.
    pub fn filter(&self, predicate: Expr) -> Result<DataFrame, DataFrameError> {
        self.check_columns(predicate.columns())?;
        self.with_op(Op::Filter(predicate), "filter")
    }

    /// A column `name` (added, or replaced) computed by `value`.
    pub fn assign(&self, name: &str, value: Expr) -> Result<DataFrame, DataFrameError> {
        self.check_columns(value.columns())?;
        self.with_op(Op::Assign(name.to_string(), value), "assign")
    }

    /// Only these columns, in this order.
    pub fn select(&self, columns: &[&str]) -> Result<DataFrame, DataFrameError> {
        self.check_columns(columns.iter().copied())?;
        let cols = columns.iter().map(|c| c.to_string()).collect();
        self.with_op(Op::Select(cols), "select")
    }

    /// A registered function ([`register_partition`]) applied to every partition; its result
    /// columns are found by calling it on no rows.
    pub fn map_partitions(&self, function: &str) -> Result<DataFrame, DataFrameError> {
        ops::partition_fn(function)?;
        self.with_op(Op::Partition(function.to_string()), "map_partitions")
    }

    /// What a task that reads partition `i` takes: its input and the pending operations.
    fn input_args(&self, i: usize) -> [Arg; 2] {
        self.input_args_for(i, None)
    }

    /// The same, for a consumer that reads only the columns `need` (a file is then read for
    /// just the columns that and the pending operations need).
    fn input_args_for(&self, i: usize, need: Option<Vec<String>>) -> [Arg; 2] {
        let input = match &self.source {
            Source::Layer => Arg::key(Key::new(&self.name, &[i as u32])),
            Source::Scans(s) => Arg::lit(match &s[i] {
                Scan::Csv { path, columns, .. } => Scan::Csv {
                    path: path.clone(),
                    columns: columns.clone(),
                    // Nothing asked for (a row count): the first column.
                    projection: ops::needed(&self.ops, need).map(|p| {
                        if p.is_empty() {
                            columns.iter().take(1).map(|c| c.0.clone()).collect()
                        } else {
                            p
                        }
                    }),
                },
                other => other.clone(),
            }),
        };
        [input, Arg::lit(Ops(self.ops.clone()))]
    }

    /// The dataframe with its pending operations made into tasks (one per partition).
    fn materialized(&self) -> DataFrame {
        if self.ops.is_empty() {
            return DataFrame {
                source: Source::Layer,
                ..self.clone()
            };
        }
        let name = fresh_name("frame-ops");
        let mut g = Graph::new();
        for i in 0..self.npartitions {
            let [p, o] = self.input_args(i);
            g.insert(
                Key::new(&name, &[i as u32]),
                Task::new(kernels::PIPELINE, [p, o]),
            );
        }
        DataFrame {
            layers: stack(&[&self.layers], &name, g),
            name,
            npartitions: self.npartitions,
            source: Source::Layer,
            ops: Vec::new(),
            schema: self.schema.clone(),
            index: self.index.clone(),
        }
    }

    /// The dataframe as a graph and the keys of its partitions, in order.
    pub fn to_graph(&self) -> (Graph, Vec<Key>) {
        let d = self.materialized();
        let keys = d.keys();
        (graph_for(&d.layers, &keys), keys)
    }

    fn keys(&self) -> Vec<Key> {
        (0..self.npartitions)
            .map(|i| Key::new(&self.name, &[i as u32]))
            .collect()
    }

    fn get_parts(
        &self,
        which: &[usize],
        s: &dyn Scheduler,
    ) -> Result<Vec<PlFrame>, DataFrameError> {
        let d = self.materialized();
        let keys: Vec<Key> = which
            .iter()
            .map(|&i| Key::new(&d.name, &[i as u32]))
            .collect();
        let values = s.get(graph_for(&d.layers, &keys), &keys)?;
        Self::frames(keys, values)
    }

    /// The polars frames of computed partitions (`values`, of `keys`), in order.
    fn frames(
        keys: Vec<Key>,
        values: Vec<dask_graph::Value>,
    ) -> Result<Vec<PlFrame>, DataFrameError> {
        values
            .iter()
            .zip(keys)
            .map(|(v, key)| {
                v.downcast_ref::<Frame>()
                    .map(|f| f.0.clone())
                    .ok_or_else(|| DataFrameError::NotAFrame {
                        key,
                        got: v.type_info().name().to_string(),
                    })
            })
            .collect()
    }

    fn stacked(&self, parts: Vec<PlFrame>) -> Result<PlFrame, DataFrameError> {
        if parts.is_empty() {
            return Ok(PlFrame::empty_with_schema(&self.schema));
        }
        let refs: Vec<&PlFrame> = parts.iter().collect();
        let mut all = frame::concat(&refs).map_err(|reason| DataFrameError::Invalid {
            op: "compute",
            reason,
        })?;
        all.rechunk_mut();
        Ok(all)
    }

    /// Computes every partition and stacks them, in order, into one polars frame.
    pub fn compute(&self, scheduler: &dyn Scheduler) -> Result<PlFrame, DataFrameError> {
        let all: Vec<usize> = (0..self.npartitions).collect();
        let parts = self.get_parts(&all, scheduler)?;
        self.stacked(parts)
    }

    /// [`DataFrame::compute`] for async callers, on a scheduler that does not block their
    /// thread (a `dask_comm::Client`).
    pub async fn compute_async(
        &self,
        scheduler: &dyn dask_graph::AsyncScheduler,
    ) -> Result<PlFrame, DataFrameError> {
        let d = self.materialized();
        let keys: Vec<Key> = (0..self.npartitions)
            .map(|i| Key::new(&d.name, &[i as u32]))
            .collect();
        let values = scheduler
            .get_async(graph_for(&d.layers, &keys), &keys)
            .await?;
        let parts = Self::frames(keys, values)?;
        self.stacked(parts)
    }

    /// The first `n` rows: computes the first partition, then twice as many more at a time
    /// until it has `n` rows or there are no more.
    pub fn head(&self, n: usize, scheduler: &dyn Scheduler) -> Result<PlFrame, DataFrameError> {
        let (mut parts, mut rows) = (Vec::new(), 0usize);
        let (mut next, mut batch) = (0usize, 1usize);
        while rows < n && next < self.npartitions {
            let end = (next + batch).min(self.npartitions);
            let which: Vec<usize> = (next..end).collect();
            for p in self.get_parts(&which, scheduler)? {
                rows += p.height();
                parts.push(p);
            }
            next = end;
            batch *= 2;
        }
        Ok(self.stacked(parts)?.head(Some(n)))
    }

    /// The number of rows (computed).
    pub fn len(&self, scheduler: &dyn Scheduler) -> Result<usize, DataFrameError> {
        let name = fresh_name("len");
        let mut g = Graph::new();
        let keys: Vec<Key> = (0..self.npartitions)
            .map(|i| {
                let k = Key::new(&name, &[i as u32]);
                g.insert(
                    k,
                    Task::new(kernels::HEIGHT, self.input_args_for(i, Some(Vec::new()))),
                );
                k
            })
            .collect();
        let layers = stack(&[&self.layers], &name, g);
        let values = scheduler.get(graph_for(&layers, &keys), &keys)?;
        values
            .iter()
            .zip(keys)
            .map(|(v, key)| {
                v.downcast_ref::<u64>().map(|&n| n as usize).ok_or_else(|| {
                    DataFrameError::NotAFrame {
                        key,
                        got: v.type_info().name().to_string(),
                    }
                })
            })
            .sum()
    }

    /// Whether the dataframe has no rows (computed).
    pub fn is_empty(&self, scheduler: &dyn Scheduler) -> Result<bool, DataFrameError> {
        Ok(self.len(scheduler)? == 0)
    }

    /// Writes every partition to a file: CSV with a header, or parquet when `pattern` ends in
    /// `.parquet`; the one `*` in `pattern` becomes the zero-padded partition number.
    pub fn to_files(
        &self,
        pattern: &str,
        scheduler: &dyn Scheduler,
    ) -> Result<Vec<PathBuf>, DataFrameError> {
        let paths = crate::files::names(pattern, self.npartitions)
            .map_err(|e| create::pattern_error(pattern, e))?;
        let name = fresh_name("to-files");
        let mut g = Graph::new();
        let keys: Vec<Key> = paths
            .iter()
            .enumerate()
            .map(|(i, path)| {
                let [p, o] = self.input_args(i);
                let k = Key::new(&name, &[i as u32]);
                g.insert(k, Task::new(kernels::WRITE, [p, o, Arg::lit(path.clone())]));
                k
            })
            .collect();
        let layers = stack(&[&self.layers], &name, g);
        scheduler.get(graph_for(&layers, &keys), &keys)?;
        Ok(paths.into_iter().map(PathBuf::from).collect())
    }

    /// A tree reduction: `spec`'s partial of every partition, combined [`SPLIT_EVERY`] at a
    /// time (at least once), then finished: one partition.
    fn reduced(&self, spec: Spec, what: &'static str) -> Result<DataFrame, DataFrameError> {
        let name = fresh_name(what);
        let (partial, combine) = (format!("{name}-partial"), format!("{name}-combine"));
        let mut g = Graph::new();
        let mut level: Vec<Key> = (0..self.npartitions)
            .map(|i| {
                let k = Key::new(&partial, &[i as u32]);
                let [p, o] = self.input_args_for(i, spec.columns());
                g.insert(
                    k,
                    Task::new(kernels::AGG_PARTIAL, [p, o, Arg::lit(spec.clone())]),
                );
                k
            })
            .collect();
        let mut depth = 0u32;
        while level.len() > 1 || depth == 0 {
            level = level
                .chunks(SPLIT_EVERY)
                .enumerate()
                .map(|(j, group)| {
                    let k = Key::new(&combine, &[depth, j as u32]);
                    let mut args = vec![Arg::lit(spec.clone())];
                    args.extend(group.iter().map(|&k| Arg::key(k)));
                    g.insert(k, Task::new(kernels::AGG_COMBINE, args));
                    k
                })
                .collect();
            depth += 1;
        }
        // The result's columns: the same steps on no rows.
        let empty = PlFrame::empty_with_schema(&self.schema);
        let invalid = |reason: String| DataFrameError::Invalid { op: what, reason };
        // `self.schema` is already the schema after the pending operations.
        let meta = spec
            .partial(empty.lazy())
            .and_then(|p| spec.combine(&[&p]))
            .and_then(|c| spec.finish(&c))
            .map_err(invalid)?;
        g.insert(
            Key::new(&name, &[0]),
            Task::new(kernels::AGG_FINISH, [Arg::lit(spec), Arg::key(level[0])]),
        );
        Ok(DataFrame {
            layers: stack(&[&self.layers], &name, g),
            name,
            npartitions: 1,
            source: Source::Layer,
            ops: Vec::new(),
            schema: meta.schema().clone(),
            index: None,
        })
    }

    /// Groups by `keys` (then [`GroupBy::agg`]).
    pub fn groupby(&self, keys: &[&str]) -> Result<GroupBy, DataFrameError> {
        self.check_columns(keys.iter().copied())?;
        Ok(GroupBy {
            df: self.clone(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
        })
    }

    /// The number of rows of each distinct value of `column`: the column and `count`, largest
    /// count first (then by value), in one partition.
    pub fn value_counts(&self, column: &str) -> Result<DataFrame, DataFrameError> {
        self.check_columns([column])?;
        self.reduced(
            Spec::Counts {
                col: column.to_string(),
            },
            "value-counts",
        )
    }

    /// The number of distinct values of `column` (nulls count as one value; computed).
    pub fn nunique(
        &self,
        column: &str,
        scheduler: &dyn Scheduler,
    ) -> Result<usize, DataFrameError> {
        Ok(self.value_counts(column)?.compute(scheduler)?.height())
    }

    /// The first row of each distinct combination of `subset` (all columns when `None`), in
    /// one partition, in the order the rows came.
    pub fn drop_duplicates(&self, subset: Option<&[&str]>) -> Result<DataFrame, DataFrameError> {
        if let Some(s) = subset {
            self.check_columns(s.iter().copied())?;
        }
        self.reduced(
            Spec::Distinct {
                subset: subset.map(|s| s.iter().map(|c| c.to_string()).collect()),
            },
            "drop-duplicates",
        )
    }

    /// Count, mean, standard deviation, minimum and maximum of every numeric column: a
    /// `statistic` column and one column per numeric column, in one partition.
    pub fn describe(&self) -> Result<DataFrame, DataFrameError> {
        let cols: Vec<String> = self
            .schema
            .iter()
            .filter(|(_, t)| t.is_primitive_numeric())
            .map(|(n, _)| n.to_string())
            .collect();
        self.reduced(Spec::Describe { cols }, "describe")
    }
}

/// A dataframe grouped by key columns.
#[derive(Debug, Clone)]
pub struct GroupBy {
    df: DataFrame,
    keys: Vec<String>,
}

impl GroupBy {
    /// The statistics `aggs` (column, statistic) of every group: the keys, then a
    /// `{column}_{statistic}` column each, ordered by the keys, in one partition (a tree of
    /// partial results: sums, counts, means with their sums of squared differences, minima,
    /// maxima; variances merged with Chan's formula, so large means keep their digits).
    pub fn agg(&self, aggs: &[(&str, Agg)]) -> Result<DataFrame, DataFrameError> {
        self.df.check_columns(aggs.iter().map(|(c, _)| *c))?;
        self.df.reduced(
            Spec::Grouped {
                keys: self.keys.clone(),
                aggs: aggs.iter().map(|(c, a)| (c.to_string(), *a)).collect(),
            },
            "groupby",
        )
    }

    /// The mean of `column` per group (`{column}_mean`).
    pub fn mean(&self, column: &str) -> Result<DataFrame, DataFrameError> {
        self.agg(&[(column, Agg::Mean)])
    }

    /// The sum of `column` per group (`{column}_sum`).
    pub fn sum(&self, column: &str) -> Result<DataFrame, DataFrameError> {
        self.agg(&[(column, Agg::Sum)])
    }
}
