//! How an array is cut into blocks: Dask's `chunks`, per axis.

use super::{ArrayError, DType};

/// What a caller asks for; [`normalize`] turns it into explicit block lengths per axis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkSpec {
    /// About [`AUTO_BYTES`] per block, as square as the shape allows (Dask's `"auto"`).
    Auto,
    /// The same block length on every axis (the last block of an axis may be shorter).
    Size(usize),
    /// A block length per axis.
    PerAxis(Vec<usize>),
    /// Every block's length, per axis (they must add up to the axis's length).
    Explicit(Vec<Vec<usize>>),
}

/// What `ChunkSpec::Auto` aims at per block: 128 MiB, Dask's `array.chunk-size`.
pub const AUTO_BYTES: usize = 128 << 20;

impl From<usize> for ChunkSpec {
    fn from(n: usize) -> Self {
        ChunkSpec::Size(n)
    }
}

impl<const N: usize> From<[usize; N]> for ChunkSpec {
    fn from(v: [usize; N]) -> Self {
        ChunkSpec::PerAxis(v.to_vec())
    }
}

impl From<Vec<usize>> for ChunkSpec {
    fn from(v: Vec<usize>) -> Self {
        ChunkSpec::PerAxis(v)
    }
}

impl From<Vec<Vec<usize>>> for ChunkSpec {
    fn from(v: Vec<Vec<usize>>) -> Self {
        ChunkSpec::Explicit(v)
    }
}

/// An axis of `len` cut in blocks of `size` (the last shorter; one empty block for an empty
/// axis, as Dask).
pub fn regular(len: usize, size: usize) -> Vec<usize> {
    if len == 0 {
        return vec![0];
    }
    let size = size.max(1);
    let mut out = vec![size; len / size];
    if !len.is_multiple_of(size) {
        out.push(len % size);
    }
    out
}

/// Explicit block lengths per axis for an array of `shape` and `dtype`.
///
/// ```
/// use dask_collections::array::{normalize, ChunkSpec, DType};
/// assert_eq!(normalize(&ChunkSpec::Size(4), &[10, 4], DType::F64).unwrap(), vec![vec![4, 4, 2], vec![4]]);
/// assert!(normalize(&ChunkSpec::Explicit(vec![vec![3, 3]]), &[7], DType::F64).is_err());
/// ```
pub fn normalize(
    spec: &ChunkSpec,
    shape: &[usize],
    dtype: DType,
) -> Result<Vec<Vec<usize>>, ArrayError> {
    let per_axis = |sizes: &[usize]| -> Result<Vec<Vec<usize>>, ArrayError> {
        if sizes.len() != shape.len() {
            return Err(ArrayError::ChunksRank {
                ndim: shape.len(),
                given: sizes.len(),
            });
        }
        if let Some(axis) = sizes.iter().position(|&s| s == 0) {
            return Err(ArrayError::ZeroChunk { axis });
        }
        Ok(shape
            .iter()
            .zip(sizes)
            .map(|(&n, &s)| regular(n, s))
            .collect())
    };
    match spec {
        ChunkSpec::Size(s) => per_axis(&vec![*s; shape.len()]),
        ChunkSpec::PerAxis(sizes) => per_axis(sizes),
        ChunkSpec::Auto => {
            let elems = (AUTO_BYTES / dtype.size()).max(1) as f64;
            let side = elems.powf(1.0 / shape.len().max(1) as f64).floor().max(1.0) as usize;
            per_axis(&vec![side; shape.len()])
        }
        ChunkSpec::Explicit(blocks) => {
            if blocks.len() != shape.len() {
                return Err(ArrayError::ChunksRank {
                    ndim: shape.len(),
                    given: blocks.len(),
                });
            }
            for (axis, (b, &n)) in blocks.iter().zip(shape).enumerate() {
                if b.iter().sum::<usize>() != n {
                    return Err(ArrayError::ChunksSum {
                        axis,
                        len: n,
                        sum: b.iter().sum(),
                    });
                }
                if b.is_empty() || (n > 0 && b.contains(&0)) {
                    return Err(ArrayError::ZeroChunk { axis });
                }
            }
            Ok(blocks.clone())
        }
    }
}

/// Every block index of a grid with `grid[axis]` blocks per axis, in row-major order.
pub fn block_indices(grid: &[usize]) -> Vec<Vec<usize>> {
    let total: usize = grid.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut idx = vec![0usize; grid.len()];
    for _ in 0..total {
        out.push(idx.clone());
        for axis in (0..grid.len()).rev() {
            idx[axis] += 1;
            if idx[axis] < grid[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
    out
}
