//! `tensordot` and `dot`: result block (free blocks of `a`, free blocks of `b`) sums the
//! per-block tensordots over every combination of contracted blocks.

use dask_graph::{Arg, Graph, Task};
use ndarray::{ArrayD, IxDyn, LinalgScalar};

use super::super::create::key;
use super::super::elementwise::common_chunks;
use super::super::{Array, ArrayError, block_indices, fresh_name};
use super::{kernels, product_type};

/// `a` and `b` contracted over `axes_a` and `axes_b` (NumPy's `tensordot` of two blocks).
pub(crate) fn contract<T: LinalgScalar>(
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    axes_a: &[usize],
    axes_b: &[usize],
) -> Result<ArrayD<T>, String> {
    let free_a: Vec<usize> = (0..a.ndim()).filter(|x| !axes_a.contains(x)).collect();
    let free_b: Vec<usize> = (0..b.ndim()).filter(|x| !axes_b.contains(x)).collect();
    if axes_a.len() != axes_b.len()
        || free_a.len() + axes_a.len() != a.ndim()
        || free_b.len() + axes_b.len() != b.ndim()
    {
        return Err("contracted axes that do not name axes of the blocks".into());
    }
    let lens = |x: &ArrayD<T>, axes: &[usize]| axes.iter().map(|&i| x.shape()[i]).collect();
    let (ca, cb): (Vec<usize>, Vec<usize>) = (lens(a, axes_a), lens(b, axes_b));
    if ca != cb {
        return Err(format!("contracted lengths {ca:?} and {cb:?} differ"));
    }
    let (fa, fb): (Vec<usize>, Vec<usize>) = (lens(a, &free_a), lens(b, &free_b));
    let c: usize = ca.iter().product();
    let perm_a: Vec<usize> = free_a.iter().chain(axes_a).copied().collect();
    let perm_b: Vec<usize> = axes_b.iter().chain(&free_b).copied().collect();
    let flat = |x: &ArrayD<T>, perm: &[usize], rows: usize, cols: usize| {
        x.view()
            .permuted_axes(IxDyn(perm))
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order((rows, cols))
            .map_err(|e| e.to_string())
    };
    let a2 = flat(a, &perm_a, fa.iter().product(), c)?;
    let b2 = flat(b, &perm_b, c, fb.iter().product())?;
    let shape: Vec<usize> = fa.into_iter().chain(fb).collect();
    a2.dot(&b2)
        .into_shape_with_order(IxDyn(&shape))
        .map_err(|e| e.to_string())
}

