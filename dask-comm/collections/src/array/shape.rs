//! Shape operations: `expand_dims`, `concatenate`, `stack` and `reshape`. Blocks are reused
//! (an `identity` task names a source block under the result's key) or reshaped one by one;
//! nothing is gathered.

use dask_graph::{Arg, Graph, Task};
use ndarray::IxDyn;

use super::create::key;
use super::elementwise::common_chunks;
use super::{Array, ArrayError, Chunk, DType, block_indices, each, fresh_name, full};

/// Reshapes a block (row-major) to `shape`.
pub(crate) fn reshape_chunk(c: &Chunk, shape: &[usize]) -> Result<Chunk, String> {
    if shape.iter().product::<usize>() != c.shape().iter().product::<usize>() {
        return Err(format!(
            "a block of {:?} cannot become {shape:?}",
            c.shape()
        ));
    }
    Ok(each!(c, a => {
        let v = a.as_standard_layout().into_owned();
        Chunk::from(v.into_shape_with_order(IxDyn(shape)).map_err(|e| e.to_string())?)
    }))
}

/// Groups of input and output axes with equal products, front to back: `(ins, outs)` ranges.
/// Length-1 axes join the group before them (or the first).
fn groups(old: &[usize], new: &[usize]) -> Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < old.len() || j < new.len() {
        let (si, sj) = (i, j);
        let (mut pi, mut pj) = (1usize, 1usize);
        if i < old.len() {
            pi *= old[i];
            i += 1;
        }
        if j < new.len() {
            pj *= new[j];
            j += 1;
        }
        while pi != pj {
            if pi < pj && i < old.len() {
                pi *= old[i];
                i += 1;
            } else if j < new.len() {
                pj *= new[j];
                j += 1;
            } else {
                break;
            }
        }
        // Trailing length-1 axes belong to this group.
        while i < old.len() && old[i] == 1 && (j >= new.len() || new[j] != 1) {
            i += 1;
        }
        while j < new.len() && new[j] == 1 && (i >= old.len() || old[i] != 1) {
            j += 1;
        }
        out.push((si..i, sj..j));
    }
    out
}

/// The group's leading axis: its first longer than 1 (length-1 axes do not change the order
/// of elements), or its first; `None` for an empty group.
fn lead(axes: &std::ops::Range<usize>, shape: &[usize]) -> Option<usize> {
    axes.clone()
        .find(|&a| shape[a] != 1)
        .or_else(|| axes.clone().next())
}

