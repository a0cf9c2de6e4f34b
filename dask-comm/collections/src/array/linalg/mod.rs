//! Linear algebra on blocked arrays, as `dask.array.linalg`.
//!
//! - [`Array::matmul`], [`Array::dot`], [`Array::tensordot`]: blocked products.
//! - [`cholesky`]: the blocked right-looking algorithm over square blocks.
//! - [`qr`], [`svd`]: TSQR for tall-and-skinny arrays (one block column);
//!   [`svd_compressed`]: a randomized truncated SVD of any 2-d array.
//! - [`solve_triangular`]: blocked forward or back substitution; [`solve_spd`] through
//!   Cholesky; [`solve`], [`inv`] and [`lstsq`] through TSQR.
//! - [`norm`]: vector and matrix norms from elementwise operations and reductions.
//!
//! Block-level factorizations and solves run in `f64` with `faer` (input blocks are cast):
//! the results of `cholesky`, `qr`, `svd`, the solves, `inv` and `lstsq` are `f64` whatever
//! the input's type, `f32` included (NumPy would keep `f32`). Products keep NumPy's type
//! (integers as `i64`); `norm` is `f32` for `f32` and `f64` otherwise. A matrix that is not
//! positive definite or is singular fails its task; [`Array::compute`] reports that as
//! [`ArrayError::NotPositiveDefinite`] or [`ArrayError::Singular`], naming the task that found
//! it (an error of a computation built on top of it reports the same).
//!
//! ```
//! use dask_collections::array::{self, linalg};
//! let a = array::from_array(&ndarray::arr2(&[[4.0, 2.0], [2.0, 3.0]]).into_dyn(), 1)?;
//! let l = linalg::cholesky(&a, true)?.compute(&dask_graph::Inline)?.to_f64();
//! assert_eq!(l[[0, 0]], 2.0);
//! assert_eq!(l[[0, 1]], 0.0);
//! # Ok::<(), array::ArrayError>(())
//! ```

mod cholesky;
mod kernels;
mod norm;
mod solve;
mod tensordot;
mod tsqr;

use dask_graph::{Arg, ComputeError, FailureKind, Graph, Task, Value};
use ndarray::{Array2, Ix2};

use super::create::key;
use super::{Array, ArrayError, Chunk, DType, block_indices, fresh_name};

pub use cholesky::cholesky;
pub(crate) use kernels::register_kernels;
pub use norm::{NormOrd, norm};
pub use solve::{Lstsq, inv, lstsq, solve, solve_spd, solve_triangular};
pub use tsqr::{qr, svd, svd_compressed};

/// The type a product of `a` and `b` elements is computed in (booleans as integers).
fn product_type(a: DType, b: DType) -> DType {
    match DType::promote(a, b) {
        DType::Bool | DType::U8 | DType::I32 => DType::I64,
        t => t,
    }
}

fn two_d<T: Clone>(a: &ndarray::ArrayD<T>) -> Result<Array2<T>, String> {
    a.clone()
        .into_dimensionality::<Ix2>()
        .map_err(|e| e.to_string())
}

/// Σ_k a_k · b_k for the pairs in `args` (a_0, b_0, a_1, b_1, ...), all cast to `t`.
pub(crate) fn sum_of_products(t: DType, args: &[Value]) -> Result<Chunk, String> {
    let chunks = args
        .iter()
        .map(|v| {
            v.downcast_ref::<Chunk>()
                .ok_or("a block that is not a chunk")
        })
        .collect::<Result<Vec<&Chunk>, _>>()?;
    if chunks.is_empty() || chunks.len() % 2 != 0 {
        return Err(format!("{} blocks: pairs expected", chunks.len()));
    }
    macro_rules! sum {
        ($v:ident, $t:ty) => {{
            let mut acc: Option<Array2<$t>> = None;
            for pair in chunks.chunks_exact(2) {
                let (Chunk::$v(a), Chunk::$v(b)) = (pair[0].astype(t), pair[1].astype(t)) else {
                    unreachable!("cast to {t:?}")
                };
                let p = two_d(&a)?.dot(&two_d(&b)?);
                acc = Some(match acc {
                    Some(s) => s + p,
                    None => p,
                });
            }
            Chunk::from(acc.expect("at least one pair").into_dyn())
        }};
    }
    Ok(match t {
        DType::F64 => float_products::<f64>(&chunks)?,
        DType::F32 => float_products::<f32>(&chunks)?,
        _ => sum!(I64, i64),
    })
}