impl Array {
    /// `a` and `b` contracted over `axes_a` and `axes_b` (paired in order; negative axes
    /// count from the end), as NumPy's `tensordot(a, b, (axes_a, axes_b))`: the result's axes
    /// are `a`'s other axes, then `b`'s. Contracted axes whose blocks do not line up are
    /// rechunked to ones that do. Integers and booleans multiply as `i64`.
    ///
    /// ```
    /// use dask_collections::array;
    /// let a = array::ones(&[2, 3, 4], 2, array::DType::F64)?;
    /// let b = array::ones(&[4, 3, 5], [3, 1, 5], array::DType::F64)?;
    /// let c = a.tensordot(&b, &[1, 2], &[1, 0])?;
    /// assert_eq!(c.shape(), &[2, 5]);
    /// let v = c.compute(&dask_graph::Inline)?.to_f64();
    /// assert!(v.iter().all(|&x| x == 12.0));
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn tensordot(
        &self,
        other: &Array,
        axes_a: &[isize],
        axes_b: &[isize],
    ) -> Result<Array, ArrayError> {
        crate::array::register();
        self.require_known("tensordot")?;
        other.require_known("tensordot")?;
        let aa = distinct(self, axes_a)?;
        let ab = distinct(other, axes_b)?;
        let mismatch = || ArrayError::Broadcast {
            a: self.shape.clone(),
            b: other.shape.clone(),
        };
        if aa.len() != ab.len()
            || aa
                .iter()
                .zip(&ab)
                .any(|(&i, &j)| self.shape[i] != other.shape[j])
        {
            return Err(mismatch());
        }
        let (mut ca, mut cb) = (self.chunks.clone(), other.chunks.clone());
        for (&i, &j) in aa.iter().zip(&ab) {
            if ca[i] != cb[j] {
                let common = common_chunks(&ca[i], &cb[j]);
                ca[i] = common.clone();
                cb[j] = common;
            }
        }
        if ca != self.chunks || cb != other.chunks {
            return self
                .rechunk(ca)?
                .tensordot(&other.rechunk(cb)?, axes_a, axes_b);
        }
        let free_a: Vec<usize> = (0..self.ndim()).filter(|x| !aa.contains(x)).collect();
        let free_b: Vec<usize> = (0..other.ndim()).filter(|x| !ab.contains(x)).collect();
        let ndim = free_a.len() + free_b.len();
        if ndim > dask_graph::MAX_INDICES {
            return Err(ArrayError::TooManyAxes {
                ndim,
                max: dask_graph::MAX_INDICES,
            });
        }
        let t = product_type(self.dtype, other.dtype);
        let chunks: Vec<Vec<usize>> = free_a
            .iter()
            .map(|&i| self.chunks[i].clone())
            .chain(free_b.iter().map(|&j| other.chunks[j].clone()))
            .collect();
        let shape: Vec<usize> = chunks.iter().map(|c| c.iter().sum()).collect();
        let inner: Vec<usize> = aa.iter().map(|&i| self.chunks[i].len()).collect();
        let lit = |axes: &[usize]| Arg::lit(axes.iter().map(|&x| x as u64).collect::<Vec<u64>>());
        let name = fresh_name("tensordot");
        let mut layer = Graph::new();
        let grid: Vec<usize> = chunks.iter().map(Vec::len).collect();
        for idx in block_indices(&grid) {
            let mut args = vec![Arg::lit(t), lit(&aa), lit(&ab)];
            for combo in block_indices(&inner) {
                let mut ia = vec![0; self.ndim()];
                let mut ib = vec![0; other.ndim()];
                for (p, &i) in free_a.iter().enumerate() {
                    ia[i] = idx[p];
                }
                for (p, &j) in free_b.iter().enumerate() {
                    ib[j] = idx[free_a.len() + p];
                }
                for (p, (&i, &j)) in aa.iter().zip(&ab).enumerate() {
                    ia[i] = combo[p];
                    ib[j] = combo[p];
                }
                args.push(Arg::key(self.block_key(&ia)));
                args.push(Arg::key(other.block_key(&ib)));
            }
            layer.insert(key(&name, &idx), Task::new(kernels::TENSORDOT, args));
        }
        Ok(Array::from_layer(
            name,
            shape,
            chunks,
            t,
            layer,
            &[self, other],
        ))
    }

    /// NumPy's `dot`: the matrix product of 2-d arrays ([`Array::matmul`]), the inner product
    /// of 1-d ones, and in general a sum over `a`'s last axis and `b`'s second-to-last (its
    /// only one when 1-d); with a 0-d operand, the elementwise product.
    ///
    /// ```
    /// use dask_collections::array;
    /// let a = array::arange(0.0, 6.0, 1.0, 4, array::DType::F64)?;
    /// let d = a.dot(&a)?.compute(&dask_graph::Inline)?.to_f64();
    /// assert_eq!(d.into_raw_vec_and_offset().0, vec![55.0]);
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn dot(&self, other: &Array) -> Result<Array, ArrayError> {
        match (self.ndim(), other.ndim()) {
            (0, _) | (_, 0) => self.binary(super::super::BinaryOp::Mul, other),
            (2, 2) => self.matmul(other),
            (_, nb) => {
                let inner = if nb >= 2 { nb as isize - 2 } else { 0 };
                self.tensordot(other, &[-1], &[inner])
            }
        }
    }
}

/// Normalised axes, each named once.
fn distinct(a: &Array, axes: &[isize]) -> Result<Vec<usize>, ArrayError> {
    let out = axes
        .iter()
        .map(|&x| a.axis(x))
        .collect::<Result<Vec<_>, _>>()?;
    for (p, x) in out.iter().enumerate() {
        if out[..p].contains(x) {
            return Err(ArrayError::Axis {
                axis: axes[p],
                ndim: a.ndim(),
            });
        }
    }
    Ok(out)
}
