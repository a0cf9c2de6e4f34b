//! Boolean masks that are arrays themselves (NumPy's `x[x > 0]`): the result's block lengths
//! are not known until the mask is computed — [`UNKNOWN`], Dask's `nan` chunks. What needs
//! lengths (slicing, rechunking, aligning with another array, ...) refuses such an array with
//! [`ArrayError::UnknownChunks`] until [`Array::compute_chunk_sizes`] learns them; elementwise
//! operations with scalars, `sum`/`mean`/`var`/`std`/`prod`/`any`/`all` and `compute` work on
//! it as it is.

use dask_graph::{Arg, Scheduler, Task};
use ndarray::{ArrayD, IxDyn};

use super::create::key;
use super::{Array, ArrayError, Chunk, DType, each, fresh_name};

/// A length not known until computed (a block of a masked array).
pub const UNKNOWN: usize = usize::MAX;

/// The elements of `x` where `mask` is true, in row-major order, as one 1-d chunk.
pub(crate) fn mask_chunk(x: &Chunk, mask: &Chunk) -> Result<Chunk, String> {
    if x.shape() != mask.shape() {
        return Err(format!(
            "a mask of {:?} for a block of {:?}",
            mask.shape(),
            x.shape()
        ));
    }
    let m = mask.as_type(DType::Bool);
    let Chunk::Bool(m) = &*m else {
        unreachable!("cast to bool")
    };
    Ok(each!(x, a => {
        let v: Vec<_> = a.iter().zip(m.iter()).filter(|&(_, &k)| k).map(|(e, _)| *e).collect();
        let n = v.len();
        Chunk::from(ArrayD::from_shape_vec(IxDyn(&[n]), v).expect("one axis of n"))
    }))
}

impl Array {
    /// Whether some block length is [`UNKNOWN`].
    pub fn has_unknown_chunks(&self) -> bool {
        self.chunks.iter().flatten().any(|&c| c == UNKNOWN)
    }

    /// Refuses `op` on an array with unknown block lengths.
    pub(crate) fn require_known(&self, op: &'static str) -> Result<(), ArrayError> {
        if self.has_unknown_chunks() {
            Err(ArrayError::UnknownChunks { op })
        } else {
            Ok(())
        }
    }

    /// The elements where `mask` (of this array's shape, as booleans) is true, as a 1-d array
    /// in row-major order (NumPy's `x[mask]`). Its block lengths are [`UNKNOWN`] until
    /// computed: one block per block of this array (rechunked first so that blocks hold whole
    /// rows, which keeps NumPy's order).
    ///
    /// ```
    /// use dask_collections::array::{self, BinaryOp, DType};
    /// let x = array::arange(-3.0, 5.0, 1.0, 3, DType::I64)?;
    /// let pos = x.mask(&x.scalar(BinaryOp::Gt, 0.0, false)?)?;
    /// assert!(pos.has_unknown_chunks());
    /// let v = pos.compute(&dask_graph::Inline)?.to_f64().into_raw_vec_and_offset().0;
    /// assert_eq!(v, vec![1.0, 2.0, 3.0, 4.0]);
    /// let known = pos.compute_chunk_sizes(&dask_graph::Inline)?;
    /// assert_eq!(known.chunks(), &[vec![0, 2, 2]]);
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn mask(&self, mask: &Array) -> Result<Array, ArrayError> {
        self.require_known("mask")?;
        mask.require_known("mask")?;
        if mask.shape != self.shape {
            return Err(ArrayError::Broadcast {
                a: self.shape.clone(),
                b: mask.shape.clone(),
            });
        }
        // Blocks of whole rows (every axis but the first whole), the mask's lined up with them.
        let chunks: Vec<Vec<usize>> = self
            .chunks
            .iter()
            .enumerate()
            .map(|(a, c)| {
                if a == 0 {
                    c.clone()
                } else {
                    vec![self.shape[a]]
                }
            })
            .collect();
        let (x, m) = (self.rechunk(chunks.clone())?, mask.rechunk(chunks)?);
        let n = x.chunks.first().map_or(1, Vec::len);
        let name = fresh_name("mask");
        let (xs, ms, nd) = (x.name.clone(), m.name.clone(), x.ndim());
        let task = move |idx: &[usize]| {
            let mut at = vec![0; nd];
            if let Some(first) = at.first_mut() {
                *first = idx[0];
            }
            Task::new(
                kernels().mask,
                [Arg::key(key(&xs, &at)), Arg::key(key(&ms, &at))],
            )
        };
        Ok(Array::from_blocks(
            name,
            vec![UNKNOWN],
            vec![vec![UNKNOWN; n]],
            self.dtype,
            task,
            &[&x, &m],
        ))
    }

