//! Shuffles that move data outside the task graph (Dask's peer-to-peer shuffle).
//!
//! A shuffle has three kinds of task, each marked with its [`ShuffleRole`]
//! ([`Task::with_shuffle`](crate::Task::with_shuffle)):
//! - one **transfer** task per input partition: it splits its partition into one piece per
//!   output and hands them to [`send`];
//! - one **barrier** task over every transfer (it runs when every piece has been delivered);
//! - one **unpack** task per output: it depends on the barrier and collects its pieces with
//!   [`receive`], one from every input, in input order.
//!
//! Where the pieces go is up to the [`ShuffleService`] installed on the thread running the
//! task. The local schedulers ([`Inline`](crate::Inline), [`Threaded`](crate::Threaded)) use one
//! in-memory service per process; a dask-comm worker installs one that sends each piece
//! straight to the worker that will run the output's unpack task, and the scheduler pins
//! unpack tasks there. The same graph runs everywhere.
//!
//! Pieces are identified by (shuffle, output, input): sending a piece again replaces it, so a
//! transfer that runs twice (after a restart) does no harm.
//!
//! ```
//! use dask_graph::shuffle::{self, ShuffleId};
//! use dask_graph::Value;
//! let id = ShuffleId::new("doc-shuffle");
//! // Two inputs, two outputs: input i sends `10 * i + output` to each output.
//! for input in 0..2u32 {
//!     let pieces = (0..2u32).map(|o| (o, Value::new((10 * input + o) as i64))).collect();
//!     shuffle::send(id, input, pieces).unwrap();
//! }
//! let out1 = shuffle::receive(id, 1, 2).unwrap();
//! let got: Vec<i64> = out1.iter().map(|v| *v.downcast_ref::<i64>().unwrap()).collect();
//! assert_eq!(got, vec![1, 11]);
//! // Received pieces are gone: a second receive says which piece is missing.
//! assert!(matches!(
//!     shuffle::receive(id, 1, 2),
//!     Err(shuffle::ShuffleError::Missing { input: 0, .. })
//! ));
//! shuffle::forget_local(id);
//! ```

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::key::Name;
use crate::value::Value;

/// The built-in function of a shuffle's barrier task: it takes the transfers' results and
/// returns `()`.
pub const BARRIER: &str = "shuffle-barrier";

/// A shuffle's barrier task over `transfers` (the keys of its transfer tasks).
pub fn barrier(id: ShuffleId, transfers: impl IntoIterator<Item = crate::Key>) -> crate::Task {
    crate::Task::new(BARRIER, transfers.into_iter().map(crate::Arg::Key))
        .with_shuffle(ShuffleRole::Barrier { id })
}

/// A shuffle's identity: a name unique to it (collections use a fresh name per shuffle).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShuffleId(pub Name);

impl ShuffleId {
    /// The shuffle named `name`.
    pub fn new(name: &str) -> ShuffleId {
        ShuffleId(Name::new(name))
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        self.0.as_str()
    }
}

impl fmt::Debug for ShuffleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shuffle {}", self.0)
    }
}

impl fmt::Display for ShuffleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_str())
    }
}

/// What a task does in a shuffle (see the module docs). The scheduler of a cluster reads it:
/// it fixes where each output goes when the first transfer is placed, pins unpack tasks
/// there, and runs the transfers again when a worker holding pieces is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ShuffleRole {
    /// Splits input partition `input` and sends its pieces.
    Transfer {
        /// The shuffle.
        id: ShuffleId,
        /// The input partition.
        input: u32,
    },
    /// Runs once every transfer has delivered its pieces.
    Barrier {
        /// The shuffle.
        id: ShuffleId,
    },
    /// Collects output `part`'s pieces.
    Unpack {
        /// The shuffle.
        id: ShuffleId,
        /// The output partition.
        part: u32,
    },
}

impl ShuffleRole {
    /// The shuffle.
    pub fn id(&self) -> ShuffleId {
        match *self {
            ShuffleRole::Transfer { id, .. }
            | ShuffleRole::Barrier { id }
            | ShuffleRole::Unpack { id, .. } => id,
        }
    }
}

/// Why a shuffle's data could not be sent or collected. A task that fails with one of these
/// fails with [`FailureKind::Shuffle`](crate::FailureKind::Shuffle): a cluster's scheduler
/// restarts the shuffle (a bounded number of times) instead of failing the computation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShuffleError {
    /// A piece an unpack task needs is not where it should be (its holder was lost, or the
    /// shuffle ended and its pieces were dropped).
    #[error("{id}: the piece of output {part} from input {input} is missing")]
    Missing {
        /// The shuffle.
        id: ShuffleId,
        /// The output.
        part: u32,
        /// The input whose piece is missing.
        input: u32,
    },
    /// A piece's destination could not be reached or refused it.
    #[error("{id}: sending pieces to {peer} failed: {reason}")]
    Unreachable {
        /// The shuffle.
        id: ShuffleId,
        /// The worker the pieces were for.
        peer: String,
        /// What went wrong.
        reason: String,
    },
    /// This process has not been told where the shuffle's outputs go (the scheduler sends
    /// that with every shuffle task).
    #[error("{id}: this worker does not know the shuffle's current run")]
    NoRun {
        /// The shuffle.
        id: ShuffleId,
    },
    /// A piece names an output the shuffle does not have.
    #[error("{id}: a piece for output {part}, of {outputs}")]
    BadOutput {
        /// The shuffle.
        id: ShuffleId,
        /// The output named.
        part: u32,
        /// How many outputs there are.
        outputs: u32,
    },
    /// A piece could not be encoded for the wire, or decoded from it.
    #[error("{id}: a piece does not encode or decode: {reason}")]
    Data {
        /// The shuffle.
        id: ShuffleId,
        /// Why.
        reason: String,
    },
}

