//! An index: a column the rows are sorted by across partitions, with the partitions'
//! divisions when they are known (Dask's `set_index` and `divisions`).
//!
//! polars frames have no index, so the index is a column like any other that the partitions
//! are range-partitioned and sorted by. With `n` partitions, the divisions are `n + 1`
//! values `d`: partition `i < n - 1` holds the rows whose index is in `[d[i], d[i+1])`, the
//! last one those in `[d[n-1], d[n]]`. Nulls are in the first partition and NaN in the last
//! (where polars sorts them); the divisions describe the other values. Knowing them, `loc`
//! reads only the partitions a range touches, and a merge on the index joins partition by
//! partition (shuffling only a side that is not indexed the same way).

use std::cmp::Ordering;

use polars::prelude::{DataFrame as PlFrame, IdxCa, IdxSize, Series, SortMultipleOptions};

use dask_graph::{Arg, Graph, Key, Scheduler, Task};

use super::expr::{Lit, col, lit};
use super::frame::{self, Frame};
use super::merge::JoinSpec;
use super::ops::Op;
use super::sort::{self, Keys, series_keys};
use super::{DataFrame, DataFrameError, Source, fresh_name, graph_for, kernels, stack};

/// A dataframe's index: its column, and the divisions when known.
#[derive(Debug, Clone)]
pub(crate) struct Index {
    /// The column.
    pub column: String,
    /// `npartitions + 1` values of the column's type, when known.
    pub divisions: Option<Series>,
}

impl Index {
    /// Whether the index survives `op` (row-wise operations keep rows in their partitions).
    pub(crate) fn kept_by(&self, op: &Op) -> bool {
        match op {
            Op::Filter(_) => true,
            Op::Assign(name, _) => name != &self.column,
            Op::Select(cols) => cols.contains(&self.column),
            Op::Partition(_) => false,
        }
    }
}

/// The positions, in sorted values `v`, of the divisions for at most `parts` partitions: the
/// first, evenly spaced ones each larger than the one before, and the last.
fn picks<T: PartialOrd>(v: &[T], parts: usize) -> Vec<IdxSize> {
    let mut at = vec![0usize];
    for i in 1..parts {
        let p = i * v.len() / parts;
        if v[p] > v[*at.last().expect("not empty")] {
            at.push(p);
        }
    }
    at.push(v.len() - 1);
    at.into_iter().map(|p| p as IdxSize).collect()
}

/// The divisions for at most `parts` partitions from every partition's sample (which holds
/// its smallest and largest value), or `None` when no partition has a value.
fn divisions(samples: &[&PlFrame], parts: usize) -> Result<Option<Series>, String> {
    let all = frame::concat(samples)?;
    let by = all.get_column_names()[0].to_string();
    let sorted = all
        .sort([by.as_str()], SortMultipleOptions::default())
        .map_err(|e| e.to_string())?;
    if sorted.height() == 0 {
        return Ok(None);
    }
    let s = sorted
        .column(&by)
        .map_err(|e| e.to_string())?
        .as_materialized_series()
        .clone();
    let at = match series_keys(&s)? {
        Keys::Ints(v) => picks(&v, parts),
        Keys::Numbers(v) => picks(&v, parts),
        Keys::Text(v) => picks(&v, parts),
    };
    s.take(&IdxCa::from_vec("rows".into(), at))
        .map(Some)
        .map_err(|e| e.to_string())
}

/// A value compared with divisions.
#[derive(Debug, Clone, PartialEq)]
enum Point {
    Int(i64),
    Float(f64),
    Text(String),
}

impl PartialOrd for Point {
    fn partial_cmp(&self, other: &Point) -> Option<Ordering> {
        match (self, other) {
            (Point::Int(a), Point::Int(b)) => a.partial_cmp(b),
            (Point::Int(a), Point::Float(b)) => (*a as f64).partial_cmp(b),
            (Point::Float(a), Point::Int(b)) => a.partial_cmp(&(*b as f64)),
            (Point::Float(a), Point::Float(b)) => a.partial_cmp(b),
            (Point::Text(a), Point::Text(b)) => a.partial_cmp(b),
            _ => None,
        }
    }
}

impl From<&Lit> for Point {
    fn from(l: &Lit) -> Point {
        match l {
            Lit::Bool(b) => Point::Int(i64::from(*b)),
            Lit::Int(i) => Point::Int(*i),
            Lit::Float(f) => Point::Float(*f),
            Lit::Str(s) => Point::Text(s.clone()),
        }
    }
}

