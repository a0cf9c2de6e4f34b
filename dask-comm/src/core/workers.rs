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
                spilled: 0,
                rss: 0,
                paused: false,
                retiring: false,
                incoming: 0,
                last_seen: now,
            },
        );
        comm.send_worker(
            id,
            ToWorker::Welcome {
                id,
                heartbeat_ms: heartbeat_every(self.cfg.heartbeat_timeout),
            },
        );
        self.tell_clients_workers(comm);
        self.reopened(id, comm);
        id
    }

    /// A worker left or failed: its processing tasks are rescheduled, and values held only
    /// there are recomputed (or, for scattered values, fail the futures that need them). The
    /// tasks it may have been running (the first `nthreads` by priority: it runs them in that
    /// order) count it against [`Config::allowed_failures`].
    pub fn on_worker_removed(&mut self, w: WorkerId, comm: &mut impl Comm) {
        self.remove_worker(w, true, comm);
        self.advance_retirements(comm);
    }

    /// Removes worker `w`; `lost` when it failed (not retired).
    pub(super) fn remove_worker(&mut self, w: WorkerId, lost: bool, comm: &mut impl Comm) {
        let Some(worker) = self.workers.remove(&w) else {
            return;
        };
        if lost {
            self.stats.workers_lost += 1;
            tracing::warn!(worker = w.0, name = %worker.name, processing = worker.processing.len(), holds = worker.has.len(), "worker lost");
        } else {
            self.stats.workers_retired += 1;
            tracing::info!(worker = w.0, name = %worker.name, "worker retired");
        }
        self.tell_clients_workers(comm);
        self.copies_lost(w);
        // Steals towards it stay in flight: the victim's answer decides (a task given back
        // goes elsewhere).
        let mut lost_keys = Vec::new();
        for &id in &worker.has {
            let t = &mut self.tasks[id];
            t.who_has.retain(|&x| x != w);
            if t.who_has.is_empty() && t.status == Status::Memory {
                lost_keys.push(id);
            }
        }
        let mut rerun: Vec<TaskId> = worker.processing.iter().copied().collect();
        rerun.sort_unstable_by_key(|&id| self.tasks[id].priority);
        let mut killers = Vec::new();
        for (i, &id) in rerun.iter().enumerate() {
            let t = &mut self.tasks[id];
            t.processing_on = None;
            t.steal_refused = false;
            if let Some(thief) = t.stealing.take() {
                if let Some(ws) = self.workers.get_mut(&thief) {
                    ws.incoming = ws.incoming.saturating_sub(1);
                }
            }
            t.status = Status::Waiting;
            self.stats.rescheduled += 1;
            if lost && i < worker.nthreads as usize {
                t.killed_on.push(worker.name.clone());
                if t.killed_on.len() as u32 >= self.cfg.allowed_failures {
                    killers.push(id);
                }
            }
        }
        for id in killers {
            let t = &self.tasks[id];
            let failure = TaskFailure::new(
                t.key,
                "",
                FailureKind::KilledWorker,
                format!(
                    "{} workers died while it may have been running ({}); it is not tried again",
                    t.killed_on.len(),
                    t.killed_on.join(", ")
                ),
            );
            tracing::warn!(key = %t.key, workers = ?t.killed_on, "KilledWorker");
            self.stats.killed_worker += 1;
            self.fail(id, Arc::new(failure), comm);
        }
        // Shuffles it owned outputs of start again before anything is placed, so no task is
        // sent with a run whose owners include it.
        self.shuffles_lost_worker(w, comm);
        for id in lost_keys {
            if self
                .tasks
                .get(id)
                .is_some_and(|t| t.status == Status::Memory && t.who_has.is_empty())
            {
                self.lose(id, comm);
            }
        }
        for id in rerun {
            // Placed again, or its lost inputs computed first.
            if self
                .tasks
                .get(id)
                .is_some_and(|t| t.status == Status::Waiting)
            {
                self.compute(&[id], comm);
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
                attempt,
                ..
            } => {
                if !self.by_key.contains_key(&key) {
                    // Forgotten meanwhile: the worker may drop it.
                    comm.send_worker(w, ToWorker::Free { keys: vec![key] });
                } else if let Some(id) = self.current(w, key, attempt) {
                    self.finished(w, id, nbytes, micros, small, comm);
                }
            }
            FromWorker::Erred {
                key,
                failure,
                attempt,
            } => {
                if let Some(id) = self.current(w, key, attempt) {
                    self.erred(w, id, failure, comm);
                }
            }
            FromWorker::MissingDep {
                key,
                dep,
                tried,
                attempt,
            } => {
                if let Some(id) = self.current(w, key, attempt) {
                    self.missing_dep(w, id, dep, tried, comm);
                }
            }
            FromWorker::Heartbeat {
                stored,
                spilled,
                rss,
                paused,
                ..
            } => {
                comm.send_worker(w, ToWorker::Alive);
                let was = std::mem::replace(&mut worker.paused, paused);
                (worker.stored, worker.spilled, worker.rss) = (stored, spilled, rss);
                if was != paused {
                    tracing::info!(worker = w.0, paused, rss, "worker memory pause changed");
                }
                if was && !paused {
                    self.reopened(w, comm);
                }
            }
            FromWorker::StealResponse { key, id, stolen } => {
                self.steal_response(w, key, id, stolen, comm)
            }
            FromWorker::Acquired { keys, failed } => self.acquired(w, keys, failed, comm),
            FromWorker::LostKeys { keys } => self.lost_keys(w, keys, comm),
        }
        if !self.retirements.is_empty() {
            self.advance_retirements(comm);
        }
    }

    /// Worker `w` takes tasks again: tasks that found no open worker, then queued ones.
    pub(super) fn reopened(&mut self, w: WorkerId, comm: &mut impl Comm) {
        let unrunnable: Vec<TaskId> = std::mem::take(&mut self.no_worker)
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        for t in unrunnable {
            self.tasks[t].status = Status::Waiting;
            self.make_ready(t, comm);
        }
        self.fill(w, comm);
    }

    /// Worker `w` lost values it held (a bad spill file): found elsewhere, or computed again.
    pub(super) fn lost_keys(&mut self, w: WorkerId, keys: Vec<Key>, comm: &mut impl Comm) {
        for key in keys {
            let Some(&id) = self.by_key.get(&key) else {
                continue;
            };
            tracing::warn!(worker = w.0, %key, "a worker lost a value");
            self.tasks[id].who_has.retain(|&x| x != w);
            if let Some(ws) = self.workers.get_mut(&w) {
                ws.has.remove(&id);
            }
            if self.tasks[id].status == Status::Memory && self.tasks[id].who_has.is_empty() {
                self.lose(id, comm);
            }
        }
    }

    /// Time passed: workers silent past the heartbeat timeout are removed, idle workers steal
    /// from busy ones, and retirements move on.
    ///
    /// A tick that comes [`STALLED`] or more after the one before means the scheduler itself
    /// did not run (stopped, swapped out, a very long pass): its peers' news may be waiting
    /// unread, so their silence is counted afresh from now instead of removing them all.
    pub fn on_tick(&mut self, now: Instant, comm: &mut impl Comm) {
        let stalled = self
            .last_tick
            .is_some_and(|t| now.saturating_duration_since(t) >= STALLED);
        self.last_tick = Some(now);
        if stalled {
            tracing::warn!("the scheduler did not run for a while: its peers' silence restarts");
            for ws in self.workers.values_mut() {
                ws.last_seen = ws.last_seen.max(now);
            }
            for c in self.clients.values_mut() {
                c.last_seen = Some(now);
            }
        }
        self.remove_silent(now, comm);
        self.remove_silent_clients(now, comm);
        self.balance(comm);
        self.advance_retirements(comm);
    }

    fn remove_silent(&mut self, now: Instant, comm: &mut impl Comm) {
        let silent: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| {
                now.saturating_duration_since(w.last_seen) > self.cfg.heartbeat_timeout
            })
            .map(|(&id, _)| id)
            .collect();
        // None of them takes work (or owns a shuffle's restarted run) while the others are
        // being removed.
        for w in &silent {
            if let Some(ws) = self.workers.get_mut(w) {
                ws.retiring = true;
            }
        }
        let timeout = self.cfg.heartbeat_timeout;
        for w in silent {
            tracing::warn!(worker = w.0, ?timeout, "no heartbeat: removing the worker");
            let address = self.workers.get(&w).map(|ws| ws.address.clone());
            self.remove_worker(w, true, comm);
            // Fetches from it would wait for their deadline: its socket is open, it is silent.
            if let Some(address) = address {
                for &other in self.workers.keys() {
                    comm.send_worker(
                        other,
                        ToWorker::PeerGone {
                            address: address.clone(),
                        },
                    );
                }
            }
            // Final: the worker is told, its connection closed; a process that thaws later
            // exits and is started afresh rather than talk to a scheduler that forgot it.
            comm.drop_worker(w, format!("no heartbeat for more than {timeout:?}"));
        }
    }

    /// The task that worker `w`'s news of `key`'s assignment `attempt` is about, when that
    /// assignment is the task's current one. News of an assignment the scheduler took back
    /// is stale: the scheduler sent `w` a `Free` of the key when it did (the two crossed on
    /// the wire), so `w` drops whatever it made, and the current assignment, wherever it is,
    /// reports for itself.
    fn current(&self, w: WorkerId, key: Key, attempt: u64) -> Option<TaskId> {
        let &id = self.by_key.get(&key)?;
        let t = &self.tasks[id];
        if t.status == Status::Processing && t.processing_on == Some(w) && t.attempt == attempt {
            return Some(id);
        }
        tracing::debug!(worker = w.0, %key, attempt, current = t.attempt, "news of an assignment taken back: ignored");
        None
    }

    /// Task `id`, processing on worker `w`, finished there.
    pub(super) fn finished(
        &mut self,
        w: WorkerId,
        id: TaskId,
        nbytes: u64,
        micros: u64,
        small: Option<Payload>,
        comm: &mut impl Comm,
    ) {
        let t = &self.tasks[id];
        let prefix = t.prefix as usize;
        let secs = micros as f64 / 1e6;
        let avg = &mut self.prefixes[prefix].average;
        *avg = Some(avg.map_or(secs, |a| 0.5 * a + 0.5 * secs));
        self.unassign(id);
        if let Some(ws) = self.workers.get(&w) {
            *self.stats.finished_by.entry(ws.name.clone()).or_default() += 1;
        }
        self.tasks[id].nbytes = nbytes;
        let unpacked = self.pinned(id).then(|| self.tasks[id].shuffle).flatten();
        self.mark_in_memory(id, w, small, comm);
        if let Some(role) = unpacked {
            self.shuffle_settle(role.id(), comm);
        }
        self.fill(w, comm);
    }

    /// Task `id`, processing on worker `w`, failed there.
    pub(super) fn erred(
        &mut self,
        w: WorkerId,
        id: TaskId,
        failure: TaskFailure,
        comm: &mut impl Comm,
    ) {
        let key = self.tasks[id].key;
        self.unassign(id);
        if failure.kind == FailureKind::Shuffle && self.tasks[id].shuffle.is_some() {
            self.shuffle_task_failed(id, failure, comm);
        } else if self.tasks[id].retries > 0 {
            self.tasks[id].retries -= 1;
            self.stats.retried += 1;
            tracing::info!(%key, error = %failure, retries_left = self.tasks[id].retries, "task erred: running it again");
            self.tasks[id].status = Status::Waiting;
            self.compute(&[id], comm);
        } else {
            tracing::debug!(%key, error = %failure, "task erred");
            self.fail(id, Arc::new(failure), comm);
        }
        self.fill(w, comm);
    }

    /// Task `id`, processing on worker `w`, is back: dependency `dep` was not at any of the
    /// holders `tried` (which stop counting as its holders).
    pub(super) fn missing_dep(
        &mut self,
        w: WorkerId,
        id: TaskId,
        dep: Key,
        tried: Vec<String>,
        comm: &mut impl Comm,
    ) {
        let Some(&dep_id) = self.by_key.get(&dep) else {
            return;
        };
        let key = self.tasks[id].key;
        tracing::info!(%key, %dep, ?tried, "a dependency could not be fetched");
        let gone: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, ws)| tried.contains(&ws.address))
            .map(|(&id, _)| id)
            .collect();
        for g in gone {
            self.tasks[dep_id].who_has.retain(|&x| x != g);
            let counted = self
                .workers
                .get_mut(&g)
                .is_some_and(|ws| ws.has.remove(&dep_id));
            // A holder that did not answer in time (slow, not gone) may still have the value:
            // no longer counted, it is told to free it rather than keep it unaccounted.
            if counted && g != w {
                comm.send_worker(g, ToWorker::Free { keys: vec![dep] });
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
            self.compute(&[id], comm);
        }
        self.fill(w, comm);
    }
}