/// Where a shuffle's pieces go and come from: installed per thread by whatever runs tasks.
pub trait ShuffleService: Send + Sync {
    /// Delivers input `input`'s pieces, `(output, value)`, to their outputs; returns once
    /// every piece is stored where its output's unpack task will read it.
    fn send(
        &self,
        id: ShuffleId,
        input: u32,
        pieces: Vec<(u32, Value)>,
    ) -> Result<(), ShuffleError>;

    /// Output `part`'s pieces from inputs `0..inputs`, in input order; they are removed.
    fn receive(&self, id: ShuffleId, part: u32, inputs: u32) -> Result<Vec<Value>, ShuffleError>;
}

/// The service of a process without a cluster: pieces kept in memory until received.
#[derive(Debug, Default)]
pub struct LocalShuffles {
    pieces: Mutex<FxHashMap<(ShuffleId, u32), BTreeMap<u32, Value>>>,
}

impl LocalShuffles {
    /// Drops every piece of shuffle `id` still here.
    pub fn forget(&self, id: ShuffleId) {
        self.pieces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(s, _), _| *s != id);
    }

    /// How many pieces are held (all shuffles).
    pub fn len(&self) -> usize {
        self.pieces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(BTreeMap::len)
            .sum()
    }

    /// Whether no piece is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ShuffleService for LocalShuffles {
    fn send(
        &self,
        id: ShuffleId,
        input: u32,
        pieces: Vec<(u32, Value)>,
    ) -> Result<(), ShuffleError> {
        let mut all = self.pieces.lock().unwrap_or_else(|e| e.into_inner());
        for (part, v) in pieces {
            all.entry((id, part)).or_default().insert(input, v);
        }
        Ok(())
    }

    fn receive(&self, id: ShuffleId, part: u32, inputs: u32) -> Result<Vec<Value>, ShuffleError> {
        let mut all = self.pieces.lock().unwrap_or_else(|e| e.into_inner());
        let here = all.get(&(id, part));
        if let Some(input) = (0..inputs).find(|i| here.is_none_or(|h| !h.contains_key(i))) {
            return Err(ShuffleError::Missing { id, part, input });
        }
        let mut here = all.remove(&(id, part)).unwrap_or_default();
        Ok((0..inputs).filter_map(|i| here.remove(&i)).collect())
    }
}

/// The process's in-memory service (used where no other is installed).
pub fn local() -> &'static LocalShuffles {
    static L: OnceLock<LocalShuffles> = OnceLock::new();
    L.get_or_init(LocalShuffles::default)
}

/// Drops what the process's in-memory service holds of shuffle `id` (the local schedulers do
/// this when a computation ends, so a failed one leaves nothing behind).
pub fn forget_local(id: ShuffleId) {
    local().forget(id);
}

thread_local! {
    static SERVICE: RefCell<Option<Arc<dyn ShuffleService>>> = const { RefCell::new(None) };
    static FAILED: Cell<bool> = const { Cell::new(false) };
}

/// Installs `service` for tasks run on this thread from now on (`None`: the in-memory one).
pub fn install(service: Option<Arc<dyn ShuffleService>>) {
    SERVICE.with(|s| *s.borrow_mut() = service);
}

fn with_service<T>(
    f: impl FnOnce(&dyn ShuffleService) -> Result<T, ShuffleError>,
) -> Result<T, ShuffleError> {
    let installed = SERVICE.with(|s| s.borrow().clone());
    let r = match installed {
        Some(s) => f(&*s),
        None => f(local()),
    };
    if r.is_err() {
        FAILED.with(|x| x.set(true));
    }
    r
}

/// Sends input `input`'s pieces, `(output, value)`, through this thread's service (a transfer
/// task's work). A task that returns this error fails as
/// [`FailureKind::Shuffle`](crate::FailureKind::Shuffle).
pub fn send(id: ShuffleId, input: u32, pieces: Vec<(u32, Value)>) -> Result<(), ShuffleError> {
    with_service(|s| s.send(id, input, pieces))
}

/// Output `part`'s pieces from inputs `0..inputs`, in input order (an unpack task's work).
pub fn receive(id: ShuffleId, part: u32, inputs: u32) -> Result<Vec<Value>, ShuffleError> {
    with_service(|s| s.receive(id, part, inputs))
}

/// Clears the flag that a shuffle call on this thread failed (before a task runs).
pub(crate) fn clear_failed() {
    FAILED.with(|x| x.set(false));
}

/// Whether a shuffle call on this thread failed since [`clear_failed`].
pub(crate) fn failed() -> bool {
    FAILED.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_replace_not_duplicate_and_missing_ones_are_named() {
        let s = LocalShuffles::default();
        let id = ShuffleId::new("shuffle-test-replace");
        s.send(id, 0, vec![(0, Value::new(1i64)), (1, Value::new(2i64))])
            .unwrap();
        // The same input again (a transfer run twice): replaced.
        s.send(id, 0, vec![(0, Value::new(3i64)), (1, Value::new(4i64))])
            .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.receive(id, 0, 2).unwrap_err(),
            ShuffleError::Missing {
                id,
                part: 0,
                input: 1
            }
        );
        s.send(id, 1, vec![(0, Value::new(5i64))]).unwrap();
        let got: Vec<i64> = s
            .receive(id, 0, 2)
            .unwrap()
            .iter()
            .map(|v| *v.downcast_ref::<i64>().unwrap())
            .collect();
        assert_eq!(got, vec![3, 5]);
        assert_eq!(s.len(), 1, "output 1's piece stays");
        s.forget(id);
        assert!(s.is_empty());
    }
}
