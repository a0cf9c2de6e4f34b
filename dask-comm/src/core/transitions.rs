//! Task state transitions: computing, assigning, finishing, failing, losing and releasing tasks.

use super::*;

impl Core {
    /// Makes sure `roots` (and what they need) get computed: released tasks become waiting,
    /// recursively, and those whose dependencies are all in memory become ready.
    pub(super) fn compute(&mut self, roots: &[TaskId], comm: &mut impl Comm) {
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
    pub(super) fn recount(&mut self, id: TaskId) {
        let n = self.tasks[id]
            .deps
            .iter()
            .filter(|&&d| self.tasks[d].status != Status::Memory)
            .count();
        self.tasks[id].waiting_on = n as u32;
    }

    /// A task whose dependencies are all in memory: to a worker, or the queue.
    pub(super) fn make_ready(&mut self, id: TaskId, comm: &mut impl Comm) {
        debug_assert_eq!(self.tasks[id].status, Status::Waiting);
        let priority = self.tasks[id].priority;
        if let Some(owner) = self.shuffle_owner(id) {
            // An unpack task runs where its output's pieces are; while that worker is gone
            // (the shuffle restarts) it waits among the unrunnable.
            match owner {
                Some(w) => self.assign(id, w, comm),
                None => {
                    self.tasks[id].status = Status::NoWorker;
                    self.no_worker.insert((priority, id));
                }
            }
            return;
        }
        if !self.workers.values().any(|ws| ws.open()) {
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
        let w = self.decide_worker(id).expect("an open worker exists");
        self.assign(id, w, comm);
    }

    /// Sends task `id` to worker `w`.
    pub(super) fn assign(&mut self, id: TaskId, w: WorkerId, comm: &mut impl Comm) {
        let expected = self.expected(self.tasks[id].prefix);
        let shuffle = self.shuffle_run(id, Some(w));
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
        self.last_attempt += 1;
        let t = &mut self.tasks[id];
        t.status = Status::Processing;
        t.processing_on = Some(w);
        t.attempt = self.last_attempt;
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
                shuffle,
                attempt: t.attempt,
            },
        );
    }

    /// Takes a processing task off its worker's books (and a steal in flight with it).
    pub(super) fn unassign(&mut self, id: TaskId) {
        let t = &mut self.tasks[id];
        t.steal_refused = false;
        if let Some(thief) = t.stealing.take() {
            if let Some(ws) = self.workers.get_mut(&thief) {
                ws.incoming = ws.incoming.saturating_sub(1);
            }
        }
        if let Some(w) = t.processing_on.take() {
            if let Some(ws) = self.workers.get_mut(&w) {
                ws.processing.remove(&id);
                ws.occupancy = (ws.occupancy - t.expected).max(0.0);
            }
        }
    }

    /// Task `id`'s value is on worker `w` (and, when small, in `small`): tell who wants it, wake
    /// dependents, release what no longer has a use.
    pub(super) fn mark_in_memory(
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
    pub(super) fn fail(&mut self, id: TaskId, cause: Arc<TaskFailure>, comm: &mut impl Comm) {
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
        let mut shuffles: Vec<dask_graph::ShuffleId> = failed
            .iter()
            .filter_map(|&i| self.tasks[i].shuffle.map(|r| r.id()))
            .collect();
        shuffles.sort_unstable();
        shuffles.dedup();
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
        // A shuffle whose outputs failed has nothing pending: its pieces go.
        for sid in shuffles {
            self.shuffle_settle(sid, comm);
        }
    }

    /// Task `id`'s value is gone from every worker: dependents waiting on it wait again, ones
    /// running elsewhere are taken back, and it is recomputed if anything needs it.
    pub(super) fn lose(&mut self, id: TaskId, comm: &mut impl Comm) {
        self.tasks[id].status = Status::Released;
        self.tasks[id].who_has.clear();
        let key = self.tasks[id].key;
        for &c in &self.tasks[id].wanted_by {
            comm.send_client(c, ToClient::Lost { key });
        }
        self.value_gone(id, comm);
        if self.needed(id) {
            if self.tasks[id].spec.is_some() {
                self.stats.recomputed += 1;
            }
            self.compute(&[id], comm);
        } else {
            self.release(id, comm);
        }
    }

    /// Whether anything needs task `id`: a client, or a dependent still to run.
    pub(super) fn needed(&self, id: TaskId) -> bool {
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
    pub(super) fn release(&mut self, id: TaskId, comm: &mut impl Comm) {
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
            self.forget(i, comm);
        }
    }

    /// Removes a released task nothing refers to (no client, no dependent), and then its
    /// dependencies that this leaves unreferenced.
    pub(super) fn forget(&mut self, id: TaskId, comm: &mut impl Comm) {
        let mut stack = vec![id];
        let mut shuffles = Vec::new();
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
            if let Some(role) = t.shuffle {
                shuffles.push(role.id());
            }
            for d in t.deps {
                if let Some(dt) = self.tasks.get_mut(d) {
                    dt.dependents.retain(|&x| x != i);
                    stack.push(d);
                }
            }
        }
        shuffles.sort_unstable();
        shuffles.dedup();
        for sid in shuffles {
            self.shuffle_settle(sid, comm);
        }
    }

    // ---- helpers -----------------------------------------------------------------------

    pub(super) fn prefix_of(&mut self, key: &Key) -> u32 {
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
    pub(super) fn in_memory(&self, id: TaskId, value: Option<Payload>) -> ToClient {
        let t = &self.tasks[id];
        ToClient::InMemory {
            key: t.key,
            nbytes: t.nbytes,
            holders: self.addresses(&t.who_has),
            value,
        }
    }

    pub(super) fn addresses(&self, ws: &[WorkerId]) -> Vec<String> {
        ws.iter()
            .filter_map(|w| self.workers.get(w).map(|w| w.address.clone()))
            .collect()
    }

    pub(super) fn worker_infos(&self) -> Vec<WorkerInfo> {
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

    pub(super) fn tell_clients_workers(&self, comm: &mut impl Comm) {
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
}
