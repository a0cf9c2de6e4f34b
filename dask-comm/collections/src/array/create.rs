//! Arrays from nothing, or from an ndarray: `zeros`, `ones`, `full`, `arange`, `from_array`.

use dask_graph::{Arg, Graph, Task, Value};
use ndarray::{ArrayD, Slice};

use super::{
    block_indices, fresh_name, kernels, normalize, Array, ArrayError, ChunkElem, ChunkSpec, DType,
};

fn check_rank(ndim: usize) -> Result<(), ArrayError> {
    if ndim > dask_graph::MAX_INDICES {
        return Err(ArrayError::TooManyAxes {
            ndim,
            max: dask_graph::MAX_INDICES,
        });
    }
    Ok(())
}

/// An array of `shape` with every element `value` (cast to `dtype`), in blocks of `chunks`.
///
/// ```
/// use dask_collections::array::{full, DType};
/// let a = full(&[5, 4], 2, DType::I32, 7.0)?;
/// assert_eq!(a.chunks(), &[vec![2, 2, 1], vec![2, 2]]);
/// # Ok::<(), dask_collections::array::ArrayError>(())
/// ```
pub fn full(
    shape: &[usize],
    chunks: impl Into<ChunkSpec>,
    dtype: DType,
    value: f64,
) -> Result<Array, ArrayError> {
    kernels::register();
    check_rank(shape.len())?;
    let chunks = normalize(&chunks.into(), shape, dtype)?;
    let name = fresh_name("full");
    let mut layer = Graph::new();
    let grid: Vec<usize> = chunks.iter().map(Vec::len).collect();
    for idx in block_indices(&grid) {
        let bshape: Vec<u64> = idx.iter().zip(&chunks).map(|(&i, c)| c[i] as u64).collect();
        layer.insert(
            key(&name, &idx),
            Task::new(
                kernels::FULL,
                [Arg::lit(bshape), Arg::lit(dtype), Arg::lit(value)],
            ),
        );
    }
    Ok(Array::from_layer(
        name,
        shape.to_vec(),
        chunks,
        dtype,
        layer,
        &[],
    ))
}

/// Zeros (see [`full`]).
pub fn zeros(
    shape: &[usize],
    chunks: impl Into<ChunkSpec>,
    dtype: DType,
) -> Result<Array, ArrayError> {
    full(shape, chunks, dtype, 0.0)
}

/// Ones (see [`full`]).
pub fn ones(
    shape: &[usize],
    chunks: impl Into<ChunkSpec>,
    dtype: DType,
) -> Result<Array, ArrayError> {
    full(shape, chunks, dtype, 1.0)
}

/// `start, start + step, ...` below `stop` (above it for a negative step), as NumPy's
/// `arange`, in blocks of `chunks`.
///
/// ```
/// use dask_collections::array::{arange, DType};
/// let a = arange(0.0, 10.0, 3.0, 2, DType::I64)?;
/// assert_eq!((a.shape(), a.chunks()), (&[4][..], &[vec![2, 2]][..]));
/// # Ok::<(), dask_collections::array::ArrayError>(())
/// ```
pub fn arange(
    start: f64,
    stop: f64,
    step: f64,
    chunks: impl Into<ChunkSpec>,
    dtype: DType,
) -> Result<Array, ArrayError> {
    kernels::register();
    if step == 0.0 || !step.is_finite() || !start.is_finite() || !stop.is_finite() {
        return Err(ArrayError::DType {
            op: "arange with a zero or non-finite step or bound",
            dtype: dtype.name(),
        });
    }
    let n = ((stop - start) / step).ceil().max(0.0) as usize;
    let chunks = normalize(&chunks.into(), &[n], dtype)?;
    let name = fresh_name("arange");
    let mut layer = Graph::new();
    let mut at = 0usize;
    for (i, &len) in chunks[0].iter().enumerate() {
        layer.insert(
            key(&name, &[i]),
            Task::new(
                kernels::ARANGE,
                [
                    Arg::lit(start + at as f64 * step),
                    Arg::lit(step),
                    Arg::lit(len as u64),
                    Arg::lit(dtype),
                ],
            ),
        );
        at += len;
    }
    Ok(Array::from_layer(name, vec![n], chunks, dtype, layer, &[]))
}

/// An array holding `a`'s elements, cut in blocks of `chunks` (each block a literal value in
/// the graph, as Dask's `from_array` with an in-memory array).
///
/// ```
/// use dask_collections::array::from_array;
/// use dask_graph::Sync;
/// let a = ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(&[4, 3]), |i| (i[0] * 3 + i[1]) as f64);
/// let x = from_array(&a, 2)?;
/// assert_eq!(x.numblocks(), vec![2, 2]);
/// assert_eq!(x.compute(&Sync)?.to_f64(), a);
/// # Ok::<(), dask_collections::array::ArrayError>(())
/// ```
pub fn from_array<T: ChunkElem>(
    a: &ArrayD<T>,
    chunks: impl Into<ChunkSpec>,
) -> Result<Array, ArrayError> {
    kernels::register();
    check_rank(a.ndim())?;
    let chunks = normalize(&chunks.into(), a.shape(), T::DTYPE)?;
    let name = fresh_name("array");
    let mut layer = Graph::new();
    let grid: Vec<usize> = chunks.iter().map(Vec::len).collect();
    let starts: Vec<Vec<usize>> = chunks
        .iter()
        .map(|c| {
            c.iter()
                .scan(0, |at, &len| {
                    let s = *at;
                    *at += len;
                    Some(s)
                })
                .collect()
        })
        .collect();
    for idx in block_indices(&grid) {
        let mut view = a.view();
        for (axis, &i) in idx.iter().enumerate() {
            let s = starts[axis][i];
            let len = chunks[axis][i];
            view.slice_axis_inplace(ndarray::Axis(axis), Slice::from(s..s + len));
        }
        let block = view.to_owned().into_dyn();
        layer.insert(key(&name, &idx), Value::new(T::wrap(block)));
    }
    Ok(Array::from_layer(
        name,
        a.shape().to_vec(),
        chunks,
        T::DTYPE,
        layer,
        &[],
    ))
}

pub(crate) fn key(name: &str, idx: &[usize]) -> dask_graph::Key {
    let idx: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
    dask_graph::Key::new(name, &idx)
}
