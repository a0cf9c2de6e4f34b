//! Peer-to-peer shuffles (see [`dask_graph::shuffle`]): the scheduler's part.
//!
//! A shuffle's **run** starts when its first transfer (or unpack) task is placed: the open
//! workers at that moment become its owners, output `i` going to `owners[i % n]`. Every
//! shuffle task is sent with the run ([`ShuffleRun`]); transfer tasks send their pieces
//! straight to the owners, and each unpack task runs on its output's owner (never stolen).
//!
//! A run is lost when an owner leaves before every output is computed, or when a shuffle
//! task fails with [`FailureKind::Shuffle`] (a peer unreachable, a piece missing). Then the
//! shuffle **restarts**: the workers drop the earlier runs' pieces, a new run starts with the
//! workers there are, and every transfer runs again (outputs already computed stay). Restarts
//! for lost owners are as many as the workers lost; after [`SHUFFLE_RESTARTS`] restarts for
//! task failures the shuffle's pending tasks fail instead. When no output is pending any more
//! (computed, or failed), the workers drop the run's pieces.

use dask_graph::{ShuffleId, ShuffleRole};

use super::*;
use crate::protocol::ShuffleRun;

/// Restarts of one shuffle for task failures ([`FailureKind::Shuffle`]) before its pending
/// tasks fail (restarts for lost owners are not counted: each needs a worker to leave).
pub const SHUFFLE_RESTARTS: u32 = 5;

/// One shuffle.
#[derive(Debug, Default)]
pub struct ShuffleState {
    /// The current run's number (numbered across every shuffle of the scheduler).
    pub run: u32,
    /// The current run's owners (empty: not started).
    pub owners: Vec<WorkerId>,
    pub transfers: Vec<Key>,
    pub barrier: Vec<Key>,
    pub unpacks: Vec<Key>,
    pub restarts: u32,
    /// The current run's pieces were dropped (no output was pending).
    pub done: bool,
}

impl ShuffleState {
    fn keys(&self) -> impl Iterator<Item = &Key> {
        self.transfers
            .iter()
            .chain(&self.barrier)
            .chain(&self.unpacks)
    }
}

fn pending(s: Status) -> bool {
    matches!(
        s,
        Status::Waiting | Status::Queued | Status::NoWorker | Status::Processing
    )
}

impl Core {
    /// A run number no shuffle had before.
    fn fresh_shuffle_run(&mut self) -> u32 {
        self.last_shuffle_run += 1;
        self.last_shuffle_run
    }

    /// A new task with a shuffle role joins its shuffle's books.
    pub(super) fn shuffle_task_added(&mut self, key: Key, role: ShuffleRole) {
        if !self.shuffles.contains_key(&role.id()) {
            let run = self.fresh_shuffle_run();
            self.shuffles.insert(
                role.id(),
                ShuffleState {
                    run,
                    ..ShuffleState::default()
                },
            );
        }
        let st = self.shuffles.get_mut(&role.id()).expect("inserted");
        match role {
            ShuffleRole::Transfer { .. } => st.transfers.push(key),
            ShuffleRole::Barrier { .. } => st.barrier.push(key),
            ShuffleRole::Unpack { .. } => st.unpacks.push(key),
        }
    }

