//! Integer-list and boolean indexing along one axis: `take` (NumPy's `x[[3, 0, 3]]`) and
//! `compress` (a boolean mask known when the graph is built, NumPy's `compress`). A result
//! block gathers its indices from each source block they fall in, then puts them in order.

use dask_graph::{Arg, Graph, Task};

use super::create::key;
use super::overlap::Pick;
use super::{Array, ArrayError, block_indices, fresh_name, regular};

impl Array {
    /// The elements at `indices` along `axis` (negative indices count from the end; repeats
    /// and any order allowed), as NumPy's `take`. Result blocks along `axis` are as long as
    /// the array's longest there.
    ///
    /// ```
    /// use dask_collections::array::{self, DType};
    /// let x = array::arange(0.0, 10.0, 1.0, 3, DType::I64)?;
    /// let y = x.take(&[9, 0, -1, 4, 4], 0)?;
    /// let v = y.compute(&dask_graph::Inline)?.to_f64().into_raw_vec_and_offset().0;
    /// assert_eq!(v, vec![9.0, 0.0, 9.0, 4.0, 4.0]);
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn take(&self, indices: &[isize], axis: isize) -> Result<Array, ArrayError> {
        self.require_known("take")?;
        let ax = self.axis(axis)?;
        let len = self.shape[ax];
        let picks = indices
            .iter()
            .map(|&i| {
                let j = if i < 0 { i + len as isize } else { i };
                if (0..len as isize).contains(&j) {
                    Ok(j as usize)
                } else {
                    Err(ArrayError::OutOfBounds {
                        axis: ax,
                        index: i,
                        len,
                    })
                }
            })
            .collect::<Result<Vec<usize>, _>>()?;
        let starts = super::create::block_starts(&self.chunks);
        let block_of = |i: usize| starts[ax].partition_point(|&s| s <= i) - 1;
        let size = self.chunks[ax].iter().copied().max().unwrap_or(1).max(1);
        let mut chunks = self.chunks.clone();
        chunks[ax] = regular(picks.len(), size);
        let name = fresh_name("take");
        let gathered = fresh_name("take-gather");
        let mut layer = Graph::new();
        let grid: Vec<usize> = chunks.iter().map(Vec::len).collect();
        let all = |local: Vec<u32>| -> Vec<Pick> {
            (0..self.ndim())
                .map(|a| {
                    if a == ax {
                        Pick::Indices(local.clone())
                    } else {
                        Pick::All
                    }
                })
                .collect()
        };
        let mut at = 0;
        let mut pieces_along: Vec<Vec<(usize, Vec<u32>)>> = Vec::new();
        let mut orders: Vec<Option<Vec<u32>>> = Vec::new();
        for &n in &chunks[ax] {
            let mine = &picks[at..at + n];
            at += n;
            // Source blocks in order, each with its local indices in order of appearance.
            let mut by_block: Vec<(usize, Vec<u32>)> = Vec::new();
            for &i in mine {
                let b = block_of(i);
                let local = (i - starts[ax][b]) as u32;
                match by_block.iter_mut().find(|(bb, _)| *bb == b) {
                    Some((_, l)) => l.push(local),
                    None => by_block.push((b, vec![local])),
                }
            }
            by_block.sort_by_key(|(b, _)| *b);
            if by_block.is_empty() {
                by_block.push((0, Vec::new()));
            }
            // Where each result position sits in the concatenation of the pieces.
            let order = (by_block.len() > 1).then(|| {
                let mut seen = vec![0u32; by_block.len()];
                let offsets: Vec<u32> = by_block
                    .iter()
                    .scan(0u32, |o, (_, l)| {
                        let here = *o;
                        *o += l.len() as u32;
                        Some(here)
                    })
                    .collect();
                mine.iter()
                    .map(|&i| {
                        let k = by_block
                            .iter()
                            .position(|(b, _)| *b == block_of(i))
                            .expect("grouped above");
                        seen[k] += 1;
                        offsets[k] + seen[k] - 1
                    })
                    .collect::<Vec<u32>>()
            });
            pieces_along.push(by_block);
            orders.push(order);
        }
        for (flat, idx) in block_indices(&grid).into_iter().enumerate() {
            let pieces = &pieces_along[idx[ax]];
            let src = |b: usize| {
                let mut s = idx.clone();
                s[ax] = b;
                self.block_key(&s)
            };
            let out = key(&name, &idx);
            if let [(b, local)] = pieces.as_slice() {
                layer.insert(
                    out,
                    Task::new(
                        crate::array::overlap::kernels().pick,
                        [Arg::lit(all(local.clone())), Arg::key(src(*b))],
                    ),
                );
                continue;
            }
            let mut sub = vec![1u64; self.ndim()];
            sub[ax] = pieces.len() as u64;
            let mut args = vec![Arg::lit(sub)];
            for (k, (b, local)) in pieces.iter().enumerate() {
                let piece = key(&gathered, &[flat, k]);
                layer.insert(
                    piece,
                    Task::new(
                        crate::array::overlap::kernels().pick,
                        [Arg::lit(all(local.clone())), Arg::key(src(*b))],
                    ),
                );
                args.push(Arg::key(piece));
            }
            let joined = key(&gathered, &[flat, pieces.len()]);
            layer.insert(
                joined,
                Task::new(crate::array::rechunk::kernels().concat, args),
            );
            let order = orders[idx[ax]]
                .clone()
                .expect("several pieces have an order");
            layer.insert(
                out,
                Task::new(
                    crate::array::overlap::kernels().pick,
                    [Arg::lit(all(order)), Arg::key(joined)],
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

    /// The elements along `axis` where `mask` is true (NumPy's `compress`, or `x[mask]` for a
    /// boolean mask known now); the mask must be as long as the axis.
    ///
    /// ```
    /// use dask_collections::array::{self, DType};
    /// let x = array::arange(0.0, 5.0, 1.0, 2, DType::F32)?;
    /// let y = x.compress(&[true, false, false, true, true], 0)?;
    /// assert_eq!(y.shape(), &[3]);
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn compress(&self, mask: &[bool], axis: isize) -> Result<Array, ArrayError> {
        self.require_known("compress")?;
        let ax = self.axis(axis)?;
        if mask.len() != self.shape[ax] {
            return Err(ArrayError::Broadcast {
                a: vec![self.shape[ax]],
                b: vec![mask.len()],
            });
        }
        let picks: Vec<isize> = mask
            .iter()
            .enumerate()
            .filter(|&(_, &m)| m)
            .map(|(i, _)| i as isize)
            .collect();
        self.take(&picks, axis)
    }
}