/// The product of a group's lengths after its leading axis.
fn after(axes: &std::ops::Range<usize>, shape: &[usize], lead: usize) -> usize {
    (lead + 1..axes.end).map(|a| shape[a]).product()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl Array {
    /// A new length-1 axis at `axis` (NumPy's `expand_dims`; negative counts from the end of
    /// the result).
    pub fn expand_dims(&self, axis: isize) -> Result<Array, ArrayError> {
        let n = self.ndim() as isize + 1;
        let a = if axis < 0 { axis + n } else { axis };
        if !(0..n).contains(&a) {
            return Err(ArrayError::Axis {
                axis,
                ndim: self.ndim(),
            });
        }
        let mut shape = self.shape.clone();
        shape.insert(a as usize, 1);
        self.reshape(&shape)
    }

    /// The same elements in `shape` (row-major, as NumPy; every length given). Each group of axes whose lengths multiply to the same
    /// number is merged or split block by block; the array is rechunked first where its blocks
    /// would not map onto whole blocks of the result (the axes merged into an earlier one are
    /// made whole; a split axis's blocks are made multiples of what follows it), as Dask's
    /// `reshape`.
    ///
    /// ```
    /// use dask_collections::array::{self, DType};
    /// let x = array::arange(0.0, 24.0, 1.0, 6, DType::I64)?;
    /// let y = x.reshape(&[4, 6])?;
    /// assert_eq!(y.chunks(), &[vec![1, 1, 1, 1], vec![6]]);
    /// let z = y.reshape(&[24])?.compute(&dask_graph::Inline)?;
    /// assert_eq!(z, x.compute(&dask_graph::Inline)?);
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn reshape(&self, shape: &[usize]) -> Result<Array, ArrayError> {
        self.require_known("reshape")?;
        if shape.iter().product::<usize>() != self.size() {
            return Err(ArrayError::Reshape {
                from: self.shape.clone(),
                to: shape.to_vec(),
            });
        }
        if shape == self.shape.as_slice() {
            return Ok(self.clone());
        }
        if self.size() == 0 {
            let chunks: Vec<Vec<usize>> = shape.iter().map(|&l| vec![l]).collect();
            return full(shape, chunks, self.dtype, 0.0);
        }
        let groups = groups(&self.shape, shape);
        // Rechunk so that, in every group, the input axes after the first are whole and the
        // first axis's blocks are multiples of what the output's later axes need.
        let mut chunks = self.chunks.clone();
        for (ins, outs) in &groups {
            let (Some(fi), Some(fo)) = (lead(ins, &self.shape), lead(outs, shape)) else {
                continue;
            };
            for a in ins.clone().filter(|&a| a != fi) {
                chunks[a] = vec![self.shape[a]];
            }
            let (rest, inner) = (after(ins, &self.shape, fi), after(outs, shape, fo));
            let m = inner / gcd(inner, rest.max(1)).max(1);
            if m > 1 && chunks[fi].iter().any(|&c| c % m != 0) {
                let typical = chunks[fi].iter().copied().max().unwrap_or(1);
                let size = typical.div_ceil(m).max(1) * m;
                chunks[fi] = super::regular(self.shape[fi], size);
            }
        }
        let src = self.rechunk(chunks)?;
        // The result's blocks: per group, the first output axis takes the merged blocks (cut
        // into the later output axes, which are whole), 1:1 with the input's first-axis blocks.
        let mut out_chunks: Vec<Vec<usize>> = shape.iter().map(|&l| vec![l]).collect();
        let mut first_of: Vec<(usize, usize)> = Vec::new();
        for (ins, outs) in &groups {
            let (Some(fi), Some(fo)) = (lead(ins, &self.shape), lead(outs, shape)) else {
                // A group without input axes is all length 1 (and the other way round).
                continue;
            };
            let (rest, inner) = (after(ins, &self.shape, fi), after(outs, shape, fo));
            out_chunks[fo] = src.chunks[fi]
                .iter()
                .map(|&c| c * rest / inner.max(1))
                .collect();
            first_of.push((fi, fo));
        }
        let name = fresh_name("reshape");
        let mut layer = Graph::new();
        let grid: Vec<usize> = out_chunks.iter().map(Vec::len).collect();
        for idx in block_indices(&grid) {
            let mut from = vec![0usize; self.ndim()];
            for &(fi, fo) in &first_of {
                from[fi] = idx[fo];
            }
            let bshape: Vec<u64> = idx
                .iter()
                .zip(&out_chunks)
                .map(|(&i, c)| c[i] as u64)
                .collect();
            layer.insert(
                key(&name, &idx),
                Task::new(
                    kernels().reshape,
                    [Arg::lit(bshape), Arg::key(src.block_key(&from))],
                ),
            );
        }
        Ok(Array::from_layer(
            name,
            shape.to_vec(),
            out_chunks,
            self.dtype,
            layer,
            &[&src],
        ))
    }
}

/// `arrays` joined along an existing `axis` (NumPy's `concatenate`): the same number of axes
/// and the same lengths elsewhere; the result has their promoted type, their blocks lined up
/// along the other axes, and each one's blocks along `axis` in turn.
///
/// ```
/// use dask_collections::array::{self, DType};
/// let a = array::ones(&[2, 3], 1, DType::I32)?;
/// let b = array::zeros(&[4, 3], 2, DType::F32)?;
/// let c = array::concatenate(&[&a, &b], 0)?;
/// assert_eq!((c.shape(), c.dtype()), (&[6, 3][..], DType::F64));
/// assert_eq!(c.chunks()[0], vec![1, 1, 2, 2]);
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn concatenate(arrays: &[&Array], axis: isize) -> Result<Array, ArrayError> {
    let Some(first) = arrays.first() else {
        return Err(ArrayError::Nothing);
    };
    let ax = first.axis(axis)?;
    for a in arrays {
        a.require_known("concatenate")?;
        let same = a.ndim() == first.ndim()
            && (0..a.ndim()).all(|i| i == ax || a.shape[i] == first.shape[i]);
        if !same {
            return Err(ArrayError::Broadcast {
                a: first.shape.clone(),
                b: a.shape.clone(),
            });
        }
    }
    let dtype = arrays
        .iter()
        .map(|a| a.dtype)
        .reduce(DType::promote)
        .unwrap_or(first.dtype);
    // Along every other axis, all take every boundary any has.
    let mut common: Vec<Vec<usize>> = first.chunks.clone();
    for a in &arrays[1..] {
        for (i, c) in common.iter_mut().enumerate() {
            if i != ax && *c != a.chunks[i] {
                *c = common_chunks(c, &a.chunks[i]);
            }
        }
    }
    let parts = arrays
        .iter()
        .map(|a| {
            let mut c = common.clone();
            c[ax] = a.chunks[ax].clone();
            a.astype(dtype)?.rechunk(c)
        })
        .collect::<Result<Vec<Array>, ArrayError>>()?;
    let mut chunks = common;
    chunks[ax] = parts.iter().flat_map(|p| p.chunks[ax].clone()).collect();
    let name = fresh_name("concatenate");
    let mut layer = Graph::new();
    let grid: Vec<usize> = chunks.iter().map(Vec::len).collect();
    // Block b along `axis` is part `owner[b]`'s block `local[b]`.
    let mut owner = Vec::new();
    for (p, part) in parts.iter().enumerate() {
        owner.extend((0..part.chunks[ax].len()).map(|l| (p, l)));
    }
    for idx in block_indices(&grid) {
        let (p, l) = owner[idx[ax]];
        let mut from = idx.clone();
        from[ax] = l;
        layer.insert(
            key(&name, &idx),
            Task::new("identity", [Arg::key(parts[p].block_key(&from))]),
        );
    }
    let refs: Vec<&Array> = parts.iter().collect();
    Ok(Array::from_layer(
        name,
        chunks.iter().map(|c| c.iter().sum()).collect(),
        chunks,
        dtype,
        layer,
        &refs,
    ))
}

/// `arrays` (all of one shape) stacked along a new `axis` (NumPy's `stack`): one block per
/// array along it.
///
/// ```
/// use dask_collections::array::{self, DType};
/// let a = array::ones(&[3], 2, DType::F64)?;
/// let s = array::stack(&[&a, &a, &a], -1)?;
/// assert_eq!((s.shape(), s.chunks()), (&[3, 3][..], &[vec![2, 1], vec![1, 1, 1]][..]));
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn stack(arrays: &[&Array], axis: isize) -> Result<Array, ArrayError> {
    let Some(first) = arrays.first() else {
        return Err(ArrayError::Nothing);
    };
    if let Some(a) = arrays.iter().find(|a| a.shape != first.shape) {
        return Err(ArrayError::Broadcast {
            a: first.shape.clone(),
            b: a.shape.clone(),
        });
    }
    let n = first.ndim() as isize + 1;
    let at = if axis < 0 { axis + n } else { axis };
    let expanded = arrays
        .iter()
        .map(|a| a.expand_dims(axis))
        .collect::<Result<Vec<Array>, ArrayError>>()?;
    let refs: Vec<&Array> = expanded.iter().collect();
    concatenate(&refs, at)
}

/// The kernel of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// A block reshaped.
    pub reshape: dask_graph::Func<(Vec<u64>, crate::array::Block), crate::array::Chunk>,
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| Kernels {
        reshape: dask_graph::registry().register(
            "dask-array-reshape",
            |shape: Vec<u64>, a: crate::array::Block| {
                let shape: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
                reshape_chunk(&a, &shape)
            },
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_group_by_equal_products() {
        assert_eq!(groups(&[24], &[4, 6]), vec![(0..1, 0..2)]);
        assert_eq!(groups(&[4, 6], &[24]), vec![(0..2, 0..1)]);
        assert_eq!(
            groups(&[2, 3, 4], &[6, 2, 2]),
            vec![(0..2, 0..1), (2..3, 1..3)]
        );
        assert_eq!(groups(&[4, 6], &[6, 4]), vec![(0..2, 0..2)]);
        assert_eq!(groups(&[3], &[1, 3, 1]), vec![(0..1, 0..3)]);
        assert_eq!(groups(&[1, 3], &[3]), vec![(0..2, 0..1)]);
    }

    #[test]
    fn bad_reshapes_and_empty_lists_are_errors() {
        let x = full(&[4, 6], 2, DType::F64, 1.0).unwrap();
        assert!(matches!(
            x.reshape(&[5, 5]),
            Err(ArrayError::Reshape { .. })
        ));
        assert!(matches!(concatenate(&[], 0), Err(ArrayError::Nothing)));
        assert!(matches!(stack(&[], 0), Err(ArrayError::Nothing)));
        let y = full(&[4, 5], 2, DType::F64, 1.0).unwrap();
        assert!(matches!(
            concatenate(&[&x, &y], 0),
            Err(ArrayError::Broadcast { .. })
        ));
        assert!(matches!(x.expand_dims(3), Err(ArrayError::Axis { .. })));
    }

    #[test]
    fn a_block_of_the_wrong_size_is_an_error() {
        let c = Chunk::full(&[2, 3], DType::U8, 1.0);
        assert!(reshape_chunk(&c, &[7]).is_err());
        assert_eq!(reshape_chunk(&c, &[3, 1, 2]).unwrap().shape(), &[3, 1, 2]);
    }
}