    /// The same array with its block lengths known: each block's shape is computed on
    /// `scheduler` (as Dask's `compute_chunk_sizes`, the blocks are computed again when the
    /// array is). An array whose lengths are known is returned as it is.
    pub fn compute_chunk_sizes(&self, scheduler: &dyn Scheduler) -> Result<Array, ArrayError> {
        if !self.has_unknown_chunks() {
            return Ok(self.clone());
        }
        let name = fresh_name("chunk-sizes");
        let mut graph = self.graph_for(&self.keys());
        let mut keys = Vec::new();
        for (i, k) in self.keys().into_iter().enumerate() {
            let s = key(&name, &[i]);
            graph.insert(s, Task::new(kernels().shape, [Arg::key(k)]));
            keys.push(s);
        }
        let shapes = scheduler.get(graph, &keys)?;
        let mut chunks: Vec<Vec<usize>> = self.chunks.clone();
        let grid = self.numblocks();
        for (idx, (v, k)) in super::block_indices(&grid)
            .into_iter()
            .zip(shapes.iter().zip(&keys))
        {
            let shape = v.downcast_ref::<Vec<u64>>().ok_or(ArrayError::NotAChunk {
                key: *k,
                got: v.type_info().name().to_string(),
                dtype: "shape",
            })?;
            if shape.len() != self.ndim() {
                return Err(ArrayError::BlockShape {
                    key: *k,
                    got: shape.iter().map(|&n| n as usize).collect(),
                    expected: self.block_shape(&idx),
                });
            }
            for (a, (&i, &len)) in idx.iter().zip(shape).enumerate() {
                let slot = &mut chunks[a][i];
                if *slot == UNKNOWN {
                    *slot = len as usize;
                } else if *slot != len as usize {
                    return Err(ArrayError::BlockShape {
                        key: *k,
                        got: shape.iter().map(|&n| n as usize).collect(),
                        expected: self.block_shape(&idx),
                    });
                }
            }
        }
        let mut known = self.clone();
        known.shape = chunks.iter().map(|c| c.iter().sum()).collect();
        known.chunks = chunks;
        Ok(known)
    }
}

/// The kernels of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// A block's elements where a mask block is true.
    pub mask: dask_graph::Func<(crate::array::Block, crate::array::Block), crate::array::Chunk>,
    /// A block's shape.
    pub shape: dask_graph::Func<(crate::array::Block,), Vec<u64>>,
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let r = dask_graph::registry();
        Kernels {
            mask: r.register(
                "dask-array-mask",
                |x: crate::array::Block, m: crate::array::Block| mask_chunk(&x, &m),
            ),
            shape: r.register("dask-array-shape", |x: crate::array::Block| {
                x.shape().iter().map(|&n| n as u64).collect::<Vec<u64>>()
            }),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_keeps_its_selected_elements_in_row_major_order() {
        let x = Chunk::from(ndarray::arr2(&[[1i32, 2, 3], [4, 5, 6]]).into_dyn());
        let m = Chunk::from(ndarray::arr2(&[[1u8, 0, 1], [0, 1, 0]]).into_dyn());
        let got = mask_chunk(&x, &m).unwrap();
        assert_eq!(got, Chunk::from(ndarray::arr1(&[1i32, 3, 5]).into_dyn()));
        assert!(mask_chunk(&x, &Chunk::full(&[3], DType::Bool, 1.0)).is_err());
    }

    #[test]
    fn what_needs_lengths_refuses_unknown_ones() {
        let x = crate::array::arange(0.0, 6.0, 1.0, 2, DType::F64).unwrap();
        let m = x
            .mask(&x.scalar(super::super::BinaryOp::Gt, 2.0, false).unwrap())
            .unwrap();
        for r in [
            m.rechunk(2).map(|_| ()),
            m.slice(&[(0..1).into()]).map(|_| ()),
            (&m + &m).map(|_| ()),
            m.max(&[], false).map(|_| ()),
            m.argmin(None, false).map(|_| ()),
            m.take(&[0], 0).map(|_| ()),
            m.reshape(&[3]).map(|_| ()),
        ] {
            assert!(matches!(r, Err(ArrayError::UnknownChunks { .. })), "{r:?}");
        }
        // Sums and scalar operations need no lengths.
        let s = (&m * 2.0).unwrap().sum(&[], false).unwrap();
        assert_eq!(s.compute(&dask_graph::Inline).unwrap().to_f64()[[]], 24.0);
    }
}
