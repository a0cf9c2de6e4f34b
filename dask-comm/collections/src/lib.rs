//! Chunked collections over [`dask_graph`]: operations build task graphs, and any
//! [`dask_graph::Scheduler`] computes them (the local `Inline` and `Threaded` schedulers, or a
//! dask-comm cluster's `Client`).
//!
//! - [`array`]: an n-d array of ndarray blocks, as `dask.array`.
//! - [`bag`]: partitions of semi-structured items (text lines, JSON records), as `dask.bag`.
//!
//! Every process that runs array or bag tasks must have their functions registered: call
//! [`array::register`] and [`bag::register`] (and register your own functions) at the top of `main` (before `dask_comm::run_if_worker` in a program
//! that starts a `LocalCluster` of processes).

pub mod array;
pub mod bag;
pub mod dataframe;
mod files;
mod layers;

/// How a shuffle (a dataframe's hash join, a bag's `groupby`) moves its buckets (Dask's
/// `shuffle_method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum ShuffleMethod {
    /// Peer-to-peer: each partition's transfer task sends its buckets straight to the
    /// workers that own their outputs, outside the task graph (`n + 1 + m` tasks for `n`
    /// inputs and `m` outputs; on a cluster the bytes move worker to worker over the data
    /// connections, in bounded batches).
    #[default]
    P2p,
    /// Tasks: one task per bucket per partition (`n × m` of them), fetched by the output
    /// tasks like any value.
    Tasks,
}
