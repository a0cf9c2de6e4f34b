//! Property tests for ghosting (`overlap`, `trim_internal`, `map_overlap`), `map_blocks` and
//! `where_`: random shapes, chunkings, depths and boundaries against a reference built on the
//! whole ndarray from global indices, on `Inline`, `Threaded` and a `LocalCluster`.

use std::sync::Arc;

use crate::common::{check, shaped, whole};
use dask_collections::array::{self, BinaryOp, Boundary, Chunk, DType};
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;

/// Where position `p` (may be outside `0..len`) of an axis reads from: `Some(Some(i))` an
/// element, `Some(None)` the constant, `None` nothing (a `None` boundary).
fn source(p: isize, len: usize, b: Boundary) -> Option<Option<usize>> {
    let n = len as isize;
    if (0..n).contains(&p) {
        return Some(Some(p as usize));
    }
    match b {
        Boundary::None => None,
        Boundary::Constant(_) => Some(None),
        Boundary::Periodic => Some(Some(p.rem_euclid(n) as usize)),
        Boundary::Nearest => Some(Some(if p < 0 { 0 } else { len - 1 })),
        Boundary::Reflect => Some(Some(if p < 0 { -1 - p } else { 2 * n - 1 - p } as usize)),
    }
}

/// The overlapped array, assembled: along each axis the concatenation over blocks of the
/// positions each extended block reads.
fn reference_overlap(
    x: &ArrayD<f64>,
    chunks: &[Vec<usize>],
    depth: &[usize],
    bounds: &[Boundary],
) -> ArrayD<f64> {
    let per_axis: Vec<Vec<Option<usize>>> = chunks
        .iter()
        .enumerate()
        .map(|(a, c)| {
            let (len, d) = (x.shape()[a], depth[a] as isize);
            let mut out = Vec::new();
            let mut start = 0isize;
            for &l in c {
                let end = start + l as isize;
                out.extend((start - d..end + d).filter_map(|p| source(p, len, bounds[a])));
                start = end;
            }
            out
        })
        .collect();
    let shape: Vec<usize> = per_axis.iter().map(Vec::len).collect();
    let constant = bounds
        .iter()
        .find_map(|b| match b {
            Boundary::Constant(v) => Some(*v),
            _ => None,
        })
        .unwrap_or(f64::NAN);
    ArrayD::from_shape_fn(IxDyn(&shape), |i| {
        let pos: Option<Vec<usize>> = (0..shape.len()).map(|a| per_axis[a][i[a]]).collect();
        pos.map_or(constant, |p| x[IxDyn(&p)])
    })
}

/// The sum over each element's 3ⁿ neighbourhood, positions outside read as the boundary says
/// (left out for `None`).
fn reference_neighbours(x: &ArrayD<f64>, bounds: &[Boundary], constant: f64) -> ArrayD<f64> {
    let n = x.ndim();
    let offsets: Vec<Vec<isize>> = (0..3usize.pow(n as u32))
        .map(|k| {
            (0..n)
                .map(|a| (k / 3usize.pow(a as u32)) as isize % 3 - 1)
                .collect()
        })
        .collect();
    ArrayD::from_shape_fn(x.raw_dim(), |i| {
        let mut sum = 0.0;
        for o in &offsets {
            // Nothing there along a `None` axis; else the constant if any axis reads it.
            let at: Option<Vec<Option<usize>>> = (0..n)
                .map(|a| source(i[a] as isize + o[a], x.shape()[a], bounds[a]))
                .collect();
            match at {
                None => {}
                Some(at) => match at.into_iter().collect::<Option<Vec<usize>>>() {
                    Some(p) => sum += x[IxDyn(&p)],
                    None => sum += constant,
                },
            }
        }
        sum
    })
}

/// The test's kernel: each element's neighbourhood sum within the block (what exists of it).
fn neighbour_sum(c: Arc<Chunk>) -> Chunk {
    let x = c.to_f64();
    Chunk::from(reference_neighbours(
        &x,
        &vec![Boundary::None; x.ndim()],
        0.0,
    ))
}

