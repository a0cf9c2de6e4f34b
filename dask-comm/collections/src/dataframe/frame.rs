//! [`Frame`]: a polars `DataFrame` as a task value, carried between processes as an Arrow IPC
//! stream in one frame; and the column types a dataframe's schema is described with.

use std::io::Cursor;
use std::sync::Arc;

use bytes::Bytes;
use dask_graph::{DataError, Encoded};
use polars::prelude::{
    DataFrame as PlFrame, DataType, IpcStreamReader, IpcStreamWriter, Schema, SerReader, SerWriter,
};
use serde::{Deserialize, Serialize};

/// One partition: a polars data frame.
#[derive(Debug, Clone)]
pub struct Frame(pub PlFrame);

impl dask_graph::Data for Frame {
    fn nbytes(&self) -> usize {
        self.0.estimated_size()
    }

    fn encode(&self) -> Result<Encoded, DataError> {
        let mut buf = Vec::with_capacity(self.0.estimated_size() + 1024);
        let mut df = self.0.clone();
        IpcStreamWriter::new(&mut buf)
            .finish(&mut df)
            .map_err(|e| DataError::Encode {
                type_name: "Frame",
                reason: e.to_string(),
            })?;
        Ok(Encoded {
            header: Vec::new(),
            frames: vec![dask_graph::Frame::Host(Bytes::from(buf))],
        })
    }

    fn decode(_header: &[u8], frames: Vec<dask_graph::Frame>) -> Result<Self, DataError> {
        let err = |reason: String| DataError::Decode {
            type_name: "Frame".into(),
            reason,
        };
        let bytes = match <[dask_graph::Frame; 1]>::try_from(frames) {
            Ok([dask_graph::Frame::Host(b)]) => b,
            #[allow(unreachable_patterns)] // a device frame, with the `cuda` feature
            Ok(_) => return Err(err("a device frame".into())),
            Err(f) => return Err(err(format!("{} frames, expected 1", f.len()))),
        };
        IpcStreamReader::new(Cursor::new(bytes))
            .finish()
            .map(Frame)
            .map_err(|e| err(e.to_string()))
    }
}

/// A column's type, as a dataframe's schema records it (the types CSV and parquet files
/// bring; anything else is `Other`, kept as polars gives it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ColumnType {
    /// Booleans.
    Bool,
    /// 32-bit integers.
    Int32,
    /// 64-bit integers.
    Int64,
    /// 32-bit unsigned integers.
    UInt32,
    /// 64-bit unsigned integers.
    UInt64,
    /// 32-bit floats.
    Float32,
    /// 64-bit floats.
    Float64,
    /// UTF-8 strings.
    String,
    /// Another polars type.
    Other,
}

impl ColumnType {
    /// The type of a polars column.
    pub fn of(t: &DataType) -> ColumnType {
        match t {
            DataType::Boolean => ColumnType::Bool,
            DataType::Int32 => ColumnType::Int32,
            DataType::Int64 => ColumnType::Int64,
            DataType::UInt32 => ColumnType::UInt32,
            DataType::UInt64 => ColumnType::UInt64,
            DataType::Float32 => ColumnType::Float32,
            DataType::Float64 => ColumnType::Float64,
            DataType::String => ColumnType::String,
            _ => ColumnType::Other,
        }
    }

    /// The polars type (`None` for `Other`).
    pub fn polars(self) -> Option<DataType> {
        Some(match self {
            ColumnType::Bool => DataType::Boolean,
            ColumnType::Int32 => DataType::Int32,
            ColumnType::Int64 => DataType::Int64,
            ColumnType::UInt32 => DataType::UInt32,
            ColumnType::UInt64 => DataType::UInt64,
            ColumnType::Float32 => DataType::Float32,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::String => DataType::String,
            ColumnType::Other => return None,
        })
    }

    /// Whether the type is a number.
    pub fn is_numeric(self) -> bool {
        !matches!(
            self,
            ColumnType::Bool | ColumnType::String | ColumnType::Other
        )
    }
}

/// The columns of a dataframe, in order.
pub type Columns = Vec<(String, ColumnType)>;

/// The columns of a polars frame.
pub(crate) fn columns_of(schema: &Schema) -> Columns {
    schema
        .iter()
        .map(|(n, t)| (n.to_string(), ColumnType::of(t)))
        .collect()
}

/// A polars schema from columns (`None` when a type is `Other`).
pub(crate) fn schema_of(cols: &Columns) -> Option<Arc<Schema>> {
    let mut s = Schema::with_capacity(cols.len());
    for (n, t) in cols {
        s.insert(n.as_str().into(), t.polars()?);
    }
    Some(Arc::new(s))
}

/// Frames one after another, in order (an empty list is an error: every caller has one frame
/// per input at least).
/// The polars frames inside `values` (each a [`Frame`]); `what` names them in the error.
pub(crate) fn frames_of<'a>(
    values: &'a [dask_graph::Value],
    what: &str,
) -> Result<Vec<&'a PlFrame>, String> {
    values
        .iter()
        .map(|v| {
            v.downcast_ref::<Frame>()
                .map(|f| &f.0)
                .ok_or_else(|| format!("{what}: a frame expected"))
        })
        .collect()
}

pub(crate) fn concat(frames: &[&PlFrame]) -> Result<PlFrame, String> {
    let (first, rest) = frames.split_first().ok_or("no frames to stack")?;
    let mut all = (*first).clone();
    for f in rest {
        all.vstack_mut(f).map_err(|e| e.to_string())?;
    }
    Ok(all)
}
