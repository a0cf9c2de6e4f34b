//! Row-wise operations (`filter`, `assign`, `select`, `map_partitions`) are not tasks of their
//! own: a dataframe keeps the operations given since its last materialised layer, and the task
//! that reads a partition runs them as one polars query (so a read of a CSV file parses only
//! the columns the query needs and filters as it goes).

use std::sync::Arc;

use dask_graph::Value;
use polars::prelude::{
    self as pl, CsvReadOptions, DataFrame as PlFrame, IntoLazy, LazyFrame, PlRefPath, PolarsResult,
    ScanArgsParquet, SerReader,
};
use serde::{Deserialize, Serialize};

use super::DataFrameError;
use super::expr::Expr;
use super::frame::{Columns, Frame, schema_of};

/// One pending operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Op {
    Filter(Expr),
    Assign(String, Expr),
    Select(Vec<String>),
    Partition(String),
}

/// The operations a task runs, as a task argument.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Ops(pub Vec<Op>);

dask_graph::serde_data!(Ops, nbytes = |o: &Ops| 24 + o.0.len() * 64);

/// A file a partition is read from, as a task argument.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Scan {
    /// A CSV file with a header, parsed with these column types; only the `projection`
    /// columns (all when `None`).
    Csv {
        path: String,
        columns: Columns,
        projection: Option<Vec<String>>,
    },
    /// A parquet file.
    Parquet { path: String },
}

dask_graph::serde_data!(Scan);

type PartFn = Arc<dyn Fn(PlFrame) -> PolarsResult<PlFrame> + Send + Sync>;

/// A partition function as the process's registry holds it.
struct Registered(PartFn);

/// The name a partition function has in the process's one registry: qualified,
/// `dataframe:{name}`, as bag functions are `bag:{name}` (functions of polars frames, not of
/// task values).
fn wire(name: &str) -> String {
    format!("dataframe:{name}")
}

/// Registers a function over whole partitions under `name` (in every process, as every task
/// function), for [`DataFrame::map_partitions`](super::DataFrame::map_partitions).
///
/// # Panics
///
/// When another place in the code registered a partition function of that name (the message
/// names both places). The same place registering again keeps the first.
///
/// ```
/// use dask_collections::dataframe;
/// use polars::prelude::*;
/// dataframe::register_partition("ops-doc-double", |df: DataFrame| {
///     df.lazy().with_column((col("x") * lit(2i64)).alias("x")).collect()
/// });
/// let df = df!("x" => [1i64, 2, 3]).unwrap();
/// let d = dataframe::from_polars(df, 2)?.map_partitions("ops-doc-double")?;
/// let got = d.compute(&dask_graph::Inline)?;
/// assert_eq!(got.column("x").unwrap().i64().unwrap().to_vec(), vec![Some(2), Some(4), Some(6)]);
/// # Ok::<(), dataframe::DataFrameError>(())
/// ```
#[track_caller]
pub fn register_partition<F>(name: &str, f: F)
where
    F: Fn(PlFrame) -> PolarsResult<PlFrame> + Send + Sync + 'static,
{
    tracing::trace!(name, "registered a dataframe partition function");
    if let Err(e) = dask_graph::registry().register_native(&wire(name), Registered(Arc::new(f))) {
        panic!("{e}");
    }
}

pub(crate) fn partition_fn(name: &str) -> Result<PartFn, DataFrameError> {
    dask_graph::registry()
        .native::<Registered>(wire(name).as_str())
        .map(|r| r.0.clone())
        .ok_or_else(|| DataFrameError::UnknownFunction {
            name: name.to_string(),
        })
}

/// The input of a task: a partition, or a file to scan.
pub(crate) fn input(v: &Value) -> Result<LazyFrame, String> {
    if let Some(f) = v.downcast_ref::<Frame>() {
        return Ok(f.0.clone().lazy());
    }
    match v.downcast_ref::<Scan>() {
        // The eager reader: on a whole file it parses faster than the lazy scan (which counts
        // the file's lines first), and reading only the projected columns is the pushdown
        // that matters (a filter runs as the query's first step).
        Some(Scan::Csv {
            path,
            columns,
            projection,
        }) => CsvReadOptions::default()
            .with_has_header(true)
            .with_schema(schema_of(columns))
            .with_columns(
                projection
                    .as_ref()
                    .map(|p| p.iter().map(|c| c.as_str().into()).collect()),
            )
            .try_into_reader_with_file_path(Some(path.into()))
            .and_then(SerReader::finish)
            .map(IntoLazy::lazy)
            .map_err(|e| format!("{path}: {e}")),
        Some(Scan::Parquet { path }) => {
            LazyFrame::scan_parquet(PlRefPath::new(path.as_str()), ScanArgsParquet::default())
                .map_err(|e| format!("{path}: {e}"))
        }
        None => Err(format!(
            "a dataframe partition expected, the task got a {}",
            v.type_info().name()
        )),
    }
}

/// The columns of the input that `ops` and then a consumer needing `need` (every column
/// when `None`) read: what a file scan may project to.
pub(crate) fn needed(ops: &[Op], need: Option<Vec<String>>) -> Option<Vec<String>> {
    let mut need = need?;
    for op in ops.iter().rev() {
        match op {
            Op::Filter(e) => need.extend(e.columns().into_iter().map(String::from)),
            Op::Assign(name, e) => {
                need.retain(|c| c != name);
                need.extend(e.columns().into_iter().map(String::from));
            }
            // A select reads every column it names.
            Op::Select(cols) => need = cols.clone(),
            Op::Partition(_) => return None,
        }
    }
    // Each once (a reader given a column twice fills the second with nulls).
    need.sort_unstable();
    need.dedup();
    Some(need)
}

/// `ops` on top of `lf`.
pub(crate) fn apply(mut lf: LazyFrame, ops: &[Op]) -> Result<LazyFrame, String> {
    for op in ops {
        lf = match op {
            Op::Filter(e) => lf.filter(e.polars()),
            Op::Assign(name, e) => lf.with_column(e.polars().alias(name.as_str())),
            Op::Select(cols) => {
                lf.select(cols.iter().map(|c| pl::col(c.as_str())).collect::<Vec<_>>())
            }
            Op::Partition(f) => {
                let f = partition_fn(f).map_err(|e| e.to_string())?;
                let df = lf.collect().map_err(|e| e.to_string())?;
                f(df).map_err(|e| e.to_string())?.lazy()
            }
        };
    }
    Ok(lf)
}

/// `e` with the file the input `v` is read from, if any, in front.
pub(crate) fn context(v: &Value, e: String) -> String {
    match v.downcast_ref::<Scan>() {
        Some(Scan::Csv { path, .. } | Scan::Parquet { path }) if !e.starts_with(path.as_str()) => {
            format!("{path}: {e}")
        }
        _ => e,
    }
}

/// The partition in `v` with `ops` run.
pub(crate) fn run(v: &Value, ops: &Ops) -> Result<PlFrame, String> {
    apply(input(v)?, &ops.0)?
        .collect()
        .map_err(|e| context(v, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_function_name_is_taken_once() {
        let register = || register_partition("ops-test-same", Ok);
        register();
        register();
        assert!(partition_fn("ops-test-same").is_ok());
        let e = std::panic::catch_unwind(|| register_partition("ops-test-same", Ok)).unwrap_err();
        let text = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains("dataframe:ops-test-same"), "{text}");
        assert!(matches!(
            partition_fn("ops-test-none"),
            Err(DataFrameError::UnknownFunction { .. })
        ));
    }
}
