//! Property tests of `array::linalg`: random sizes and chunkings, each factorization checked
//! by reconstruction and against `faer` or ndarray on the whole matrix, on the `Inline` and
//! `Threaded` schedulers and on an in-process `LocalCluster`.

use crate::common::{cluster, schedulers};
use dask_collections::array::linalg::{self, NormOrd};
use dask_collections::array::{self, Array, ArrayError, DType};
use dask_graph::{Inline, Threaded};
use ndarray::{Array2, ArrayD, Ix2, IxDyn};
use proptest::prelude::*;

/// Relative tolerance of every check (the matrices are well conditioned).
const TOL: f64 = 1e-9;

/// `a` computed on every scheduler (the cluster too), as `f64`s, each checked to be `f64`.
fn on_all(a: &Array) -> Vec<(&'static str, ArrayD<f64>)> {
    let mut out: Vec<(&str, ArrayD<f64>)> = schedulers()
        .into_iter()
        .map(|(n, s)| (n, a.compute(s.as_ref()).expect("computes").to_f64()))
        .collect();
    out.push((
        "cluster",
        a.compute(cluster())
            .expect("computes on the cluster")
            .to_f64(),
    ));
    assert_eq!(a.dtype(), DType::F64);
    out
}

/// Whether `got` is `want` to `TOL` relative to `want`'s largest element (at least 1).
fn close(got: &ArrayD<f64>, want: &ArrayD<f64>, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shapes");
    let scale = want.iter().fold(1f64, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(want)
        .fold(0f64, |m, (g, w)| m.max((g - w).abs()));
    assert!(
        worst <= TOL * scale,
        "{what}: off by {worst} (scale {scale})\ngot {got}\nwant {want}"
    );
}

/// Every scheduler's result of `a` close to `want`.
fn check(a: &Array, want: &ArrayD<f64>, what: &str) {
    for (name, got) in on_all(a) {
        close(&got, want, &format!("{what} on {name}"));
    }
}

fn m2(x: &ArrayD<f64>) -> Array2<f64> {
    x.clone().into_dimensionality::<Ix2>().expect("2-d")
}

/// A random matrix, uniform on [-1, 1).
fn random(seed: u64, r: usize, c: usize) -> Array2<f64> {
    let a = array::random::uniform(seed, -1.0, 1.0, &[r, c], [r.max(1), c.max(1)]).unwrap();
    m2(&a.compute(&Inline).unwrap().to_f64())
}

fn faer(x: &Array2<f64>) -> faer::Mat<f64> {
    faer::Mat::from_fn(x.nrows(), x.ncols(), |i, j| x[[i, j]])
}

/// The singular values of the whole matrix, descending, by `faer`.
fn singular_values(x: &Array2<f64>) -> Vec<f64> {
    faer(x).singular_values().expect("an SVD")
}

/// `n`×`n`, symmetric positive definite: MᵀM + n·I.
fn spd(seed: u64, n: usize) -> Array2<f64> {
    let m = random(seed, n, n);
    m.t().dot(&m) + Array2::<f64>::eye(n) * n as f64
}

/// Square and well conditioned: M + n·I.
fn well_conditioned(seed: u64, n: usize) -> Array2<f64> {
    random(seed, n, n) + Array2::<f64>::eye(n) * n as f64
}

fn is_lower(x: &Array2<f64>) -> bool {
    x.indexed_iter().all(|((i, j), v)| j <= i || *v == 0.0)
}

/// A size, and block sizes along it of 1 to the size.
fn sized(max: usize) -> impl Strategy<Value = (usize, usize, usize)> {
    (1..=max).prop_flat_map(|n| (Just(n), 1..=n, 1..=n))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn cholesky_reconstructs_spd_matrices((n, c0, c1) in sized(24), seed in any::<u64>()) {
        let a = spd(seed, n);
        // Blocks of different lengths on the two axes are made square first.
        let x = array::from_array(&a.clone().into_dyn(), [c0, c1]).unwrap();
        let l = linalg::cholesky(&x, true).unwrap();
        for (name, got) in on_all(&l) {
            let got = m2(&got);
            prop_assert!(is_lower(&got), "L on {} is not lower triangular:\n{}", name, got);
            close(&got.dot(&got.t()).into_dyn(), &a.clone().into_dyn(), &format!("L·Lᵀ on {name}"));
        }
        let u = m2(&linalg::cholesky(&x, false).unwrap().compute(&Inline).unwrap().to_f64());
        prop_assert!(is_lower(&u.t().to_owned()), "U is not upper triangular:\n{}", u);
        close(&u.t().dot(&u).into_dyn(), &a.into_dyn(), "Uᵀ·U");
    }

    #[test]
    fn qr_reconstructs_and_q_is_orthonormal(
        (m, c, _) in sized(40),
        n in 1usize..=8,
        seed in any::<u64>(),
    ) {
        let a = random(seed, m, n);
        let x = array::from_array(&a.clone().into_dyn(), [c, n]).unwrap();
        let (q, r) = linalg::qr(&x).unwrap();
        let k = m.min(n);
        prop_assert_eq!((q.shape(), r.shape()), (&[m, k][..], &[k, n][..]));
        prop_assert_eq!(q.chunks()[0].clone(), x.chunks()[0].clone());
        let (qs, rs) = (on_all(&q), on_all(&r));
        for ((name, q), (_, r)) in qs.iter().zip(&rs) {
            let (q, r) = (m2(q), m2(r));
            close(&q.dot(&r).into_dyn(), &a.clone().into_dyn(), &format!("Q·R on {name}"));
            close(&q.t().dot(&q).into_dyn(), &Array2::<f64>::eye(k).into_dyn(), &format!("QᵀQ on {name}"));
            prop_assert!(is_lower(&r.t().to_owned()), "R on {} is not upper triangular:\n{}", name, r);
        }
    }

    #[test]
    fn svd_reconstructs_and_matches_the_whole(
        (m, c, _) in sized(40),
        n in 1usize..=8,
        wide in any::<bool>(),
        seed in any::<u64>(),
    ) {
        // Tall in one block column, or its transpose: wide in one block row.
        let (a, chunks) = if wide {
            (random(seed, n, m), [n, c])
        } else {
            (random(seed, m, n), [c, n])
        };
        let x = array::from_array(&a.clone().into_dyn(), chunks).unwrap();
        let (u, s, vt) = linalg::svd(&x).unwrap();
        let k = m.min(n);
        prop_assert_eq!(s.shape(), &[k][..]);
        let want_s = singular_values(&a);
        let (us, ss, vts) = (on_all(&u), on_all(&s), on_all(&vt));
        for (((name, u), (_, s)), (_, vt)) in us.iter().zip(&ss).zip(&vts) {
            let (u, vt) = (m2(u), m2(vt));
            prop_assert!(s.iter().all(|&v| v >= 0.0), "negative singular values on {}", name);
            prop_assert!(s.iter().zip(s.iter().skip(1)).all(|(p, q)| p >= q), "S on {} not descending: {}", name, s);
            close(s, &ArrayD::from_shape_vec(IxDyn(&[k]), want_s.clone()).unwrap(), &format!("S on {name}"));
            let us_ = &u * &s.clone().into_dimensionality::<ndarray::Ix1>().unwrap();
            close(&us_.dot(&vt).into_dyn(), &a.clone().into_dyn(), &format!("U·S·Vᵀ on {name}"));
            close(&u.t().dot(&u).into_dyn(), &Array2::<f64>::eye(k).into_dyn(), &format!("UᵀU on {name}"));
        }
    }

    #[test]
    fn svd_compressed_recovers_a_low_rank_matrix(
        (m, c0, _) in sized(40),
        (n, c1, _) in sized(12),
        rank in 1usize..=3,
        power in 0usize..=2,
        seed in any::<u64>(),
    ) {
        // A matrix of rank at most `rank`: the compression loses nothing, so S and U·S·Vᵀ
        // are exact (to rounding) whatever Ω is.
        let a = random(seed, m, rank).dot(&random(seed ^ 7, rank, n));
        let x = array::from_array(&a.clone().into_dyn(), [c0, c1]).unwrap();
        let (u, s, vt) = linalg::svd_compressed(&x, rank, power, seed ^ 11).unwrap();
        let k = rank.min(m).min(n);
        prop_assert_eq!((u.shape(), s.shape(), vt.shape()), (&[m, k][..], &[k][..], &[k, n][..]));
        let want_s = singular_values(&a);
        let (us, ss, vts) = (on_all(&u), on_all(&s), on_all(&vt));
        for (((name, u), (_, s)), (_, vt)) in us.iter().zip(&ss).zip(&vts) {
            close(s, &ArrayD::from_shape_vec(IxDyn(&[k]), want_s[..k].to_vec()).unwrap(), &format!("S on {name}"));
            let us_ = &m2(u) * &s.clone().into_dimensionality::<ndarray::Ix1>().unwrap();
            close(&us_.dot(&m2(vt)).into_dyn(), &a.clone().into_dyn(), &format!("U·S·Vᵀ on {name}"));
        }
    }

    #[test]
    fn solve_triangular_matches_substitution_on_the_whole(
        (n, c0, c1) in sized(24),
        k in 0usize..=3,
        lower in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let t = well_conditioned(seed, n);
        let t = if lower {
            Array2::from_shape_fn((n, n), |(i, j)| if j <= i { t[[i, j]] } else { 0.0 })
        } else {
            Array2::from_shape_fn((n, n), |(i, j)| if j >= i { t[[i, j]] } else { 0.0 })
        };
        // k = 0: a 1-d right-hand side.
        let b = random(seed ^ 5, n, k.max(1));
        let b = if k == 0 { b.column(0).to_owned().into_dyn() } else { b.into_dyn() };
        let mut want = faer(&m2(&if k == 0 { b.clone().insert_axis(ndarray::Axis(1)) } else { b.clone() }));
        if lower {
            faer::linalg::triangular_solve::solve_lower_triangular_in_place(faer(&t).as_ref(), want.as_mut(), faer::Par::Seq);
        } else {
            faer::linalg::triangular_solve::solve_upper_triangular_in_place(faer(&t).as_ref(), want.as_mut(), faer::Par::Seq);
        }
        let want = ArrayD::from_shape_fn(IxDyn(b.shape()), |i| want[(i[0], if k == 0 { 0 } else { i[1] })]);
        let a = array::from_array(&t.into_dyn(), [c0, c1]).unwrap();
        let bx = array::from_array(&b, if k == 0 { vec![c1] } else { vec![c1, 2] }).unwrap();
        let x = linalg::solve_triangular(&a, &bx, lower).unwrap();
        prop_assert_eq!(x.shape(), b.shape());
        check(&x, &want, "solve_triangular");
    }

    #[test]
    fn solve_solve_spd_and_inv_leave_small_residuals(
        (n, c0, c1) in sized(24),
        k in 0usize..=3,
        seed in any::<u64>(),
    ) {
        let a = well_conditioned(seed, n);
        let b = random(seed ^ 9, n, k.max(1));
        let b = if k == 0 { b.column(0).to_owned().into_dyn() } else { b.into_dyn() };
        let ax = array::from_array(&a.clone().into_dyn(), [c0, c1]).unwrap();
        let bx = array::from_array(&b, if k == 0 { vec![c0] } else { vec![c1, 1] }).unwrap();
        let x = linalg::solve(&ax, &bx).unwrap();
        for (name, got) in on_all(&x) {
            let back = if k == 0 {
                a.dot(&got.into_dimensionality::<ndarray::Ix1>().unwrap()).into_dyn()
            } else {
                a.dot(&m2(&got)).into_dyn()
            };
            close(&back, &b, &format!("a·solve(a, b) on {name}"));
        }
        // Symmetric positive definite: through Cholesky, in the same blocks.
        let p = spd(seed ^ 13, n);
        let px = array::from_array(&p.clone().into_dyn(), [c0, c1]).unwrap();
        let x = linalg::solve_spd(&px, &bx).unwrap();
        for (name, got) in on_all(&x) {
            let back = if k == 0 {
                p.dot(&got.into_dimensionality::<ndarray::Ix1>().unwrap()).into_dyn()
            } else {
                p.dot(&m2(&got)).into_dyn()
            };
            close(&back, &b, &format!("p·solve_spd(p, b) on {name}"));
        }
        let inv = linalg::inv(&ax).unwrap();
        for (name, got) in on_all(&inv) {
            close(&a.dot(&m2(&got)).into_dyn(), &Array2::<f64>::eye(n).into_dyn(), &format!("a·inv(a) on {name}"));
        }
    }

    #[test]
    fn lstsq_satisfies_the_normal_equations(
        (m, c, _) in sized(40),
        n in 1usize..=6,
        two_d in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let m = m.max(n);
        let c = c.min(m);
        let a = random(seed, m, n) + Array2::<f64>::eye(m).slice(ndarray::s![.., ..n]).to_owned() * 3.0;
        let b = random(seed ^ 3, m, 2);
        let b = if two_d { b.into_dyn() } else { b.column(0).to_owned().into_dyn() };
        let ax = array::from_array(&a.clone().into_dyn(), [c, n.min(2)]).unwrap();
        let bx = array::from_array(&b, if two_d { vec![c, 1] } else { vec![c] }).unwrap();
        let fit = linalg::lstsq(&ax, &bx).unwrap();
        let mut want_residuals = None;
        for (name, x) in on_all(&fit.x) {
            let x = if two_d { m2(&x) } else { x.insert_axis(ndarray::Axis(1)).into_dimensionality().unwrap() };
            let b2 = if two_d { m2(&b) } else { b.clone().insert_axis(ndarray::Axis(1)).into_dimensionality().unwrap() };
            let r = &b2 - &a.dot(&x);
            // Aᵀ(b − A·x) = 0 at the least-squares solution.
            close(&a.t().dot(&r).into_dyn(), &Array2::<f64>::zeros((n, b2.ncols())).into_dyn(), &format!("Aᵀ·r on {name}"));
            want_residuals = Some(r.mapv(|v| v * v).sum_axis(ndarray::Axis(0)).into_dyn());
        }
        // Dask keeps the axis for a 1-d b: shape (1,).
        check(&fit.residuals, &want_residuals.unwrap(), "residuals");
        let rank = fit.rank.compute(&Inline).unwrap();
        prop_assert_eq!(rank.dtype(), DType::I64);
        prop_assert_eq!(rank.to_f64()[[]], n as f64);
        check(&fit.s, &ArrayD::from_shape_vec(IxDyn(&[n]), singular_values(&a)).unwrap(), "s");
    }

    #[test]
    fn dot_and_tensordot_match_ndarray(
        (m, cm, _) in sized(9),
        (k, ck, _) in sized(9),
        (n, cn, _) in sized(9),
        seed in any::<u64>(),
    ) {
        let a = random(seed, m, k);
        let b = random(seed ^ 1, k, n);
        let v = random(seed ^ 2, k, 1).column(0).to_owned();
        let w = random(seed ^ 4, m, 1).column(0).to_owned();
        let ax = array::from_array(&a.clone().into_dyn(), [cm, ck]).unwrap();
        // b's inner blocks differ from a's: they are unified.
        let bx = array::from_array(&b.clone().into_dyn(), [ck.div_ceil(2).max(1), cn]).unwrap();
        let vx = array::from_array(&v.clone().into_dyn(), ck).unwrap();
        let wx = array::from_array(&w.clone().into_dyn(), cm).unwrap();
        check(&ax.dot(&bx).unwrap(), &a.dot(&b).into_dyn(), "2-d · 2-d");
        check(&ax.dot(&vx).unwrap(), &a.dot(&v).into_dyn(), "2-d · 1-d");
        check(&wx.dot(&ax).unwrap(), &w.dot(&a).into_dyn(), "1-d · 2-d");
        check(&vx.dot(&vx).unwrap(), &ArrayD::from_elem(IxDyn(&[]), v.dot(&v)), "1-d · 1-d");
        // A 3-d tensor contracted over two axes: t[i, j, l] · a[l, j] (sum over j and l).
        let t = ArrayD::from_shape_fn(IxDyn(&[n, k, m]), |i| (i[0] * 7 + i[1] * 3 + i[2]) as f64 / 10.0 - 1.0);
        let tx = array::from_array(&t, [cn, ck, cm]).unwrap();
        let want = ArrayD::from_shape_fn(IxDyn(&[n]), |i| {
            let mut s = 0.0;
            for j in 0..k { for l in 0..m { s += t[[i[0], j, l]] * a[[l, j]]; } }
            s
        });
        check(&tx.tensordot(&ax, &[1, -1], &[1, 0]).unwrap(), &want, "tensordot over two axes");
        // No axes: the outer product.
        let outer = ArrayD::from_shape_fn(IxDyn(&[m, k]), |i| w[i[0]] * v[i[1]]);
        check(&wx.tensordot(&vx, &[], &[]).unwrap(), &outer, "outer product");
    }

    #[test]
    fn norms_match_their_definitions((m, c0, c1) in sized(12), n in 1usize..=6, seed in any::<u64>()) {
        let a = random(seed, m, n);
        let x = array::from_array(&a.clone().into_dyn(), [c0, c1.min(n)]).unwrap();
        let scalar = |v: f64| ArrayD::from_elem(IxDyn(&[]), v);
        let abs = a.mapv(f64::abs);
        let fro = a.mapv(|v| v * v).sum().sqrt();
        check(&linalg::norm(&x, None, &[], false).unwrap(), &scalar(fro), "default");
        check(&linalg::norm(&x, Some(NormOrd::Fro), &[], false).unwrap(), &scalar(fro), "fro");
        let cols = abs.sum_axis(ndarray::Axis(0));
        let rows = abs.sum_axis(ndarray::Axis(1));
        let max = |x: &ndarray::Array1<f64>| x.fold(f64::MIN, |m, v| m.max(*v));
        let min = |x: &ndarray::Array1<f64>| x.fold(f64::MAX, |m, v| m.min(*v));
        check(&linalg::norm(&x, Some(NormOrd::P(1.0)), &[], false).unwrap(), &scalar(max(&cols)), "1");
        check(&linalg::norm(&x, Some(NormOrd::P(-1.0)), &[], false).unwrap(), &scalar(min(&cols)), "-1");
        check(&linalg::norm(&x, Some(NormOrd::Inf), &[], false).unwrap(), &scalar(max(&rows)), "inf");
        check(&linalg::norm(&x, Some(NormOrd::NegInf), &[], false).unwrap(), &scalar(min(&rows)), "-inf");
        let s = singular_values(&a);
        check(&linalg::norm(&x, Some(NormOrd::P(2.0)), &[], false).unwrap(), &scalar(s[0]), "2");
        check(&linalg::norm(&x, Some(NormOrd::Nuc), &[], false).unwrap(), &scalar(s.iter().sum()), "nuc");
        let kept = linalg::norm(&x, Some(NormOrd::P(1.0)), &[0, 1], true).unwrap();
        check(&kept, &ArrayD::from_elem(IxDyn(&[1, 1]), max(&cols)), "1 keepdims");
        // Vector norms along each row.
        let along = |f: &dyn Fn(ndarray::ArrayView1<f64>) -> f64| {
            ArrayD::from_shape_fn(IxDyn(&[m]), |i| f(a.row(i[0])))
        };
        check(&linalg::norm(&x, None, &[1], false).unwrap(), &along(&|r| r.dot(&r).sqrt()), "row 2-norms");
        check(&linalg::norm(&x, Some(NormOrd::P(1.0)), &[-1], false).unwrap(), &along(&|r| r.mapv(f64::abs).sum()), "row 1-norms");
        check(&linalg::norm(&x, Some(NormOrd::Inf), &[1], false).unwrap(), &along(&|r| r.fold(0.0, |m, v| m.max(v.abs()))), "row inf-norms");
        check(&linalg::norm(&x, Some(NormOrd::P(3.0)), &[1], false).unwrap(), &along(&|r| r.mapv(|v| v.abs().powi(3)).sum().cbrt()), "row 3-norms");
        check(&linalg::norm(&x, Some(NormOrd::P(0.0)), &[1], false).unwrap(), &along(&|r| r.iter().filter(|v| **v != 0.0).count() as f64), "row 0-norms");
    }
}

#[test]
fn many_blocks_make_a_tsqr_tree() {
    // 300 blocks: Rs stacked 16 to a block, twice, before one task factors the last stack.
    for (m, c, n) in [(600, 2, 3), (170, 1, 4), (90, 5, 7)] {
        let a = random(m as u64, m, n);
        let x = array::from_array(&a.clone().into_dyn(), [c, n]).unwrap();
        let (q, r) = linalg::qr(&x).unwrap();
        let (qs, rs) = (on_all(&q), on_all(&r));
        for ((name, q), (_, r)) in qs.iter().zip(&rs) {
            let (q, r) = (m2(q), m2(r));
            let what = format!("{m}×{n} in blocks of {c} on {name}");
            close(
                &q.dot(&r).into_dyn(),
                &a.clone().into_dyn(),
                &format!("Q·R, {what}"),
            );
            close(
                &q.t().dot(&q).into_dyn(),
                &Array2::<f64>::eye(n).into_dyn(),
                &format!("QᵀQ, {what}"),
            );
            assert!(is_lower(&r.t().to_owned()), "R not upper, {what}");
        }
        let s = linalg::svd(&x).unwrap().1;
        check(
            &s,
            &ArrayD::from_shape_vec(IxDyn(&[n]), singular_values(&a)).unwrap(),
            "S through the tree",
        );
    }
}

#[test]
fn a_matrix_that_is_not_positive_definite_is_a_typed_error() {
    let a = ndarray::arr2(&[[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]]).into_dyn();
    let x = array::from_array(&a, 2).unwrap();
    let l = linalg::cholesky(&x, true).unwrap();
    for (name, s) in schedulers() {
        let e = l.compute(s.as_ref()).unwrap_err();
        assert!(
            matches!(e, ArrayError::NotPositiveDefinite { .. }),
            "{name}: {e}"
        );
    }
    let e = l.compute(cluster()).unwrap_err();
    assert!(
        matches!(e, ArrayError::NotPositiveDefinite { .. }),
        "cluster: {e}"
    );
}

#[test]
fn singular_matrices_are_typed_errors() {
    let a = ndarray::arr2(&[[1.0, 2.0], [2.0, 4.0]]).into_dyn();
    let x = array::from_array(&a, 1).unwrap();
    let b = array::ones(&[2], 1, DType::F64).unwrap();
    let e = linalg::solve(&x, &b).unwrap().compute(&Inline).unwrap_err();
    assert!(matches!(e, ArrayError::Singular { .. }), "{e}");
    let e = linalg::inv(&x).unwrap().compute(cluster()).unwrap_err();
    assert!(matches!(e, ArrayError::Singular { .. }), "{e}");
    let t = ndarray::arr2(&[[1.0, 0.0], [3.0, 0.0]]).into_dyn();
    let t = array::from_array(&t, 1).unwrap();
    let e = linalg::solve_triangular(&t, &b, true)
        .unwrap()
        .compute(&Threaded::new(2))
        .unwrap_err();
    assert!(matches!(e, ArrayError::Singular { .. }), "{e}");
}

#[test]
fn integer_and_f32_inputs_are_factored_in_f64() {
    let a = ndarray::arr2(&[[4i64, 2], [2, 5]]).into_dyn();
    let x = array::from_array(&a, 1).unwrap();
    let l = linalg::cholesky(&x, true).unwrap();
    assert_eq!(l.dtype(), DType::F64);
    check(
        &l,
        &ndarray::arr2(&[[2.0, 0.0], [1.0, 2.0]]).into_dyn(),
        "cholesky of int64",
    );
    let f = array::from_array(&a.mapv(|v| v as f32), 1).unwrap();
    let (q, r) = linalg::qr(&f.rechunk(vec![vec![1, 1], vec![2]]).unwrap()).unwrap();
    assert_eq!((q.dtype(), r.dtype()), (DType::F64, DType::F64));
    let n = linalg::norm(&f, None, &[], false).unwrap();
    assert_eq!(n.dtype(), DType::F32);
    // Products keep NumPy's types: integers multiply as i64.
    let i = array::from_array(&ndarray::arr1(&[1i32, 2, 3]).into_dyn(), 2).unwrap();
    let d = i.dot(&i).unwrap();
    assert_eq!(d.dtype(), DType::I64);
    assert_eq!(
        d.compute(cluster()).unwrap(),
        array::Chunk::from(ndarray::ArrayD::from_elem(IxDyn(&[]), 14i64))
    );
}
