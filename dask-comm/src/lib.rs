//! A Dask-like distributed task scheduler over `transport`.
//!
//! The runtime of a cluster: a scheduler, workers, and clients, over any `transport` address
//! (`tcp://` by default, `ucx://` for speed, `inproc://` within a process). Graphs are
//! [`dask_graph`] graphs, so any graph that runs on [`dask_graph::Inline`] or
//! [`dask_graph::Threaded`] runs on a cluster unchanged: [`Client`] implements
//! [`dask_graph::Scheduler`].
//!
//! - [`core`]: the scheduler's state machine, with no I/O (tested with a recording `Comm`);
//! - [`SchedulerServer`], [`run_worker`], [`Client`]: the processes;
//! - [`LocalCluster`]: a scheduler and worker processes on this machine;
//! - [`cli`]: the `dask-comm scheduler|worker|bench` command line;
//! - [`protocol`], [`spec`], [`security`]: what travels, and who may send it.
//!
//! ```no_run
//! use dask_comm::LocalCluster;
//! use dask_graph::{registry, Arg, Graph, Scheduler, Task};
//! registry().register("inc", |x: i64| x + 1);
//! registry().register_variadic("sum", |xs: Vec<i64>| xs.iter().sum::<i64>());
//! dask_comm::run_if_worker(); // worker processes stop here, as workers
//! let cluster = LocalCluster::new(2, 1).unwrap();
//! let client = cluster.client().unwrap();
//! let mut g = Graph::new();
//! for i in 0..100u32 {
//!     g.insert(("x", i), Task::new("inc", [Arg::lit(i as i64)]));
//! }
//! g.insert("total", Task::new("sum", (0..100).map(|i| Arg::key(("x", i)))));
//! let total = client.get(g, &["total".into()]).unwrap();
//! assert_eq!(total[0].downcast_ref::<i64>(), Some(&5050));
//! ```

// Not the library's API: the drills and the benchmark functions this repository's tests,
// examples and comparisons use (feature `drills`).
#[cfg(feature = "drills")]
#[doc(hidden)]
pub mod bench;
#[cfg(not(feature = "drills"))]
mod bench;
mod benchcli;
pub mod cli;
mod client;
mod cluster;
pub mod core;
pub mod dashboard;
#[cfg(feature = "drills")]
#[doc(hidden)]
pub mod drills;
mod error;
pub mod launch;
mod net;
pub mod protocol;
mod runtime;
mod scheduler;
pub mod security;
pub mod spec;
pub mod transfers;
mod worker;

#[cfg(test)]
mod liveness_tests;

pub use client::{Blocking, Client, ClientOptions, DFuture, SubmitOptions};
pub use cluster::{run_if_worker, ClusterOptions, LocalCluster, Protocol};
pub use error::{Error, Result};
pub use launch::{initialize, LaunchOptions, Launched};
pub use net::{set_tls, ENV_TLS_DIR};
pub use protocol::Transfer;
pub use scheduler::SchedulerServer;
pub use security::Secret;
pub use worker::memory::{MemoryThresholds, EXIT_MEMORY};
pub use worker::{
    exit_code, run_worker, MemoryLimit, WorkerOptions, DEFAULT_SCHEDULER_TIMEOUT, EXIT_REMOVED,
    EXIT_SCHEDULER_LOST,
};
