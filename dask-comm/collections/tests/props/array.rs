//! Property tests: random shapes, chunkings and axes, each operation against the same
//! operation on the whole ndarray, on the `Inline` and `Threaded` schedulers and on a
//! `LocalCluster` (in-process workers over `inproc://`: the same scheduler, workers and
//! protocol as with processes, without starting any).

use crate::common::{check, cluster, shaped, whole};
use dask_collections::array::{self, BinaryOp, Chunk, ReduceOp, UnaryOp};
use dask_graph::{Inline, Threaded};
use ndarray::{ArrayD, Axis, IxDyn};
use proptest::prelude::*;

/// The reference reduction on the whole array.
fn reference(op: ReduceOp, x: &ArrayD<f64>, axes: &[usize], keepdims: bool) -> ArrayD<f64> {
    let mut r = x.clone();
    for &a in axes.iter().rev() {
        let n = r.shape()[a] as f64;
        r = match op {
            ReduceOp::Sum => r.sum_axis(Axis(a)),
            ReduceOp::Prod => r.fold_axis(Axis(a), 1.0, |p, q| p * q),
            ReduceOp::Min => r.fold_axis(Axis(a), f64::INFINITY, |p, q| p.min(*q)),
            ReduceOp::Max => r.fold_axis(Axis(a), f64::NEG_INFINITY, |p, q| p.max(*q)),
            ReduceOp::Mean => r.sum_axis(Axis(a)) / n,
            _ => unreachable!("var and std are checked over all their axes at once"),
        };
    }
    if keepdims {
        for &a in axes {
            r = r.insert_axis(Axis(a));
        }
    }
    r
}

fn reference_var(x: &ArrayD<f64>, axes: &[usize], ddof: f64, sqrt: bool) -> ArrayD<f64> {
    // Move the reduced axes last, flatten them, and take the two-pass variance per row.
    let kept: Vec<usize> = (0..x.ndim()).filter(|a| !axes.contains(a)).collect();
    let order: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let moved = x
        .view()
        .permuted_axes(IxDyn(&order))
        .as_standard_layout()
        .into_owned();
    let rows: usize = kept.iter().map(|&a| x.shape()[a]).product();
    let per: usize = axes.iter().map(|&a| x.shape()[a]).product();
    let flat = moved.into_shape_with_order((rows, per)).unwrap();
    let out: Vec<f64> = flat
        .outer_iter()
        .map(|row| {
            let m = row.sum() / per as f64;
            let v = row.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (per as f64 - ddof);
            if sqrt { v.sqrt() } else { v }
        })
        .collect();
    let shape: Vec<usize> = kept.iter().map(|&a| x.shape()[a]).collect();
    ArrayD::from_shape_vec(IxDyn(&shape), out).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn elementwise_matches_ndarray((shape, chunks, data) in shaped(), s in -3.0f64..3.0) {
        let x = whole(&shape, &data);
        let a = array::from_array(&x, chunks.clone()).unwrap();
        let y = x.mapv(|v| v * 0.5 - 1.0);
        let b = array::from_array(&y, chunks).unwrap();
        check(&(&a + &b).unwrap(), &(&x + &y), "a + b");
        check(&(&a * s).unwrap(), &x.mapv(|v| v * s), "a * s");
        check(&(s - &a).unwrap(), &x.mapv(|v| s - v), "s - a");
        check(&a.binary(BinaryOp::Maximum, &b).unwrap(), &ndarray::Zip::from(&x).and(&y).map_collect(|p, q| p.max(*q)), "maximum");
        check(&a.unary(UnaryOp::Tanh).unwrap(), &x.mapv(f64::tanh), "tanh");
        let gt = a.binary(BinaryOp::Gt, &b).unwrap();
        check(&gt, &ndarray::Zip::from(&x).and(&y).map_collect(|p, q| f64::from(u8::from(p > q))), "a > b");
        check(&a.t().unwrap(), &x.t().to_owned(), "a.T");
        check(&a.astype(array::DType::I32).unwrap(), &x.mapv(|v| f64::from(v as i32)), "astype i32");
    }

    #[test]
    fn reductions_match_ndarray(
        (shape, chunks, data) in shaped(),
        pick in prop::collection::vec(any::<bool>(), 3),
        keepdims in any::<bool>(),
        split_every in 2usize..6,
    ) {
        let x = whole(&shape, &data);
        let a = array::from_array(&x, chunks).unwrap();
        let axes: Vec<usize> = (0..shape.len()).filter(|&i| pick[i]).collect();
        let all: Vec<usize> = if axes.is_empty() { (0..shape.len()).collect() } else { axes.clone() };
        let given: Vec<isize> = axes.iter().map(|&i| i as isize).collect();
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max] {
            let r = a.reduce(op, &given, keepdims, Some(split_every)).unwrap();
            check(&r, &reference(op, &x, &all, keepdims), &format!("{op:?} over {all:?}"));
        }
        let var = a.reduce(ReduceOp::Var(0.0), &given, false, Some(split_every)).unwrap();
        check(&var, &reference_var(&x, &all, 0.0, false), &format!("var over {all:?}"));
        let std = a.reduce(ReduceOp::Std(1.0), &given, false, Some(split_every)).unwrap();
        check(&std, &reference_var(&x, &all, 1.0, true), &format!("std ddof 1 over {all:?}"));
    }
}

