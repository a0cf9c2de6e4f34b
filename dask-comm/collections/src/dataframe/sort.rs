//! Sorting by columns: range partitioning on the peer-to-peer shuffle.
//!
//! A sample task per partition takes up to [`SAMPLE`] evenly spaced values of the first
//! sort column (nulls and NaN left out); one boundaries task sorts every sample and picks
//! `n - 1` evenly spaced boundaries; each partition's transfer task sends every row to the
//! output its first column's value falls in (`b[i-1] <= x < b[i]`, outputs in reverse when
//! that column is descending; nulls to the first output, NaN to the last ascending and the
//! first descending, as polars orders them), and each output's unpack task stacks its pieces
//! in input order and sorts them by every sort column, keeping the order of equal rows. Equal
//! values of the first column always land in one output, so the outputs in order are the
//! whole frame sorted, as one stable sort of it would be. The boundaries are computed inside
//! the graph, so building the sort computes nothing.

use std::sync::Arc;

use polars::prelude::{
    DataFrame as PlFrame, DataType, IdxCa, IdxSize, NamedFrom, Series, SortMultipleOptions,
};

use dask_graph::{Arg, Graph, Key, ShuffleId, Task, Value};

use super::frame::{self, Frame};
use super::ops::{self, Ops};
use super::{DataFrame, DataFrameError, fresh_name, kernels, stack};
use crate::layers::{p2p_shuffle, shuffle_id};

/// Most values each partition contributes to the boundaries.
pub const SAMPLE: usize = 256;

/// The name of the boundaries' one column.
pub(crate) const BOUND: &str = "bound";

/// The sort column's values as the sort compares them: integers (but `u64`) and booleans as
/// `i64` (exactly), other numbers as floats, or text.
pub(crate) enum Keys {
    Ints(Vec<Option<i64>>),
    Numbers(Vec<Option<f64>>),
    Text(Vec<Option<String>>),
}

/// Whether values of type `t` are compared as `i64`.
fn exact(t: &DataType) -> bool {
    (t.is_integer() && t != &DataType::UInt64) || t.is_bool()
}

/// The values of a column, as the sort compares them.
pub(crate) fn series_keys(s: &Series) -> Result<Keys, String> {
    if s.dtype() == &DataType::String {
        let ca = s.str().map_err(|e| e.to_string())?;
        return Ok(Keys::Text(
            ca.iter().map(|v| v.map(str::to_string)).collect(),
        ));
    }
    if exact(s.dtype()) {
        let s = s.cast(&DataType::Int64).map_err(|e| e.to_string())?;
        let ca = s.i64().map_err(|e| e.to_string())?;
        return Ok(Keys::Ints(ca.iter().collect()));
    }
    let s = s.cast(&DataType::Float64).map_err(|e| e.to_string())?;
    let ca = s.f64().map_err(|e| e.to_string())?;
    Ok(Keys::Numbers(ca.iter().collect()))
}

fn keys(df: &PlFrame, by: &str) -> Result<Keys, String> {
    series_keys(
        df.column(by)
            .map_err(|e| e.to_string())?
            .as_materialized_series(),
    )
}

/// Whether a column of type `t` can be sorted by.
pub(crate) fn sortable(t: &DataType) -> bool {
    t.is_integer() || t.is_float() || t.is_bool() || t == &DataType::String
}

