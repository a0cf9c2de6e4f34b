//! Functions over blocks: `map_blocks` with a registered function, and `where_` (NumPy's
//! `where`), the three-operand elementwise selection.

use std::sync::Arc;

use dask_graph::{Arg, Graph, Task, registry};
use ndarray::{IxDyn, Zip};

use super::create::key;
use super::elementwise::{Operand, broadcast_shape, unify_all};
use super::{Array, ArrayError, Chunk, DType, block_indices, fresh_name};

/// `x` where `cond` is true, else `y`, broadcasting the three (the kernel of [`where_`]).
pub(crate) fn select_chunks(t: DType, cond: &Chunk, x: &Chunk, y: &Chunk) -> Result<Chunk, String> {
    let shape = broadcast_shape(cond.shape(), x.shape())
        .and_then(|s| broadcast_shape(&s, y.shape()))
        .map_err(|e| e.to_string())?;
    let Chunk::Bool(c) = cond.astype(DType::Bool) else {
        unreachable!("cast to bool")
    };
    let c = c
        .broadcast(IxDyn(&shape))
        .ok_or("condition does not broadcast")?;
    macro_rules! pick {
        ($v:ident) => {{
            let (Chunk::$v(a), Chunk::$v(b)) = (&*x.as_type(t), &*y.as_type(t)) else {
                unreachable!("cast to {t:?}")
            };
            let (a, b) = (
                a.broadcast(IxDyn(&shape)).ok_or("x does not broadcast")?,
                b.broadcast(IxDyn(&shape)).ok_or("y does not broadcast")?,
            );
            Chunk::$v(
                Zip::from(&c)
                    .and(&a)
                    .and(&b)
                    .map_collect(|&c, &a, &b| if c { a } else { b }),
            )
        }};
    }
    Ok(match t {
        DType::Bool => pick!(Bool),
        DType::U8 => pick!(U8),
        DType::I32 => pick!(I32),
        DType::I64 => pick!(I64),
        DType::F32 => pick!(F32),
        DType::F64 => pick!(F64),
    })
}

/// NumPy's `where(cond, x, y)`: `x`'s element where `cond` (as booleans) is true, else `y`'s,
/// the three broadcast against each other and their blocks lined up; the result has `x` and
/// `y`'s promoted type. A scalar operand is a 0-d array (`full(&[], v, ...)`).
///
/// ```
/// use dask_collections::array::{self, DType};
/// let x = array::arange(0.0, 6.0, 1.0, 4, DType::I64)?;
/// let cond = x.scalar(array::BinaryOp::Lt, 3.0, false)?;
/// let zero = array::full(&[], 0, DType::F64, 1.0)?;
/// let v = array::where_(&cond, &x, &zero)?.compute(&dask_graph::Inline)?;
/// assert_eq!(v.to_f64().into_raw_vec_and_offset().0, vec![0.0, 1.0, 2.0, 1.0, 1.0, 1.0]);
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn where_(cond: &Array, x: &Array, y: &Array) -> Result<Array, ArrayError> {
    for a in [cond, x, y] {
        a.require_known("where")?;
    }
    let shape = broadcast_shape(&broadcast_shape(&cond.shape, &x.shape)?, &y.shape)?;
    let ops = unify_all(&[cond, x, y], &shape)?;
    let n = shape.len();
    let chunks: Vec<Vec<usize>> = (0..n)
        .map(|axis| {
            ops.iter()
                .find_map(|a| {
                    let off = n - a.ndim();
                    (axis >= off && !(a.shape[axis - off] == 1 && shape[axis] != 1))
                        .then(|| a.chunks[axis - off].clone())
                })
                .unwrap_or_else(|| vec![shape[axis]])
        })
        .collect();
    let t = DType::promote(x.dtype, y.dtype);
    let name = fresh_name("where");
    let operands: Vec<Operand> = ops.iter().map(|a| Operand::of(a, &shape)).collect();
    let task = move |idx: &[usize]| {
        let mut args = vec![Arg::lit(t)];
        args.extend(operands.iter().map(|o| Arg::key(o.block(idx))));
        Task::new(kernels().select, args)
    };
    let refs: Vec<&Array> = ops.iter().collect();
    Ok(Array::from_blocks(name, shape, chunks, t, task, &refs))
}

