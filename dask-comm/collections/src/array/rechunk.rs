//! `rechunk`: new block boundaries, in two stages so that no task holds more than it needs.
//! Stage one cuts every old block into the pieces that fall in each new block (a slice task
//! per piece; an old block that lies inside one new block is taken whole); stage two
//! concatenates each new block's pieces. A task holds one old block, or one new block's
//! pieces: from (20000, 100) to (100, 20000) blocks, never the 200 old blocks a new block
//! touches.

use dask_graph::{Arg, Graph, Task};

use super::create::key;
use super::slice::Local;
use super::{Array, ArrayError, ChunkSpec, block_indices, fresh_name, normalize};

/// Along one axis, for each new block: the (old block, start, end) ranges it is made of.
fn plan_axis(old: &[usize], new: &[usize]) -> Vec<Vec<(usize, usize, usize)>> {
    let mut out = Vec::with_capacity(new.len());
    let (mut ob, mut ooff) = (0usize, 0usize); // old block, offset into it
    for &len in new {
        let mut need = len;
        let mut pieces = Vec::new();
        while need > 0 {
            let avail = old[ob] - ooff;
            let take = avail.min(need);
            pieces.push((ob, ooff, ooff + take));
            need -= take;
            ooff += take;
            if ooff == old[ob] {
                ob += 1;
                ooff = 0;
            }
        }
        if pieces.is_empty() {
            // An empty axis: one empty piece of the first old block.
            pieces.push((0, 0, 0));
        }
        out.push(pieces);
    }
    out
}

impl Array {
    /// The same array in blocks of `chunks`.
    ///
    /// ```
    /// use dask_collections::array;
    /// let x = array::arange(0.0, 24.0, 1.0, 5, array::DType::F64)?;
    /// let y = x.rechunk(vec![vec![7, 7, 10]])?;
    /// assert_eq!(y.chunks(), &[vec![7, 7, 10]]);
    /// assert_eq!(y.compute(&dask_graph::Inline)?, x.compute(&dask_graph::Inline)?);
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn rechunk(&self, chunks: impl Into<ChunkSpec>) -> Result<Array, ArrayError> {
        self.require_known("rechunk")?;
        let new = normalize(&chunks.into(), &self.shape, self.dtype)?;
        if new == self.chunks {
            return Ok(self.clone());
        }
        let plans: Vec<Vec<Vec<(usize, usize, usize)>>> = self
            .chunks
            .iter()
            .zip(&new)
            .map(|(o, n)| plan_axis(o, n))
            .collect();
        let split = fresh_name("rechunk-split");
        let name = fresh_name("rechunk");
        let mut layer = Graph::new();
        let grid: Vec<usize> = new.iter().map(Vec::len).collect();
        for (flat, idx) in block_indices(&grid).into_iter().enumerate() {
            let per_axis: Vec<&Vec<(usize, usize, usize)>> =
                idx.iter().zip(&plans).map(|(&i, p)| &p[i]).collect();
            let sub: Vec<usize> = per_axis.iter().map(|p| p.len()).collect();
            let mut args = vec![Arg::lit(
                sub.iter().map(|&n| n as u64).collect::<Vec<u64>>(),
            )];
            for (piece, rel) in block_indices(&sub).into_iter().enumerate() {
                let src: Vec<usize> = rel.iter().zip(&per_axis).map(|(&r, p)| p[r].0).collect();
                let whole = rel
                    .iter()
                    .zip(&per_axis)
                    .enumerate()
                    .all(|(a, (&r, p))| p[r].1 == 0 && p[r].2 == self.chunks[a][p[r].0]);
                if whole {
                    args.push(Arg::key(self.block_key(&src)));
                    continue;
                }
                let locals: Vec<Local> = rel
                    .iter()
                    .zip(&per_axis)
                    .map(|(&r, p)| Local::range(p[r].1, p[r].2))
                    .collect();
                let piece_key = key(&split, &[flat, piece]);
                layer.insert(
                    piece_key,
                    Task::new(
                        crate::array::slice::kernels().slice,
                        [Arg::lit(locals), Arg::key(self.block_key(&src))],
                    ),
                );
                args.push(Arg::key(piece_key));
            }
            layer.insert(key(&name, &idx), Task::new(kernels().concat, args));
        }
        Ok(Array::from_layer(
            name,
            self.shape.clone(),
            new,
            self.dtype,
            layer,
            &[self],
        ))
    }
}

/// The kernel of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// Pieces joined into one block: a grid, then as many pieces as it has cells.
    pub concat: dask_graph::Func<dask_graph::Values, dask_graph::Value>,
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| Kernels {
        concat: dask_graph::registry().register_values(
            "dask-array-concat",
            |args: &[dask_graph::Value]| {
                let (grid, pieces) = crate::array::grid_and_chunks(args)?;
                crate::array::assemble_at(pieces, &grid, 0).map(dask_graph::Value::new)
            },
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_are_cut_where_the_new_blocks_say() {
        assert_eq!(
            plan_axis(&[5, 5], &[3, 4, 3]),
            vec![vec![(0, 0, 3)], vec![(0, 3, 5), (1, 0, 2)], vec![(1, 2, 5)]]
        );
        assert_eq!(
            plan_axis(&[2, 2, 2], &[6]),
            vec![vec![(0, 0, 2), (1, 0, 2), (2, 0, 2)]]
        );
        assert_eq!(plan_axis(&[0], &[0]), vec![vec![(0, 0, 0)]]);
    }
}
