//! Dataframes from polars frames, CSV files and parquet files.

use std::path::PathBuf;
use std::sync::Arc;

use dask_graph::{Arg, Graph, Key, Task};

use crate::files::PatternError;
use polars::prelude::{DataFrame as PlFrame, Schema};

use super::frame::{self, ColumnType, Frame};
use super::ops::{self, Ops, Scan};
use super::{DataFrame, DataFrameError, Source, fresh_name, kernels, register, stack};

/// The rows of `df` in `npartitions` partitions of nearly equal length.
///
/// ```
/// use dask_collections::dataframe;
/// use polars::prelude::*;
/// let d = dataframe::from_polars(df!("x" => 0..10i64).unwrap(), 3)?;
/// assert_eq!(d.npartitions(), 3);
/// assert_eq!(d.len(&dask_graph::Inline)?, 10);
/// # Ok::<(), dataframe::DataFrameError>(())
/// ```
pub fn from_polars(df: PlFrame, npartitions: usize) -> Result<DataFrame, DataFrameError> {
    register();
    if npartitions == 0 {
        return Err(DataFrameError::NoPartitions {
            what: "from_polars",
        });
    }
    let rows = df.height();
    let n = npartitions.min(rows).max(1);
    let name = fresh_name("from-polars");
    let mut g = Graph::new();
    let mut start = 0usize;
    for i in 0..n {
        let len = rows / n + usize::from(i < rows % n);
        g.insert(
            Key::new(&name, &[i as u32]),
            dask_graph::Value::new(Frame(df.slice(start as i64, len))),
        );
        start += len;
    }
    Ok(DataFrame {
        layers: stack(&[], &name, g),
        name,
        npartitions: n,
        source: Source::Layer,
        ops: Vec::new(),
        schema: df.schema().clone(),
        index: None,
    })
}

fn files(pattern: &str) -> Result<Vec<PathBuf>, DataFrameError> {
    crate::files::expand(pattern).map_err(|e| pattern_error(pattern, e))
}

pub(crate) fn pattern_error(pattern: &str, e: PatternError) -> DataFrameError {
    let bad = |reason: String| DataFrameError::Pattern {
        pattern: pattern.to_string(),
        reason,
    };
    match e {
        PatternError::Malformed(reason) => bad(reason),
        PatternError::Io { path, reason } => DataFrameError::Io { path, reason },
        PatternError::NoFiles => bad("no file matches".into()),
    }
}

fn scanned(name: String, scans: Vec<Scan>, schema: Arc<Schema>) -> DataFrame {
    let mut g = Graph::new();
    for (i, s) in scans.iter().enumerate() {
        g.insert(
            Key::new(&name, &[i as u32]),
            Task::new(
                kernels::PIPELINE,
                [Arg::lit(s.clone()), Arg::lit(Ops::default())],
            ),
        );
    }
    DataFrame {
        layers: stack(&[], &name, g),
        name,
        npartitions: scans.len(),
        source: Source::Scans(Arc::new(scans)),
        ops: Vec::new(),
        schema,
        index: None,
    }
}

/// The CSV files (with a header) `pattern` names (a glob, sorted), one partition each. The
/// column types are inferred from the first file's first rows and every file is parsed with
/// them (a value that does not parse fails the task that reads it, naming the file).
///
/// ```
/// use dask_collections::dataframe;
/// let dir = std::env::temp_dir().join(format!("frame-doc-csv-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// std::fs::write(dir.join("2015-01-01.csv"), "user_id,value\n1,2.5\n2,1.0\n").unwrap();
/// std::fs::write(dir.join("2015-01-02.csv"), "user_id,value\n1,0.5\n").unwrap();
/// let d = dataframe::read_csv(&format!("{}/2015-*-*.csv", dir.display()))?;
/// let m = d.groupby(&["user_id"])?.agg(&[("value", dataframe::Agg::Mean)])?;
/// let got = m.compute(&dask_graph::Inline)?;
/// assert_eq!(got.column("value_mean").unwrap().f64().unwrap().to_vec(), vec![Some(1.5), Some(1.0)]);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), dataframe::DataFrameError>(())
/// ```
pub fn read_csv(pattern: &str) -> Result<DataFrame, DataFrameError> {
    register();
    let paths = files(pattern)?;
    let first = &paths[0];
    let io = |reason: String| DataFrameError::Io {
        path: first.clone(),
        reason,
    };
    let head = polars::prelude::CsvReadOptions::default()
        .with_has_header(true)
        .with_n_rows(Some(1000))
        .try_into_reader_with_file_path(Some(first.clone()))
        .and_then(polars::prelude::SerReader::finish)
        .map_err(|e| io(e.to_string()))?;
    let columns = frame::columns_of(head.schema());
    if let Some((c, _)) = columns.iter().find(|(_, t)| *t == ColumnType::Other) {
        return Err(io(format!(
            "column {c:?} has a type CSV partitions do not carry"
        )));
    }
    let scans = paths
        .iter()
        .map(|p| Scan::Csv {
            path: p.to_string_lossy().into_owned(),
            columns: columns.clone(),
            projection: None,
        })
        .collect();
    Ok(scanned(
        fresh_name("read-csv"),
        scans,
        head.schema().clone(),
    ))
}

/// The parquet files `pattern` names (sorted), one partition each; the schema is the first
/// file's.
pub fn read_parquet(pattern: &str) -> Result<DataFrame, DataFrameError> {
    register();
    let paths = files(pattern)?;
    let first = &paths[0];
    let schema = ops::input(&dask_graph::Value::new(Scan::Parquet {
        path: first.to_string_lossy().into_owned(),
    }))
    .and_then(|mut lf| lf.collect_schema().map_err(|e| e.to_string()))
    .map_err(|reason| DataFrameError::Io {
        path: first.clone(),
        reason,
    })?;
    let scans = paths
        .iter()
        .map(|p| Scan::Parquet {
            path: p.to_string_lossy().into_owned(),
        })
        .collect();
    Ok(scanned(fresh_name("read-parquet"), scans, schema))
}
