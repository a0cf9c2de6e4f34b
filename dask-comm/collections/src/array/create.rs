//! Arrays from nothing, or from an ndarray: `zeros`, `ones`, `full`, `arange`, `from_array`.

use dask_graph::{Arg, Graph, Task, Value};
use ndarray::{ArrayD, Slice};

use super::{Array, ArrayError, ChunkElem, ChunkSpec, DType, block_indices, fresh_name, normalize};

pub(crate) fn check_rank(ndim: usize) -> Result<(), ArrayError> {
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
    check_rank(shape.len())?;
    let chunks = normalize(&chunks.into(), shape, dtype)?;
    Ok(generated("full", shape, chunks, dtype, move |_, bshape| {
        Task::new(
            kernels().full,
            [Arg::lit(bshape), Arg::lit(dtype), Arg::lit(value)],
        )
    }))
}

/// An array whose block `idx` of shape `bshape` is the task `make(idx, bshape)`.
pub(crate) fn generated(
    prefix: &str,
    shape: &[usize],
    chunks: Vec<Vec<usize>>,
    dtype: DType,
    make: impl Fn(&[usize], Vec<u64>) -> Task + Send + Sync + 'static,
) -> Array {
    let name = fresh_name(prefix);
    let blocks = chunks.clone();
    let task = move |idx: &[usize]| {
        let bshape: Vec<u64> = idx.iter().zip(&blocks).map(|(&i, c)| c[i] as u64).collect();
        make(idx, bshape)
    };
    Array::from_blocks(name, shape.to_vec(), chunks, dtype, task, &[])
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
    if step == 0.0 || !step.is_finite() || !start.is_finite() || !stop.is_finite() {
        return Err(ArrayError::DType {
            op: "arange with a zero or non-finite step or bound",
            dtype: dtype.name(),
        });
    }
    let n = ((stop - start) / step).ceil().max(0.0) as usize;
    let chunks = normalize(&chunks.into(), &[n], dtype)?;
    Ok(stepped("arange", start, step, chunks, dtype))
}