/// Up to [`SAMPLE`] evenly spaced values of `by` in partition `df` (sorted; no nulls, no NaN),
/// its smallest and largest among them, as a one-column frame.
pub(crate) fn sample(df: &PlFrame, by: &str) -> Result<Frame, String> {
    fn spaced<T: Clone>(v: &[T]) -> Vec<T> {
        let step = v.len().div_ceil(SAMPLE).max(1);
        let mut s: Vec<T> = v.iter().step_by(step).cloned().collect();
        if !v.is_empty() && !(v.len() - 1).is_multiple_of(step) {
            s.extend(v.last().cloned());
        }
        s
    }
    let column = match keys(df, by)? {
        Keys::Ints(v) => {
            let mut v: Vec<i64> = v.into_iter().flatten().collect();
            v.sort_unstable();
            Series::new(BOUND.into(), spaced(&v))
        }
        Keys::Numbers(v) => {
            let mut v: Vec<f64> = v.into_iter().flatten().filter(|x| !x.is_nan()).collect();
            v.sort_by(f64::total_cmp);
            Series::new(BOUND.into(), spaced(&v))
        }
        Keys::Text(v) => {
            let mut v: Vec<String> = v.into_iter().flatten().collect();
            v.sort();
            Series::new(BOUND.into(), spaced(&v))
        }
    };
    PlFrame::new(column.len(), vec![column.into()])
        .map(Frame)
        .map_err(|e| e.to_string())
}

/// `parts - 1` boundaries from every partition's sample: evenly spaced quantiles.
pub(crate) fn boundaries(samples: &[&PlFrame], parts: usize) -> Result<Frame, String> {
    let all = frame::concat(samples)?;
    let sorted = all
        .sort([BOUND], SortMultipleOptions::default())
        .map_err(|e| e.to_string())?;
    let n = sorted.height();
    let picks: Vec<IdxSize> = if n == 0 {
        Vec::new()
    } else {
        (1..parts)
            .map(|i| ((i * n / parts).min(n - 1)) as IdxSize)
            .collect()
    };
    sorted
        .take(&IdxCa::from_vec("rows".into(), picks))
        .map(Frame)
        .map_err(|e| e.to_string())
}

/// A sample task per partition of `d` (materialized) into `g`, keys `(name-sample, i)`: the
/// [`sample`] of column `by`.
pub(crate) fn sample_tasks(d: &DataFrame, by: &str, name: &str, g: &mut Graph) -> Vec<Key> {
    (0..d.npartitions)
        .map(|i| {
            let key = Key::new(&format!("{name}-sample"), &[i as u32]);
            let [p, o] = d.input_args(i);
            g.insert(
                key,
                Task::new(kernels::SORT_SAMPLE, [p, o, Arg::lit(by.to_string())]),
            );
            key
        })
        .collect()
}

/// What a sort's transfer and unpack tasks need to know, as a task argument.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct SortSpec {
    /// The columns; the rows are range-partitioned by the first.
    pub by: Vec<String>,
    /// Whether each column sorts in descending order (as many as `by`).
    pub descending: Vec<bool>,
    /// The shuffle's name.
    pub shuffle: String,
    /// Outputs.
    pub parts: u64,
}

dask_graph::serde_data!(SortSpec);

