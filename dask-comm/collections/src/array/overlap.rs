//! Ghosting: every block extended by `depth` elements of its neighbours (or of a boundary
//! condition at the array's edges), a function mapped over the extended blocks, and the
//! extension trimmed off again — `dask.array.overlap`, `map_overlap` and `trim_internal`.
//!
//! An extended block is a grid of at most three pieces per axis (left strip, the block, right
//! strip); each strip is a selection of a neighbour's indices (reversed for `Reflect`, one index
//! repeated for `Nearest`) or a constant. The block itself is used as is.

use dask_graph::{Arg, Graph, Task};
use ndarray::Axis;
use serde::{Deserialize, Serialize};

use super::create::key;
use super::slice::Local;
use super::{Array, ArrayError, Chunk, DType, block_indices, each, fresh_name};

/// What lies beyond the array's edge along an axis (Dask's `boundary`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Boundary {
    /// Nothing: the outer blocks are not extended on their outer side.
    None,
    /// The other end of the axis (wraps around).
    Periodic,
    /// The edge mirrored, the edge element included (NumPy's `symmetric` pad, Dask's
    /// `reflect`).
    Reflect,
    /// The edge element repeated.
    Nearest,
    /// A constant.
    Constant(f64),
}

/// Which indices of a source block a piece takes along one axis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Pick {
    /// All of them, in order.
    All,
    /// These, in this order (repeats allowed).
    Indices(Vec<u32>),
}

/// One piece along one axis: from source block `block`, or a constant `len` long.
#[derive(Debug, Clone)]
enum Segment {
    Block { block: usize, pick: Pick },
    Constant { len: usize },
}

impl Segment {
    fn strip(block: usize, indices: impl Iterator<Item = usize>) -> Segment {
        Segment::Block {
            block,
            pick: Pick::Indices(indices.map(|i| i as u32).collect()),
        }
    }
}

/// The pieces of block `i` along an axis of blocks `chunks`, extended by `depth` on each side.
fn segments(chunks: &[usize], i: usize, depth: usize, boundary: Boundary) -> Vec<Segment> {
    let n = chunks.len();
    let last = n - 1;
    let mut out = Vec::with_capacity(3);
    if depth > 0 {
        let left = if i > 0 {
            let c = chunks[i - 1];
            Some(Segment::strip(i - 1, c - depth..c))
        } else {
            match boundary {
                Boundary::None => None,
                Boundary::Periodic => {
                    let c = chunks[last];
                    Some(Segment::strip(last, c - depth..c))
                }
                Boundary::Reflect => Some(Segment::strip(0, (0..depth).rev())),
                Boundary::Nearest => Some(Segment::strip(0, std::iter::repeat_n(0, depth))),
                Boundary::Constant(_) => Some(Segment::Constant { len: depth }),
            }
        };
        out.extend(left);
    }
    out.push(Segment::Block {
        block: i,
        pick: Pick::All,
    });
    if depth > 0 {
        let right = if i < last {
            Some(Segment::strip(i + 1, 0..depth))
        } else {
            let c = chunks[last];
            match boundary {
                Boundary::None => None,
                Boundary::Periodic => Some(Segment::strip(0, 0..depth)),
                Boundary::Reflect => Some(Segment::strip(last, (c - depth..c).rev())),
                Boundary::Nearest => Some(Segment::strip(last, std::iter::repeat_n(c - 1, depth))),
                Boundary::Constant(_) => Some(Segment::Constant { len: depth }),
            }
        };
        out.extend(right);
    }
    out
}

/// Takes `picks` (one per axis) of a block.
pub(crate) fn pick_chunk(c: &Chunk, picks: &[Pick]) -> Result<Chunk, String> {
    if picks.len() != c.shape().len() {
        return Err(format!(
            "{} picks for a {}-d block",
            picks.len(),
            c.shape().len()
        ));
    }
    for (axis, p) in picks.iter().enumerate() {
        if let Pick::Indices(ix) = p
            && let Some(&bad) = ix.iter().find(|&&i| i as usize >= c.shape()[axis])
        {
            return Err(format!(
                "index {bad} outside axis {axis} of a block of {:?}",
                c.shape()
            ));
        }
    }
    Ok(each!(c, a => {
        let mut out = a.clone();
        for (axis, p) in picks.iter().enumerate() {
            if let Pick::Indices(ix) = p {
                let ix: Vec<usize> = ix.iter().map(|&i| i as usize).collect();
                out = out.select(Axis(axis), &ix);
            }
        }
        Chunk::from(out)
    }))
}

