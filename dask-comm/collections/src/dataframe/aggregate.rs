//! Grouped aggregations as trees of partial results (Dask's `groupby(...).agg(...)` with
//! `split_out=1`): each partition is grouped and reduced to partial columns (sums, counts,
//! means and sums of squared differences from them, minima, maxima), partial frames are
//! stacked and reduced again (means and variances merged with Chan's formula), and the
//! last step turns the partials into the asked-for statistics.

use polars::prelude::{
    self as pl, DataFrame as PlFrame, DataType, IntoLazy, LazyFrame, SortMultipleOptions,
    UniqueKeepStrategy, len,
};
use serde::{Deserialize, Serialize};

/// A statistic of a column per group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Agg {
    /// The sum.
    Sum,
    /// The mean (of the non-null values).
    Mean,
    /// The number of non-null values.
    Count,
    /// The smallest value.
    Min,
    /// The largest value.
    Max,
    /// The sample variance (`ddof = 1`).
    Var,
    /// The sample standard deviation (`ddof = 1`).
    Std,
}

impl Agg {
    /// The statistic's name, as it ends result columns (`value_mean`).
    pub fn name(self) -> &'static str {
        match self {
            Agg::Sum => "sum",
            Agg::Mean => "mean",
            Agg::Count => "count",
            Agg::Min => "min",
            Agg::Max => "max",
            Agg::Var => "var",
            Agg::Std => "std",
        }
    }

    /// The partials this statistic is made from.
    fn partials(self) -> &'static [Partial] {
        match self {
            Agg::Sum => &[Partial::Sum],
            Agg::Count => &[Partial::Count],
            Agg::Mean => &[Partial::FloatSum, Partial::Count],
            Agg::Min => &[Partial::Min],
            Agg::Max => &[Partial::Max],
            Agg::Var | Agg::Std => &[Partial::Count, Partial::Mean, Partial::M2],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Partial {
    Sum,
    /// The sum as a float (a mean's: an integer sum may overflow its type).
    FloatSum,
    /// Non-null values.
    Count,
    /// The mean, and the sum of squared differences from it (`M2`): a variance's partials,
    /// merged with Chan's formula (sums of squares lose every digit for large means).
    Mean,
    M2,
    Min,
    Max,
}

impl Partial {
    fn column(self, col: &str) -> String {
        let s = match self {
            Partial::Sum => "sum",
            Partial::FloatSum => "fsum",
            Partial::Count => "count",
            Partial::Mean => "mean",
            Partial::M2 => "m2",
            Partial::Min => "min",
            Partial::Max => "max",
        };
        format!("{col}\u{1f}{s}")
    }

    /// The partial of one partition.
    fn first(self, col: &str) -> pl::Expr {
        let c = pl::col(col);
        let f = || pl::col(col).cast(DataType::Float64);
        match self {
            Partial::Sum => c.sum(),
            Partial::FloatSum => f().sum(),
            Partial::Count => c.count().cast(DataType::UInt64),
            Partial::Mean => f().mean(),
            Partial::M2 => {
                let d = f() - f().mean();
                (d.clone() * d).sum()
            }
            Partial::Min => c.min(),
            Partial::Max => c.max(),
        }
        .alias(self.column(col))
    }

    /// Partials of several partitions reduced to one (a mean and `M2` with Chan's formula:
    /// `n = Σnᵢ`, `mean = Σnᵢmeanᵢ / n`, `M2 = ΣM2ᵢ + Σnᵢ(meanᵢ − mean)²`).
    fn again(self, col: &str) -> pl::Expr {
        let name = self.column(col);
        let c = pl::col(name.as_str());
        let n = || pl::col(Partial::Count.column(col).as_str()).cast(DataType::Float64);
        let mean = || pl::col(Partial::Mean.column(col).as_str());
        // Parts with no values have a null mean (and a count of 0): sums skip them.
        let pooled = || (n() * mean()).sum() / n().sum();
        match self {
            Partial::Sum | Partial::FloatSum | Partial::Count => c.sum(),
            Partial::Mean => pooled(),
            Partial::M2 => {
                let d = mean() - pooled();
                c.sum() + (n() * d.clone() * d).sum()
            }
            Partial::Min => c.min(),
            Partial::Max => c.max(),
        }
        .alias(name)
    }
}

/// What a grouped aggregation computes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Spec {
    /// `groupby(keys).agg(aggs)`: `keys`, then a `{col}_{agg}` column per statistic.
    Grouped {
        keys: Vec<String>,
        aggs: Vec<(String, Agg)>,
    },
    /// `value_counts(col)`: the column and `count`, largest first.
    Counts { col: String },
    /// `describe()`: a `statistic` column (count, mean, std, min, max) and one per column.
    Describe { cols: Vec<String> },
    /// `drop_duplicates(subset)`: the first row of each distinct subset.
    Distinct { subset: Option<Vec<String>> },
}

dask_graph::serde_data!(Spec);

const COUNT: &str = "count";

impl Spec {
    /// The input columns the aggregation reads (`None`: every column).
    pub(crate) fn columns(&self) -> Option<Vec<String>> {
        match self {
            Spec::Grouped { keys, aggs } => Some(
                keys.iter()
                    .cloned()
                    .chain(aggs.iter().map(|(c, _)| c.clone()))
                    .collect(),
            ),
            Spec::Counts { col } => Some(vec![col.clone()]),
            Spec::Describe { cols } => Some(cols.clone()),
            Spec::Distinct { .. } => None,
        }
    }

