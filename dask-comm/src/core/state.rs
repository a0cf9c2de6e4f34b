//! What the scheduler core knows: tasks, workers, clients, and the invariants between them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use dask_graph::{Key, TaskFailure};
use rustc_hash::FxHashSet;

use crate::protocol::{ClientId, Payload, Priority, WorkerId};

/// A task's number in the core (its slot).
pub type TaskId = u32;

/// A task's state, as Dask names them (forgotten tasks leave the core).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Known, not computed, not needed now (or lost).
    Released,
    /// Needed; waiting for dependencies.
    Waiting,
    /// Ready root task, held back until a worker thread is free.
    Queued,
    /// Ready, but there is no worker.
    NoWorker,
    /// Sent to a worker.
    Processing,
    /// Its value is on one or more workers.
    Memory,
    /// It failed (or a dependency did).
    Erred,
}

impl Status {
    /// Every state, in the order a task moves through them.
    pub const ALL: [Status; 7] = [
        Status::Released,
        Status::Waiting,
        Status::Queued,
        Status::NoWorker,
        Status::Processing,
        Status::Memory,
        Status::Erred,
    ];

    /// Its name, as Dask's (`no-worker` and all).
    pub fn name(self) -> &'static str {
        match self {
            Status::Released => "released",
            Status::Waiting => "waiting",
            Status::Queued => "queued",
            Status::NoWorker => "no-worker",
            Status::Processing => "processing",
            Status::Memory => "memory",
            Status::Erred => "erred",
        }
    }
}

/// One task.
#[derive(Debug)]
pub struct TaskState {
    pub key: Key,
    /// What a worker runs; `None` for values a client scattered (they cannot be recomputed).
    pub spec: Option<Payload>,
    pub deps: Vec<TaskId>,
    pub dependents: Vec<TaskId>,
    pub status: Status,
    /// Dependencies not in memory (while waiting).
    pub waiting_on: u32,
    pub who_has: Vec<WorkerId>,
    pub processing_on: Option<WorkerId>,
    /// The number of its latest assignment to a worker ([`ToWorker::Compute`]'s `attempt`):
    /// a worker's news of an earlier one is stale.
    ///
    /// [`ToWorker::Compute`]: crate::protocol::ToWorker::Compute
    pub attempt: u64,
    /// Seconds the worker it runs on is expected to spend on it.
    pub expected: f64,
    pub wanted_by: Vec<ClientId>,
    pub priority: Priority,
    pub nbytes: u64,
    pub failure: Option<Arc<TaskFailure>>,
    /// The task's prefix (see [`Key::prefix`]), numbered.
    pub prefix: u32,
    /// Runs left after a failure (the client's `retries`).
    pub retries: u32,
    /// Workers that died while they may have been running it (names): at
    /// [`Config::allowed_failures`](super::Config) it errs with `KilledWorker`.
    pub killed_on: Vec<String>,
    /// A steal in flight: the victim (`processing_on`) was asked to give it back, for this
    /// thief.
    pub stealing: Option<WorkerId>,
    /// The number of the last steal asked for it.
    pub steal_id: u64,
    /// Its worker refused a steal (it started): not asked again while it is there.
    pub steal_refused: bool,
    /// Its part in a peer-to-peer shuffle.
    pub shuffle: Option<dask_graph::ShuffleRole>,
}

impl TaskState {
    /// A task the scheduler has just learnt of: released, linked to nothing yet.
    pub fn new(key: Key, spec: Option<Payload>, priority: Priority, prefix: u32) -> TaskState {
        TaskState {
            key,
            spec,
            deps: Vec::new(),
            dependents: Vec::new(),
            status: Status::Released,
            waiting_on: 0,
            who_has: Vec::new(),
            processing_on: None,
            attempt: 0,
            expected: 0.0,
            wanted_by: Vec::new(),
            priority,
            nbytes: 0,
            failure: None,
            prefix,
            retries: 0,
            killed_on: Vec::new(),
            stealing: None,
            steal_id: 0,
            steal_refused: false,
            shuffle: None,
        }
    }
}

/// One worker.
#[derive(Debug)]
pub struct WorkerState {
    pub name: String,
    pub address: String,
    pub nthreads: u32,
    pub memory_limit: u64,
    pub pid: u32,
    pub processing: FxHashSet<TaskId>,
    /// Seconds of work assigned and not finished.
    pub occupancy: f64,
    pub has: FxHashSet<TaskId>,
    pub stored: u64,
    /// Bytes it spilled to disk (last heartbeat).
    pub spilled: u64,
    /// Its process's resident memory (last heartbeat).
    pub rss: u64,
    /// Above its pause threshold: it gets no new task, and what waits there may be stolen.
    pub paused: bool,
    /// Being retired: it gets no new task, and leaves once what others need is elsewhere.
    pub retiring: bool,
    /// Steals in flight towards it (they count against its slots).
    pub incoming: u32,
    pub last_seen: Instant,
}

impl WorkerState {
    /// Whether new tasks may go here.
    pub fn open(&self) -> bool {
        !self.paused && !self.retiring
    }
}

/// A request to retire workers, until they are all gone.
#[derive(Debug)]
pub struct Retirement {
    pub client: ClientId,
    pub workers: Vec<WorkerId>,
    pub addresses: Vec<String>,
    /// The request's number (the client's).
    pub id: u64,
    /// Values being copied off a retiring worker: the key, and the worker fetching it.
    pub moving: Vec<(Key, WorkerId)>,
    /// Copies asked per value.
    pub attempts: rustc_hash::FxHashMap<Key, u32>,
}

/// One client.
#[derive(Debug)]
pub struct ClientState {
    pub name: String,
    /// When the client was last heard from (`None`: not since it joined; the next tick
    /// starts its clock).
    pub last_seen: Option<Instant>,
}

/// Durations of a prefix's tasks.
#[derive(Debug, Clone)]
pub struct PrefixStats {
    pub name: &'static str,
    /// Exponentially weighted average duration in seconds, once one finished.
    pub average: Option<f64>,
}

/// Slots that keep their numbers while others come and go.
#[derive(Debug)]
pub struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    pub fn insert(&mut self, v: T) -> u32 {
        self.len += 1;
        match self.free.pop() {
            Some(i) => {
                self.items[i as usize] = Some(v);
                i
            }
            None => {
                self.items.push(Some(v));
                (self.items.len() - 1) as u32
            }
        }
    }

    pub fn remove(&mut self, i: u32) -> Option<T> {
        let v = self.items.get_mut(i as usize)?.take();
        if v.is_some() {
            self.len -= 1;
            self.free.push(i);
        }
        v
    }

    pub fn get(&self, i: u32) -> Option<&T> {
        self.items.get(i as usize)?.as_ref()
    }

    pub fn get_mut(&mut self, i: u32) -> Option<&mut T> {
        self.items.get_mut(i as usize)?.as_mut()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.items
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.as_ref().map(|v| (i as u32, v)))
    }
}

impl<T> std::ops::Index<u32> for Slab<T> {
    type Output = T;
    fn index(&self, i: u32) -> &T {
        self.get(i).expect("a live task")
    }
}

impl<T> std::ops::IndexMut<u32> for Slab<T> {
    fn index_mut(&mut self, i: u32) -> &mut T {
        self.get_mut(i).expect("a live task")
    }
}

/// The sets of ready tasks the core holds back, by priority.
pub type Ordered = BTreeSet<(Priority, TaskId)>;