fn points(divisions: &Series) -> Result<Vec<Point>, String> {
    Ok(match series_keys(divisions)? {
        Keys::Ints(v) => v.into_iter().flatten().map(Point::Int).collect(),
        Keys::Numbers(v) => v.into_iter().flatten().map(Point::Float).collect(),
        Keys::Text(v) => v.into_iter().flatten().map(Point::Text).collect(),
    })
}

/// The partitions `[first, last]` that may hold index values in `[lo, hi]` (`None`: none).
fn touched(d: &[Point], lo: &Point, hi: &Point) -> Result<Option<(usize, usize)>, String> {
    let n = d.len() - 1;
    let le = |a: &Point, b: &Point| -> Result<bool, String> {
        a.partial_cmp(b)
            .map(|o| o != Ordering::Greater)
            .ok_or_else(|| format!("{a:?} and {b:?} cannot be compared"))
    };
    if !le(lo, hi)? {
        return Ok(None);
    }
    let mut found: Option<(usize, usize)> = None;
    for i in 0..n {
        // Partition i holds [d[i], d[i+1]) (the last one [d[n-1], d[n]]).
        let below_end = if i == n - 1 {
            le(lo, &d[n])?
        } else {
            !le(&d[i + 1], lo)?
        };
        if le(&d[i], hi)? && below_end {
            found = Some(found.map_or((i, i), |(f, _)| (f, i)));
        }
    }
    Ok(found)
}

impl DataFrame {
    /// The index column, when the dataframe has one ([`set_index`](Self::set_index)).
    pub fn index(&self) -> Option<&str> {
        self.index.as_ref().map(|i| i.column.as_str())
    }

    /// The divisions, when known: `npartitions + 1` values of the index column's type;
    /// partition `i` holds the rows whose index is at least value `i` and below value `i + 1`
    /// (at most that, for the last partition). Nulls are in the first partition and NaN in
    /// the last.
    pub fn divisions(&self) -> Option<&Series> {
        self.index.as_ref().and_then(|i| i.divisions.as_ref())
    }

    /// The rows sorted by `column`, which becomes the index, in at most as many partitions
    /// as before, with their divisions (Dask's `set_index`). The divisions are computed
    /// now, on `scheduler`, from a sample of every partition (so the partitions' inputs are
    /// read once for the sample and again when the result is computed); equal values never
    /// straddle two partitions, so with few distinct values there are fewer partitions. The
    /// rows move on the peer-to-peer shuffle. polars frames have no index: the column stays
    /// a column.
    ///
    /// ```
    /// use dask_collections::dataframe;
    /// use polars::prelude::*;
    /// let df = df!("x" => [50i64, 30, 90, 10, 70, 20], "y" => [1, 2, 3, 4, 5, 6]).unwrap();
    /// let d = dataframe::from_polars(df, 3)?.set_index("x", &dask_graph::Inline)?;
    /// assert_eq!(d.index(), Some("x"));
    /// let divisions = d.divisions().unwrap();
    /// assert_eq!(divisions.len(), d.npartitions() + 1);
    /// assert_eq!(divisions.i64().unwrap().get(0), Some(10));
    /// assert_eq!(divisions.i64().unwrap().get(d.npartitions()), Some(90));
    /// // `loc` reads only the partitions the range touches.
    /// let some = d.loc(25i64, 60i64)?.compute(&dask_graph::Inline)?;
    /// assert_eq!(some.column("y").unwrap().i32().unwrap().to_vec(), vec![Some(2), Some(1)]);
    /// # Ok::<(), dataframe::DataFrameError>(())
    /// ```
    pub fn set_index(
        &self,
        column: &str,
        scheduler: &dyn Scheduler,
    ) -> Result<DataFrame, DataFrameError> {
        self.check_sortable(column, "set_index")?;
        let d = self.materialized();
        let n = d.npartitions;
        let name = fresh_name("set-index");
        let mut g = Graph::new();
        let samples = sort::sample_tasks(&d, column, &name, &mut g);
        let layers = stack(&[&d.layers], &name, g);
        let values = scheduler.get(graph_for(&layers, &samples), &samples)?;
        let frames =
            frame::frames_of(&values, "samples").map_err(|reason| DataFrameError::Invalid {
                op: "set_index",
                reason,
            })?;
        let invalid = |reason: String| DataFrameError::Invalid {
            op: "set_index",
            reason,
        };
        let found = divisions(&frames, n).map_err(invalid)?;
        let parts = found.as_ref().map_or(1, |s| s.len() - 1);
        let bounds = match &found {
            Some(s) => s.slice(1, parts - 1),
            None => Series::new_empty(
                sort::BOUND.into(),
                self.schema.get(column).expect("checked"),
            ),
        };
        let bounds = PlFrame::new(
            bounds.len(),
            vec![bounds.with_name(sort::BOUND.into()).into()],
        )
        .map_err(|e| invalid(e.to_string()))?;
        let name = fresh_name("indexed");
        let mut g = Graph::new();
        sort::range_shuffle(
            &d,
            &[column],
            &[false],
            &name,
            Arg::lit(Frame(bounds)),
            parts,
            &mut g,
        );
        let t = self.schema.get(column).expect("checked");
        // In the column's type where every value fits it exactly (a `u64` past 2^53 went
        // through a float: then the floats).
        let divisions = found.map(|s| {
            s.strict_cast(t)
                .ok()
                .filter(|c| c.null_count() == 0)
                .unwrap_or(s)
                .with_name(column.into())
        });
        Ok(DataFrame {
            layers: stack(&[&d.layers], &name, g),
            name,
            npartitions: parts,
            source: Source::Layer,
            ops: Vec::new(),
            schema: self.schema.clone(),
            index: Some(Index {
                column: column.to_string(),
                divisions,
            }),
        })
    }

