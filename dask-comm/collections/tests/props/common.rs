//! What the property tests share: the schedulers every check runs on (`Inline`, `Threaded` and
//! an in-process `LocalCluster`), the check itself, and random shapes with chunkings.

use std::sync::OnceLock;

use dask_collections::array::{self, Array, Chunk};
use dask_comm::{ClusterOptions, LocalCluster, Protocol};
use dask_graph::{Inline, Scheduler, Threaded};
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;

pub fn cluster() -> &'static dask_comm::Client {
    static C: OnceLock<(LocalCluster, dask_comm::Client)> = OnceLock::new();
    &C.get_or_init(|| {
        array::register();
        dask_collections::bag::register();
        dask_collections::dataframe::register();
        let c = LocalCluster::with(ClusterOptions {
            workers: 2,
            threads_per_worker: 1,
            protocol: Protocol::Inproc,
            processes: false,
            ..Default::default()
        })
        .expect("a local cluster");
        let client = c.client().expect("a client");
        (c, client)
    })
    .1
}

pub fn schedulers() -> Vec<(&'static str, Box<dyn Scheduler>)> {
    vec![
        ("sync", Box::new(Inline)),
        ("threaded", Box::new(Threaded::new(2))),
    ]
}

/// Computes `a` on every scheduler (the cluster too) and checks each against `want`.
pub fn check(a: &Array, want: &ArrayD<f64>, what: &str) {
    let mut results: Vec<(&str, Chunk)> = schedulers()
        .into_iter()
        .map(|(n, s)| (n, a.compute(s.as_ref()).expect("computes")))
        .collect();
    results.push((
        "cluster",
        a.compute(cluster()).expect("computes on the cluster"),
    ));
    for (name, got) in results {
        assert_eq!(got.dtype(), a.dtype(), "{what} on {name}");
        assert_eq!(got.shape(), want.shape(), "{what} on {name}");
        let got = got.to_f64();
        for (g, w) in got.iter().zip(want.iter()) {
            let close = (g - w).abs() <= 1e-9 * w.abs().max(1.0) || (g.is_nan() && w.is_nan());
            assert!(
                close,
                "{what} on {name}: {g} vs {w}\ngot {got}\nwant {want}"
            );
        }
    }
}

/// A shape of 1–3 axes of 1–9, chunk sizes per axis, and the elements.
pub fn shaped() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, Vec<f64>)> {
    prop::collection::vec(1usize..9, 1..=3).prop_flat_map(|shape| {
        let n: usize = shape.iter().product();
        let chunks = shape.iter().map(|&l| 1..=l).collect::<Vec<_>>();
        (
            Just(shape),
            chunks,
            prop::collection::vec(-100.0f64..100.0, n..=n),
        )
    })
}

pub fn whole(shape: &[usize], data: &[f64]) -> ArrayD<f64> {
    ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap()
}