/// `c` (or its cast to `T`, when there is one) as a row-major matrix.
fn row_major<'a, T: super::ChunkElem>(
    c: &'a Chunk,
    cast: &'a Option<Chunk>,
) -> Result<ndarray::CowArray<'a, T, Ix2>, String> {
    let a = T::view(cast.as_ref().unwrap_or(c)).ok_or("a block of another type")?;
    let v = a
        .view()
        .into_dimensionality::<Ix2>()
        .map_err(|e| e.to_string())?;
    Ok(if v.is_standard_layout() {
        ndarray::CowArray::from(v)
    } else {
        ndarray::CowArray::from(v.as_standard_layout().into_owned())
    })
}

/// Σ a_k · b_k in floats with faer's matrix product, accumulated in place in one row-major
/// block (the operands read where they lie when they are row-major).
fn float_products<T>(chunks: &[&Chunk]) -> Result<Chunk, String>
where
    T: super::ChunkElem + faer::traits::ComplexField,
{
    let mut acc: Option<Array2<T>> = None;
    for pair in chunks.chunks_exact(2) {
        // Blocks of the type are read where they lie (copied only if not row-major).
        let casts: Vec<Option<Chunk>> = pair
            .iter()
            .map(|c| (c.dtype() != T::DTYPE).then(|| c.astype(T::DTYPE)))
            .collect();
        let (a, b) = (
            row_major::<T>(pair[0], &casts[0])?,
            row_major::<T>(pair[1], &casts[1])?,
        );
        if a.ncols() != b.nrows() {
            return Err(format!(
                "blocks of {:?} and {:?} do not multiply",
                a.dim(),
                b.dim()
            ));
        }
        let out =
            acc.get_or_insert_with(|| Array2::from_elem((a.nrows(), b.ncols()), T::from_f64(0.0)));
        if out.dim() != (a.nrows(), b.ncols()) {
            return Err("products of different shapes".into());
        }
        let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
        let lhs = faer::MatRef::from_row_major_slice(a.as_slice().expect("standard layout"), m, k);
        let rhs = faer::MatRef::from_row_major_slice(b.as_slice().expect("standard layout"), k, n);
        let dst = faer::MatMut::from_row_major_slice_mut(
            out.as_slice_mut().expect("standard layout"),
            m,
            n,
        );
        faer::linalg::matmul::matmul(
            dst,
            faer::Accum::Add,
            lhs,
            rhs,
            T::from_f64(1.0),
            faer::Par::Seq,
        );
    }
    Ok(Chunk::from(acc.ok_or("no pairs")?.into_dyn()))
}

impl Array {
    /// The matrix product of two 2-d arrays (`a @ b`); inner blocks that do not line up are
    /// rechunked to ones that do.
    ///
    /// ```
    /// use dask_collections::array;
    /// let a = array::ones(&[4, 6], 2, array::DType::F64)?;
    /// let b = array::ones(&[6, 3], [2, 3], array::DType::F64)?;
    /// let c = a.matmul(&b)?.compute(&dask_graph::Inline)?;
    /// assert_eq!(c.to_f64(), ndarray::ArrayD::from_elem(ndarray::IxDyn(&[4, 3]), 6.0));
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn matmul(&self, other: &Array) -> Result<Array, ArrayError> {
        crate::array::register();
        self.require_known("matmul")?;
        other.require_known("matmul")?;
        if self.ndim() != 2 || other.ndim() != 2 {
            return Err(ArrayError::DType {
                op: "matmul of arrays that are not 2-d",
                dtype: self.dtype.name(),
            });
        }
        if self.shape[1] != other.shape[0] {
            return Err(ArrayError::Broadcast {
                a: self.shape.clone(),
                b: other.shape.clone(),
            });
        }
        if self.chunks[1] != other.chunks[0] {
            // The inner blocks must line up: both take every boundary either has.
            let inner = super::elementwise::common_chunks(&self.chunks[1], &other.chunks[0]);
            let a = self.rechunk(vec![self.chunks[0].clone(), inner.clone()])?;
            let b = other.rechunk(vec![inner, other.chunks[1].clone()])?;
            return a.matmul(&b);
        }
        let t = product_type(self.dtype, other.dtype);
        let name = fresh_name("matmul");
        let mut layer = Graph::new();
        let grid = [self.chunks[0].len(), other.chunks[1].len()];
        let inner = self.chunks[1].len();
        for idx in block_indices(&grid) {
            let mut args = vec![Arg::lit(t)];
            for k in 0..inner {
                args.push(Arg::key(self.block_key(&[idx[0], k])));
                args.push(Arg::key(other.block_key(&[k, idx[1]])));
            }
            layer.insert(key(&name, &idx), Task::new(array_kernels().matmul, args));
        }
        Ok(Array::from_layer(
            name,
            vec![self.shape[0], other.shape[1]],
            vec![self.chunks[0].clone(), other.chunks[1].clone()],
            t,
            layer,
            &[self, other],
        ))
    }
}