#[test]
fn the_seed_expression() {
    // (x + x.T - x.mean(axis=0)).sum() on a 12×12 in blocks of 5.
    let x = ArrayD::from_shape_fn(IxDyn(&[12, 12]), |i| (i[0] * 12 + i[1]) as f64 / 7.0);
    let a = array::from_array(&x, 5).unwrap();
    let m = x.mean_axis(Axis(0)).unwrap();
    let want = (&(&x + &x.t()) - &m).sum();
    let got = (&(&a + &a.t().unwrap()).unwrap() - &a.mean(&[0], false).unwrap())
        .unwrap()
        .sum(&[], false)
        .unwrap();
    check(
        &got,
        &ArrayD::from_elem(IxDyn(&[]), want),
        "seed expression",
    );
}

#[test]
fn misaligned_blocks_are_unified_and_bad_axes_are_errors() {
    let a = array::ones(&[6, 6], 3, array::DType::F64).unwrap();
    let b = array::ones(&[6, 6], 2, array::DType::F64).unwrap();
    // Blocks that do not line up are rechunked to every boundary either has (Dask's unify).
    let sum = (&a + &b).unwrap();
    assert_eq!(sum.chunks(), &[vec![2, 1, 1, 2], vec![2, 1, 1, 2]]);
    check(
        &sum,
        &ArrayD::from_elem(IxDyn(&[6, 6]), 2.0),
        "misaligned a + b",
    );
    let c = array::ones(&[5], 5, array::DType::F64).unwrap();
    assert!(matches!(&a + &c, Err(array::ArrayError::Broadcast { .. })));
    assert!(matches!(
        a.sum(&[2], false),
        Err(array::ArrayError::Axis { axis: 2, .. })
    ));
    assert!(matches!(
        a.sum(&[0, -2], false),
        Err(array::ArrayError::Axis { .. })
    ));
    assert!(matches!(
        array::ones(&[4], 0, array::DType::F64),
        Err(array::ArrayError::ZeroChunk { axis: 0 })
    ));
}

