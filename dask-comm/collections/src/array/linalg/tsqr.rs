//! TSQR (Dask's `tsqr`) for tall-and-skinny arrays of one block column: a QR per block, a
//! QR of the stacked Rs (one task for up to 16 blocks; beyond, a TSQR of the Rs stacked 16
//! to a block, recursively), and Q's block i = Q_i · the rows of the second Q that belong to
//! block i. `svd` adds an SVD of the small R; `svd_compressed` is the randomized SVD of any
//! 2-d array, through TSQR of its sketch.

use dask_graph::{Arg, Graph, Task};

use super::super::create::key;
use super::super::{Array, ArrayError, ChunkSpec, DType, Index, fresh_name, random};
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
/// let back = q.matmul(&r)?.compute(&dask_graph::Inline)?.to_f64();
/// let want = a.compute(&dask_graph::Inline)?.to_f64();
/// assert!((back - want).iter().all(|d| d.abs() < 1e-12));
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn qr(a: &Array) -> Result<(Array, Array), ArrayError> {
    crate::array::register();
    a.require_known("qr")?;
    tall_skinny(a, "qr")?;
    let n = a.shape[1];
    let rows = &a.chunks[0];
    if rows.len() > SPLIT && n > 0 {
        return tree(a);
    }
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

/// Most blocks whose Rs one task stacks; more make a tree (Dask's TSQR recursion).
const SPLIT: usize = 16;

/// TSQR of more than [`SPLIT`] blocks: the blocks' Rs, stacked [`SPLIT`] to a block, are
/// themselves factored by TSQR (recursively), and Q's block i is Q_i · (the rows of that
/// factorization's Q that belong to block i).
fn tree(a: &Array) -> Result<(Array, Array), ArrayError> {
    let n = a.shape[1];
    let rows = &a.chunks[0];
    let ks: Vec<usize> = rows.iter().map(|&m| m.min(n)).collect();
    let factors = fresh_name("qr-factors");
    let rs_name = fresh_name("qr-rs");
    let mut layer = Graph::new();
    for i in 0..rows.len() {
        layer.insert(
            key(&factors, &[i]),
            Task::new(kernels::QR_BLOCK, [Arg::key(a.block_key(&[i, 0]))]),
        );
        layer.insert(
            key(&rs_name, &[i, 0]),
            Task::new(
                kernels::ITEM,
                [Arg::lit(1u64), Arg::key(key(&factors, &[i]))],
            ),
        );
    }
    let rs = Array::from_layer(
        rs_name,
        vec![ks.iter().sum(), n],
        vec![ks.clone(), vec![n]],
        DType::F64,
        layer,
        &[a],
    );
    let groups: Vec<usize> = ks.chunks(SPLIT).map(|g| g.iter().sum()).collect();
    let (q2, r) = qr(&rs.rechunk(vec![groups, vec![n]])?)?;
    let k = q2.shape[1];
    let q2 = q2.rechunk(vec![ks, vec![k]])?;
    let name = fresh_name("qr-q");
    let mut layer = Graph::new();
    for i in 0..rows.len() {
        layer.insert(
            key(&name, &[i, 0]),
            Task::new(
                kernels::QR_APPLY,
                [
                    Arg::key(key(&factors, &[i])),
                    Arg::key(q2.block_key(&[i, 0])),
                ],
            ),
        );
    }
    let q = Array::from_layer(
        name,
        vec![a.shape[0], k],
        vec![rows.clone(), vec![k]],
        DType::F64,
        layer,
        &[&rs, &q2],
    );
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
/// let s = s.compute(&dask_graph::Inline)?.to_f64();
/// assert!(s[0] >= s[1] && s[1] >= s[2] && s[2] >= 0.0);
/// assert_eq!((u.shape(), vt.shape()), (&[20, 3][..], &[3, 3][..]));
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn svd(a: &Array) -> Result<(Array, Array, Array), ArrayError> {
    crate::array::register();
    a.require_known("svd")?;
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

/// Columns of the random test matrix beyond `k` (Dask's `n_oversamples` default).
const OVERSAMPLES: usize = 10;

/// The leading `k` singular triplets of any 2-d array by randomized compression (Halko,
/// Martinsson and Tropp; Dask's `svd_compressed`): `l = min(k + 10, m, n)` columns of
/// `a·Ω` for a normal Ω drawn from `seed`, `n_power_iter` power iterations
/// (`a·(aᵀ·Q)`, re-orthonormalised by TSQR), then the SVD of the small `Qᵀ·a`. U is
/// `m`×`k`, S `k`, Vᵀ `k`×`n`; `k` above `min(m, n)` is taken as `min(m, n)`. Exact for a
/// matrix of rank at most `k`; otherwise an approximation that power iterations sharpen.
///
/// ```
/// use dask_collections::array::{self, linalg};
/// let x = array::random::uniform(1, -1.0, 1.0, &[40, 2], [10, 2])?;
/// let y = array::random::uniform(2, -1.0, 1.0, &[2, 30], [2, 10])?;
/// let a = x.matmul(&y)?; // rank 2
/// let (_, s, _) = linalg::svd_compressed(&a, 2, 1, 42)?;
/// let (_, exact, _) = linalg::svd(&a.rechunk(vec![vec![10; 4], vec![30]])?)?;
/// let (s, exact) = (s.compute(&dask_graph::Inline)?.to_f64(), exact.compute(&dask_graph::Inline)?.to_f64());
/// assert!((s[0] - exact[0]).abs() < 1e-9 && (s[1] - exact[1]).abs() < 1e-9);
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn svd_compressed(
    a: &Array,
    k: usize,
    n_power_iter: usize,
    seed: u64,
) -> Result<(Array, Array, Array), ArrayError> {
    crate::array::register();
    a.require_known("svd_compressed")?;
    if a.ndim() != 2 {
        return Err(ArrayError::Rank {
            op: "svd_compressed",
            expected: "a 2-d array",
            ndim: a.ndim(),
        });
    }
    let (m, n) = (a.shape[0], a.shape[1]);
    let k = k.min(m).min(n);
    let l = (k + OVERSAMPLES).min(m).min(n);
    let omega = random::normal(
        seed,
        0.0,
        1.0,
        &[n, l],
        ChunkSpec::Explicit(vec![a.chunks[1].clone(), vec![l]]),
    )?;
    let mut y = a.matmul(&omega)?;
    for _ in 0..n_power_iter {
        let (q, _) = qr(&y)?;
        y = a.matmul(&a.t()?.matmul(&q)?)?;
    }
    let (q, _) = qr(&y)?;
    // Qᵀ·a is l×n in one block row: its SVD goes through TSQR of its transpose.
    let (ub, s, vt) = svd(&q.t()?.matmul(a)?)?;
    let u = q.matmul(&ub)?;
    let first = Index::Range(Some(0), Some(k as isize), 1);
    Ok((
        u.slice(&[Index::Full, first])?,
        s.slice(&[first])?,
        vt.slice(&[first, Index::Full])?,
    ))
}
