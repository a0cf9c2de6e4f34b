//! Basic indexing: per axis a range with a step (negative too), an integer, or everything, as
//! NumPy's `x[a:b:s, i, :]`. Each result block is a slice of one source block, so only the
//! blocks a selection touches are in its graph (and computed: the graph is culled).

use dask_graph::{Arg, Graph, Task};
use ndarray::{Axis, Slice};
use serde::{Deserialize, Serialize};

use super::create::key;
use super::{Array, ArrayError, Chunk, block_indices, each, fresh_name};

/// What to take along one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Index {
    /// Everything (`:`).
    Full,
    /// `start:stop:step`, each optional as in Python (`None` for an end), negative counting
    /// from the end; a step of 0 is refused.
    Range(Option<isize>, Option<isize>, isize),
    /// One element: the axis goes away. Negative counts from the end.
    At(isize),
}

impl From<std::ops::Range<isize>> for Index {
    fn from(r: std::ops::Range<isize>) -> Index {
        Index::Range(Some(r.start), Some(r.end), 1)
    }
}

impl From<std::ops::RangeFull> for Index {
    fn from(_: std::ops::RangeFull) -> Index {
        Index::Full
    }
}

impl From<isize> for Index {
    fn from(i: isize) -> Index {
        Index::At(i)
    }
}

/// A slice of one block along one axis: local `start`, `end` (exclusive), `step` as ndarray's
/// [`Slice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Local {
    start: u64,
    end: u64,
    step: i64,
    /// The axis is indexed by an integer and goes away.
    drop: bool,
}

impl Local {
    /// `start..end` with step 1.
    pub(crate) fn range(start: usize, end: usize) -> Local {
        Local {
            start: start as u64,
            end: end as u64,
            step: 1,
            drop: false,
        }
    }
}

/// The source indices a range selects on an axis of `len` (Python's `slice.indices`).
fn selected(len: usize, start: Option<isize>, stop: Option<isize>, step: isize) -> Vec<usize> {
    let n = len as isize;
    let clamp = |v: isize, lo: isize, hi: isize| v.max(lo).min(hi);
    let norm = |v: isize| if v < 0 { v + n } else { v };
    let (s, e) = if step > 0 {
        (
            start.map_or(0, |v| clamp(norm(v), 0, n)),
            stop.map_or(n, |v| clamp(norm(v), 0, n)),
        )
    } else {
        (
            start.map_or(n - 1, |v| clamp(norm(v), -1, n - 1)),
            stop.map_or(-1, |v| clamp(norm(v), -1, n - 1)),
        )
    };
    let mut out = Vec::new();
    let mut i = s;
    while (step > 0 && i < e) || (step < 0 && i > e) {
        out.push(i as usize);
        i += step;
    }
    out
}

/// Groups the selected source indices by source block, in selection order: each group is
/// (source block, local start, local end exclusive, step) for ndarray's `Slice`.
fn groups(chunks: &[usize], picks: &[usize], step: isize) -> Vec<(usize, Local, usize)> {
    let mut starts = Vec::with_capacity(chunks.len());
    let mut at = 0;
    for &c in chunks {
        starts.push(at);
        at += c;
    }
    let block_of = |i: usize| starts.partition_point(|&s| s <= i) - 1;
    let mut out: Vec<(usize, Local, usize)> = Vec::new();
    let mut k = 0;
    while k < picks.len() {
        let b = block_of(picks[k]);
        let mut j = k;
        while j + 1 < picks.len() && block_of(picks[j + 1]) == b {
            j += 1;
        }
        let (first, last) = (picks[k] - starts[b], picks[j] - starts[b]);
        // ndarray's negative-step slice walks [start, end) backwards from end - 1.
        let (start, end) = if step > 0 {
            (first, last + 1)
        } else {
            (last, first + 1)
        };
        out.push((
            b,
            Local {
                start: start as u64,
                end: end as u64,
                step: step as i64,
                drop: false,
            },
            j - k + 1,
        ));
        k = j + 1;
    }
    out
}

/// Slices one block.
pub(crate) fn slice_chunk(c: &Chunk, locals: &[Local]) -> Chunk {
    each!(c, a => {
        let mut v = a.view();
        for (axis, l) in locals.iter().enumerate() {
            v.slice_axis_inplace(
                Axis(axis),
                Slice::new(l.start as isize, Some(l.end as isize), l.step as isize),
            );
        }
        let mut out = v.to_owned();
        for (axis, l) in locals.iter().enumerate().rev() {
            if l.drop {
                out = out.index_axis_move(Axis(axis), 0);
            }
        }
        Chunk::from(out)
    })
}

