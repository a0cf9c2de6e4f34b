//! Solves: `solve_triangular` by blocked forward or back substitution, `solve_spd` through
//! Cholesky; `solve`, `inv` and `lstsq` through TSQR (`a = Q·R`, `x = R⁻¹·(Qᵀ·b)`), which
//! is backward stable without pivoting across blocks: `a` is rechunked to one block column,
//! and R is one block.

use dask_graph::{Arg, Graph, Task};

use super::super::create::key;
use super::super::elementwise::common_chunks;
use super::super::{Array, ArrayError, ChunkSpec, DType, eye, fresh_name};
use super::{kernels, square, tsqr};

/// Refuses a right-hand side that is not 1-d or 2-d or does not have `n` rows.
fn rhs(a: &Array, b: &Array, op: &'static str) -> Result<(), ArrayError> {
    if !(1..=2).contains(&b.ndim()) {
        return Err(ArrayError::Rank {
            op,
            expected: "a 1-d or 2-d right-hand side",
            ndim: b.ndim(),
        });
    }
    if b.shape[0] != a.shape[0] {
        return Err(ArrayError::Broadcast {
            a: a.shape.clone(),
            b: b.shape.clone(),
        });
    }
    Ok(())
}

/// `x` with `a·x = b` for a triangular `a` (the blocked substitution), refusing a diagonal
/// element at most `rcond` times the largest as singular.
fn substitute(a: &Array, b: &Array, lower: bool, rcond: f64) -> Result<Array, ArrayError> {
    let common = common_chunks(&common_chunks(&a.chunks[0], &a.chunks[1]), &b.chunks[0]);
    let a = a.rechunk(vec![common.clone(), common.clone()])?;
    let mut bc = b.chunks.clone();
    bc[0] = common.clone();
    let b = b.rechunk(bc)?;
    let nb = common.len();
    let cols = b.chunks.get(1).map_or(1, Vec::len);
    let idx = |i: usize, c: usize| if b.ndim() == 1 { vec![i] } else { vec![i, c] };
    let name = fresh_name("solve-triangular");
    let mut layer = Graph::new();
    for i in 0..nb {
        // Rows already solved: above for a lower-triangular a, below for an upper one.
        let done: Vec<usize> = if lower {
            (0..i).collect()
        } else {
            (i + 1..nb).collect()
        };
        for c in 0..cols {
            let mut args = vec![
                Arg::lit(lower),
                Arg::lit(rcond),
                Arg::key(a.block_key(&[i, i])),
                Arg::key(b.block_key(&idx(i, c))),
            ];
            for &j in &done {
                args.push(Arg::key(a.block_key(&[i, j])));
                args.push(Arg::key(key(&name, &idx(j, c))));
            }
            layer.insert(key(&name, &idx(i, c)), Task::new(kernels::TRSM, args));
        }
    }
    Ok(Array::from_layer(
        name,
        b.shape.clone(),
        b.chunks.clone(),
        DType::F64,
        layer,
        &[&a, &b],
    ))
}

/// `x` with `a·x = b` for a lower (`lower`) or upper triangular square `a` and a 1-d or 2-d
/// `b`, by blocked substitution (only `a`'s triangle is read). Blocks are made to line up
/// (square on `a`, and `b`'s rows with them). An exactly zero diagonal element fails when
/// computed, as [`ArrayError::Singular`].
///
/// ```
/// use dask_collections::array::{self, linalg};
/// let l = array::from_array(&ndarray::arr2(&[[2.0, 0.0], [1.0, 4.0]]).into_dyn(), 1)?;
/// let b = array::from_array(&ndarray::arr1(&[2.0, 9.0]).into_dyn(), 1)?;
/// let x = linalg::solve_triangular(&l, &b, true)?.compute(&dask_graph::Inline)?.to_f64();
/// assert_eq!(x.into_raw_vec_and_offset().0, vec![1.0, 2.0]);
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn solve_triangular(a: &Array, b: &Array, lower: bool) -> Result<Array, ArrayError> {
    crate::array::register();
    a.require_known("solve_triangular")?;
    b.require_known("solve_triangular")?;
    square(a, "solve_triangular")?;
    rhs(a, b, "solve_triangular")?;
    substitute(a, b, lower, 0.0)
}

