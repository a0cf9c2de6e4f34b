//! The scheduler core: a state machine with no I/O, no clock and no locks.
//!
//! Everything happens in `on_*` handlers that take `&mut self`, a [`Comm`] to send messages
//! through, and (where time matters) `now`. The scheduler process runs the core on one task
//! and only decodes messages and dispatches them here; tests drive it with a recording `Comm`.
//!
//! Task states follow Dask's: released, waiting, queued, no-worker, processing, memory,
//! erred (and forgotten, when a task leaves). Placement puts a task where it can start
//! earliest, counting the bytes of its dependencies that would have to move; root tasks (no
//! dependencies) are queued and released only to free worker threads (Dask's worker
//! saturation), with more slots for tasks so short that a round trip to the scheduler would
//! leave threads idle. Keys are released as soon as no client and no pending task needs them.
//! A lost worker's processing tasks are rescheduled, and values held only there recomputed
//! from their lineage.

mod balance;
mod clients;
mod placement;
mod retire;
mod shuffle;
mod state;
#[cfg(test)]
mod tests;
mod transitions;
mod workers;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dask_graph::{FailureKind, Key, TaskFailure};
use rustc_hash::FxHashMap;

pub use retire::MOVE_ATTEMPTS;
pub use shuffle::SHUFFLE_RESTARTS;
pub use state::Status;
use state::{ClientState, Ordered, PrefixStats, Retirement, Slab, TaskId, TaskState, WorkerState};

use crate::protocol::{
    ClientId, Dep, FromClient, FromWorker, Payload, Priority, Scattered, TaskDef, ToClient,
    ToWorker, WorkerId, WorkerInfo,
};

/// Where the core's messages go. The scheduler process batches them per peer; tests record
/// them.
pub trait Comm {
    /// A message to a worker.
    fn send_worker(&mut self, w: WorkerId, msg: ToWorker);
    /// A message to a client.
    fn send_client(&mut self, c: ClientId, msg: ToClient);
    /// The core removed worker `w` for good (silent past the heartbeat timeout): tell it why
    /// ([`ToWorker::Removed`]) and close its connection. The core has already forgotten it.
    fn drop_worker(&mut self, w: WorkerId, reason: String);
    /// The core removed client `c` (silent past the client timeout): tell it why
    /// ([`ToClient::Removed`]) and close its connection.
    fn drop_client(&mut self, c: ClientId, reason: String);
}

/// How often a peer whose silence for `timeout` gets it removed sends heartbeats, in
/// milliseconds: an eighth of the timeout (a peer is removed after about eight missed), between
/// 20 ms and 2 s.
pub fn heartbeat_every(timeout: Duration) -> u64 {
    (timeout.as_millis() / 8).clamp(20, 2000) as u64
}

/// The core's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Tasks per worker thread to release from the queue (Dask's `worker-saturation`).
    pub saturation: f64,
    /// A prefix's tasks shorter than a round trip get more slots: enough to keep a thread busy
    /// for this long without waiting for the scheduler.
    pub latency_fill: Duration,
    /// The most slots per thread short tasks get.
    pub max_saturation: f64,
    /// Assumed duration of a task whose prefix has never finished (Dask's 500 ms).
    pub unknown_duration: Duration,
    /// Assumed bandwidth between workers, to weigh data transfers (bytes per second).
    pub bandwidth: f64,
    /// A worker silent this long is removed (workers send a heartbeat every 2 s).
    pub heartbeat_timeout: Duration,
    /// A client silent this long is dropped, its futures released (clients send a heartbeat
    /// every 2 s).
    pub client_timeout: Duration,
    /// Workers that may die while running one task before it errs with `KilledWorker`
    /// (Dask's `allowed-failures`).
    pub allowed_failures: u32,
    /// Idle workers take tasks waiting on busy ones (see [`balance`](self)); a steal is
    /// confirmed by the victim, so no task runs twice.
    pub work_stealing: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            saturation: 1.1,
            latency_fill: Duration::from_millis(1),
            max_saturation: 64.0,
            unknown_duration: Duration::from_millis(500),
            bandwidth: 100e6,
            heartbeat_timeout: Duration::from_secs(60),
            client_timeout: Duration::from_secs(60),
            allowed_failures: 3,
            work_stealing: true,
        }
    }
}

/// The scheduler's state. See the module docs.
#[derive(Debug)]
pub struct Core {
    cfg: Config,
    tasks: Slab<TaskState>,
    by_key: FxHashMap<Key, TaskId>,
    workers: BTreeMap<WorkerId, WorkerState>,
    next_worker: u32,
    clients: BTreeMap<ClientId, ClientState>,
    next_client: u32,
    queued: Ordered,
    no_worker: Ordered,
    generation: u32,
    prefixes: Vec<PrefixStats>,
    prefix_ids: FxHashMap<&'static str, u32>,
    retirements: Vec<Retirement>,
    next_steal: u64,
    shuffles: FxHashMap<dask_graph::ShuffleId, shuffle::ShuffleState>,
    /// The last run number given to any shuffle: runs are numbered across shuffles, so a
    /// shuffle forgotten and submitted again never reuses a run its workers dropped.
    last_shuffle_run: u32,
    /// The last assignment number given (see [`TaskState::attempt`]).
    last_attempt: u64,
    stats: Stats,
    /// When [`Core::on_tick`] last ran.
    last_tick: Option<Instant>,
}

