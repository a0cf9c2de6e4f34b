//! The task functions of the linear algebra: chunk-level factorizations and solves with
//! `faer`, all in `f64`. Several return a [`List`] of factors (a QR's Q and R, an SVD's U, S
//! and Vᵀ) that [`ITEM`] tasks take apart.

use std::sync::Arc;

use dask_graph::{List, Registry, Value};
use faer::linalg::triangular_solve::{
    solve_lower_triangular_in_place, solve_upper_triangular_in_place,
};
use faer::{Mat, MatRef, Par, Side};
use ndarray::{ArrayD, IxDyn};

use super::super::{Chunk, DType};

pub(crate) const TENSORDOT: &str = "dask-array-linalg-tensordot";
pub(crate) const CHOL_DIAG: &str = "dask-array-linalg-cholesky-diagonal";
pub(crate) const CHOL_OFF: &str = "dask-array-linalg-cholesky-offdiagonal";
pub(crate) const TRSM: &str = "dask-array-linalg-solve-triangular";
pub(crate) const QR_BLOCK: &str = "dask-array-linalg-qr-block";
pub(crate) const QR_STACK: &str = "dask-array-linalg-qr-stack";
pub(crate) const QR_Q: &str = "dask-array-linalg-qr-q";
pub(crate) const QR_APPLY: &str = "dask-array-linalg-qr-apply";
pub(crate) const SVD_SMALL: &str = "dask-array-linalg-svd";
pub(crate) const RANK: &str = "dask-array-linalg-rank";
pub(crate) const ITEM: &str = "dask-array-linalg-item";

/// How a Cholesky task says its matrix is not positive definite (the start of its error).
pub(crate) const NOT_SPD: &str = "not positive definite";
/// How a solve says its matrix is singular.
pub(crate) const SINGULAR: &str = "singular matrix";

/// A 2-d `f64` block in row-major order, viewed as a matrix in place.
fn view(c: &Chunk) -> Option<MatRef<'_, f64>> {
    match c {
        Chunk::F64(a) if a.ndim() == 2 => {
            let (r, k) = (a.shape()[0], a.shape()[1]);
            a.as_slice().map(|s| MatRef::from_row_major_slice(s, r, k))
        }
        _ => None,
    }
}

/// A 2-d block as a matrix (a 1-d block as one column).
pub(crate) fn mat(c: &Chunk) -> Result<Mat<f64>, String> {
    if let Some(m) = view(c) {
        return Ok(m.to_owned());
    }
    let a = c.to_f64();
    match *a.shape() {
        [n] => Ok(Mat::from_fn(n, 1, |i, _| a[[i]])),
        [r, k] => Ok(Mat::from_fn(r, k, |i, j| a[[i, j]])),
        ref s => Err(format!("a {}-d block where a matrix belongs", s.len())),
    }
}

/// A matrix as a 2-d `f64` block (1-d when `vector`: its one column).
pub(crate) fn chunk(m: MatRef<'_, f64>, vector: bool) -> Chunk {
    let (r, c) = (m.nrows(), m.ncols());
    let mut out = ndarray::Array2::<f64>::zeros((r, c));
    faer::MatMut::from_row_major_slice_mut(
        out.as_slice_mut().expect("a new array is row-major"),
        r,
        c,
    )
    .copy_from(m);
    if vector {
        Chunk::from(
            out.into_shape_with_order(IxDyn(&[r]))
                .expect("one column")
                .into_dyn(),
        )
    } else {
        Chunk::from(out.into_dyn())
    }
}

fn chunk_at(args: &[Value], i: usize) -> Result<&Chunk, String> {
    args.get(i)
        .and_then(|v| v.downcast_ref::<Chunk>())
        .ok_or_else(|| format!("argument {i} is not a chunk"))
}

fn list_at(args: &[Value], i: usize) -> Result<&List, String> {
    args.get(i)
        .and_then(|v| v.downcast_ref::<List>())
        .ok_or_else(|| format!("argument {i} is not a list of factors"))
}

