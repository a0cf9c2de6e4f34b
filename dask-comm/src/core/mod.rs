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

mod placement;
mod state;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dask_graph::{FailureKind, Key, TaskFailure};
use rustc_hash::FxHashMap;

pub use state::Status;
use state::{ClientState, Ordered, PrefixStats, Slab, TaskId, TaskState, WorkerState};

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
    /// A worker silent this long is removed.
    pub heartbeat_timeout: Duration,
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
        }
    }

    // ---- clients -----------------------------------------------------------------------

    /// A client connected; it is welcomed with the workers there are.
    pub fn on_client_added(&mut self, name: String, comm: &mut impl Comm) -> ClientId {
        let id = ClientId(self.next_client);
        self.next_client += 1;
        tracing::debug!(client = id.0, %name, "client added");
        self.clients.insert(id, ClientState { name });
        comm.send_client(
            id,
            ToClient::Welcome {
                id,
                workers: self.worker_infos(),
            },
        );
        id
    }

    /// A client left (closed or failed): its keys are released.
    pub fn on_client_removed(&mut self, c: ClientId, comm: &mut impl Comm) {
        let Some(client) = self.clients.remove(&c) else {
            return;
        };
        tracing::debug!(client = c.0, name = %client.name, "client removed");
        let wanted: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.wanted_by.contains(&c))
            .map(|(id, _)| id)
            .collect();
        self.unwant(&wanted, c, comm);
    }

    /// A message from client `c`.
    pub fn on_client_message(&mut self, c: ClientId, msg: FromClient, comm: &mut impl Comm) {
        if !self.clients.contains_key(&c) {
            return;
        }
        match msg {
            FromClient::UpdateGraph { tasks, wanted } => self.update_graph(c, tasks, wanted, comm),
            FromClient::Scattered { keys } => self.scattered(c, keys, comm),
            FromClient::Release { keys } => {
                let ids: Vec<TaskId> = keys
                    .iter()
                    .filter_map(|k| self.by_key.get(k).copied())
                    .collect();
                self.unwant(&ids, c, comm);
            }
            FromClient::Cancel { keys } => {
                let mut ids = Vec::with_capacity(keys.len());
                for k in keys {
                    if let Some(&id) = self.by_key.get(&k) {
                        if self.tasks[id].wanted_by.contains(&c) {
                            comm.send_client(c, ToClient::Cancelled { key: k });
                            ids.push(id);
                        }
                    }
                }
                self.unwant(&ids, c, comm);
            }
            FromClient::WhoHas { keys } => {
                let holders = keys
                    .into_iter()
                    .map(|k| {
                        let addrs = self
                            .by_key
                            .get(&k)
                            .map(|&id| self.addresses(&self.tasks[id].who_has))
                            .unwrap_or_default();
                        (k, addrs)
                    })
                    .collect();
                comm.send_client(c, ToClient::WhoHas { holders });
            }
        }
    }

    fn update_graph(
        &mut self,
        c: ClientId,
        defs: Vec<TaskDef>,
        wanted: Vec<Key>,
        comm: &mut impl Comm,
    ) {
        // Every dependency must be in this graph or already known; otherwise nothing is added.
        let incoming: rustc_hash::FxHashSet<Key> = defs.iter().map(|d| d.key).collect();
        let missing = defs.iter().find_map(|d| {
            d.deps
                .iter()
                .find(|k| !incoming.contains(k) && !self.by_key.contains_key(k))
                .map(|k| (d.key, *k))
        });
        let unknown_wanted = wanted
            .iter()
            .find(|k| !incoming.contains(k) && !self.by_key.contains_key(k));
        if let Some(reason) = missing
            .map(|(key, dep)| format!("task {key} needs {dep}, which the scheduler does not have"))
            .or_else(|| unknown_wanted.map(|k| format!("{k} is neither in the graph nor known")))
        {
            tracing::warn!(client = c.0, %reason, "refused a graph");
            comm.send_client(
                c,
                ToClient::Refused {
                    keys: wanted,
                    reason,
                },
            );
            return;
        }
        self.generation += 1;
        let mut fresh = Vec::with_capacity(defs.len());
        let mut links = Vec::with_capacity(defs.len());
        for d in defs {
            if self.by_key.contains_key(&d.key) {
                continue; // known already: the existing task stands
            }
            let prefix = self.prefix_of(&d.key);
            let id = self.tasks.insert(TaskState {
                key: d.key,
                spec: Some(d.spec),
                deps: Vec::new(),
                dependents: Vec::new(),
                status: Status::Released,
                waiting_on: 0,
                who_has: Vec::new(),
                processing_on: None,
                expected: 0.0,
                wanted_by: Vec::new(),
                priority: Priority(self.generation, d.order),
                nbytes: 0,
                failure: None,
                prefix,
            });
            self.by_key.insert(d.key, id);
            fresh.push(id);
            links.push(d.deps);
        }
        for (&id, deps) in fresh.iter().zip(links) {
            let mut dep_ids: Vec<TaskId> = deps.iter().map(|k| self.by_key[k]).collect();
            dep_ids.sort_unstable();
            dep_ids.dedup();
            for &d in &dep_ids {
                self.tasks[d].dependents.push(id);
            }
            self.tasks[id].deps = dep_ids;
        }
        let mut roots = Vec::with_capacity(wanted.len());
        for k in wanted {
            let id = self.by_key[&k];
            let t = &mut self.tasks[id];
            if !t.wanted_by.contains(&c) {
                t.wanted_by.push(c);
            }
            match t.status {
                Status::Memory => comm.send_client(c, self.in_memory(id, None)),
                Status::Erred => {
                    let failure = t.failure.as_deref().cloned().unwrap_or_else(|| {
                        TaskFailure::new(k, "", FailureKind::Lost, "failed earlier")
                    });
                    comm.send_client(c, ToClient::Erred { key: k, failure });
                }
                _ => roots.push(id),
            }
        }
        self.compute(&roots, comm);
        // New tasks no one needs (not wanted, no pending dependent) are forgotten at once.
        for id in fresh {
            if self
                .tasks
                .get(id)
                .is_some_and(|t| t.status == Status::Released)
            {
                self.release(id, comm);
            }
        }
    }

    fn scattered(&mut self, c: ClientId, items: Vec<Scattered>, comm: &mut impl Comm) {
        for s in items {
            if !self.workers.contains_key(&s.worker) {
                comm.send_client(
                    c,
                    ToClient::Refused {
                        keys: vec![s.key],
                        reason: format!("worker {} is gone", s.worker.0),
                    },
                );
                continue;
            }
            let id = match self.by_key.get(&s.key) {
                Some(&id) => id,
                None => {
                    let prefix = self.prefix_of(&s.key);
                    let id = self.tasks.insert(TaskState {
                        key: s.key,
                        spec: None,
                        deps: Vec::new(),
                        dependents: Vec::new(),
                        status: Status::Released,
                        waiting_on: 0,
                        who_has: Vec::new(),
                        processing_on: None,
                        expected: 0.0,
                        wanted_by: Vec::new(),
                        priority: Priority(self.generation, 0),
                        nbytes: 0,
                        failure: None,
                        prefix,
                    });
                    self.by_key.insert(s.key, id);
                    id
                }
            };
            if !self.tasks[id].wanted_by.contains(&c) {
                self.tasks[id].wanted_by.push(c);
            }
            if self.tasks[id].status != Status::Memory {
                // Tells the clients that want it, this one included.
                self.tasks[id].nbytes = s.nbytes;
                self.mark_in_memory(id, s.worker, None, comm);
                continue;
            }
            if !self.tasks[id].who_has.contains(&s.worker) {
                self.tasks[id].who_has.push(s.worker);
                if let Some(w) = self.workers.get_mut(&s.worker) {
                    w.has.insert(id);
                }
            }
            comm.send_client(c, self.in_memory(id, None));
        }
    }

    /// Client `c` no longer wants tasks `ids`: all of them first, then what that leaves
    /// unneeded is released (one at a time would hand freed slots to tasks about to go).
    fn unwant(&mut self, ids: &[TaskId], c: ClientId, comm: &mut impl Comm) {
        for &id in ids {
            self.tasks[id].wanted_by.retain(|&x| x != c);
        }
        for &id in ids {
            if self.tasks.get(id).is_some() && !self.needed(id) {
                self.release(id, comm);
            }
        }
    }

    // ---- workers -----------------------------------------------------------------------

    /// A worker registered: it gets work at once (queued and unrunnable tasks).
    pub fn on_worker_added(
        &mut self,
        w: NewWorker,
        now: Instant,
        comm: &mut impl Comm,
    ) -> WorkerId {
        let id = WorkerId(self.next_worker);
        self.next_worker += 1;
        tracing::info!(worker = id.0, name = %w.name, address = %w.address, nthreads = w.nthreads, "worker added");
        self.workers.insert(
            id,
            WorkerState {
                name: w.name,
                address: w.address,
                nthreads: w.nthreads.max(1),
                memory_limit: w.memory_limit,
                pid: w.pid,
                processing: Default::default(),
                occupancy: 0.0,
                has: Default::default(),
                stored: 0,
                last_seen: now,
            },
        );
        comm.send_worker(id, ToWorker::Welcome { id });
        self.tell_clients_workers(comm);
        let unrunnable: Vec<TaskId> = std::mem::take(&mut self.no_worker)
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        for t in unrunnable {
            self.tasks[t].status = Status::Waiting;
            self.make_ready(t, comm);
        }
        self.fill(id, comm);
        id
    }

    /// A worker left or failed: its processing tasks are rescheduled, and values held only
    /// there are recomputed (or, for scattered values, fail the futures that need them).
    pub fn on_worker_removed(&mut self, w: WorkerId, comm: &mut impl Comm) {
        let Some(worker) = self.workers.remove(&w) else {
            return;
        };
        tracing::warn!(worker = w.0, name = %worker.name, processing = worker.processing.len(), holds = worker.has.len(), "worker removed");
        self.tell_clients_workers(comm);
        let mut lost = Vec::new();
        for &id in &worker.has {
            let t = &mut self.tasks[id];
            t.who_has.retain(|&x| x != w);
            if t.who_has.is_empty() && t.status == Status::Memory {
                lost.push(id);
            }
        }
        let mut rerun: Vec<TaskId> = worker.processing.iter().copied().collect();
        rerun.sort_unstable();
        for &id in &rerun {
            let t = &mut self.tasks[id];
            t.processing_on = None;
            t.status = Status::Waiting;
        }
        for id in lost {
            self.lose(id, comm);
        }
        for id in rerun {
            if self
                .tasks
                .get(id)
                .is_some_and(|t| t.status == Status::Waiting)
            {
                self.recount(id);
                if self.tasks[id].waiting_on == 0 {
                    self.make_ready(id, comm);
                } else {
                    self.compute(&[id], comm);
                }
            }
        }
        // Slots freed elsewhere are filled as tasks finish; if none is busy, fill now.
        let ids: Vec<WorkerId> = self.workers.keys().copied().collect();
        for id in ids {
            self.fill(id, comm);
        }
    }

    /// A message from worker `w`.
    pub fn on_worker_message(
        &mut self,
        w: WorkerId,
        msg: FromWorker,
        now: Instant,
        comm: &mut impl Comm,
    ) {
        let Some(worker) = self.workers.get_mut(&w) else {
            return;
        };
        worker.last_seen = now;
        match msg {
            FromWorker::Finished {
                key,
                nbytes,
                micros,
                small,
            } => self.finished(w, key, nbytes, micros, small, comm),
            FromWorker::Erred { key, failure } => self.erred(w, key, failure, comm),
            FromWorker::MissingDep { key, dep, tried } => {
                self.missing_dep(w, key, dep, tried, comm)
            }
            FromWorker::Heartbeat { stored, .. } => worker.stored = stored,
        }
    }

    /// Time passed: workers silent past the heartbeat timeout are removed.
    pub fn on_tick(&mut self, now: Instant, comm: &mut impl Comm) {
        let silent: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| {
                now.saturating_duration_since(w.last_seen) > self.cfg.heartbeat_timeout
            })
            .map(|(&id, _)| id)
            .collect();
        for w in silent {
            tracing::warn!(worker = w.0, "no heartbeat: removing the worker");
            self.on_worker_removed(w, comm);
        }
    }

    fn finished(
        &mut self,
        w: WorkerId,
        key: Key,
        nbytes: u64,
        micros: u64,
        small: Option<Payload>,
        comm: &mut impl Comm,
    ) {
        let Some(&id) = self.by_key.get(&key) else {
            // Forgotten meanwhile: the worker may drop it.
            comm.send_worker(w, ToWorker::Free { keys: vec![key] });
            return;
        };
        let t = &self.tasks[id];
        if t.status != Status::Processing || t.processing_on != Some(w) {
            if t.status == Status::Memory && !t.who_has.contains(&w) {
                // Computed twice (rescheduled): a second copy is as good.
                self.tasks[id].who_has.push(w);
                if let Some(ws) = self.workers.get_mut(&w) {
                    ws.has.insert(id);
                }
            } else {
                comm.send_worker(w, ToWorker::Free { keys: vec![key] });
            }
            return;
        }
        let prefix = t.prefix as usize;
        let secs = micros as f64 / 1e6;
        let avg = &mut self.prefixes[prefix].average;
        *avg = Some(avg.map_or(secs, |a| 0.5 * a + 0.5 * secs));
        self.unassign(id);
        self.tasks[id].nbytes = nbytes;
        self.mark_in_memory(id, w, small, comm);
        self.fill(w, comm);
    }

    fn erred(&mut self, w: WorkerId, key: Key, failure: TaskFailure, comm: &mut impl Comm) {
        let Some(&id) = self.by_key.get(&key) else {
            return;
        };
        let t = &self.tasks[id];
        if t.status != Status::Processing || t.processing_on != Some(w) {
            return;
        }
        tracing::debug!(%key, error = %failure, "task erred");
        self.unassign(id);
        self.fail(id, Arc::new(failure), comm);
        self.fill(w, comm);
    }

    fn missing_dep(
        &mut self,
        w: WorkerId,
        key: Key,
        dep: Key,
        tried: Vec<String>,
        comm: &mut impl Comm,
    ) {
        let (Some(&id), Some(&dep_id)) = (self.by_key.get(&key), self.by_key.get(&dep)) else {
            return;
        };
        if self.tasks[id].processing_on != Some(w) {
            return;
        }
        tracing::info!(%key, %dep, ?tried, "a dependency could not be fetched");
        let gone: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, ws)| tried.contains(&ws.address))
            .map(|(&id, _)| id)
            .collect();
        for g in gone {
            self.tasks[dep_id].who_has.retain(|&x| x != g);
            if let Some(ws) = self.workers.get_mut(&g) {
                ws.has.remove(&dep_id);
            }
        }
        self.unassign(id);
        self.tasks[id].status = Status::Waiting;
        if self.tasks[dep_id].who_has.is_empty() && self.tasks[dep_id].status == Status::Memory {
            self.lose(dep_id, comm);
        }
        if self
            .tasks
            .get(id)
            .is_some_and(|t| t.status == Status::Waiting)
        {
            self.recount(id);
            if self.tasks[id].waiting_on == 0 {
                self.make_ready(id, comm);
            }
        }
        self.fill(w, comm);
    }

    // ---- transitions -------------------------------------------------------------------

    /// Makes sure `roots` (and what they need) get computed: released tasks become waiting,
    /// recursively, and those whose dependencies are all in memory become ready.
    fn compute(&mut self, roots: &[TaskId], comm: &mut impl Comm) {
        let mut stack: Vec<TaskId> = Vec::new();
        let mut woken = Vec::new();
        for &r in roots {
            match self.tasks[r].status {
                Status::Released | Status::Waiting => stack.push(r),
                _ => {}
            }
        }
        // Walk down through released dependencies, marking them waiting.
        while let Some(id) = stack.pop() {
            let t = &mut self.tasks[id];
            if t.status == Status::Released {
                if t.spec.is_none() {
                    let key = t.key;
                    let failure = TaskFailure::new(
                        key,
                        "scatter",
                        FailureKind::Lost,
                        format!(
                            "{key} was scattered to a worker that left; it cannot be recomputed"
                        ),
                    );
                    self.fail(id, Arc::new(failure), comm);
                    continue;
                }
                t.status = Status::Waiting;
            } else if t.status != Status::Waiting {
                continue;
            }
            woken.push(id);
            let deps = self.tasks[id].deps.clone();
            for d in deps {
                if self.tasks[d].status == Status::Released {
                    stack.push(d);
                }
            }
        }
        // Dependencies first, so an erred dependency fails its dependents.
        for &id in woken.iter().rev() {
            if self
                .tasks
                .get(id)
                .is_none_or(|t| t.status != Status::Waiting)
            {
                continue;
            }
            if let Some(cause) = self.tasks[id]
                .deps
                .iter()
                .find_map(|&d| self.tasks[d].failure.clone())
            {
                self.fail(id, cause, comm);
                continue;
            }
            self.recount(id);
            if self.tasks[id].waiting_on == 0 {
                self.make_ready(id, comm);
            }
        }
    }

    /// Counts a waiting task's dependencies that are not in memory.
    fn recount(&mut self, id: TaskId) {
        let n = self.tasks[id]
            .deps
            .iter()
            .filter(|&&d| self.tasks[d].status != Status::Memory)
            .count();
        self.tasks[id].waiting_on = n as u32;
    }

    /// A task whose dependencies are all in memory: to a worker, or the queue.
    fn make_ready(&mut self, id: TaskId, comm: &mut impl Comm) {
        debug_assert_eq!(self.tasks[id].status, Status::Waiting);
        let priority = self.tasks[id].priority;
        if self.workers.is_empty() {
            self.tasks[id].status = Status::NoWorker;
            self.no_worker.insert((priority, id));
            return;
        }
        if self.tasks[id].deps.is_empty() {
            match self.free_worker(self.tasks[id].prefix) {
                Some(w) => self.assign(id, w, comm),
                None => {
                    self.tasks[id].status = Status::Queued;
                    self.queued.insert((priority, id));
                }
            }
            return;
        }
        let w = self.decide_worker(id);
        self.assign(id, w, comm);
    }

    /// Sends task `id` to worker `w`.
    fn assign(&mut self, id: TaskId, w: WorkerId, comm: &mut impl Comm) {
        let expected = self.expected(self.tasks[id].prefix);
        let deps: Vec<Dep> = self.tasks[id]
            .deps
            .iter()
            .map(|&d| {
                let dt = &self.tasks[d];
                Dep {
                    key: dt.key,
                    holders: self.addresses(&dt.who_has),
                    nbytes: dt.nbytes,
                }
            })
            .collect();
        let t = &mut self.tasks[id];
        t.status = Status::Processing;
        t.processing_on = Some(w);
        t.expected = expected;
        let ws = self.workers.get_mut(&w).expect("assigned to a live worker");
        ws.processing.insert(id);
        ws.occupancy += expected;
        comm.send_worker(
            w,
            ToWorker::Compute {
                key: t.key,
                spec: t.spec.clone().unwrap_or_default(),
                deps,
                priority: t.priority,
                wanted: !t.wanted_by.is_empty(),
            },
        );
    }

    /// Takes a processing task off its worker's books.
    fn unassign(&mut self, id: TaskId) {
        let t = &mut self.tasks[id];
        if let Some(w) = t.processing_on.take() {
            if let Some(ws) = self.workers.get_mut(&w) {
                ws.processing.remove(&id);
                ws.occupancy = (ws.occupancy - t.expected).max(0.0);
            }
        }
    }

    /// Task `id`'s value is on worker `w` (and, when small, in `small`): tell who wants it, wake
    /// dependents, release what no longer has a use.
    fn mark_in_memory(
        &mut self,
        id: TaskId,
        w: WorkerId,
        small: Option<Payload>,
        comm: &mut impl Comm,
    ) {
        let t = &mut self.tasks[id];
        t.status = Status::Memory;
        t.who_has = vec![w];
        t.failure = None;
        if let Some(ws) = self.workers.get_mut(&w) {
            ws.has.insert(id);
        }
        if !self.tasks[id].wanted_by.is_empty() {
            let msg = self.in_memory(id, small);
            for &c in &self.tasks[id].wanted_by {
                comm.send_client(c, msg.clone());
            }
        }
        let dependents = self.tasks[id].dependents.clone();
        for d in dependents {
            let dt = &mut self.tasks[d];
            if dt.status == Status::Waiting {
                dt.waiting_on = dt.waiting_on.saturating_sub(1);
                if dt.waiting_on == 0 {
                    self.make_ready(d, comm);
                }
            }
        }
        let deps = self.tasks[id].deps.clone();
        for d in deps {
            if self.tasks.get(d).is_some() && !self.needed(d) {
                self.release(d, comm);
            }
        }
        if !self.needed(id) {
            self.release(id, comm);
        }
    }

    /// Task `id` failed with `cause`: it and every pending task that needs it err.
    fn fail(&mut self, id: TaskId, cause: Arc<TaskFailure>, comm: &mut impl Comm) {
        let mut stack = vec![id];
        let mut failed = Vec::new();
        while let Some(i) = stack.pop() {
            let t = &mut self.tasks[i];
            if t.status == Status::Erred {
                continue;
            }
            match t.status {
                Status::Queued => {
                    self.queued.remove(&(t.priority, i));
                }
                Status::NoWorker => {
                    self.no_worker.remove(&(t.priority, i));
                }
                _ => {}
            }
            let t = &mut self.tasks[i];
            t.status = Status::Erred;
            t.failure = Some(Arc::clone(&cause));
            for &c in &t.wanted_by {
                comm.send_client(
                    c,
                    ToClient::Erred {
                        key: t.key,
                        failure: (*cause).clone(),
                    },
                );
            }
            failed.push(i);
            stack.extend(self.tasks[i].dependents.iter().copied().filter(|&d| {
                matches!(
                    self.tasks[d].status,
                    Status::Waiting | Status::Queued | Status::NoWorker
                )
            }));
        }
        for i in failed {
            let deps = self.tasks[i].deps.clone();
            for d in deps {
                if self.tasks.get(d).is_some() && !self.needed(d) {
                    self.release(d, comm);
                }
            }
            if self.tasks.get(i).is_some() && !self.needed(i) {
                self.release(i, comm);
            }
        }
    }

    /// Task `id`'s value is gone from every worker: dependents waiting on it wait again, ones
    /// running elsewhere are taken back, and it is recomputed if anything needs it.
    fn lose(&mut self, id: TaskId, comm: &mut impl Comm) {
        self.tasks[id].status = Status::Released;
        self.tasks[id].who_has.clear();
        let dependents = self.tasks[id].dependents.clone();
        for d in dependents {
            let dt = &self.tasks[d];
            match dt.status {
                Status::Waiting => self.tasks[d].waiting_on += 1,
                Status::Processing => {
                    let (key, w) = (dt.key, dt.processing_on);
                    self.unassign(d);
                    if let Some(w) = w {
                        comm.send_worker(w, ToWorker::Free { keys: vec![key] });
                    }
                    self.tasks[d].status = Status::Waiting;
                    self.recount(d);
                }
                Status::NoWorker => {
                    self.no_worker.remove(&(dt.priority, d));
                    self.tasks[d].status = Status::Waiting;
                    self.recount(d);
                }
                _ => {}
            }
        }
        if self.needed(id) {
            self.compute(&[id], comm);
        } else {
            self.release(id, comm);
        }
    }

    /// Whether anything needs task `id`: a client, or a dependent still to run.
    fn needed(&self, id: TaskId) -> bool {
        let t = &self.tasks[id];
        !t.wanted_by.is_empty()
            || t.dependents.iter().any(|&d| {
                matches!(
                    self.tasks[d].status,
                    Status::Waiting | Status::Queued | Status::NoWorker | Status::Processing
                )
            })
    }

    /// Releases tasks nothing needs (freeing their values on workers, cancelling them where
    /// they run), then forgets those nothing refers to.
    fn release(&mut self, id: TaskId, comm: &mut impl Comm) {
        let mut stack = vec![id];
        let mut forget = Vec::new();
        while let Some(i) = stack.pop() {
            let Some(t) = self.tasks.get_mut(i) else {
                continue;
            };
            let key = t.key;
            match t.status {
                Status::Memory => {
                    for w in std::mem::take(&mut t.who_has) {
                        if let Some(ws) = self.workers.get_mut(&w) {
                            ws.has.remove(&i);
                            comm.send_worker(w, ToWorker::Free { keys: vec![key] });
                        }
                    }
                }
                Status::Processing => {
                    let w = t.processing_on;
                    self.unassign(i);
                    if let Some(w) = w {
                        comm.send_worker(w, ToWorker::Free { keys: vec![key] });
                        self.fill(w, comm);
                    }
                }
                Status::Queued => {
                    let p = t.priority;
                    self.queued.remove(&(p, i));
                }
                Status::NoWorker => {
                    let p = t.priority;
                    self.no_worker.remove(&(p, i));
                }
                Status::Waiting | Status::Released | Status::Erred => {}
            }
            let t = &mut self.tasks[i];
            if t.status != Status::Erred {
                t.status = Status::Released;
            }
            forget.push(i);
            for &d in &self.tasks[i].deps {
                if self.tasks[d].status != Status::Released && !self.needed(d) {
                    stack.push(d);
                }
            }
        }
        for i in forget {
            self.forget(i);
        }
    }

    /// Removes a released task nothing refers to (no client, no dependent), and then its
    /// dependencies that this leaves unreferenced.
    fn forget(&mut self, id: TaskId) {
        let mut stack = vec![id];
        while let Some(i) = stack.pop() {
            let Some(t) = self.tasks.get(i) else {
                continue;
            };
            if !t.wanted_by.is_empty()
                || !t.dependents.is_empty()
                || !matches!(t.status, Status::Released | Status::Erred)
            {
                continue;
            }
            let t = self.tasks.remove(i).expect("checked above");
            self.by_key.remove(&t.key);
            for d in t.deps {
                if let Some(dt) = self.tasks.get_mut(d) {
                    dt.dependents.retain(|&x| x != i);
                    stack.push(d);
                }
            }
        }
    }

    // ---- helpers -----------------------------------------------------------------------

    fn prefix_of(&mut self, key: &Key) -> u32 {
        let name = key.prefix();
        if let Some(&id) = self.prefix_ids.get(name) {
            return id;
        }
        let id = self.prefixes.len() as u32;
        self.prefixes.push(PrefixStats {
            name,
            average: None,
        });
        self.prefix_ids.insert(name, id);
        id
    }

    /// Tells a client that task `id`'s value is in memory, and where (and the value itself
    /// when it is small and at hand).
    fn in_memory(&self, id: TaskId, value: Option<Payload>) -> ToClient {
        let t = &self.tasks[id];
        ToClient::InMemory {
            key: t.key,
            nbytes: t.nbytes,
            holders: self.addresses(&t.who_has),
            value,
        }
    }

    fn addresses(&self, ws: &[WorkerId]) -> Vec<String> {
        ws.iter()
            .filter_map(|w| self.workers.get(w).map(|w| w.address.clone()))
            .collect()
    }

    fn worker_infos(&self) -> Vec<WorkerInfo> {
        self.workers
            .iter()
            .map(|(&id, w)| WorkerInfo {
                id,
                address: w.address.clone(),
                nthreads: w.nthreads,
                pid: w.pid,
            })
            .collect()
    }

    fn tell_clients_workers(&self, comm: &mut impl Comm) {
        let workers = self.worker_infos();
        for &c in self.clients.keys() {
            comm.send_client(
                c,
                ToClient::Workers {
                    workers: workers.clone(),
                },
            );
        }
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
            })
            .collect()
    }

    /// The average duration of each task prefix seen, in seconds.
    pub fn prefix_durations(&self) -> Vec<(&'static str, Option<f64>)> {
        self.prefixes.iter().map(|p| (p.name, p.average)).collect()
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