/// `a` in one block column, R of its TSQR, and `y = Qᵀ·b`.
fn qr_and_project(a: &Array, b: &Array) -> Result<(Array, Array), ArrayError> {
    let n = a.shape[1];
    let one = a.rechunk(vec![a.chunks[0].clone(), vec![n]])?;
    let (q, r) = tsqr::qr(&one)?;
    Ok((r, q.t()?.dot(b)?))
}

/// `x` with `a·x = b` for a square `a` and a 1-d or 2-d `b`, through TSQR: `a` is rechunked
/// to one block column (its row blocks kept), `a = Q·R`, and `x = R⁻¹·(Qᵀ·b)` with R in one
/// block. A numerically singular `a` (a diagonal element of R at most `n·ε` times the
/// largest) fails when computed, as [`ArrayError::Singular`].
///
/// ```
/// use dask_collections::array::{self, linalg};
/// let a = array::from_array(&ndarray::arr2(&[[0.0, 2.0], [1.0, 1.0]]).into_dyn(), 1)?;
/// let b = array::from_array(&ndarray::arr1(&[4.0, 3.0]).into_dyn(), 1)?;
/// let x = linalg::solve(&a, &b)?.compute(&dask_graph::Inline)?.to_f64();
/// assert!((x[0] - 1.0).abs() < 1e-12 && (x[1] - 2.0).abs() < 1e-12);
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn solve(a: &Array, b: &Array) -> Result<Array, ArrayError> {
    crate::array::register();
    a.require_known("solve")?;
    b.require_known("solve")?;
    let n = square(a, "solve")?;
    rhs(a, b, "solve")?;
    let (r, y) = qr_and_project(a, b)?;
    substitute(&r, &y, false, n as f64 * f64::EPSILON)
}

/// `x` with `a·x = b` for a symmetric positive definite `a` (Dask's `solve` with
/// `assume_a="pos"`): `a = L·Lᵀ` by the blocked [`cholesky`](super::cholesky), then two
/// blocked triangular solves, so no task holds more than a few blocks. A matrix that is not
/// positive definite fails when computed, as [`ArrayError::NotPositiveDefinite`].
///
/// ```
/// use dask_collections::array::{self, linalg};
/// let a = array::from_array(&ndarray::arr2(&[[4.0, 2.0], [2.0, 3.0]]).into_dyn(), 1)?;
/// let b = array::from_array(&ndarray::arr1(&[8.0, 7.0]).into_dyn(), 1)?;
/// let x = linalg::solve_spd(&a, &b)?.compute(&dask_graph::Inline)?.to_f64();
/// assert!((x[0] - 1.25).abs() < 1e-12 && (x[1] - 1.5).abs() < 1e-12);
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn solve_spd(a: &Array, b: &Array) -> Result<Array, ArrayError> {
    crate::array::register();
    a.require_known("solve_spd")?;
    b.require_known("solve_spd")?;
    square(a, "solve_spd")?;
    rhs(a, b, "solve_spd")?;
    let l = super::cholesky(a, true)?;
    let y = substitute(&l, b, true, 0.0)?;
    substitute(&l.t()?, &y, false, 0.0)
}

/// The inverse of a square `a`: [`solve`] with the identity (in `a`'s row blocks).
///
/// ```
/// use dask_collections::array::{self, linalg};
/// let a = array::from_array(&ndarray::arr2(&[[2.0, 0.0], [0.0, 4.0]]).into_dyn(), 1)?;
/// let i = linalg::inv(&a)?.compute(&dask_graph::Inline)?.to_f64();
/// assert_eq!(i, ndarray::arr2(&[[0.5, 0.0], [0.0, 0.25]]).into_dyn());
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn inv(a: &Array) -> Result<Array, ArrayError> {
    crate::array::register();
    let n = square(a, "inv")?;
    let c = a.chunks[0].clone();
    solve(
        a,
        &eye(n, ChunkSpec::Explicit(vec![c.clone(), c]), 0, DType::F64)?,
    )
}