fn item_of(l: &List, i: usize) -> Result<&Chunk, String> {
    l.0.get(i)
        .and_then(|v| v.downcast_ref::<Chunk>())
        .ok_or_else(|| format!("factor {i} of {} is missing", l.0.len()))
}

/// `m -= Σ x_j · y_j` (`y_j` transposed when `transposed`) over the pairs of blocks from
/// `args[from..]`.
fn subtract_products(
    m: &mut Mat<f64>,
    args: &[Value],
    from: usize,
    transposed: bool,
) -> Result<(), String> {
    let rest = args.len().saturating_sub(from);
    if !rest.is_multiple_of(2) {
        return Err(format!("{rest} blocks: pairs expected"));
    }
    for p in (from..args.len()).step_by(2) {
        // Read in place when row-major f64 (the usual case), copied otherwise.
        let (xc, yc) = (chunk_at(args, p)?, chunk_at(args, p + 1)?);
        let (xo, yo);
        let x = match view(xc) {
            Some(v) => v,
            None => {
                xo = mat(xc)?;
                xo.as_ref()
            }
        };
        let y = match view(yc) {
            Some(v) => v,
            None => {
                yo = mat(yc)?;
                yo.as_ref()
            }
        };
        let y = if transposed { y.transpose() } else { y };
        if x.ncols() != y.nrows() || x.nrows() != m.nrows() || y.ncols() != m.ncols() {
            return Err("blocks of a product do not line up".into());
        }
        faer::linalg::matmul::matmul(m.as_mut(), faer::Accum::Add, x, y, -1.0, Par::Seq);
    }
    Ok(())
}

/// Solves `t · X = rhs` in place for a triangular `t`; a diagonal element at most `rcond`
/// times the largest in magnitude (exactly zero for `rcond` 0) is a singular matrix.
pub(crate) fn triangular_solve(
    t: MatRef<'_, f64>,
    rhs: &mut Mat<f64>,
    lower: bool,
    rcond: f64,
) -> Result<(), String> {
    if t.nrows() != t.ncols() || t.nrows() != rhs.nrows() {
        return Err("a triangular block that does not match its right-hand side".into());
    }
    let big = (0..t.nrows()).fold(0f64, |m, i| m.max(t[(i, i)].abs()));
    if let Some(i) = (0..t.nrows()).find(|&i| t[(i, i)].abs() <= rcond * big || t[(i, i)] == 0.0) {
        return Err(format!("{SINGULAR}: diagonal element {i} is {}", t[(i, i)]));
    }
    if lower {
        solve_lower_triangular_in_place(t, rhs.as_mut(), Par::Seq);
    } else {
        solve_upper_triangular_in_place(t, rhs.as_mut(), Par::Seq);
    }
    Ok(())
}

/// `tensordot` of two blocks over `axes_a` and `axes_b`, in `t` (f64, f32 or i64).
fn tensordot_blocks(
    t: DType,
    axes_a: &[usize],
    axes_b: &[usize],
    args: &[Value],
) -> Result<Chunk, String> {
    macro_rules! td {
        ($v:ident) => {{
            let mut acc: Option<ArrayD<_>> = None;
            for p in (0..args.len()).step_by(2) {
                let (Chunk::$v(a), Chunk::$v(b)) = (
                    chunk_at(args, p)?.astype(t),
                    chunk_at(args, p + 1)?.astype(t),
                ) else {
                    unreachable!("cast to {t:?}")
                };
                let r = super::tensordot::contract(&a, &b, axes_a, axes_b)?;
                acc = Some(match acc {
                    Some(s) => s + r,
                    None => r,
                });
            }
            Chunk::from(acc.ok_or("no blocks to contract")?)
        }};
    }
    if !args.len().is_multiple_of(2) {
        return Err(format!("{} blocks: pairs expected", args.len()));
    }
    Ok(match t {
        DType::F64 => td!(F64),
        DType::F32 => td!(F32),
        _ => td!(I64),
    })
}

