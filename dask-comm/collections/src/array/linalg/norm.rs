//! `norm`: NumPy's vector and matrix norms, built from elementwise operations and
//! reductions (and, for the 2-norm and nuclear norm of a matrix, the singular values from
//! [`svd`](super::svd)).

use serde::{Deserialize, Serialize};

use super::super::{Array, ArrayError, BinaryOp, DType, UnaryOp};

/// A norm's order (NumPy's `ord`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum NormOrd {
    /// Frobenius (matrices only): the square root of the sum of squares.
    Fro,
    /// Nuclear (matrices only): the sum of the singular values.
    Nuc,
    /// `inf`: the largest |x| of a vector; the largest row sum of |x| of a matrix.
    Inf,
    /// `-inf`: the smallest |x|; the smallest row sum of |x|.
    NegInf,
    /// `p`: (Σ|x|ᵖ)^(1/p) of a vector (0 counts non-zeros); for a matrix 1 and −1 are the
    /// largest and smallest column sums of |x|, 2 and −2 the largest and smallest singular
    /// values.
    P(f64),
}

/// The norm of `a` over `axis` (one axis: a vector norm; two: a matrix norm), as NumPy's
/// `linalg.norm`. With no axes: for no `ord`, the 2-norm of all elements whatever the rank;
/// otherwise `a` must be 1-d or 2-d. `ord` `None` is the 2-norm of vectors and the Frobenius
/// norm of matrices. The result is a float (`f32` for `f32`, else `f64`). The orders from
/// singular values (matrix 2, −2, nuclear) take a 2-d `a`, without `keepdims`.
///
/// ```
/// use dask_collections::array::{self, linalg::{self, NormOrd}};
/// let x = array::from_array(&ndarray::arr2(&[[3.0, -4.0], [0.0, 0.0]]).into_dyn(), 1)?;
/// let fro = linalg::norm(&x, None, &[], false)?.compute(&dask_graph::Inline)?.to_f64();
/// assert_eq!(fro[[]], 5.0);
/// let rows = linalg::norm(&x, Some(NormOrd::P(1.0)), &[1], false)?;
/// assert_eq!(rows.compute(&dask_graph::Inline)?.to_f64().into_raw_vec_and_offset().0, vec![7.0, 0.0]);
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn norm(
    a: &Array,
    ord: Option<NormOrd>,
    axis: &[isize],
    keepdims: bool,
) -> Result<Array, ArrayError> {
    let x = if a.dtype.is_float() {
        a.clone()
    } else {
        a.astype(DType::F64)?
    };
    let axes: Vec<usize> = if axis.is_empty() {
        if ord.is_none() {
            return (&x * &x)?.sum(&[], keepdims)?.unary(UnaryOp::Sqrt);
        }
        (0..x.ndim()).collect()
    } else {
        let axes = axis
            .iter()
            .map(|&i| x.axis(i))
            .collect::<Result<Vec<_>, _>>()?;
        if axes.len() == 2 && axes[0] == axes[1] {
            return Err(ArrayError::Axis {
                axis: axis[1],
                ndim: x.ndim(),
            });
        }
        axes
    };
    match *axes.as_slice() {
        [ax] => vector(&x, ord.unwrap_or(NormOrd::P(2.0)), ax, keepdims),
        [r, c] => matrix(&x, ord.unwrap_or(NormOrd::Fro), r, c, keepdims),
        _ => Err(ArrayError::NormOrder {
            ord: ord.unwrap_or(NormOrd::Fro),
            axes: axes.len(),
        }),
    }
}

fn vector(x: &Array, ord: NormOrd, ax: usize, keepdims: bool) -> Result<Array, ArrayError> {
    let axes = [ax as isize];
    let abs = x.unary(UnaryOp::Abs)?;
    match ord {
        NormOrd::P(2.0) => (x * x)?.sum(&axes, keepdims)?.unary(UnaryOp::Sqrt),
        NormOrd::P(1.0) => abs.sum(&axes, keepdims),
        NormOrd::P(0.0) => x
            .scalar(BinaryOp::Ne, 0.0, false)?
            .sum(&axes, keepdims)?
            .astype(x.dtype),
        NormOrd::P(p) => abs
            .scalar(BinaryOp::Pow, p, false)?
            .sum(&axes, keepdims)?
            .scalar(BinaryOp::Pow, 1.0 / p, false),
        NormOrd::Inf => abs.max(&axes, keepdims),
        NormOrd::NegInf => abs.min(&axes, keepdims),
        NormOrd::Fro | NormOrd::Nuc => Err(ArrayError::NormOrder { ord, axes: 1 }),
    }
}

fn matrix(
    x: &Array,
    ord: NormOrd,
    r: usize,
    c: usize,
    keepdims: bool,
) -> Result<Array, ArrayError> {
    let both = [r as isize, c as isize];
    // The largest (smallest) over `outer` of the sums of |x| over `inner`.
    let sums = |inner: usize, outer: usize, largest: bool| -> Result<Array, ArrayError> {
        let s = x.unary(UnaryOp::Abs)?.sum(&[inner as isize], true)?;
        let m = if largest {
            s.max(&[outer as isize], true)?
        } else {
            s.min(&[outer as isize], true)?
        };
        if keepdims { Ok(m) } else { m.squeeze(&both) }
    };
    match ord {
        NormOrd::Fro => (x * x)?.sum(&both, keepdims)?.unary(UnaryOp::Sqrt),
        NormOrd::P(p) if p == 1.0 || p == -1.0 => sums(r, c, p > 0.0),
        NormOrd::Inf => sums(c, r, true),
        NormOrd::NegInf => sums(c, r, false),
        NormOrd::P(p) if (p == 2.0 || p == -2.0) && x.ndim() == 2 && !keepdims => {
            singular_values(x)?.max_or_min(p > 0.0)
        }
        NormOrd::Nuc if x.ndim() == 2 && !keepdims => singular_values(x)?.sum(&[], false),
        _ => Err(ArrayError::NormOrder { ord, axes: 2 }),
    }
}

/// The singular values of a 2-d `x` (rechunked to one block column, or row, when it has
/// neither).
fn singular_values(x: &Array) -> Result<Array, ArrayError> {
    let x = if x.chunks[0].len() == 1 || x.chunks[1].len() == 1 {
        x.clone()
    } else if x.shape[0] >= x.shape[1] {
        x.rechunk(vec![x.chunks[0].clone(), vec![x.shape[1]]])?
    } else {
        x.rechunk(vec![vec![x.shape[0]], x.chunks[1].clone()])?
    };
    Ok(super::svd(&x)?.1)
}

impl Array {
    fn max_or_min(&self, largest: bool) -> Result<Array, ArrayError> {
        if largest {
            self.max(&[], false)
        } else {
            self.min(&[], false)
        }
    }
}