impl Array {
    /// `function` applied to every block: a function registered (in every process, as
    /// [`register`](super::register) does for the array's own; its [`Func`](dask_graph::Func)
    /// handle, or its name), taking the
    /// block (an `Arc<Chunk>`) and then `extra`'s values, returning a [`Chunk`] of `dtype` —
    /// of the block's shape, or of the blocks `chunks` gives (the same number per axis) (Dask's `map_blocks(func,
    /// chunks=..., dtype=...)`). A block of another shape or type fails the computation with
    /// [`ArrayError::BlockShape`] or [`ArrayError::NotAChunk`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use dask_collections::array::{self, Chunk, DType};
    /// let double = dask_graph::registry().register("double-it", |c: Arc<Chunk>| {
    ///     Chunk::from(c.to_f64().mapv(|v| 2.0 * v))
    /// });
    /// let x = array::arange(0.0, 5.0, 1.0, 2, DType::F64)?;
    /// let y = x.map_blocks(double, &[], DType::F64, None)?;
    /// let v = y.compute(&dask_graph::Inline)?.to_f64().into_raw_vec_and_offset().0;
    /// assert_eq!(v, vec![0.0, 2.0, 4.0, 6.0, 8.0]);
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn map_blocks(
        &self,
        function: impl Into<dask_graph::Name>,
        extra: &[Arg],
        dtype: DType,
        chunks: Option<Vec<Vec<usize>>>,
    ) -> Result<Array, ArrayError> {
        // The array's own kernels, should `function` name one of them.
        super::register();
        let function: dask_graph::Name = function.into();
        if registry().get(function).is_none() {
            return Err(ArrayError::UnknownFunction {
                name: Arc::from(function.as_str()),
            });
        }
        let chunks = match chunks {
            None => self.chunks.clone(),
            Some(c) => {
                if c.len() != self.ndim() {
                    return Err(ArrayError::ChunksRank {
                        ndim: self.ndim(),
                        given: c.len(),
                    });
                }
                let grid: Vec<usize> = c.iter().map(Vec::len).collect();
                if grid != self.numblocks() {
                    return Err(ArrayError::Blocks {
                        given: grid,
                        blocks: self.numblocks(),
                    });
                }
                c
            }
        };
        let name = fresh_name(&format!("map-{function}"));
        let mut layer = Graph::new();
        let grid: Vec<usize> = chunks.iter().map(Vec::len).collect();
        for idx in block_indices(&grid) {
            let mut args = vec![Arg::key(self.block_key(&idx))];
            args.extend(extra.iter().cloned());
            layer.insert(key(&name, &idx), Task::new(function, args));
        }
        Ok(Array::from_layer(
            name,
            chunks.iter().map(|c| c.iter().sum()).collect(),
            chunks,
            dtype,
            layer,
            &[self],
        ))
    }
}

/// The kernel of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// `where(cond, x, y)` on three blocks.
    pub select: dask_graph::Func<
        (
            crate::array::DType,
            crate::array::Block,
            crate::array::Block,
            crate::array::Block,
        ),
        crate::array::Chunk,
    >,
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| Kernels {
        select: dask_graph::registry().register(
            "dask-array-where",
            |t: crate::array::DType,
             c: crate::array::Block,
             x: crate::array::Block,
             y: crate::array::Block| select_chunks(t, &c, &x, &y),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unregistered_function_is_refused_before_anything_runs() {
        let x = crate::array::ones(&[4], 2, DType::F64).unwrap();
        assert!(matches!(
            x.map_blocks("no-such-function-anywhere", &[], DType::F64, None),
            Err(ArrayError::UnknownFunction { .. })
        ));
    }

    #[test]
    fn chunks_for_another_grid_are_refused() {
        let x = crate::array::ones(&[4], 2, DType::F64).unwrap();
        assert!(matches!(
            x.map_blocks(
                crate::array::elementwise::kernels().transpose,
                &[],
                DType::F64,
                Some(vec![vec![4]])
            ),
            Err(ArrayError::Blocks { .. })
        ));
    }

    #[test]
    fn where_selects_with_broadcasting_and_promotion() {
        let c = Chunk::from(ndarray::arr1(&[true, false, true]).into_dyn());
        let x = Chunk::full(&[2, 3], DType::I32, 7.0);
        let y = Chunk::full(&[], DType::F32, 0.5);
        let got = select_chunks(DType::F64, &c, &x, &y).unwrap();
        assert_eq!(got.dtype(), DType::F64);
        assert_eq!(
            got.to_f64().into_raw_vec_and_offset().0,
            vec![7.0, 0.5, 7.0, 7.0, 0.5, 7.0]
        );
        assert!(select_chunks(DType::F64, &c, &Chunk::full(&[2], DType::F64, 1.0), &y).is_err());
    }
}