fn axes_of(v: Option<&Value>) -> Result<Vec<usize>, String> {
    v.and_then(|v| v.downcast_ref::<Vec<u64>>())
        .map(|a| a.iter().map(|&x| x as usize).collect())
        .ok_or_else(|| "axes expected".to_string())
}

/// QR of a block: a list of its thin Q and R.
fn qr_block(a: &Chunk) -> Result<Value, String> {
    let qr = mat(a)?.qr();
    Ok(Value::new(List(vec![
        Value::new(chunk(qr.compute_thin_Q().as_ref(), false)),
        Value::new(chunk(qr.thin_R(), false)),
    ])))
}

/// The second stage of TSQR: the QR of the blocks' stacked Rs, as a list of the rows of its Q
/// that belong to each block, then its R.
fn qr_stack(args: &[Value]) -> Result<Value, String> {
    let rs = (0..args.len())
        .map(|i| mat(item_of(list_at(args, i)?, 1)?))
        .collect::<Result<Vec<_>, _>>()?;
    let n = rs.first().map_or(0, |r| r.ncols());
    let rows: usize = rs.iter().map(|r| r.nrows()).sum();
    let mut stacked = Mat::<f64>::zeros(rows, n);
    let mut at = 0;
    for r in &rs {
        if r.ncols() != n {
            return Err("blocks of different widths".into());
        }
        stacked
            .as_mut()
            .submatrix_mut(at, 0, r.nrows(), n)
            .copy_from(r);
        at += r.nrows();
    }
    let qr = stacked.qr();
    let q = qr.compute_thin_Q();
    let mut out = Vec::with_capacity(rs.len() + 1);
    let mut at = 0;
    for r in &rs {
        let piece = q.as_ref().submatrix(at, 0, r.nrows(), q.ncols());
        out.push(Value::new(chunk(piece, false)));
        at += r.nrows();
    }
    out.push(Value::new(chunk(qr.thin_R(), false)));
    Ok(Value::new(List(out)))
}

/// Thin SVD of a small matrix: a list of U, S (1-d, descending) and Vᵀ.
fn svd_small(a: &Chunk) -> Result<Value, String> {
    let m = mat(a)?;
    let svd = m
        .thin_svd()
        .map_err(|e| format!("SVD did not converge: {e:?}"))?;
    let s = svd.S().column_vector();
    let s = Chunk::from(ArrayD::from_shape_fn(IxDyn(&[s.nrows()]), |i| s[i[0]]));
    Ok(Value::new(List(vec![
        Value::new(chunk(svd.U(), false)),
        Value::new(s),
        Value::new(chunk(svd.V().transpose(), false)),
    ])))
}

/// The rank of a matrix from its singular values (NumPy's `matrix_rank` tolerance:
/// `S.max() * max(M, N) * eps`), as a 0-d `i64` chunk.
fn rank(s: &Chunk, dims: usize) -> Chunk {
    let s = s.to_f64();
    let top = s.iter().fold(0f64, |m, v| m.max(*v));
    let tol = top * dims as f64 * f64::EPSILON;
    let r = s.iter().filter(|v| **v > tol).count() as i64;
    Chunk::from(ArrayD::from_elem(IxDyn(&[]), r))
}

