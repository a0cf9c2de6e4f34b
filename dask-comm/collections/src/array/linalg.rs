//! Linear algebra on blocks: `matmul` (the blocked product: result block (i, j) sums
//! A(i, k) · B(k, j) over k).

use dask_graph::{Arg, Graph, Task, Value};
use ndarray::{Array2, Ix2};

use super::create::key;
use super::{block_indices, fresh_name, kernels, Array, ArrayError, Chunk, DType};

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
        DType::F64 => sum!(F64, f64),
        DType::F32 => sum!(F32, f32),
        _ => sum!(I64, i64),
    })
}

impl Array {
    /// The matrix product of two 2-d arrays (`a @ b`); inner blocks that do not line up are
    /// rechunked to ones that do.
    ///
    /// ```
    /// use dask_collections::array;
    /// let a = array::ones(&[4, 6], 2, array::DType::F64)?;
    /// let b = array::ones(&[6, 3], [2, 3], array::DType::F64)?;
    /// let c = a.matmul(&b)?.compute(&dask_graph::Sync)?;
    /// assert_eq!(c.to_f64(), ndarray::ArrayD::from_elem(ndarray::IxDyn(&[4, 3]), 6.0));
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn matmul(&self, other: &Array) -> Result<Array, ArrayError> {
        kernels::register();
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
            layer.insert(key(&name, &idx), Task::new(kernels::MATMUL, args));
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