/// The error a failed computation stands for: a linear algebra task's refusal of a matrix
/// that is not positive definite or is singular becomes its own variant.
pub(crate) fn typed_failure(e: ComputeError) -> ArrayError {
    if let Some(c) = e.cause()
        && c.kind == FailureKind::Error
        && c.function.starts_with("dask-array-linalg-")
    {
        if c.message.starts_with(kernels::NOT_SPD) {
            return ArrayError::NotPositiveDefinite { key: c.key };
        }
        if c.message.starts_with(kernels::SINGULAR) {
            return ArrayError::Singular { key: c.key };
        }
    }
    ArrayError::Compute(e)
}

/// Refuses anything but a square 2-d array.
fn square(a: &Array, op: &'static str) -> Result<usize, ArrayError> {
    if a.ndim() != 2 {
        return Err(ArrayError::Rank {
            op,
            expected: "a 2-d array",
            ndim: a.ndim(),
        });
    }
    if a.shape[0] != a.shape[1] {
        return Err(ArrayError::NotSquare {
            shape: a.shape.clone(),
        });
    }
    Ok(a.shape[0])
}

/// A one-block array of `shape` whose block is `task`, in a layer that may hold other
/// tasks (`layer`), on top of `inputs`.
fn one_block(
    name: String,
    shape: Vec<usize>,
    mut layer: Graph,
    task: Task,
    inputs: &[&Array],
) -> Array {
    let chunks = shape.iter().map(|&n| vec![n]).collect();
    layer.insert(key(&name, &vec![0; shape.len()]), task);
    Array::from_layer(name, shape, chunks, DType::F64, layer, inputs)
}

/// Item `i` of the list of factors at `factors` (a key of a layer `inputs` stand on), as a
/// one-block `f64` array of `shape`.
fn factor(
    prefix: &str,
    factors: dask_graph::Key,
    i: u64,
    shape: Vec<usize>,
    inputs: &[&Array],
) -> Array {
    one_block(
        fresh_name(prefix),
        shape,
        Graph::new(),
        Task::new(kernels::ITEM, [Arg::lit(i), Arg::key(factors)]),
        inputs,
    )
}

/// The kernel of the block products this module builds, registered in this process on first
/// use (and by [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// A sum of block products: a type, then pairs of blocks.
    pub matmul: dask_graph::Func<dask_graph::Values, dask_graph::Value>,
}

pub(crate) fn array_kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| Kernels {
        matmul: dask_graph::registry().register_values(
            "dask-array-matmul",
            |args: &[dask_graph::Value]| {
                let Some(t) = args
                    .first()
                    .and_then(|v| v.downcast_ref::<crate::array::DType>())
                else {
                    return Err("matmul takes a type, then pairs of blocks".into());
                };
                sum_of_products(*t, &args[1..]).map(dask_graph::Value::new)
            },
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::{eye, ones};

    #[test]
    fn shapes_and_blockings_that_do_not_fit_are_refused() {
        let wide = ones(&[3, 5], 2, DType::F64).unwrap();
        assert!(matches!(
            cholesky(&wide, true),
            Err(ArrayError::NotSquare { .. })
        ));
        let v = ones(&[4], 2, DType::F64).unwrap();
        assert!(matches!(
            cholesky(&v, true),
            Err(ArrayError::Rank { ndim: 1, .. })
        ));
        assert!(matches!(inv(&wide), Err(ArrayError::NotSquare { .. })));
        // Two block columns: not tall and skinny (and, for svd, not one block row either).
        let grid = ones(&[6, 4], 2, DType::F64).unwrap();
        assert!(matches!(
            qr(&grid),
            Err(ArrayError::NotTallSkinny { ref numblocks, .. }) if numblocks == &vec![3, 2]
        ));
        assert!(matches!(svd(&grid), Err(ArrayError::NotTallSkinny { .. })));
        assert!(matches!(
            lstsq(&wide, &ones(&[3], 3, DType::F64).unwrap()),
            Err(ArrayError::NotTallSkinny { .. })
        ));
        let sq = eye(4, 2, 0, DType::F64).unwrap();
        assert!(matches!(
            solve(&sq, &ones(&[5], 5, DType::F64).unwrap()),
            Err(ArrayError::Broadcast { .. })
        ));
        assert!(matches!(
            norm(&v, Some(NormOrd::Fro), &[], false),
            Err(ArrayError::NormOrder { axes: 1, .. })
        ));
        assert!(matches!(
            norm(&sq, Some(NormOrd::P(3.0)), &[], false),
            Err(ArrayError::NormOrder { axes: 2, .. })
        ));
        assert!(matches!(
            v.tensordot(&sq, &[0], &[0, 1]),
            Err(ArrayError::Broadcast { .. })
        ));
        assert!(matches!(
            sq.tensordot(&sq, &[0, 0], &[0, 1]),
            Err(ArrayError::Axis { .. })
        ));
    }
}