/// Per-axis parameters, checked: one value for every axis, or one per axis.
fn per_axis<T: Copy>(given: &[T], ndim: usize, what: &'static str) -> Result<Vec<T>, ArrayError> {
    match given.len() {
        1 => Ok(vec![given[0]; ndim]),
        n if n == ndim => Ok(given.to_vec()),
        n => Err(ArrayError::Parameters {
            what,
            given: n,
            ndim,
        }),
    }
}

impl Array {
    /// Every block extended by `depth` elements per side along each axis (one depth for all
    /// axes, or one per axis) from its neighbours; at the array's edges from `boundary` (one for
    /// all axes, or one per axis). A depth may not exceed the smallest block along its axis
    /// (rechunk first).
    ///
    /// ```
    /// use dask_collections::array::{self, Boundary};
    /// let x = array::arange(0.0, 6.0, 1.0, 3, array::DType::F64)?;
    /// let g = x.overlap(&[1], &[Boundary::Periodic])?;
    /// assert_eq!(g.chunks(), &[vec![5, 5]]);
    /// let v = g.compute(&dask_graph::Inline)?.to_f64().into_raw_vec_and_offset().0;
    /// assert_eq!(v, vec![5.0, 0.0, 1.0, 2.0, 3.0, 2.0, 3.0, 4.0, 5.0, 0.0]);
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn overlap(&self, depth: &[usize], boundary: &[Boundary]) -> Result<Array, ArrayError> {
        self.require_known("overlap")?;
        let depth = per_axis(depth, self.ndim(), "depths")?;
        let boundary = per_axis(boundary, self.ndim(), "boundaries")?;
        for (axis, (&d, c)) in depth.iter().zip(&self.chunks).enumerate() {
            let smallest = c.iter().copied().min().unwrap_or(0);
            if d > smallest {
                return Err(ArrayError::Depth {
                    axis,
                    depth: d,
                    smallest,
                });
            }
        }
        let name = fresh_name("overlap");
        let strips = fresh_name("overlap-strip");
        let mut layer = Graph::new();
        let grid = self.numblocks();
        let mut chunks: Vec<Vec<usize>> = self.chunks.iter().map(|_| Vec::new()).collect();
        for (flat, idx) in block_indices(&grid).into_iter().enumerate() {
            let per: Vec<Vec<Segment>> = (0..self.ndim())
                .map(|a| segments(&self.chunks[a], idx[a], depth[a], boundary[a]))
                .collect();
            let sub: Vec<usize> = per.iter().map(Vec::len).collect();
            let lens: Vec<Vec<usize>> = per
                .iter()
                .enumerate()
                .map(|(a, segs)| {
                    segs.iter()
                        .map(|s| match s {
                            Segment::Constant { len } => *len,
                            Segment::Block {
                                pick: Pick::Indices(ix),
                                ..
                            } => ix.len(),
                            Segment::Block { block, .. } => self.chunks[a][*block],
                        })
                        .collect()
                })
                .collect();
            for (a, l) in lens.iter().enumerate() {
                // Along an axis, every block of the same index gets the same extension.
                if idx.iter().enumerate().all(|(b, &i)| b == a || i == 0) {
                    chunks[a].push(l.iter().sum());
                }
            }
            let mut args = vec![Arg::lit(
                sub.iter().map(|&n| n as u64).collect::<Vec<u64>>(),
            )];
            for (piece, rel) in block_indices(&sub).into_iter().enumerate() {
                let segs: Vec<&Segment> = rel.iter().zip(&per).map(|(&r, s)| &s[r]).collect();
                let shape: Vec<u64> = rel.iter().zip(&lens).map(|(&r, l)| l[r] as u64).collect();
                let constant = segs.iter().enumerate().find_map(|(a, s)| match s {
                    Segment::Constant { .. } => match boundary[a] {
                        Boundary::Constant(v) => Some(v),
                        _ => None,
                    },
                    Segment::Block { .. } => None,
                });
                let piece_key = key(&strips, &[flat, piece]);
                if let Some(v) = constant {
                    layer.insert(
                        piece_key,
                        Task::new(
                            crate::array::create::kernels().full,
                            [Arg::lit(shape), Arg::lit(self.dtype), Arg::lit(v)],
                        ),
                    );
                    args.push(Arg::key(piece_key));
                    continue;
                }
                let mut src = Vec::with_capacity(segs.len());
                let mut picks = Vec::with_capacity(segs.len());
                for s in &segs {
                    if let Segment::Block { block, pick } = s {
                        src.push(*block);
                        picks.push(pick.clone());
                    }
                }
                if picks.iter().all(|p| *p == Pick::All) {
                    args.push(Arg::key(self.block_key(&src)));
                } else {
                    layer.insert(
                        piece_key,
                        Task::new(
                            kernels().pick,
                            [Arg::lit(picks), Arg::key(self.block_key(&src))],
                        ),
                    );
                    args.push(Arg::key(piece_key));
                }
            }
            layer.insert(
                key(&name, &idx),
                Task::new(crate::array::rechunk::kernels().concat, args),
            );
        }
        Ok(Array::from_layer(
            name,
            chunks.iter().map(|c| c.iter().sum()).collect(),
            chunks,
            self.dtype,
            layer,
            &[self],
        ))
    }

