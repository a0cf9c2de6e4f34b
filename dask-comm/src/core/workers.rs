//! The core's handlers for workers: joining, leaving, and what they report.

use super::*;

impl Core {
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

    pub(super) fn finished(
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

    pub(super) fn erred(
        &mut self,
        w: WorkerId,
        key: Key,
        failure: TaskFailure,
        comm: &mut impl Comm,
    ) {
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

    pub(super) fn missing_dep(
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
}
