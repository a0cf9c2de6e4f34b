//! Chunked collections over [`dask_graph`]: operations build task graphs, and any
//! [`dask_graph::Scheduler`] computes them (the local `Sync` and `Threaded` schedulers, or a
//! dask-comm cluster's `Client`).
//!
//! - [`array`]: an n-d array of ndarray blocks, as `dask.array`.
//!
//! Every process that runs array tasks must have the array functions registered: call
//! [`array::register`] at the top of `main` (before `dask_comm::run_if_worker` in a program
//! that starts a `LocalCluster` of processes).

pub mod array;