impl Array {
    /// `x[index]`: one [`Index`] per axis (missing trailing axes are taken whole).
    ///
    /// ```
    /// use dask_collections::array::{self, Index};
    /// let x = array::ones(&[10000, 10000], 100, array::DType::F64)?;
    /// let y = x.unary(array::UnaryOp::Exp)?.slice(&[(1..100).into(), (1..100).into()])?;
    /// assert_eq!((y.shape(), y.numblocks()), (&[99, 99][..], vec![1, 1]));
    /// assert_eq!(y.compute(&dask_graph::Inline)?.shape(), &[99, 99]); // 1 block of 10,000 computed
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn slice(&self, index: &[Index]) -> Result<Array, ArrayError> {
        self.require_known("slice")?;
        if index.len() > self.ndim() {
            return Err(ArrayError::Axis {
                axis: index.len() as isize - 1,
                ndim: self.ndim(),
            });
        }
        // Per axis: the groups of (source block, local slice, length) in result order.
        let mut per_axis: Vec<Vec<(usize, Local, usize)>> = Vec::with_capacity(self.ndim());
        for axis in 0..self.ndim() {
            let len = self.shape[axis];
            let idx = index.get(axis).copied().unwrap_or(Index::Full);
            let g = match idx {
                Index::Full => groups(&self.chunks[axis], &(0..len).collect::<Vec<_>>(), 1),
                Index::Range(start, stop, step) => {
                    if step == 0 {
                        return Err(ArrayError::Axis {
                            axis: axis as isize,
                            ndim: self.ndim(),
                        });
                    }
                    groups(&self.chunks[axis], &selected(len, start, stop, step), step)
                }
                Index::At(i) => {
                    let j = if i < 0 { i + len as isize } else { i };
                    if j < 0 || j >= len as isize {
                        return Err(ArrayError::OutOfBounds {
                            axis,
                            index: i,
                            len,
                        });
                    }
                    let mut g = groups(&self.chunks[axis], &[j as usize], 1);
                    g[0].1.drop = true;
                    g
                }
            };
            per_axis.push(g);
        }
        let kept: Vec<usize> = (0..self.ndim())
            .filter(|&a| !matches!(index.get(a), Some(Index::At(_))))
            .collect();
        let mut shape = Vec::new();
        let mut chunks = Vec::new();
        for &a in &kept {
            let c: Vec<usize> = per_axis[a].iter().map(|g| g.2).collect();
            shape.push(c.iter().sum());
            // An empty selection is one empty block.
            chunks.push(if c.is_empty() { vec![0] } else { c });
        }
        let name = fresh_name("getitem");
        let mut layer = Graph::new();
        let grid: Vec<usize> = per_axis.iter().map(|g| g.len()).collect();
        if grid.iter().all(|&n| n > 0) {
            for idx in block_indices(&grid) {
                let src: Vec<usize> = idx.iter().zip(&per_axis).map(|(&i, g)| g[i].0).collect();
                let locals: Vec<Local> = idx.iter().zip(&per_axis).map(|(&i, g)| g[i].1).collect();
                let out: Vec<usize> = kept.iter().map(|&a| idx[a]).collect();
                layer.insert(
                    key(&name, &out),
                    Task::new(
                        kernels().slice,
                        [Arg::lit(locals), Arg::key(self.block_key(&src))],
                    ),
                );
            }
        } else {
            // Nothing selected on some axis: one empty block of the result's shape.
            chunks = shape.iter().map(|&n| vec![n]).collect();
            let out = vec![0; kept.len()];
            layer.insert(
                key(&name, &out),
                dask_graph::Value::new(Chunk::full(&shape, self.dtype, 0.0)),
            );
        }
        Ok(Array::from_layer(
            name,
            shape,
            chunks,
            self.dtype,
            layer,
            &[self],
        ))
    }
}

impl Array {
    /// Removes length-1 `axes` (all length-1 axes when empty), as NumPy's `squeeze`; an axis
    /// longer than 1 is refused.
    pub fn squeeze(&self, axes: &[isize]) -> Result<Array, ArrayError> {
        let axes: Vec<usize> = if axes.is_empty() {
            (0..self.ndim()).filter(|&a| self.shape[a] == 1).collect()
        } else {
            self.axes(axes)?
        };
        if let Some(&a) = axes.iter().find(|&&a| self.shape[a] != 1) {
            return Err(ArrayError::OutOfBounds {
                axis: a,
                index: 1,
                len: self.shape[a],
            });
        }
        let index: Vec<Index> = (0..self.ndim())
            .map(|a| {
                if axes.contains(&a) {
                    Index::At(0)
                } else {
                    Index::Full
                }
            })
            .collect();
        self.slice(&index)
    }
}

/// The kernel of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// A block sliced.
    pub slice: dask_graph::Func<(Vec<Local>, crate::array::Block), crate::array::Chunk>,
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| Kernels {
        slice: dask_graph::registry().register(
            "dask-array-slice",
            |locals: Vec<Local>, a: crate::array::Block| slice_chunk(&a, &locals),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_select_as_python() {
        assert_eq!(selected(10, Some(1), Some(8), 3), vec![1, 4, 7]);
        assert_eq!(selected(10, None, None, -3), vec![9, 6, 3, 0]);
        assert_eq!(selected(5, Some(-2), None, 1), vec![3, 4]);
        assert_eq!(selected(5, Some(3), Some(1), -1), vec![3, 2]);
        assert_eq!(selected(5, Some(9), Some(-9), -2), vec![4, 2, 0]);
        assert!(selected(5, Some(3), Some(1), 1).is_empty());
    }
}
