//! `cholesky`: the blocked right-looking algorithm (Dask's `_cholesky`) over square blocks.
//! Per block column k: L_kk = chol(A_kk − Σ_{j<k} L_kj L_kjᵀ), and below it
//! L_ik = (A_ik − Σ_{j<k} L_ij L_kjᵀ) L_kk⁻ᵀ by a triangular solve; zeros above.

use dask_graph::{Arg, Graph, Task};

use super::super::create::key;
use super::super::elementwise::common_chunks;
use super::super::{Array, ArrayError, DType, fresh_name};
use super::{kernels, square};

/// A square array in square blocks: the same boundaries on both axes (every boundary either
/// axis has).
pub(crate) fn square_blocks(a: &Array) -> Result<Array, ArrayError> {
    if a.chunks[0] == a.chunks[1] {
        return Ok(a.clone());
    }
    let c = common_chunks(&a.chunks[0], &a.chunks[1]);
    a.rechunk(vec![c.clone(), c])
}

/// The Cholesky factor of a symmetric positive definite `a`: lower-triangular L with
/// `a = L·Lᵀ` (`lower`), or upper-triangular U = Lᵀ with `a = Uᵀ·U`. Only the lower triangle
/// of `a` is read. Blocks are made square first (every boundary either axis has). A matrix
/// that is not positive definite fails when computed, as
/// [`ArrayError::NotPositiveDefinite`].
///
/// ```
/// use dask_collections::array::{self, linalg};
/// let a = ndarray::arr2(&[[4.0, 2.0, 0.0], [2.0, 5.0, 1.0], [0.0, 1.0, 2.0]]).into_dyn();
/// let x = array::from_array(&a, 2)?;
/// let u = linalg::cholesky(&x, false)?;
/// let back = u.t()?.matmul(&u)?.compute(&dask_graph::Inline)?.to_f64();
/// assert!((back - &a).iter().all(|d| d.abs() < 1e-12));
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn cholesky(a: &Array, lower: bool) -> Result<Array, ArrayError> {
    crate::array::register();
    a.require_known("cholesky")?;
    square(a, "cholesky")?;
    let a = square_blocks(a)?;
    let c = a.chunks[0].clone();
    let nb = c.len();
    let name = fresh_name("cholesky");
    let l = |i: usize, j: usize| Arg::key(key(&name, &[i, j]));
    let mut layer = Graph::new();
    for k in 0..nb {
        let mut diag = vec![Arg::key(a.block_key(&[k, k]))];
        diag.extend((0..k).map(|j| l(k, j)));
        layer.insert(key(&name, &[k, k]), Task::new(kernels::CHOL_DIAG, diag));
        for i in k + 1..nb {
            let mut off = vec![Arg::key(a.block_key(&[i, k])), l(k, k)];
            for j in 0..k {
                off.push(l(i, j));
                off.push(l(k, j));
            }
            layer.insert(key(&name, &[i, k]), Task::new(kernels::CHOL_OFF, off));
            layer.insert(
                key(&name, &[k, i]),
                Task::new(
                    crate::array::create::kernels().full,
                    [
                        Arg::lit(vec![c[k] as u64, c[i] as u64]),
                        Arg::lit(DType::F64),
                        Arg::lit(0.0f64),
                    ],
                ),
            );
        }
    }
    let l = Array::from_layer(
        name,
        a.shape.clone(),
        vec![c.clone(), c],
        DType::F64,
        layer,
        &[&a],
    );
    if lower { Ok(l) } else { l.t() }
}