    /// The rows whose index is at least `lo` and at most `hi` (Dask's `df.loc[lo:hi]`): with
    /// known divisions only the partitions the range touches are read (at least one), and
    /// the result keeps their divisions.
    pub fn loc(&self, lo: impl Into<Lit>, hi: impl Into<Lit>) -> Result<DataFrame, DataFrameError> {
        let index = self
            .index
            .clone()
            .ok_or(DataFrameError::NoIndex { op: "loc" })?;
        let (lo, hi) = (lo.into(), hi.into());
        let c = index.column.as_str();
        let filtered = self.with_op(
            Op::Filter(col(c).ge(lit(lo.clone())).and(col(c).le(lit(hi.clone())))),
            "loc",
        )?;
        let Some(divisions) = index
            .divisions
            .as_ref()
            .filter(|d| d.len() == self.npartitions + 1 && d.null_count() == 0)
        else {
            return Ok(filtered);
        };
        let invalid = |reason: String| DataFrameError::Invalid { op: "loc", reason };
        let d = points(divisions).map_err(invalid)?;
        let (first, last) = touched(&d, &Point::from(&lo), &Point::from(&hi))
            .map_err(invalid)?
            .unwrap_or((0, 0));
        let name = fresh_name("loc");
        let mut g = Graph::new();
        for (j, i) in (first..=last).enumerate() {
            let [p, o] = filtered.input_args(i);
            g.insert(
                Key::new(&name, &[j as u32]),
                Task::new(kernels::PIPELINE, [p, o]),
            );
        }
        Ok(DataFrame {
            layers: stack(&[&filtered.layers], &name, g),
            name,
            npartitions: last - first + 1,
            source: Source::Layer,
            ops: Vec::new(),
            schema: filtered.schema.clone(),
            index: Some(Index {
                column: index.column.clone(),
                divisions: Some(divisions.slice(first as i64, last - first + 2)),
            }),
        })
    }

    pub(crate) fn check_sortable(
        &self,
        column: &str,
        op: &'static str,
    ) -> Result<(), DataFrameError> {
        self.check_columns([column])?;
        let t = self.schema.get(column).expect("checked");
        if !sort::sortable(t) {
            return Err(DataFrameError::Invalid {
                op,
                reason: format!("{column} is of type {t}, not a number, boolean or string"),
            });
        }
        Ok(())
    }