#[test]
fn integer_and_boolean_types_follow_numpy() {
    let x = ArrayD::from_shape_fn(IxDyn(&[7]), |i| i[0] as i32 - 3);
    let a = array::from_array(&x, 3).unwrap();
    let s = a.sum(&[], false).unwrap();
    assert_eq!(s.dtype(), array::DType::I64);
    assert_eq!(
        s.compute(&Inline).unwrap(),
        Chunk::from(ArrayD::from_elem(IxDyn(&[]), 0i64))
    );
    let m = a.mean(&[], false).unwrap();
    assert_eq!(m.dtype(), array::DType::F64);
    let half = (&a / 2.0).unwrap();
    assert_eq!(half.dtype(), array::DType::F64);
    let plus = (&a + 2.0).unwrap();
    assert_eq!(plus.dtype(), array::DType::I32);
    let pos = a
        .binary(
            BinaryOp::Gt,
            &array::zeros(&[7], 3, array::DType::I32).unwrap(),
        )
        .unwrap();
    let any = pos.reduce(ReduceOp::Any, &[], false, None).unwrap();
    let all = pos.reduce(ReduceOp::All, &[], false, None).unwrap();
    assert_eq!(
        any.compute(&Inline).unwrap(),
        Chunk::from(ArrayD::from_elem(IxDyn(&[]), true))
    );
    assert_eq!(
        all.compute(&Inline).unwrap(),
        Chunk::from(ArrayD::from_elem(IxDyn(&[]), false))
    );
}

/// Python's `range(*slice(start, stop, step).indices(len))`, written out independently.
fn python_indices(
    len: usize,
    start: Option<isize>,
    stop: Option<isize>,
    step: isize,
) -> Vec<usize> {
    let n = len as isize;
    let fix = |v: isize, lo: isize, hi: isize| {
        let v = if v < 0 { v + n } else { v };
        v.clamp(lo, hi)
    };
    let (lo, hi) = if step > 0 { (0, n) } else { (-1, n - 1) };
    let s = start.map_or(if step > 0 { 0 } else { n - 1 }, |v| fix(v, lo, hi));
    let e = stop.map_or(if step > 0 { n } else { -1 }, |v| fix(v, lo, hi));
    let mut out = vec![];
    let mut i = s;
    while if step > 0 { i < e } else { i > e } {
        out.push(i as usize);
        i += step;
    }
    out
}

