//! Chunked collections over [`dask_graph`]: operations build task graphs, and any
//! [`dask_graph::Scheduler`] computes them (the local `Sync` and `Threaded` schedulers, or a
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