    fn keys(&self) -> Vec<String> {
        match self {
            Spec::Grouped { keys, .. } => keys.clone(),
            Spec::Counts { col } => vec![col.clone()],
            Spec::Describe { .. } | Spec::Distinct { .. } => Vec::new(),
        }
    }

    /// Every partial, each once, with its column.
    fn partials(&self) -> Vec<(String, Partial)> {
        let aggs: Vec<(String, Agg)> = match self {
            Spec::Grouped { aggs, .. } => aggs.clone(),
            Spec::Describe { cols } => cols
                .iter()
                .flat_map(|c| [Agg::Mean, Agg::Std, Agg::Min, Agg::Max].map(|a| (c.clone(), a)))
                .collect(),
            Spec::Counts { .. } | Spec::Distinct { .. } => Vec::new(),
        };
        let mut out: Vec<(String, Partial)> = Vec::new();
        for (c, a) in &aggs {
            for p in a.partials() {
                if !out.iter().any(|(oc, op)| oc == c && op == p) {
                    out.push((c.clone(), *p));
                }
            }
        }
        out
    }

    fn reduce(&self, lf: LazyFrame, first: bool) -> LazyFrame {
        if let Spec::Distinct { subset } = self {
            let subset = subset
                .as_ref()
                .map(|s| s.iter().map(|c| pl::col(c.as_str())).collect());
            return lf.unique_stable_generic(subset, UniqueKeepStrategy::First);
        }
        let mut exprs: Vec<pl::Expr> = self
            .partials()
            .into_iter()
            .map(|(c, p)| if first { p.first(&c) } else { p.again(&c) })
            .collect();
        if matches!(self, Spec::Counts { .. }) {
            exprs.push(if first {
                len().cast(DataType::UInt64).alias(COUNT)
            } else {
                pl::col(COUNT).sum().alias(COUNT)
            });
        }
        let keys = self.keys();
        if keys.is_empty() {
            lf.select(exprs)
        } else {
            let keys: Vec<pl::Expr> = keys.iter().map(|k| pl::col(k.as_str())).collect();
            lf.group_by(keys).agg(exprs)
        }
    }

    /// The partial result of one partition.
    pub(crate) fn partial(&self, lf: LazyFrame) -> Result<PlFrame, String> {
        self.reduce(lf, true).collect().map_err(|e| e.to_string())
    }

    /// Several partial results as one.
    pub(crate) fn combine(&self, parts: &[&PlFrame]) -> Result<PlFrame, String> {
        self.reduce(super::frame::concat(parts)?.lazy(), false)
            .collect()
            .map_err(|e| e.to_string())
    }

    /// The statistics from the combined partials, ordered by the keys (counts: largest first).
    pub(crate) fn finish(&self, partials: &PlFrame) -> Result<PlFrame, String> {
        let lf = partials.clone().lazy();
        let stat = |c: &str, a: Agg| -> pl::Expr {
            let p = |p: Partial| pl::col(p.column(c).as_str());
            let f = |p: Partial| pl::col(p.column(c).as_str()).cast(DataType::Float64);
            match a {
                Agg::Sum => p(Partial::Sum),
                Agg::Count => p(Partial::Count),
                Agg::Min => p(Partial::Min),
                Agg::Max => p(Partial::Max),
                Agg::Mean => f(Partial::FloatSum) / f(Partial::Count),
                Agg::Var | Agg::Std => {
                    let var = f(Partial::M2) / (f(Partial::Count) - pl::lit(1.0));
                    if a == Agg::Std { var.sqrt() } else { var }
                }
            }
        };
        let out = match self {
            Spec::Distinct { .. } => return Ok(partials.clone()),
            Spec::Grouped { keys, aggs } => {
                let mut exprs: Vec<pl::Expr> = keys.iter().map(|k| pl::col(k.as_str())).collect();
                exprs.extend(
                    aggs.iter()
                        .map(|(c, a)| stat(c, *a).alias(format!("{c}_{}", a.name()))),
                );
                let by: Vec<&str> = keys.iter().map(String::as_str).collect();
                lf.select(exprs)
                    .sort(by, SortMultipleOptions::default().with_nulls_last(true))
            }
            Spec::Counts { col } => lf.sort(
                [COUNT, col.as_str()],
                SortMultipleOptions::default()
                    .with_order_descending_multi([true, false])
                    .with_nulls_last(true),
            ),
            Spec::Describe { cols } => {
                // One row per statistic, one column per described column (as floats).
                let rows = [
                    (COUNT, None),
                    ("mean", Some(Agg::Mean)),
                    ("std", Some(Agg::Std)),
                    ("min", Some(Agg::Min)),
                    ("max", Some(Agg::Max)),
                ];
                let mut frames = Vec::new();
                for (label, a) in rows {
                    let mut exprs = vec![pl::lit(label).alias("statistic")];
                    for c in cols {
                        let e = match a {
                            None => pl::col(Partial::Count.column(c).as_str()),
                            Some(a) => stat(c, a),
                        };
                        exprs.push(e.cast(DataType::Float64).alias(c.as_str()));
                    }
                    frames.push(lf.clone().select(exprs));
                }
                pl::concat(frames, pl::UnionArgs::default()).map_err(|e| e.to_string())?
            }
        };
        out.collect().map_err(|e| e.to_string())
    }
}