    /// The join of `self` and `other` on their index `on`, partition by partition, when
    /// either has known divisions on it: a side indexed the same way is used as it is, any
    /// other side is range-partitioned to those divisions on the peer-to-peer shuffle.
    /// `None` when neither side is indexed by `on` with known divisions.
    pub(crate) fn aligned_merge(
        &self,
        other: &DataFrame,
        spec: &JoinSpec,
        schema: polars::prelude::SchemaRef,
    ) -> Result<Option<DataFrame>, DataFrameError> {
        let [on] = spec.on.as_slice() else {
            return Ok(None);
        };
        let known = |d: &DataFrame| {
            d.index
                .as_ref()
                .filter(|i| &i.column == on)
                .and_then(|i| i.divisions.clone())
        };
        let (ld, rd) = (known(self), known(other));
        let (divisions, keys_within, moved) = match (&ld, &rd) {
            (Some(l), Some(r)) if l.equals(r) => (l.clone(), true, None),
            // The result's keys are the indexed side's only where the other side's rows
            // cannot add keys outside its divisions.
            (Some(l), _) => (l.clone(), spec.how != super::How::Outer, Some(other)),
            (None, Some(r)) => (r.clone(), spec.how == super::How::Inner, Some(self)),
            (None, None) => return Ok(None),
        };
        if divisions.len() < 2 || divisions.null_count() > 0 {
            return Ok(None);
        }
        let parts = divisions.len() - 1;
        // A side moved into far fewer partitions than it has would crowd them: hash both.
        if moved.is_some_and(|m| parts * 2 < m.npartitions) {
            return Ok(None);
        }
        let name = fresh_name("merge-aligned");
        let mut g = Graph::new();
        let mut inputs: Vec<(DataFrame, bool)> = Vec::with_capacity(2);
        for (side, d, own) in [("left", self, &ld), ("right", other, &rd)] {
            if own.as_ref().is_some_and(|o| o.equals(&divisions)) {
                inputs.push((d.clone(), false));
                continue;
            }
            let m = d.materialized();
            let part_name = format!("{name}-{side}");
            // Divisions that do not fit this side's type exactly: the hash join instead.
            let Ok(bounds) =
                divisions.strict_cast(m.schema.get(on.as_str()).expect("checked by merge"))
            else {
                return Ok(None);
            };
            if bounds.null_count() > 0 {
                return Ok(None);
            }
            let bounds = bounds.slice(1, parts - 1).with_name(sort::BOUND.into());
            let bounds = PlFrame::new(bounds.len(), vec![bounds.into()]).map_err(|e| {
                DataFrameError::Invalid {
                    op: "merge",
                    reason: e.to_string(),
                }
            })?;
            sort::range_shuffle(
                &m,
                &[on],
                &[false],
                &part_name,
                Arg::lit(Frame(bounds)),
                parts,
                &mut g,
            );
            inputs.push((
                DataFrame {
                    name: part_name,
                    npartitions: parts,
                    source: Source::Layer,
                    ops: Vec::new(),
                    schema: m.schema.clone(),
                    index: None,
                    layers: m.layers.clone(),
                },
                true,
            ));
        }
        let [(l, _), (r, _)] = <[(DataFrame, bool); 2]>::try_from(inputs).expect("two sides");
        for i in 0..parts {
            let [lp, lo] = l.input_args(i);
            let [rp, ro] = r.input_args(i);
            g.insert(
                Key::new(&name, &[i as u32]),
                Task::new(
                    kernels::JOIN_BROADCAST,
                    [lp, lo, rp, ro, Arg::lit(spec.clone())],
                ),
            );
        }
        Ok(Some(DataFrame {
            layers: stack(&[&l.layers, &r.layers], &name, g),
            name,
            npartitions: parts,
            source: Source::Layer,
            ops: Vec::new(),
            schema,
            index: Some(Index {
                column: on.clone(),
                divisions: keys_within.then_some(divisions),
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_never_split_equal_values() {
        assert_eq!(picks(&[1, 2, 3, 4, 5, 6], 3), vec![0, 2, 4, 5]);
        assert_eq!(picks(&[3, 3, 3], 3), vec![0, 2]);
        assert_eq!(picks(&[1, 5, 5], 3), vec![0, 1, 2]);
        assert_eq!(picks(&[7], 4), vec![0, 0]);
    }

    #[test]
    fn touched_partitions() {
        let d: Vec<Point> = [0, 10, 20, 30].into_iter().map(Point::Int).collect();
        let t = |lo: i64, hi: i64| touched(&d, &Point::Int(lo), &Point::Int(hi)).unwrap();
        assert_eq!(t(0, 30), Some((0, 2)));
        assert_eq!(t(10, 19), Some((1, 1)));
        assert_eq!(t(9, 10), Some((0, 1)));
        assert_eq!(t(30, 40), Some((2, 2)));
        assert_eq!(t(31, 40), None);
        assert_eq!(t(-5, -1), None);
        assert_eq!(t(5, 2), None);
        assert_eq!(
            touched(&d, &Point::Float(9.5), &Point::Float(9.9)).unwrap(),
            Some((0, 0))
        );
        assert!(touched(&d, &Point::Text("a".into()), &Point::Int(1)).is_err());
    }
}
