//! `compute_async` on the cluster from inside an async runtime: every collection gives what
//! its blocking `compute` gives, and the runtime's one thread runs other tasks while the
//! workers compute.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dask_collections::array::{self, DType};
use dask_collections::bag::{self, Item};
use dask_collections::dataframe;
use polars::prelude::*;

use crate::common::cluster;

#[test]
fn collections_compute_async_on_the_cluster() {
    let client = cluster();
    let x = array::arange(0.0, 1000.0, 1.0, 64, DType::F64).unwrap();
    let total = x.sum(&[], false).unwrap();
    let b = bag::range(100, 7).unwrap();
    // 4 items of 100 ms each on 2 one-thread workers: at least 200 ms of computing.
    bag::register_map("async-test-slow", |x: &Item| {
        std::thread::sleep(Duration::from_millis(100));
        x.clone()
    });
    let slow = bag::range(4, 4).unwrap().map("async-test-slow").unwrap();
    let df = df!("a" => (0..50i64).collect::<Vec<_>>()).unwrap();
    let d = dataframe::from_polars(df.clone(), 4).unwrap();
    // One thread: the ticker below runs only while the computations are awaited, not blocked.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ticks = Arc::new(AtomicU64::new(0));
    let t = ticks.clone();
    let xs = x.clone();
    let t2 = ticks.clone();
    let (arr, sum, items, count, frame, during) = rt.block_on(async move {
        let ticker = tokio::spawn(async move {
            loop {
                t.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        let arr = xs.compute_async(client).await.unwrap();
        let sum = total.compute_async(client).await.unwrap();
        let items = b.compute_async(client).await.unwrap();
        let count = b.count().compute_async(client).await.unwrap();
        let frame = d.compute_async(client).await.unwrap();
        let before = t2.load(Ordering::Relaxed);
        let slowed = slow.compute_async(client).await.unwrap();
        let during = t2.load(Ordering::Relaxed) - before;
        ticker.abort();
        assert_eq!(slowed.len(), 4);
        (arr, sum, items, count, frame, during)
    });
    assert_eq!(arr.to_f64(), x.compute(client).unwrap().to_f64());
    assert_eq!(
        sum.to_f64().iter().copied().collect::<Vec<_>>(),
        vec![499_500.0]
    );
    assert_eq!(items, (0..100).map(Item::Int).collect::<Vec<_>>());
    assert_eq!(count, Item::Int(100));
    assert!(frame.equals(&df), "{frame:?}");
    // The ticker ticks every millisecond or so while the thread is free: a compute that
    // blocked the thread for the 200 ms of work would have let it tick at most once.
    assert!(
        during >= 20,
        "the runtime's thread was blocked: {during} ticks"
    );
}