/// Registers the linear algebra's task functions in `r`.
pub(crate) fn register_kernels(r: &Registry) {
    dask_graph::register_type::<List>();
    r.register_values(TENSORDOT, |args: &[Value]| {
        let Some(t) = args.first().and_then(|v| v.downcast_ref::<DType>()) else {
            return Err("tensordot takes a type, two lists of axes, then pairs of blocks".into());
        };
        let (aa, ab) = (axes_of(args.get(1))?, axes_of(args.get(2))?);
        tensordot_blocks(*t, &aa, &ab, &args[3..]).map(Value::new)
    });
    // L_kk = chol(A_kk - Σ_j L_kj L_kjᵀ): A_kk, then the L_kj.
    r.register_values(CHOL_DIAG, |args: &[Value]| {
        let mut s = mat(chunk_at(args, 0)?)?;
        for j in 1..args.len() {
            let l = mat(chunk_at(args, j)?)?;
            s -= &l * l.transpose();
        }
        if s.nrows() != s.ncols() {
            return Err("a diagonal block that is not square".into());
        }
        let llt = s
            .llt(Side::Lower)
            .map_err(|e| format!("{NOT_SPD}: {e:?}"))?;
        Ok(Value::new(chunk(llt.L(), false)))
    });
    // L_ik = (A_ik - Σ_j L_ij L_kjᵀ) L_kk⁻ᵀ: A_ik, L_kk, then pairs (L_ij, L_kj).
    r.register_values(CHOL_OFF, |args: &[Value]| {
        let mut x = mat(chunk_at(args, 0)?)?;
        let lkk = mat(chunk_at(args, 1)?)?;
        subtract_products(&mut x, args, 2, true)?;
        // L_ik L_kkᵀ = X, so L_kk L_ikᵀ = Xᵀ.
        let mut y = x.transpose().to_owned();
        triangular_solve(lkk.as_ref(), &mut y, true, 0.0)?;
        Ok(Value::new(chunk(y.transpose(), false)))
    });
    // X_i = T_ii⁻¹ (B_i - Σ_j T_ij X_j): lower, rcond, T_ii, B_i, then pairs (T_ij, X_j).
    r.register_values(TRSM, |args: &[Value]| {
        let (Some(lower), Some(rcond)) = (
            args.first().and_then(|v| v.downcast_ref::<bool>()),
            args.get(1).and_then(|v| v.downcast_ref::<f64>()),
        ) else {
            return Err("a triangular solve takes lower, rcond, then blocks".into());
        };
        let t = mat(chunk_at(args, 2)?)?;
        let b = chunk_at(args, 3)?;
        let mut x = mat(b)?;
        subtract_products(&mut x, args, 4, false)?;
        triangular_solve(t.as_ref(), &mut x, *lower, *rcond)?;
        Ok(Value::new(chunk(x.as_ref(), b.shape().len() == 1)))
    });
    r.register_values(QR_BLOCK, |args: &[Value]| qr_block(chunk_at(args, 0)?));
    r.register_values(QR_STACK, qr_stack);
    // Q_i = Q_block · (Q2's rows of block i): i, the block's factors, the stack's.
    r.register_values(QR_Q, |args: &[Value]| {
        let Some(&i) = args.first().and_then(|v| v.downcast_ref::<u64>()) else {
            return Err("qr-q takes a block number, then two lists of factors".into());
        };
        let q = mat(item_of(list_at(args, 1)?, 0)?)?;
        let q2 = mat(item_of(list_at(args, 2)?, i as usize)?)?;
        if q.ncols() != q2.nrows() {
            return Err("factors that do not line up".into());
        }
        Ok(Value::new(chunk((&q * &q2).as_ref(), false)))
    });
    // Q_i = Q_block · W_i: the block's factors, then W_i (its rows of the upper levels' Q).
    r.register_values(QR_APPLY, |args: &[Value]| {
        let q = mat(item_of(list_at(args, 0)?, 0)?)?;
        let w = mat(chunk_at(args, 1)?)?;
        if q.ncols() != w.nrows() {
            return Err("factors that do not line up".into());
        }
        Ok(Value::new(chunk((&q * &w).as_ref(), false)))
    });
    r.register_values(SVD_SMALL, |args: &[Value]| svd_small(chunk_at(args, 0)?));
    r.register(RANK, |dims: u64, s: Arc<Chunk>| rank(&s, dims as usize));
    r.register_values(ITEM, |args: &[Value]| {
        let Some(&i) = args.first().and_then(|v| v.downcast_ref::<u64>()) else {
            return Err("item takes an index, then a list".into());
        };
        list_at(args, 1)?
            .0
            .get(i as usize)
            .cloned()
            .ok_or_else(|| format!("no item {i}"))
    });
}