fn index_strategy() -> impl Strategy<Value = (Option<isize>, Option<isize>, isize, u8)> {
    (
        prop::option::of(-12isize..12),
        prop::option::of(-12isize..12),
        prop_oneof![1isize..4, -4isize..-1],
        0u8..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn slicing_matches_ndarray(
        (shape, chunks, data) in shaped(),
        picks in prop::collection::vec(index_strategy(), 3),
    ) {
        let x = whole(&shape, &data);
        let a = array::from_array(&x, chunks).unwrap();
        let mut index = Vec::new();
        let mut want = x.clone();
        let mut dropped = 0;
        for (axis, &(start, stop, step, kind)) in picks.iter().enumerate().take(shape.len()) {
            let len = shape[axis];
            let ax = Axis(axis - dropped);
            match kind {
                0 => index.push(array::Index::Full),
                1 => {
                    let i = start.unwrap_or(0).rem_euclid(len as isize);
                    index.push(array::Index::At(i - len as isize * isize::from(step < 0)));
                    want = want.index_axis_move(ax, i as usize);
                    dropped += 1;
                }
                _ => {
                    index.push(array::Index::Range(start, stop, step));
                    want = want.select(ax, &python_indices(len, start, stop, step));
                }
            }
        }
        let got = a.slice(&index).unwrap();
        check(&got, &want, &format!("x[{index:?}]"));
    }
}

#[test]
fn a_slice_computes_only_the_blocks_it_touches() {
    // The seed's `exp(ones((10000, 10000), chunks=100))[1:100, 1:100]`: 10,000 blocks, one
    // needed. The graph built for it holds the slice, the exp and the ones of that block: the
    // blockwise layers build a block's task only when it is needed.
    let x = array::ones(&[10000, 10000], 100, array::DType::F64).unwrap();
    let y = x
        .unary(UnaryOp::Exp)
        .unwrap()
        .slice(&[(1..100).into(), (1..100).into()])
        .unwrap();
    let needed = y.graph_for(&y.keys());
    assert_eq!(needed.len(), 3);
    assert_eq!(y.graph().len(), 20_001);
    assert_eq!(dask_graph::optimize::cull(y.graph(), &y.keys()).len(), 3);
    let want = ArrayD::from_elem(IxDyn(&[99, 99]), 1f64.exp());
    check(&y, &want, "exp(ones)[1:100, 1:100]");
    assert!(matches!(
        x.slice(&[array::Index::At(10000)]),
        Err(array::ArrayError::OutOfBounds {
            axis: 0,
            index: 10000,
            len: 10000
        })
    ));
}

#[test]
fn random_arrays_are_reproducible_and_distributed() {
    use array::random;
    let a = random::random(42, &[300, 200], 70).unwrap();
    let on_sync = a.compute(&Inline).unwrap();
    assert_eq!(on_sync, a.compute(&Threaded::new(2)).unwrap());
    assert_eq!(on_sync, a.compute(cluster()).unwrap());
    assert_ne!(
        on_sync,
        random::random(43, &[300, 200], 70)
            .unwrap()
            .compute(&Inline)
            .unwrap()
    );
    let x = on_sync.to_f64();
    assert!(x.iter().all(|v| (0.0..1.0).contains(v)));
    let mean = x.mean().unwrap();
    assert!((mean - 0.5).abs() < 0.01, "uniform mean {mean}");
    let n = random::normal(1, 3.0, 2.0, &[200_000], 50_000).unwrap();
    let m = n
        .mean(&[], false)
        .unwrap()
        .compute(&Inline)
        .unwrap()
        .to_f64();
    let s = n
        .std(&[], false, 0.0)
        .unwrap()
        .compute(&Inline)
        .unwrap()
        .to_f64();
    let (m, s) = (m.first().copied().unwrap(), s.first().copied().unwrap());
    assert!(
        (m - 3.0).abs() < 0.03 && (s - 2.0).abs() < 0.03,
        "normal mean {m} sd {s}"
    );
    let i = random::integers(5, -3, 4, &[1000], 300)
        .unwrap()
        .compute(&Inline)
        .unwrap();
    assert_eq!(i.dtype(), array::DType::I64);
    let i = i.to_f64();
    assert!(i.iter().all(|v| (-3.0..4.0).contains(v)));
    assert!(random::integers(5, 4, 4, &[3], 3).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn matmul_matches_ndarray(
        (m, k, n) in (1usize..9, 1usize..9, 1usize..9),
        (cm, ck, cn) in (1usize..9, 1usize..9, 1usize..9),
        seed in any::<u64>(),
    ) {
        let a = array::random::uniform(seed, -1.0, 1.0, &[m, k], [cm.min(m), ck.min(k)]).unwrap();
        let b = array::random::uniform(seed ^ 1, -1.0, 1.0, &[k, n], [ck.min(k), cn.min(n)]).unwrap();
        let (x, y) = (a.compute(&Inline).unwrap().to_f64(), b.compute(&Inline).unwrap().to_f64());
        let want = x.into_dimensionality::<ndarray::Ix2>().unwrap()
            .dot(&y.into_dimensionality::<ndarray::Ix2>().unwrap()).into_dyn();
        check(&a.matmul(&b).unwrap(), &want, "a @ b");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn rechunk_keeps_every_element(
        (shape, chunks, data) in shaped(),
        again in prop::collection::vec(1usize..9, 3),
    ) {
        let x = whole(&shape, &data);
        let a = array::from_array(&x, chunks).unwrap();
        let new: Vec<usize> = shape.iter().zip(&again).map(|(&l, &c)| c.min(l)).collect();
        let r = a.rechunk(new.clone()).unwrap();
        prop_assert_eq!(r.chunks().iter().map(|c| c[0]).collect::<Vec<_>>(), new);
        check(&r, &x, "rechunk");
        // And operands in different blocks meet at every boundary either has.
        let other: Vec<usize> = again.iter().zip(&shape).map(|(&c, &l)| (c % l) + 1).collect();
        let b = array::from_array(&x, other).unwrap();
        check(&(&a + &b).unwrap(), &(&x * 2.0), "a + b in other blocks");
    }
}

#[test]
fn linspace_eye_and_squeeze_match_numpy() {
    let l = array::linspace(-1.0, 2.0, 13, 5, true).unwrap();
    let want = ArrayD::from_shape_fn(IxDyn(&[13]), |i| -1.0 + i[0] as f64 * 0.25);
    check(&l, &want, "linspace(-1, 2, 13)");
    let l = array::linspace(0.0, 1.0, 4, 3, false).unwrap();
    check(
        &l,
        &ArrayD::from_shape_vec(IxDyn(&[4]), vec![0.0, 0.25, 0.5, 0.75]).unwrap(),
        "linspace no endpoint",
    );
    for k in [-2isize, 0, 1, 5] {
        let e = array::eye(5, 2, k, array::DType::F64).unwrap();
        let want = ArrayD::from_shape_fn(IxDyn(&[5, 5]), |i| {
            f64::from(u8::from(i[1] as isize - i[0] as isize == k))
        });
        check(&e, &want, &format!("eye(5, k={k})"));
    }
    let x = ArrayD::from_shape_fn(IxDyn(&[1, 4, 1]), |i| i[1] as f64);
    let a = array::from_array(&x, [1, 3, 1]).unwrap();
    check(
        &a.squeeze(&[]).unwrap(),
        &ArrayD::from_shape_fn(IxDyn(&[4]), |i| i[0] as f64),
        "squeeze()",
    );
    check(
        &a.squeeze(&[-1]).unwrap(),
        &x.index_axis(Axis(2), 0).to_owned(),
        "squeeze(-1)",
    );
    assert!(a.squeeze(&[1]).is_err());
}

/// NumPy's argmin/argmax along `axis` (flattened for `None`): first on ties.
fn reference_arg(x: &ArrayD<f64>, axis: Option<usize>, max: bool) -> ArrayD<f64> {
    let better = |v: f64, w: f64| if max { v > w } else { v < w };
    let first = |lane: ndarray::ArrayViewD<f64>| -> f64 {
        let mut best = 0;
        for (i, &v) in lane.iter().enumerate() {
            if better(v, lane.iter().nth(best).copied().unwrap()) {
                best = i;
            }
        }
        best as f64
    };
    match axis {
        None => ArrayD::from_elem(
            IxDyn(&[]),
            first(x.view().into_shape_with_order(IxDyn(&[x.len()])).unwrap()),
        ),
        Some(a) => x.map_axis(Axis(a), |lane| first(lane.into_dyn())),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn argmin_and_argmax_match_numpy(
        (shape, chunks, data) in shaped(),
        axis in prop::option::of(0usize..3),
        rounded in any::<bool>(),
    ) {
        // Rounded to a few integers, ties are common: the first must win.
        let data: Vec<f64> = if rounded { data.iter().map(|v| (v / 40.0).round()).collect() } else { data };
        let x = whole(&shape, &data);
        let a = array::from_array(&x, chunks).unwrap();
        let a = if rounded { a.astype(array::DType::I32).unwrap() } else { a };
        let axis = axis.map(|v| v % shape.len());
        for max in [false, true] {
            let r = if max {
                a.argmax(axis.map(|v| v as isize), false)
            } else {
                a.argmin(axis.map(|v| v as isize), false)
            }
            .unwrap();
            prop_assert_eq!(r.dtype(), array::DType::I64);
            check(&r, &reference_arg(&x, axis, max), &format!("arg max={max} axis={axis:?}"));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn take_and_compress_match_numpy(
        (shape, chunks, data) in shaped(),
        axis in 0usize..3,
        raw in prop::collection::vec(-20isize..20, 0..12),
        mask_bits in any::<u16>(),
    ) {
        let x = whole(&shape, &data);
        let a = array::from_array(&x, chunks).unwrap();
        let ax = axis % shape.len();
        let len = shape[ax] as isize;
        // In range (negative ones too), repeats and any order.
        let indices: Vec<isize> = raw.iter().map(|&i| i.rem_euclid(2 * len) - len).collect();
        let positive: Vec<usize> = indices.iter().map(|&i| i.rem_euclid(len) as usize).collect();
        check(&a.take(&indices, ax as isize).unwrap(), &x.select(Axis(ax), &positive), "take");
        let mask: Vec<bool> = (0..shape[ax]).map(|i| mask_bits >> i & 1 == 1).collect();
        let kept: Vec<usize> = (0..shape[ax]).filter(|&i| mask[i]).collect();
        check(&a.compress(&mask, ax as isize).unwrap(), &x.select(Axis(ax), &kept), "compress");
        let refused = matches!(
            a.take(&[len], ax as isize),
            Err(array::ArrayError::OutOfBounds { .. })
        );
        prop_assert!(refused, "an index past the end is refused");
    }
}

#[test]
fn persisted_arrays_compute_from_kept_blocks() {
    let x = array::random::normal(11, 1.0, 2.0, &[40, 30], 7).unwrap();
    let want = x.compute(&Inline).unwrap().to_f64();
    // Locally the blocks become values in the graph: no random task is left.
    let local = x.persist(&Threaded::new(2)).unwrap();
    assert!(
        local
            .graph()
            .iter()
            .all(|(_, n)| matches!(n, dask_graph::Node::Value(_)))
    );
    check(
        &(&local * 2.0).unwrap(),
        &want.mapv(|v| v * 2.0),
        "persisted locally, doubled",
    );
    // On a cluster they stay on the workers; graphs built on them name their keys.
    let kept = x.persist(cluster()).unwrap();
    assert!(
        kept.graph().is_empty(),
        "{:?}",
        kept.graph().iter().take(2).collect::<Vec<_>>()
    );
    for _ in 0..2 {
        let got = (&kept + 1.0).unwrap().compute(cluster()).unwrap().to_f64();
        assert_eq!(got, want.mapv(|v| v + 1.0));
    }
    assert_eq!(kept.compute(cluster()).unwrap().to_f64(), want);
    // Elsewhere those keys mean nothing: a clear error, not a hang.
    assert!(matches!(
        kept.compute(&Inline),
        Err(array::ArrayError::Compute(_))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn boolean_masks_match_numpy(
        (shape, chunks, data) in shaped(),
        threshold in -100.0f64..100.0,
    ) {
        let x = whole(&shape, &data);
        let a = array::from_array(&x, chunks).unwrap();
        let cond = a.scalar(BinaryOp::Gt, threshold, false).unwrap();
        let m = a.mask(&cond).unwrap();
        prop_assert!(m.has_unknown_chunks());
        // NumPy's x[x > t]: the selected elements in row-major order.
        let picked: Vec<f64> = x.iter().copied().filter(|&v| v > threshold).collect();
        let want = ArrayD::from_shape_vec(IxDyn(&[picked.len()]), picked.clone()).unwrap();
        check(&m, &want, "x[x > t]");
        // Reductions that need no lengths work as they are; the rest after learning them.
        let total: f64 = picked.iter().sum();
        check(&m.sum(&[], false).unwrap(), &ArrayD::from_elem(IxDyn(&[]), total), "sum of x[x > t]");
        for (name, s) in crate::common::schedulers() {
            let known = m.compute_chunk_sizes(s.as_ref()).unwrap();
            prop_assert!(!known.has_unknown_chunks(), "{}", name);
            prop_assert_eq!(known.shape(), &[picked.len()][..]);
            if !picked.is_empty() {
                let top = picked.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                check(&known.max(&[], false).unwrap(), &ArrayD::from_elem(IxDyn(&[]), top), "max after compute_chunk_sizes");
                // Empty blocks take part in arg-reductions without winning.
                let at = picked.iter().position(|&v| v == top).unwrap() as f64;
                check(&known.argmax(None, false).unwrap(), &ArrayD::from_elem(IxDyn(&[]), at), "argmax after compute_chunk_sizes");
            }
        }
    }
}
