//! Property tests for shape operations (`reshape`, `expand_dims`, `concatenate`, `stack`):
//! random shapes and chunkings against ndarray's answer on the whole array, on `Inline`,
//! `Threaded` and a `LocalCluster`.

use crate::common::{check, shaped, whole};
use dask_collections::array::{self, DType};
use ndarray::{ArrayD, Axis, Dimension, IxDyn};
use proptest::prelude::*;

/// Shapes of the same size as `shape`: flat, reversed, merged, split, padded with 1s.
fn targets(shape: &[usize], split: usize) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    let mut out = vec![
        vec![n],
        shape.iter().rev().copied().collect(),
        vec![1, n, 1],
    ];
    if shape.len() >= 2 {
        let mut merged = vec![shape[0] * shape[1]];
        merged.extend(&shape[2..]);
        out.push(merged);
    }
    let divisors: Vec<usize> = (1..=n).filter(|d| n.is_multiple_of(*d)).collect();
    let d = divisors[split % divisors.len()];
    out.push(vec![d, n / d]);
    let mut padded = vec![1];
    padded.extend(shape);
    out.push(padded);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn reshape_matches_ndarray((shape, chunks, data) in shaped(), split in 0usize..100) {
        let x = whole(&shape, &data);
        let a = array::from_array(&x, chunks).unwrap();
        for target in targets(&shape, split) {
            let r = a.reshape(&target).unwrap();
            let want = x.clone().into_shape_with_order(IxDyn(&target)).unwrap();
            check(&r, &want, &format!("reshape {shape:?} -> {target:?}"));
        }
    }

    #[test]
    fn concatenate_stack_and_expand_dims_match_ndarray(
        (shape, chunks, data) in shaped(),
        other in 1usize..5,
        other_chunk in 1usize..4,
        axis in 0usize..3,
    ) {
        let x = whole(&shape, &data);
        let a = array::from_array(&x, chunks).unwrap();
        let ax = axis % shape.len();
        // b: the same shape but `other` long along the axis, chunked its own way.
        let mut bshape = shape.clone();
        bshape[ax] = other;
        let y = ArrayD::from_shape_fn(IxDyn(&bshape), |i| i.slice().iter().sum::<usize>() as f64);
        let b = array::from_array(&y, other_chunk).unwrap().astype(DType::I32).unwrap();
        let c = array::concatenate(&[&a, &b, &a], ax as isize).unwrap();
        prop_assert_eq!(c.dtype(), DType::F64);
        let want = ndarray::concatenate(Axis(ax), &[x.view(), y.view(), x.view()]).unwrap();
        check(&c, &want, &format!("concatenate along {ax}"));

        let s = array::stack(&[&a, &a.scalar(array::BinaryOp::Mul, 2.0, false).unwrap()], ax as isize).unwrap();
        let doubled = x.mapv(|v| v * 2.0);
        let want = ndarray::stack(Axis(ax), &[x.view(), doubled.view()]).unwrap();
        check(&s, &want, &format!("stack along {ax}"));

        let e = a.expand_dims(-1).unwrap();
        check(&e, &x.clone().insert_axis(Axis(shape.len())), "expand_dims(-1)");
    }
}

#[test]
fn reshape_keeps_blocks_where_it_can() {
    // Splitting an axis whose blocks are whole rows of the result needs no rechunk.
    let x = array::arange(0.0, 24.0, 1.0, 12, DType::F64).unwrap();
    let y = x.reshape(&[4, 6]).unwrap();
    assert_eq!(y.chunks(), &[vec![2, 2], vec![6]]);
    // Adding and removing length-1 axes keeps the blocks along the others.
    let e = y.expand_dims(1).unwrap();
    assert_eq!(e.chunks(), &[vec![2, 2], vec![1], vec![6]]);
    assert_eq!(e.squeeze(&[1]).unwrap().chunks(), y.chunks());
    // Blocks that are not whole rows are grown to the next multiple.
    let z = array::arange(0.0, 24.0, 1.0, 5, DType::F64)
        .unwrap()
        .reshape(&[4, 6])
        .unwrap();
    assert_eq!(z.chunks(), &[vec![1, 1, 1, 1], vec![6]]);
}
