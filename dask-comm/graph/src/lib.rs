//! Task graphs for the dask-comm scheduler, with no network: keys, tasks, graphs, the function
//! registry, values and their codecs, graph optimisations, static ordering, and two local
//! schedulers.
//!
//! A graph maps [`Key`]s to [`Node`]s: a [`Task`] (a registered function's name and its
//! [`Arg`]s: other keys, literal values, lists, nested tasks) or a [`Value`]. Every process
//! registers the same functions ([`registry`]), so a graph names functions and never ships
//! code. Compute it with any [`Scheduler`]: [`Inline`] (one thread, for debugging),
//! [`Threaded`], or a dask-comm cluster's client; the result is the same.
//!
//! ```
//! use dask_graph::{registry, Arg, Graph, Scheduler, Inline, Task, Threaded, Value};
//! registry().register("inc-lib-doc", |x: i64| x + 1);
//! registry().register_variadic("sum-lib-doc", |xs: Vec<i64>| xs.iter().sum::<i64>());
//! let mut g = Graph::new();
//! for i in 0..10u32 {
//!     g.insert(("x", i), Task::new("inc-lib-doc", [Arg::lit(i as i64)]));
//! }
//! g.insert("total", Task::new("sum-lib-doc", (0..10).map(|i| Arg::key(("x", i)))));
//! let a = Inline.get(g.clone(), &["total".into()]).unwrap();
//! let b = Threaded::new(2).get(g, &["total".into()]).unwrap();
//! assert_eq!(a[0].downcast_ref::<i64>(), Some(&55));
//! assert_eq!(b[0].downcast_ref::<i64>(), Some(&55));
//! ```

mod builtins;
mod exec;
mod graph;
mod key;
pub mod local;
pub mod optimize;
pub mod order;
mod registry;
pub mod shuffle;
mod task;
pub mod value;

pub use exec::{run, ComputeError, FailureKind, TaskFailure};
pub use graph::{Graph, GraphError, Structure};
pub use key::{Key, Name, MAX_INDICES};
pub use local::{AsyncScheduler, BoxFuture, Inline, Persisted, Plan, Scheduler, Threaded};
pub use registry::{
    registry, CallError, Callable, DuplicateName, FromValue, Func, Function, IntoValue, Params,
    Registry, TypedFn, Values, Variadic,
};
pub use shuffle::{ShuffleError, ShuffleId, ShuffleRole};
pub use task::{Arg, Node, Task};
pub use value::{
    register_type, Data, DataError, Encoded, Expect, Frame, List, TypeInfo, Value, ValueMeta,
    WireValue,
};