/// Ticks this far apart mean the scheduler did not run in between (see [`Core::on_tick`]).
pub const STALLED: Duration = Duration::from_secs(1);

/// What the core counted since it started (see [`Core::stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Workers removed because they failed (not retired).
    pub workers_lost: u64,
    /// Workers retired gracefully.
    pub workers_retired: u64,
    /// Tasks sent back to the scheduling pool because their worker was lost.
    pub rescheduled: u64,
    /// Values lost with their workers and computed again.
    pub recomputed: u64,
    /// Steals asked of victims, and those they confirmed.
    pub steals_asked: u64,
    /// Steals confirmed (the task moved).
    pub steals_done: u64,
    /// Tasks run again after failing (`retries`).
    pub retried: u64,
    /// Tasks that erred with `KilledWorker`.
    pub killed_worker: u64,
    /// Shuffles started again (an owner lost, or shuffle data missing).
    pub shuffle_restarts: u64,
    /// Clients dropped for silence past the client timeout.
    pub clients_dropped: u64,
    /// Tasks each worker finished, by worker name.
    pub finished_by: BTreeMap<String, u64>,
}

/// A worker as the core sees it (see [`Core::worker_summaries`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSummary {
    /// Its number.
    pub id: WorkerId,
    /// Its name.
    pub name: String,
    /// Its data address.
    pub address: String,
    /// Its threads.
    pub nthreads: u32,
    /// Its memory limit (0: none).
    pub memory_limit: u64,
    /// Bytes it held at its last heartbeat.
    pub stored: u64,
    /// Tasks it is running or has been sent.
    pub processing: usize,
    /// Bytes it spilled to disk at its last heartbeat.
    pub spilled: u64,
    /// Its resident memory at its last heartbeat.
    pub rss: u64,
    /// It is paused (above its memory pause threshold).
    pub paused: bool,
    /// It is being retired.
    pub retiring: bool,
}

/// What a worker told the scheduler when it registered.
#[derive(Debug, Clone)]
pub struct NewWorker {
    /// A name for logs.
    pub name: String,
    /// Its data address.
    pub address: String,
    /// Threads.
    pub nthreads: u32,
    /// Memory limit in bytes (0: none).
    pub memory_limit: u64,
    /// Its process id (on its host).
    pub pid: u32,
}

impl Core {
    /// An empty core.
    pub fn new(cfg: Config) -> Core {
        Core {
            cfg,
            tasks: Slab::default(),
            by_key: FxHashMap::default(),
            workers: BTreeMap::new(),
            next_worker: 0,
            clients: BTreeMap::new(),
            next_client: 0,
            queued: Ordered::new(),
            no_worker: Ordered::new(),
            generation: 0,
            prefixes: Vec::new(),
            prefix_ids: FxHashMap::default(),
            retirements: Vec::new(),
            next_steal: 0,
            shuffles: FxHashMap::default(),
            last_shuffle_run: 0,
            last_attempt: 0,
            last_tick: None,
            stats: Stats::default(),
        }
    }

    /// What the core counted since it started.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    // ---- introspection (tests, dashboard) ----------------------------------------------

    /// A key's state, if the core knows it.
    pub fn status(&self, key: &Key) -> Option<Status> {
        self.by_key.get(key).map(|&id| self.tasks[id].status)
    }

    /// The workers holding a key's value.
    pub fn who_has(&self, key: &Key) -> Vec<WorkerId> {
        self.by_key
            .get(key)
            .map(|&id| self.tasks[id].who_has.clone())
            .unwrap_or_default()
    }

    /// How many tasks the core knows.
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// The workers, by number.
    pub fn workers(&self) -> Vec<WorkerId> {
        self.workers.keys().copied().collect()
    }

    /// Each worker: number, name, address, threads, memory limit, bytes stored (last
    /// heartbeat), tasks processing.
    pub fn worker_summaries(&self) -> Vec<WorkerSummary> {
        self.workers
            .iter()
            .map(|(&id, w)| WorkerSummary {
                id,
                name: w.name.clone(),
                address: w.address.clone(),
                nthreads: w.nthreads,
                memory_limit: w.memory_limit,
                stored: w.stored,
                processing: w.processing.len(),
                spilled: w.spilled,
                rss: w.rss,
                paused: w.paused,
                retiring: w.retiring,
            })
            .collect()
    }

    /// Calls `f` with every task's key and state (the dashboard's progress and counts).
    pub fn for_each_task(&self, mut f: impl FnMut(&Key, Status)) {
        for (_, t) in self.tasks.iter() {
            f(&t.key, t.status);
        }
    }