/// `df` split by `by` at `bounds` into `parts` pieces (more than the boundaries allow are
/// empty: with no sampled value at all, every row but NaN goes to the first). Descending,
/// the pieces are in reverse order but nulls still come first, and NaN (the largest) too.
pub(crate) fn split(
    df: &PlFrame,
    by: &str,
    descending: bool,
    bounds: &PlFrame,
    parts: usize,
) -> Result<Vec<Frame>, String> {
    let b = keys(bounds, BOUND)?;
    let parts = parts.max(bounds.height() + 1);
    // The output of each row in ascending order; None for a null.
    let outputs: Vec<Option<usize>> = match (keys(df, by)?, b) {
        (Keys::Ints(v), Keys::Ints(b)) => {
            let b: Vec<i64> = b.into_iter().flatten().collect();
            v.into_iter()
                .map(|x| x.map(|x| b.partition_point(|&y| y <= x)))
                .collect()
        }
        (Keys::Numbers(v), Keys::Numbers(b)) => {
            let b: Vec<f64> = b.into_iter().flatten().collect();
            v.into_iter()
                .map(|x| {
                    x.map(|x| match x {
                        // Last ascending; the reversal below makes it first descending.
                        x if x.is_nan() => parts - 1,
                        x => b.partition_point(|&y| y <= x),
                    })
                })
                .collect()
        }
        (Keys::Text(v), Keys::Text(b)) => {
            let b: Vec<String> = b.into_iter().flatten().collect();
            v.into_iter()
                .map(|x| x.map(|x| b.partition_point(|y| *y <= x)))
                .collect()
        }
        _ => return Err(format!("the boundaries of {by} are not of its type")),
    };
    let mut rows: Vec<Vec<IdxSize>> = vec![Vec::new(); parts];
    for (i, o) in outputs.into_iter().enumerate() {
        // Nulls first either way; descending, output o of the ascending order is the
        // (parts - 1 - o)-th.
        let o = match o {
            None => 0,
            Some(o) if descending => parts - 1 - o,
            Some(o) => o,
        };
        rows[o].push(i as IdxSize);
    }
    rows.into_iter()
        .map(|r| {
            df.take(&IdxCa::from_vec("rows".into(), r))
                .map(Frame)
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// Output `part` of a sort: its pieces stacked in input order, sorted stably.
pub(crate) fn unpack(spec: &SortSpec, part: u32, inputs: u32) -> Result<Frame, String> {
    let pieces = dask_graph::shuffle::receive(ShuffleId::new(&spec.shuffle), part, inputs)
        .map_err(|e| e.to_string())?;
    let frames = frame::frames_of(&pieces, "shuffle pieces")?;
    frame::concat(&frames)?
        .sort(
            spec.by.iter().map(String::as_str),
            SortMultipleOptions::default()
                .with_order_descending_multi(spec.descending.iter().copied())
                .with_maintain_order(true),
        )
        .map(Frame)
        .map_err(|e| e.to_string())
}

/// The tasks of a range shuffle into `g`: partition `i` of `d` (materialized) split by
/// `by[0]` at `bounds` (a task's or a literal [`Frame`] of boundaries) into `outputs`
/// pieces, sent on the peer-to-peer shuffle; output `j` (key `(name, j)`) its pieces sorted
/// stably by `by`, each column descending where `descending` says.
pub(crate) fn range_shuffle(
    d: &DataFrame,
    by: &[&str],
    descending: &[bool],
    name: &str,
    bounds: Arg,
    outputs: usize,
    g: &mut Graph,
) {
    let n = d.npartitions as u32;
    let spec = SortSpec {
        by: by.iter().map(|c| c.to_string()).collect(),
        descending: descending.to_vec(),
        shuffle: shuffle_id(name).as_str().to_string(),
        parts: outputs as u64,
    };
    p2p_shuffle(
        g,
        name,
        n,
        outputs as u32,
        |i| {
            let [p, o] = d.input_args(i as usize);
            Task::new(
                kernels::SORT_TRANSFER,
                [
                    p,
                    o,
                    bounds.clone(),
                    Arg::lit(spec.clone()),
                    Arg::lit(u64::from(i)),
                ],
            )
        },
        |barrier, j| {
            Task::new(
                kernels::SORT_UNPACK,
                [
                    barrier,
                    Arg::lit(spec.clone()),
                    Arg::lit(u64::from(j)),
                    Arg::lit(u64::from(n)),
                ],
            )
        },
    );
}

/// A transfer: partition `input` (with its operations) split at the boundaries and sent.
pub(crate) fn transfer(
    input: &Value,
    ops: &Ops,
    bounds: &Frame,
    spec: &SortSpec,
    index: u32,
) -> Result<(), String> {
    let (by, shuffle) = (spec.by[0].as_str(), spec.shuffle.as_str());
    let descending = spec.descending[0];
    let pieces = split(
        &ops::run(input, ops)?,
        by,
        descending,
        &bounds.0,
        spec.parts as usize,
    )?
    .into_iter()
    .enumerate()
    .map(|(j, f)| (j as u32, Value::new(f)))
    .collect();
    dask_graph::shuffle::send(ShuffleId::new(shuffle), index, pieces).map_err(|e| e.to_string())
}

impl DataFrame {
    /// The rows sorted by `by` (ascending; nulls first and NaN last, as polars sorts; equal
    /// values in their order), in as many partitions as before: partition `j` holds the
    /// rows between the `j`-th and `j+1`-th boundaries, which are estimated from a sample of
    /// every partition inside the graph. The rows move on the peer-to-peer shuffle.
    ///
    /// ```
    /// use dask_collections::dataframe;
    /// use polars::prelude::*;
    /// let df = df!("x" => [5i64, 3, 9, 1, 7, 2]).unwrap();
    /// let d = dataframe::from_polars(df, 3).unwrap().sort_values("x").unwrap();
    /// let got = d.compute(&dask_graph::Inline).unwrap();
    /// let x: Vec<i64> = got.column("x").unwrap().i64().unwrap().into_no_null_iter().collect();
    /// assert_eq!(x, vec![1, 2, 3, 5, 7, 9]);
    /// ```
    pub fn sort_values(&self, by: &str) -> Result<DataFrame, DataFrameError> {
        self.sort_values_by(&[by], &[false])
    }

    /// The rows sorted by the columns `by` in turn, each descending where `descending` says
    /// (one flag for every column, or one per column), as polars' stable `sort` with
    /// `with_order_descending_multi` orders them: nulls first, NaN the largest value. The
    /// partitions are ranges of the first column (all its equal values in one partition,
    /// so a first column of few values makes as many partitions full, the others empty).
    ///
    /// ```
    /// use dask_collections::dataframe;
    /// use polars::prelude::*;
    /// let df = df!("g" => ["a", "b", "a", "b", "a"], "x" => [1i64, 2, 3, 4, 5]).unwrap();
    /// let d = dataframe::from_polars(df, 2).unwrap();
    /// let got = d.sort_values_by(&["g", "x"], &[false, true]).unwrap()
    ///     .compute(&dask_graph::Inline).unwrap();
    /// let x: Vec<i64> = got.column("x").unwrap().i64().unwrap().into_no_null_iter().collect();
    /// assert_eq!(x, vec![5, 3, 1, 4, 2]);
    /// ```
    pub fn sort_values_by(
        &self,
        by: &[&str],
        descending: &[bool],
    ) -> Result<DataFrame, DataFrameError> {
        let Some(&first) = by.first() else {
            return Err(DataFrameError::Invalid {
                op: "sort_values",
                reason: "no column to sort by".into(),
            });
        };
        let descending: Vec<bool> = match descending.len() {
            1 => vec![descending[0]; by.len()],
            l if l == by.len() => descending.to_vec(),
            l => {
                return Err(DataFrameError::Invalid {
                    op: "sort_values",
                    reason: format!("{l} descending flags for {} columns", by.len()),
                });
            }
        };
        for c in by {
            self.check_sortable(c, "sort_values")?;
        }
        let d = self.materialized();
        let n = d.npartitions;
        let name = fresh_name("sort");
        let mut g = Graph::new();
        let samples = sample_tasks(&d, first, &name, &mut g);
        let bounds = Key::name_only(&format!("{name}-bounds"));
        g.insert(
            bounds,
            Task::new(
                kernels::SORT_BOUNDS,
                [Arg::lit(n as u64)]
                    .into_iter()
                    .chain(samples.into_iter().map(Arg::Key)),
            ),
        );
        range_shuffle(&d, by, &descending, &name, Arg::key(bounds), n, &mut g);
        Ok(DataFrame {
            layers: stack(&[&d.layers], &name, g),
            name,
            npartitions: n,
            source: super::Source::Layer,
            ops: Vec::new(),
            schema: Arc::clone(&self.schema),
            index: None,
        })
    }
}