    /// The run to send with task `id` (a transfer or unpack task); starts one if none is
    /// under way (the open workers become the owners; a transfer after the last run ended
    /// starts the next one).
    pub(super) fn shuffle_run(&mut self, id: TaskId, w: Option<WorkerId>) -> Option<ShuffleRun> {
        let role = self.tasks[id].shuffle?;
        if matches!(role, ShuffleRole::Barrier { .. }) {
            return None;
        }
        let sid = role.id();
        let transfer = matches!(role, ShuffleRole::Transfer { .. });
        // A transfer after the last run ended starts the next one, under a new number.
        let fresh = match self.shuffles.get(&sid) {
            Some(st) if st.done && (transfer || st.owners.is_empty()) => {
                Some(self.fresh_shuffle_run())
            }
            _ => None,
        };
        let open: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, ws)| ws.open())
            .map(|(&w, _)| w)
            .collect();
        let st = self.shuffles.get_mut(&sid)?;
        if st.owners.is_empty() || fresh.is_some() {
            if let Some(run) = fresh {
                st.run = run;
                st.done = false;
            }
            st.owners = if open.is_empty() {
                w.into_iter().collect()
            } else {
                open
            };
            tracing::info!(shuffle = %sid, run = st.run, owners = st.owners.len(), "shuffle run starts");
        }
        let (run, owners) = (st.run, st.owners.clone());
        Some(ShuffleRun {
            id: sid,
            run,
            owners: owners
                .iter()
                .map(|w| {
                    self.workers
                        .get(w)
                        .map(|ws| ws.address.clone())
                        .unwrap_or_default()
                })
                .collect(),
        })
    }

    /// Where unpack task `id` must run: its output's owner, if that worker is here. `None`
    /// for other tasks, and `Some(None)` for an unpack task whose owner is gone (the shuffle
    /// restarts as that worker's removal is handled).
    pub(super) fn shuffle_owner(&mut self, id: TaskId) -> Option<Option<WorkerId>> {
        let Some(ShuffleRole::Unpack { id: sid, part }) = self.tasks[id].shuffle else {
            return None;
        };
        let started = self
            .shuffles
            .get(&sid)
            .is_some_and(|st| !st.owners.is_empty());
        if !started {
            // No transfer ran (a shuffle of no inputs): the run starts here.
            self.shuffle_run(id, None);
        }
        let st = self.shuffles.get(&sid)?;
        if st.owners.is_empty() {
            return Some(None);
        }
        let owner = st.owners[part as usize % st.owners.len()];
        if self.workers.contains_key(&owner) {
            return Some(Some(owner));
        }
        if st.done {
            // The run is over (its pieces dropped) and no restart is coming for it: the task
            // runs anywhere, finds its pieces missing, and that restarts the shuffle.
            return Some(self.workers.keys().next().copied());
        }
        Some(None)
    }

    /// Whether task `id` is an unpack task (pinned to its owner: never stolen).
    pub(super) fn pinned(&self, id: TaskId) -> bool {
        matches!(self.tasks[id].shuffle, Some(ShuffleRole::Unpack { .. }))
    }

    /// Worker `w` left: every unfinished shuffle it owned outputs of starts again.
    pub(super) fn shuffles_lost_worker(&mut self, w: WorkerId, comm: &mut impl Comm) {
        let hit: Vec<ShuffleId> = self
            .shuffles
            .iter()
            .filter(|(_, st)| !st.done && st.owners.contains(&w))
            .map(|(&sid, _)| sid)
            .collect();
        for sid in hit {
            tracing::warn!(shuffle = %sid, worker = w.0, "a shuffle's owner left: restarting it");
            self.restart_shuffle(sid, None, comm);
        }
    }

    /// Shuffle task `id` failed with [`FailureKind::Shuffle`] (already taken off its
    /// worker): the shuffle restarts, or when it has restarted too often, the task fails.
    pub(super) fn shuffle_task_failed(
        &mut self,
        id: TaskId,
        failure: TaskFailure,
        comm: &mut impl Comm,
    ) {
        let sid = self.tasks[id].shuffle.map(|r| r.id());
        match sid {
            Some(sid) if self.shuffles.contains_key(&sid) => {
                tracing::warn!(shuffle = %sid, error = %failure, "shuffle data lost: restarting the shuffle");
                self.tasks[id].status = Status::Waiting;
                self.restart_shuffle(sid, Some(failure), comm);
            }
            _ => self.fail(id, Arc::new(failure), comm),
        }
    }

    /// Starts shuffle `sid` again (see the module docs). `why`: the failure that caused it,
    /// which the pending tasks fail with once the restarts are used up.
    fn restart_shuffle(&mut self, sid: ShuffleId, why: Option<TaskFailure>, comm: &mut impl Comm) {
        let Some(st) = self.shuffles.get_mut(&sid) else {
            return;
        };
        if why.is_some() {
            st.restarts += 1;
        }
        let (restarts, run, started) = (st.restarts, st.run, !st.owners.is_empty());
        let keys: Vec<Key> = st.keys().copied().collect();
        let ids: Vec<TaskId> = keys
            .iter()
            .filter_map(|k| self.by_key.get(k).copied())
            .collect();
        if restarts > SHUFFLE_RESTARTS {
            let cause = why.map_or_else(
                || {
                    TaskFailure::new(
                        keys.first()
                            .copied()
                            .unwrap_or_else(|| Key::name_only("shuffle")),
                        "",
                        FailureKind::Shuffle,
                        format!(
                            "shuffle {sid} lost its data {restarts} times; it is not tried again"
                        ),
                    )
                },
                |f| {
                    let mut f = f;
                    f.message = format!(
                        "{} (shuffle {sid} restarted {SHUFFLE_RESTARTS} times; not tried again)",
                        f.message
                    );
                    f
                },
            );
            tracing::warn!(shuffle = %sid, restarts, "a shuffle lost its data too often: failing it");
            if started {
                for &w in self.workers.keys() {
                    comm.send_worker(w, ToWorker::ShuffleDone { id: sid, run });
                }
            }
            if let Some(st) = self.shuffles.get_mut(&sid) {
                st.done = true;
            }
            let cause = Arc::new(cause);
            for id in ids {
                let Some(t) = self.tasks.get(id) else {
                    continue;
                };
                if !pending(t.status) {
                    continue;
                }
                if t.status == Status::Processing {
                    let (key, w) = (t.key, t.processing_on);
                    self.unassign(id);
                    if let Some(w) = w {
                        comm.send_worker(w, ToWorker::Free { keys: vec![key] });
                    }
                    self.tasks[id].status = Status::Waiting;
                }
                self.fail(id, Arc::clone(&cause), comm);
            }
            return;
        }
        self.stats.shuffle_restarts += 1;
        if started {
            // Pieces of the runs so far are dropped everywhere; the next run's are kept apart
            // by their run number, so this cannot race with them.
            for &w in self.workers.keys() {
                comm.send_worker(w, ToWorker::ShuffleDone { id: sid, run });
            }
            let fresh = self.fresh_shuffle_run();
            let st = self.shuffles.get_mut(&sid).expect("checked above");
            st.run = fresh;
        }
        let st = self.shuffles.get_mut(&sid).expect("checked above");
        st.owners.clear();
        st.done = false;
        // Every transfer and the barrier run again; unpack tasks that had started wait for
        // the barrier again; outputs in memory stay.
        for &id in &ids {
            let role = self.tasks[id].shuffle;
            let unpack = matches!(role, Some(ShuffleRole::Unpack { .. }));
            match self.tasks[id].status {
                Status::Memory if !unpack => {
                    let key = self.tasks[id].key;
                    for w in std::mem::take(&mut self.tasks[id].who_has) {
                        if let Some(ws) = self.workers.get_mut(&w) {
                            ws.has.remove(&id);
                            comm.send_worker(w, ToWorker::Free { keys: vec![key] });
                        }
                    }
                    self.tasks[id].status = Status::Released;
                    self.value_gone(id, comm);
                }
                Status::Processing => {
                    let (key, w) = (self.tasks[id].key, self.tasks[id].processing_on);
                    self.unassign(id);
                    if let Some(w) = w {
                        comm.send_worker(w, ToWorker::Free { keys: vec![key] });
                    }
                    self.tasks[id].status = Status::Waiting;
                }
                Status::NoWorker if unpack => {
                    let p = self.tasks[id].priority;
                    self.no_worker.remove(&(p, id));
                    self.tasks[id].status = Status::Waiting;
                }
                _ => {}
            }
        }
        let waiting: Vec<TaskId> = ids
            .iter()
            .copied()
            .filter(|&id| {
                self.tasks
                    .get(id)
                    .is_some_and(|t| t.status == Status::Waiting)
            })
            .collect();
        for &id in &waiting {
            self.recount(id);
        }
        let (needed, idle): (Vec<TaskId>, Vec<TaskId>) =
            waiting.into_iter().partition(|&id| self.needed(id));
        self.compute(&needed, comm);
        for id in idle {
            if self.tasks.get(id).is_some() && !self.needed(id) {
                self.release(id, comm);
            }
        }
    }

    /// A task's value went from every worker (`who_has` already empty, status released):
    /// its waiting dependents count it again, running ones are taken back (what `lose` does
    /// before recomputing; [`Core::restart_shuffle`] recomputes the whole shuffle at once).
    pub(super) fn value_gone(&mut self, id: TaskId, comm: &mut impl Comm) {
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
    }

    /// After an unpack task finished or shuffle tasks were forgotten: when no output of the
    /// shuffle is pending, its workers drop the run's pieces; when none of its tasks is left,
    /// the shuffle is forgotten.
    pub(super) fn shuffle_settle(&mut self, sid: ShuffleId, comm: &mut impl Comm) {
        let Some(st) = self.shuffles.get(&sid) else {
            return;
        };
        let statuses: Vec<Option<Status>> = st
            .keys()
            .map(|k| self.by_key.get(k).map(|&id| self.tasks[id].status))
            .collect();
        let busy = statuses.iter().flatten().any(|&s| pending(s));
        if busy {
            return;
        }
        let (run, started, done) = (st.run, !st.owners.is_empty(), st.done);
        if started && !done {
            tracing::debug!(shuffle = %sid, run, "shuffle run over: dropping its pieces");
            for &w in self.workers.keys() {
                comm.send_worker(w, ToWorker::ShuffleDone { id: sid, run });
            }
        }
        if statuses.iter().all(Option::is_none) {
            self.shuffles.remove(&sid);
        } else if let Some(st) = self.shuffles.get_mut(&sid) {
            st.done = started || st.done;
        }
    }

    /// The shuffles, for introspection: each one's run, owners and restarts.
    pub fn shuffle_summaries(&self) -> Vec<(ShuffleId, u32, Vec<WorkerId>, u32)> {
        let mut out: Vec<_> = self
            .shuffles
            .iter()
            .map(|(&sid, st)| (sid, st.run, st.owners.clone(), st.restarts))
            .collect();
        out.sort_by_key(|s| s.0);
        out
    }
}