fn boundary() -> impl Strategy<Value = Boundary> {
    prop_oneof![
        Just(Boundary::None),
        Just(Boundary::Periodic),
        Just(Boundary::Reflect),
        Just(Boundary::Nearest),
        (-5.0f64..5.0).prop_map(Boundary::Constant),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn overlap_reads_neighbours_and_boundaries(
        (shape, chunks, data) in shaped(),
        depths in prop::collection::vec(0usize..3, 3),
        bounds in prop::collection::vec(boundary(), 3),
    ) {
        let x = whole(&shape, &data);
        let a = array::from_array(&x, chunks).unwrap();
        let n = shape.len();
        // A depth fits the smallest block; one constant for all constant axes.
        let depth: Vec<usize> = (0..n)
            .map(|i| depths[i].min(*a.chunks()[i].iter().min().unwrap()))
            .collect();
        let c = bounds.iter().find_map(|b| match b {
            Boundary::Constant(v) => Some(*v),
            _ => None,
        });
        let bounds: Vec<Boundary> = bounds[..n]
            .iter()
            .map(|b| match (b, c) {
                (Boundary::Constant(_), Some(v)) => Boundary::Constant(v),
                (b, _) => *b,
            })
            .collect();
        let g = a.overlap(&depth, &bounds).unwrap();
        let want = reference_overlap(&x, a.chunks(), &depth, &bounds);
        check(&g, &want, &format!("overlap {depth:?} {bounds:?}"));
        check(&g.trim_internal(&depth, &bounds).unwrap(), &x, "trim_internal of overlap");

        if depth.iter().all(|&d| d >= 1) {
            dask_graph::registry().register("test-neighbour-sum", neighbour_sum);
            let depth = vec![1; n];
            let m = a
                .map_overlap("test-neighbour-sum", &depth, &bounds, DType::F64)
                .unwrap();
            prop_assert_eq!(m.chunks(), a.chunks());
            let want = reference_neighbours(&x, &bounds, c.unwrap_or(0.0));
            check(&m, &want, &format!("map_overlap {bounds:?}"));
        }
    }

    #[test]
    fn where_selects_with_broadcasting(
        (shape, chunks, data) in shaped(),
        other_chunk in 1usize..9,
    ) {
        let x = whole(&shape, &data);
        let a = array::from_array(&x, chunks).unwrap();
        let cond = a.scalar(BinaryOp::Gt, 0.0, false).unwrap();
        // y: the last axis only, chunked its own way (broadcast, then unified).
        let last = *shape.last().unwrap();
        let yv = ArrayD::from_shape_fn(IxDyn(&[last]), |i| i[0] as f64 - 100.0);
        let y = array::from_array(&yv, other_chunk.min(last)).unwrap();
        let w = array::where_(&cond, &a, &y).unwrap();
        let want = ndarray::Zip::from(&x)
            .and_broadcast(&yv)
            .map_collect(|&v, &f| if v > 0.0 { v } else { f });
        check(&w, &want, "where(a > 0, a, y)");
        let i = a.astype(DType::I32).unwrap();
        let zero = array::full(&[], 0, DType::I32, 0.0).unwrap();
        let w = array::where_(&cond, &zero, &i).unwrap();
        prop_assert_eq!(w.dtype(), DType::I32);
        let want = x.mapv(|v| if v > 0.0 { 0.0 } else { v.trunc() });
        check(&w, &want, "where(a > 0, 0, a as i32)");
    }
}

#[test]
fn map_blocks_may_change_block_shapes() {
    dask_graph::registry().register("test-first-row", |c: Arc<Chunk>| {
        let x = c.to_f64();
        Chunk::from(x.slice(ndarray::s![0..1, ..]).to_owned().into_dyn())
    });
    let whole = ArrayD::from_shape_fn(IxDyn(&[4, 6]), |i| (i[0] * 6 + i[1]) as f64);
    let x = array::from_array(&whole, [2, 3]).unwrap();
    let rows = x
        .map_blocks(
            "test-first-row",
            &[],
            DType::F64,
            Some(vec![vec![1, 1], vec![3, 3]]),
        )
        .unwrap();
    let want =
        ndarray::arr2(&[[0.0, 1., 2., 3., 4., 5.], [12., 13., 14., 15., 16., 17.]]).into_dyn();
    check(&rows, &want, "first row of each block");
    // Telling it the wrong shapes fails the computation, typed.
    let wrong = x
        .map_blocks("test-first-row", &[], DType::F64, None)
        .unwrap();
    assert!(matches!(
        wrong.compute(&dask_graph::Inline),
        Err(array::ArrayError::BlockShape { .. })
    ));
}
