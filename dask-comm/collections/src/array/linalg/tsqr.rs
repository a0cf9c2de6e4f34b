//! TSQR (Dask's `tsqr`) for tall-and-skinny arrays of one block column: a QR per block, a
//! QR of the stacked Rs (one task: one level of the tree), and Q's block i = Q_i · the rows
//! of the second Q that belong to block i. `svd` adds an SVD of the small R.

use dask_graph::{Arg, Graph, Task};

use super::super::create::key;
use super::super::{fresh_name, kernels as array_kernels, Array, ArrayError, DType};
use super::{factor, kernels};

fn tall_skinny(a: &Array, op: &'static str) -> Result<(), ArrayError> {
    if a.ndim() != 2 {
        return Err(ArrayError::Rank {
            op,
            expected: "a 2-d array",
            ndim: a.ndim(),
        });
    }
    if a.chunks[1].len() != 1 {
        return Err(ArrayError::NotTallSkinny {
            shape: a.shape.clone(),
            numblocks: a.numblocks(),
        });
    }
    Ok(())
}

/// The reduced QR factorization of an `m`×`n` array in one block column: Q (`m`×`k`, `a`'s
/// row blocks, orthonormal columns) and R (`k`×`n`, one block, upper triangular), with
/// `k = min(m, n)` and `a = Q·R`. Anything else is [`ArrayError::NotTallSkinny`] (rechunk
/// to one block column first).
///
/// ```
/// use dask_collections::array::{self, linalg};
/// let a = array::random::uniform(7, -1.0, 1.0, &[30, 4], [8, 4])?;
/// let (q, r) = linalg::qr(&a)?;
/// assert_eq!((q.shape(), r.shape()), (&[30, 4][..], &[4, 4][..]));
/// let back = q.matmul(&r)?.compute(&dask_graph::Sync)?.to_f64();
/// let want = a.compute(&dask_graph::Sync)?.to_f64();
/// assert!((back - want).iter().all(|d| d.abs() < 1e-12));
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn qr(a: &Array) -> Result<(Array, Array), ArrayError> {
    array_kernels::register();
    tall_skinny(a, "qr")?;
    let n = a.shape[1];
    let rows = &a.chunks[0];
    let stacked: usize = rows.iter().map(|&m| m.min(n)).sum();
    let k = stacked.min(n);
    let factors = fresh_name("qr-factors");
    let stack = key(&fresh_name("qr-stack"), &[]);
    let name = fresh_name("qr-q");
    let mut layer = Graph::new();
    for i in 0..rows.len() {
        layer.insert(
            key(&factors, &[i]),
            Task::new(kernels::QR_BLOCK, [Arg::key(a.block_key(&[i, 0]))]),
        );
        layer.insert(
            key(&name, &[i, 0]),
            Task::new(
                kernels::QR_Q,
                [
                    Arg::lit(i as u64),
                    Arg::key(key(&factors, &[i])),
                    Arg::key(stack),
                ],
            ),
        );
    }
    let parts = (0..rows.len()).map(|i| Arg::key(key(&factors, &[i])));
    layer.insert(
        stack,
        Task::new(kernels::QR_STACK, parts.collect::<Vec<_>>()),
    );
    let q = Array::from_layer(
        name,
        vec![a.shape[0], k],
        vec![rows.clone(), vec![k]],
        DType::F64,
        layer,
        &[a],
    );
    let r = factor("qr-r", stack, rows.len() as u64, vec![k, n], &[&q]);
    Ok((q, r))
}

/// The reduced SVD of an array in one block column (or one block row): U (`m`×`k`), S
/// (`k`, descending, non-negative) and Vᵀ (`k`×`n`) with `a = U·diag(S)·Vᵀ`, `k = min(m, n)`,
/// through TSQR and one SVD of the `k`×`n` R (of `aᵀ` for one block row). Anything else is
/// [`ArrayError::NotTallSkinny`].
///
/// ```
/// use dask_collections::array::{self, linalg};
/// let a = array::random::uniform(3, -1.0, 1.0, &[20, 3], [6, 3])?;
/// let (u, s, vt) = linalg::svd(&a)?;
/// let s = s.compute(&dask_graph::Sync)?.to_f64();
/// assert!(s[0] >= s[1] && s[1] >= s[2] && s[2] >= 0.0);
/// assert_eq!((u.shape(), vt.shape()), (&[20, 3][..], &[3, 3][..]));
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn svd(a: &Array) -> Result<(Array, Array, Array), ArrayError> {
    array_kernels::register();
    if a.ndim() == 2 && a.chunks[1].len() != 1 && a.chunks[0].len() == 1 {
        // aᵀ = U'·S·V'ᵀ, so a = V'·S·U'ᵀ.
        let (u, s, vt) = svd(&a.t()?)?;
        return Ok((vt.t()?, s, u.t()?));
    }
    let (q, r) = qr(a)?;
    let (k, n) = (r.shape[0], r.shape[1]);
    let factors = key(&fresh_name("svd-factors"), &[]);
    let mut layer = Graph::new();
    layer.insert(
        factors,
        Task::new(kernels::SVD_SMALL, [Arg::key(r.block_key(&[0, 0]))]),
    );
    let ur = super::one_block(
        fresh_name("svd-ur"),
        vec![k, k],
        layer,
        Task::new(kernels::ITEM, [Arg::lit(0u64), Arg::key(factors)]),
        &[&r],
    );
    let u = q.matmul(&ur)?;
    let s = factor("svd-s", factors, 1, vec![k], &[&ur]);
    let vt = factor("svd-vt", factors, 2, vec![k, n], &[&ur]);
    Ok((u, s, vt))
}