/// What [`lstsq`] returns, as Dask's `lstsq`.
#[derive(Debug, Clone)]
pub struct Lstsq {
    /// The least-squares solution: `n`, or `n`×`k` for a 2-d `b`.
    pub x: Array,
    /// The squared 2-norm of each column of `b − a·x`: `(1,)` for a 1-d `b`, `(k,)` for a
    /// 2-d one.
    pub residuals: Array,
    /// `a`'s rank (a 0-d `i64` array): singular values of R above `S.max()·n·ε`.
    pub rank: Array,
    /// `a`'s singular values (those of R), descending.
    pub s: Array,
}

/// The least-squares solution of `a·x = b` for an `m`×`n` `a` with `m ≥ n` (anything else is
/// [`ArrayError::NotTallSkinny`]) through TSQR: `x = R⁻¹·(Qᵀ·b)`, `a` rechunked to one block
/// column. A rank-deficient `a` whose R has an exactly zero diagonal element fails when
/// computed, as [`ArrayError::Singular`].
///
/// ```
/// use dask_collections::array::{self, linalg};
/// let a = array::from_array(&ndarray::arr2(&[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]).into_dyn(), 2)?;
/// let b = array::from_array(&ndarray::arr1(&[1.0, 1.0, 2.0]).into_dyn(), 2)?;
/// let fit = linalg::lstsq(&a, &b)?;
/// let x = fit.x.compute(&dask_graph::Inline)?.to_f64();
/// assert!((x[0] - 1.0).abs() < 1e-12 && (x[1] - 1.0).abs() < 1e-12);
/// assert_eq!(fit.rank.compute(&dask_graph::Inline)?.to_f64()[[]], 2.0);
/// # Ok::<(), array::ArrayError>(())
/// ```
pub fn lstsq(a: &Array, b: &Array) -> Result<Lstsq, ArrayError> {
    crate::array::register();
    a.require_known("lstsq")?;
    b.require_known("lstsq")?;
    if a.ndim() != 2 {
        return Err(ArrayError::Rank {
            op: "lstsq",
            expected: "a 2-d array",
            ndim: a.ndim(),
        });
    }
    if a.shape[0] < a.shape[1] {
        return Err(ArrayError::NotTallSkinny {
            shape: a.shape.clone(),
            numblocks: a.numblocks(),
        });
    }
    rhs(a, b, "lstsq")?;
    let n = a.shape[1];
    let (r, y) = qr_and_project(a, b)?;
    let x = substitute(&r, &y, false, 0.0)?;
    let diff = (b - &a.dot(&x)?)?;
    let residuals = (&diff * &diff)?.sum(&[0], b.ndim() == 1)?;
    let factors = key(&fresh_name("lstsq-svd"), &[]);
    let mut layer = Graph::new();
    layer.insert(
        factors,
        Task::new(kernels::SVD_SMALL, [Arg::key(r.block_key(&[0, 0]))]),
    );
    let s = super::one_block(
        fresh_name("lstsq-s"),
        vec![n],
        layer,
        Task::new(kernels::ITEM, [Arg::lit(1u64), Arg::key(factors)]),
        &[&r],
    );
    let rank = super::one_block(
        fresh_name("lstsq-rank"),
        vec![],
        Graph::new(),
        Task::new(
            kernels::RANK,
            [Arg::lit(n as u64), Arg::key(s.block_key(&[0]))],
        ),
        &[&s],
    );
    let rank = Array {
        dtype: DType::I64,
        ..rank
    };
    Ok(Lstsq {
        x,
        residuals,
        rank,
        s,
    })
}