    /// The average duration of each task prefix seen, in seconds.
    pub fn prefix_durations(&self) -> Vec<(&'static str, Option<f64>)> {
        self.prefixes.iter().map(|p| (p.name, p.average)).collect()
    }

    /// Up to `limit` tasks that are waiting, queued or processing, one line each: state, where
    /// it runs, and each dependency's state and holders (for diagnosing a computation that
    /// does not finish).
    pub fn describe_pending(&self, limit: usize) -> Vec<String> {
        self.tasks
            .iter()
            .filter(|(_, t)| !matches!(t.status, Status::Memory | Status::Erred | Status::Released))
            .take(limit)
            .map(|(_, t)| {
                let deps: Vec<String> = t
                    .deps
                    .iter()
                    .map(|&d| {
                        let dt = &self.tasks[d];
                        let holders: Vec<u32> = dt.who_has.iter().map(|w| w.0).collect();
                        format!("{} {:?} on {holders:?}", dt.key, dt.status)
                    })
                    .collect();
                format!(
                    "{} {:?} on {:?} waiting for {} (steal {:?}, wanted by {}): [{}]",
                    t.key,
                    t.status,
                    t.processing_on.map(|w| w.0),
                    t.waiting_on,
                    t.stealing.map(|w| w.0),
                    t.wanted_by.len(),
                    deps.join(", ")
                )
            })
            .collect()
    }

    /// How many tasks a worker is running or has been sent.
    pub fn processing(&self, w: WorkerId) -> usize {
        self.workers.get(&w).map_or(0, |ws| ws.processing.len())
    }

    /// Checks every invariant between tasks, workers and clients; panics naming the first one
    /// broken (tests call it after every step).
    pub fn check(&self) {
        for (id, t) in self.tasks.iter() {
            let k = t.key;
            assert_eq!(self.by_key.get(&k), Some(&id), "{k}: indexed");
            assert_eq!(
                t.status == Status::Processing,
                t.processing_on.is_some(),
                "{k}: processing iff on a worker"
            );
            assert!(
                t.stealing.is_none() || t.status == Status::Processing,
                "{k}: stolen only while processing"
            );
            if let Some(w) = t.processing_on {
                assert!(
                    self.workers
                        .get(&w)
                        .is_some_and(|ws| ws.processing.contains(&id)),
                    "{k}: on its worker's books"
                );
            }
            assert_eq!(
                t.status == Status::Memory,
                !t.who_has.is_empty(),
                "{k} ({:?}): in memory iff someone holds it",
                t.status
            );
            for w in &t.who_has {
                assert!(
                    self.workers.get(w).is_some_and(|ws| ws.has.contains(&id)),
                    "{k}: its holder knows"
                );
            }
            if t.status == Status::Waiting {
                let not_in_memory = t
                    .deps
                    .iter()
                    .filter(|&&d| self.tasks[d].status != Status::Memory)
                    .count();
                assert_eq!(t.waiting_on as usize, not_in_memory, "{k}: waiting count");
                assert!(not_in_memory > 0, "{k}: waiting on nothing");
            }
            assert_eq!(
                t.status == Status::Queued,
                self.queued.contains(&(t.priority, id)),
                "{k}: queued iff in the queue"
            );
            assert_eq!(
                t.status == Status::NoWorker,
                self.no_worker.contains(&(t.priority, id)),
                "{k}: no-worker iff in that set"
            );
            for &d in &t.deps {
                assert!(
                    self.tasks
                        .get(d)
                        .is_some_and(|dt| dt.dependents.contains(&id)),
                    "{k}: its dependencies know it"
                );
            }
            for &d in &t.dependents {
                assert!(
                    self.tasks.get(d).is_some_and(|dt| dt.deps.contains(&id)),
                    "{k}: its dependents know it"
                );
            }
            for c in &t.wanted_by {
                assert!(self.clients.contains_key(c), "{k}: wanted by a live client");
            }
            if matches!(
                t.status,
                Status::Memory | Status::Processing | Status::Waiting
            ) && t.wanted_by.is_empty()
            {
                assert!(
                    self.needed(id),
                    "{k} ({:?}): kept only while needed",
                    t.status
                );
            }
        }
        for (w, ws) in &self.workers {
            for &id in &ws.processing {
                assert_eq!(
                    self.tasks.get(id).and_then(|t| t.processing_on),
                    Some(*w),
                    "worker {}: processing",
                    w.0
                );
            }
            let incoming = self
                .tasks
                .iter()
                .filter(|(_, t)| t.stealing == Some(*w))
                .count();
            assert_eq!(
                ws.incoming as usize, incoming,
                "worker {}: steals towards it",
                w.0
            );
            for &id in &ws.has {
                assert!(
                    self.tasks.get(id).is_some_and(|t| t.who_has.contains(w)),
                    "worker {}: holds",
                    w.0
                );
            }
        }
        assert_eq!(self.by_key.len(), self.tasks.len(), "index and slab agree");
    }
}