    /// Cuts `depth` off both sides of every block, except the outer side of the outer blocks
    /// along an axis whose boundary was [`Boundary::None`]: undoes [`Array::overlap`] with the
    /// same arguments (Dask's `trim_internal`).
    ///
    /// ```
    /// use dask_collections::array::{self, Boundary};
    /// let x = array::ones(&[8, 8], 4, array::DType::F32)?;
    /// let back = x.overlap(&[2, 1], &[Boundary::None])?.trim_internal(&[2, 1], &[Boundary::None])?;
    /// assert_eq!(back.chunks(), x.chunks());
    /// assert_eq!(back.compute(&dask_graph::Inline)?, x.compute(&dask_graph::Inline)?);
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn trim_internal(
        &self,
        depth: &[usize],
        boundary: &[Boundary],
    ) -> Result<Array, ArrayError> {
        self.require_known("trim_internal")?;
        let depth = per_axis(depth, self.ndim(), "depths")?;
        let boundary = per_axis(boundary, self.ndim(), "boundaries")?;
        // (left, right) cut per axis and block.
        let mut cuts: Vec<Vec<(usize, usize)>> = Vec::with_capacity(self.ndim());
        for (axis, c) in self.chunks.iter().enumerate() {
            let (d, outer) = (depth[axis], boundary[axis] != Boundary::None);
            let last = c.len() - 1;
            let mut axis_cuts = Vec::with_capacity(c.len());
            for (i, &len) in c.iter().enumerate() {
                let left = if i > 0 || outer { d } else { 0 };
                let right = if i < last || outer { d } else { 0 };
                if left + right > len {
                    return Err(ArrayError::Depth {
                        axis,
                        depth: d,
                        smallest: len,
                    });
                }
                axis_cuts.push((left, right));
            }
            cuts.push(axis_cuts);
        }
        let chunks: Vec<Vec<usize>> = self
            .chunks
            .iter()
            .zip(&cuts)
            .map(|(c, cut)| c.iter().zip(cut).map(|(&l, (a, b))| l - a - b).collect())
            .collect();
        let name = fresh_name("trim");
        let mut layer = Graph::new();
        for idx in block_indices(&self.numblocks()) {
            let locals: Vec<Local> = idx
                .iter()
                .enumerate()
                .map(|(a, &i)| {
                    let (l, r) = cuts[a][i];
                    Local::range(l, self.chunks[a][i] - r)
                })
                .collect();
            layer.insert(
                key(&name, &idx),
                Task::new(
                    crate::array::slice::kernels().slice,
                    [Arg::lit(locals), Arg::key(self.block_key(&idx))],
                ),
            );
        }
        Ok(Array::from_layer(
            name,
            chunks.iter().map(|c| c.iter().sum()).collect(),
            chunks,
            self.dtype,
            layer,
            &[self],
        ))
    }