/// An array holding `a`'s elements, cut in blocks of `chunks` (each block a literal value in
/// the graph, as Dask's `from_array` with an in-memory array).
///
/// ```
/// use dask_collections::array::from_array;
/// use dask_graph::Inline;
/// let a = ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(&[4, 3]), |i| (i[0] * 3 + i[1]) as f64);
/// let x = from_array(&a, 2)?;
/// assert_eq!(x.numblocks(), vec![2, 2]);
/// assert_eq!(x.compute(&Inline)?.to_f64(), a);
/// # Ok::<(), dask_collections::array::ArrayError>(())
/// ```
pub fn from_array<T: ChunkElem>(
    a: &ArrayD<T>,
    chunks: impl Into<ChunkSpec>,
) -> Result<Array, ArrayError> {
    check_rank(a.ndim())?;
    // Its blocks are chunks in the graph, not kernels' results: the chunk type (and the
    // kernels later operations use) must be known to decode them.
    super::register();
    let chunks = normalize(&chunks.into(), a.shape(), T::DTYPE)?;
    let name = fresh_name("array");
    let mut layer = Graph::new();
    let grid: Vec<usize> = chunks.iter().map(Vec::len).collect();
    let starts = block_starts(&chunks);
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

/// `num` evenly spaced numbers from `start` to `stop` (included when `endpoint`), as NumPy's
/// `linspace`, in blocks of `chunks`.
///
/// ```
/// use dask_collections::array::linspace;
/// let a = linspace(0.0, 1.0, 5, 2, true)?.compute(&dask_graph::Inline)?;
/// assert_eq!(a.to_f64().into_raw_vec_and_offset().0, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
/// # Ok::<(), dask_collections::array::ArrayError>(())
/// ```
pub fn linspace(
    start: f64,
    stop: f64,
    num: usize,
    chunks: impl Into<ChunkSpec>,
    endpoint: bool,
) -> Result<Array, ArrayError> {
    let div = if endpoint { num.saturating_sub(1) } else { num };
    let step = if div == 0 {
        0.0
    } else {
        (stop - start) / div as f64
    };
    let chunks = normalize(&chunks.into(), &[num], DType::F64)?;
    Ok(stepped("linspace", start, step, chunks, DType::F64))
}

/// An `n`×`n` array with ones on diagonal `k` (above the main one for `k > 0`) and zeros
/// elsewhere, as NumPy's `eye`.
///
/// ```
/// use dask_collections::array::{eye, DType};
/// let a = eye(3, 2, 1, DType::I32)?.compute(&dask_graph::Inline)?.to_f64();
/// assert_eq!(a.into_raw_vec_and_offset().0, vec![0., 1., 0., 0., 0., 1., 0., 0., 0.]);
/// # Ok::<(), dask_collections::array::ArrayError>(())
/// ```
pub fn eye(
    n: usize,
    chunks: impl Into<ChunkSpec>,
    k: isize,
    dtype: DType,
) -> Result<Array, ArrayError> {
    let chunks = normalize(&chunks.into(), &[n, n], dtype)?;
    let starts = block_starts(&chunks);
    Ok(generated(
        "eye",
        &[n, n],
        chunks,
        dtype,
        move |idx, bshape| {
            let (r0, c0) = (starts[0][idx[0]] as i64, starts[1][idx[1]] as i64);
            Task::new(
                kernels().eye,
                [
                    Arg::lit(bshape),
                    Arg::lit(c0 - r0 - k as i64),
                    Arg::lit(dtype),
                ],
            )
        },
    ))
}

/// Where each block starts, per axis.
pub(crate) fn block_starts(chunks: &[Vec<usize>]) -> Vec<Vec<usize>> {
    chunks
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
        .collect()
}

/// A 1-d array `start + i * step` in blocks `chunks` (one axis).
fn stepped(prefix: &str, start: f64, step: f64, chunks: Vec<Vec<usize>>, dtype: DType) -> Array {
    let name = fresh_name(prefix);
    let mut layer = Graph::new();
    let starts = block_starts(&chunks);
    for (i, &len) in chunks[0].iter().enumerate() {
        layer.insert(
            key(&name, &[i]),
            Task::new(
                kernels().arange,
                [
                    Arg::lit(start + starts[0][i] as f64 * step),
                    Arg::lit(step),
                    Arg::lit(len as u64),
                    Arg::lit(dtype),
                ],
            ),
        );
    }
    let n = chunks[0].iter().sum();
    Array::from_layer(name, vec![n], chunks, dtype, layer, &[])
}

/// The kernels of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// A block of one value.
    pub full: dask_graph::Func<(Vec<u64>, crate::array::DType, f64), crate::array::Chunk>,
    /// A block of evenly spaced values.
    pub arange: dask_graph::Func<(f64, f64, u64, crate::array::DType), crate::array::Chunk>,
    /// A block of an identity-like matrix.
    pub eye: dask_graph::Func<(Vec<u64>, i64, crate::array::DType), crate::array::Chunk>,
}

fn arange_chunk<T: crate::array::ChunkElem>(
    start: f64,
    step: f64,
    n: usize,
) -> crate::array::Chunk {
    T::wrap(ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(&[n]), |i| {
        T::from_f64(start + i[0] as f64 * step)
    }))
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let r = dask_graph::registry();
        Kernels {
            full: r.register(
                "dask-array-full",
                |shape: Vec<u64>, dtype: crate::array::DType, value: f64| {
                    let shape: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
                    crate::array::Chunk::full(&shape, dtype, value)
                },
            ),
            arange: r.register(
                "dask-array-arange",
                |start: f64, step: f64, n: u64, dtype: crate::array::DType| {
                    let n = n as usize;
                    match dtype {
                        crate::array::DType::Bool => arange_chunk::<bool>(start, step, n),
                        crate::array::DType::U8 => arange_chunk::<u8>(start, step, n),
                        crate::array::DType::I32 => arange_chunk::<i32>(start, step, n),
                        crate::array::DType::I64 => arange_chunk::<i64>(start, step, n),
                        crate::array::DType::F32 => arange_chunk::<f32>(start, step, n),
                        crate::array::DType::F64 => arange_chunk::<f64>(start, step, n),
                    }
                },
            ),
            // A block of an identity-like matrix: one where local column - local row ==
            // shift's negation, i.e. global column - global row == k.
            eye: r.register(
                "dask-array-eye",
                |shape: Vec<u64>, shift: i64, dtype: crate::array::DType| {
                    let (rows, cols) = (
                        shape[0] as usize,
                        shape.get(1).copied().unwrap_or(0) as usize,
                    );
                    let a = ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(&[rows, cols]), |i| {
                        f64::from(u8::from(i[1] as i64 + shift == i[0] as i64))
                    });
                    crate::array::Chunk::from(a).into_type(dtype)
                },
            ),
        }
    })
}