    /// `function` (a registered function from a chunk to a chunk of the same shape) applied to
    /// every block extended as [`Array::overlap`] says, the extension then trimmed: Dask's
    /// `map_overlap(func, depth, boundary)`. `dtype` is the type the function returns.
    pub fn map_overlap(
        &self,
        function: &str,
        depth: &[usize],
        boundary: &[Boundary],
        dtype: DType,
    ) -> Result<Array, ArrayError> {
        self.overlap(depth, boundary)?
            .map_blocks(function, &[], dtype, None)?
            .trim_internal(depth, boundary)
    }
}

/// The kernel of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// Rows picked out of a block, per axis.
    pub pick: dask_graph::Func<(Vec<Pick>, crate::array::Block), crate::array::Chunk>,
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| Kernels {
        pick: dask_graph::registry().register(
            "dask-array-pick",
            |picks: Vec<Pick>, a: crate::array::Block| pick_chunk(&a, &picks),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picks(s: &[Segment]) -> Vec<(usize, Vec<u32>)> {
        s.iter()
            .map(|s| match s {
                Segment::Block {
                    block,
                    pick: Pick::Indices(ix),
                } => (*block, ix.clone()),
                Segment::Block { block, .. } => (*block, vec![]),
                Segment::Constant { len } => (usize::MAX, vec![*len as u32]),
            })
            .collect()
    }

    #[test]
    fn strips_come_from_neighbours_or_the_boundary() {
        let c = [3, 4, 3];
        assert_eq!(
            picks(&segments(&c, 1, 2, Boundary::None)),
            vec![(0, vec![1, 2]), (1, vec![]), (2, vec![0, 1])]
        );
        assert_eq!(
            picks(&segments(&c, 0, 2, Boundary::None)),
            vec![(0, vec![]), (1, vec![0, 1])]
        );
        assert_eq!(
            picks(&segments(&c, 0, 2, Boundary::Periodic))[0],
            (2, vec![1, 2])
        );
        assert_eq!(
            picks(&segments(&c, 0, 2, Boundary::Reflect))[0],
            (0, vec![1, 0])
        );
        assert_eq!(
            picks(&segments(&c, 2, 2, Boundary::Reflect))[2],
            (2, vec![2, 1])
        );
        assert_eq!(
            picks(&segments(&c, 2, 2, Boundary::Nearest))[2],
            (2, vec![2, 2])
        );
        assert_eq!(
            picks(&segments(&c, 2, 2, Boundary::Constant(1.0)))[2],
            (usize::MAX, vec![2])
        );
        assert_eq!(picks(&segments(&c, 1, 0, Boundary::Reflect)).len(), 1);
    }

    #[test]
    fn a_depth_past_the_smallest_block_is_refused() {
        let x = crate::array::ones(&[10], vec![vec![6, 2, 2]], DType::F64).unwrap();
        assert!(matches!(
            x.overlap(&[3], &[Boundary::None]),
            Err(ArrayError::Depth {
                axis: 0,
                depth: 3,
                smallest: 2
            })
        ));
        assert!(matches!(
            x.overlap(&[1, 1], &[Boundary::None]),
            Err(ArrayError::Parameters {
                given: 2,
                ndim: 1,
                ..
            })
        ));
    }

    #[test]
    fn picks_outside_the_block_are_an_error_not_a_panic() {
        let c = Chunk::full(&[2, 2], DType::I32, 1.0);
        assert!(pick_chunk(&c, &[Pick::Indices(vec![5]), Pick::All]).is_err());
        assert!(pick_chunk(&c, &[Pick::All]).is_err());
        let got = pick_chunk(&c, &[Pick::Indices(vec![1, 1, 0]), Pick::All]).unwrap();
        assert_eq!(got.shape(), &[3, 2]);
    }
}
