//! Work stealing: idle workers take tasks that wait on busy ones.
//!
//! On each tick, a worker with fewer than two tasks per thread (open: not paused, not
//! retiring) is a thief, and a worker with more tasks than threads is a victim (a paused or
//! retiring worker: every task it holds). A task moves when it would *finish* on the thief before it would *start* on the
//! victim: the thief's backlog, plus moving the dependencies it lacks, plus the task's
//! expected duration, is less than the victim's backlog (Dask's compute/transfer test, in
//! seconds rather than bins). The latest tasks by priority go first, since the victim would
//! run them last.
//!
//! A steal is a transaction: the victim is asked ([`ToWorker::Steal`]) and answers whether it
//! gave the task back ([`FromWorker::StealResponse`](crate::protocol::FromWorker)). Only a
//! task that has not started is given back, so no task runs twice. Until the answer, the
//! task stays on the victim's books and counts against the thief's slots; a task that
//! finished, failed or was released meanwhile, a victim or a thief that died, all leave the
//! task where the other transitions put it.

use super::*;

impl Core {
    /// One round of stealing (see the module docs).
    pub(super) fn balance(&mut self, comm: &mut impl Comm) {
        if self.workers.len() < 2 {
            return;
        }
        // With stealing off, retiring workers still hand back what has not started (else a
        // paused retiring worker would never drain).
        let only_retiring = !self.cfg.work_stealing;
        if only_retiring && self.retirements.is_empty() {
            return;
        }
        let mut thieves: Vec<(WorkerId, usize)> = self
            .workers
            .iter()
            .filter(|(_, ws)| ws.open())
            .filter_map(|(&w, ws)| {
                // Room for one task per thread and one waiting behind it, so a thread does
                // not idle from one round of stealing to the next.
                let idle = (2 * ws.nthreads as usize).saturating_sub(self.busy(ws));
                (idle > 0).then_some((w, idle))
            })
            .collect();
        if thieves.is_empty() {
            return;
        }
        thieves.sort_by_key(|&(w, idle)| (std::cmp::Reverse(idle), w));

        // Each victim's candidates, latest first.
        let mut victims: Vec<(WorkerId, Vec<TaskId>)> = self
            .workers
            .iter()
            .filter(|(_, ws)| !only_retiring || ws.retiring)
            .filter_map(|(&w, ws)| {
                let keep = if ws.open() { ws.nthreads as usize } else { 0 };
                let surplus = ws.processing.len().saturating_sub(keep);
                if surplus == 0 {
                    return None;
                }
                let mut ids: Vec<TaskId> = ws
                    .processing
                    .iter()
                    .copied()
                    .filter(|&id| {
                        let t = &self.tasks[id];
                        t.stealing.is_none() && !t.steal_refused && !self.pinned(id)
                    })
                    .collect();
                ids.sort_unstable_by_key(|&id| std::cmp::Reverse(self.tasks[id].priority));
                let in_flight = ws.processing.len() - ids.len();
                ids.truncate(surplus.saturating_sub(in_flight));
                (!ids.is_empty()).then_some((w, ids))
            })
            .collect();
        // Backlogs in seconds with what is known now of each prefix (occupancy holds the
        // estimates made at assignment, which go stale as durations are learnt).
        let mut backlog: BTreeMap<WorkerId, f64> = self
            .workers
            .iter()
            .map(|(&w, ws)| {
                let secs: f64 = ws
                    .processing
                    .iter()
                    .map(|&id| self.expected(self.tasks[id].prefix))
                    .sum();
                (w, secs / ws.nthreads as f64)
            })
            .collect();
        for (thief, idle) in thieves {
            for _ in 0..idle {
                let Some((victim, id)) = self.pick(thief, &mut victims, &backlog) else {
                    break;
                };
                let cost = self.expected(self.tasks[id].prefix);
                let threads = |w: &WorkerId| self.workers[w].nthreads as f64;
                *backlog.entry(victim).or_default() -= cost / threads(&victim);
                *backlog.entry(thief).or_default() +=
                    (cost + self.transfer_time(id, thief)) / threads(&thief);
                self.ask_steal(id, victim, thief, comm);
            }
        }
    }

    /// The best task for `thief`: from the victim with the longest backlog, the latest task
    /// worth moving.
    fn pick(
        &self,
        thief: WorkerId,
        victims: &mut [(WorkerId, Vec<TaskId>)],
        backlog: &BTreeMap<WorkerId, f64>,
    ) -> Option<(WorkerId, TaskId)> {
        let of = |w: &WorkerId| backlog.get(w).copied().unwrap_or(0.0);
        let thief_backlog = of(&thief);
        let mut order: Vec<usize> = (0..victims.len())
            .filter(|&i| victims[i].0 != thief && !victims[i].1.is_empty())
            .collect();
        order.sort_by(|&a, &b| of(&victims[b].0).total_cmp(&of(&victims[a].0)));
        for i in order {
            let (victim, ids) = &mut victims[i];
            let victim_open = self.workers[victim].open();
            let victim_backlog = of(victim);
            if let Some(pos) = ids.iter().position(|&id| {
                let finish = thief_backlog
                    + self.transfer_time(id, thief)
                    + self.expected(self.tasks[id].prefix);
                // A paused or retiring victim runs nothing new: anything is worth moving.
                !victim_open || finish < victim_backlog
            }) {
                return Some((*victim, ids.remove(pos)));
            }
        }
        None
    }

    fn ask_steal(&mut self, id: TaskId, victim: WorkerId, thief: WorkerId, comm: &mut impl Comm) {
        self.next_steal += 1;
        let t = &mut self.tasks[id];
        t.stealing = Some(thief);
        t.steal_id = self.next_steal;
        self.stats.steals_asked += 1;
        if let Some(ws) = self.workers.get_mut(&thief) {
            ws.incoming += 1;
        }
        tracing::debug!(key = %t.key, victim = victim.0, thief = thief.0, "asking to steal");
        comm.send_worker(
            victim,
            ToWorker::Steal {
                key: t.key,
                id: t.steal_id,
            },
        );
    }

    /// The victim's answer to a steal.
    pub(super) fn steal_response(
        &mut self,
        victim: WorkerId,
        key: Key,
        steal: u64,
        stolen: bool,
        comm: &mut impl Comm,
    ) {
        let Some(&id) = self.by_key.get(&key) else {
            return;
        };
        let t = &self.tasks[id];
        if t.processing_on != Some(victim) || t.stealing.is_none() || t.steal_id != steal {
            // Finished, failed, released or rescheduled meanwhile, or the answer to an
            // earlier steal of the key: nothing to move.
            return;
        }
        let thief = t.stealing;
        if !stolen {
            // It started: it stays, and is not asked for again while there.
            self.tasks[id].stealing = None;
            self.tasks[id].steal_refused = true;
            if let Some(ws) = thief.and_then(|th| self.workers.get_mut(&th)) {
                ws.incoming = ws.incoming.saturating_sub(1);
            }
            return;
        }
        self.stats.steals_done += 1;
        self.unassign(id);
        self.tasks[id].status = Status::Waiting;
        self.recount(id);
        match thief.filter(|th| self.workers.get(th).is_some_and(|ws| ws.open())) {
            Some(th) if self.tasks[id].waiting_on == 0 => self.assign(id, th, comm),
            // Placed anew (its thief is gone), or its lost inputs computed first.
            _ => self.compute(&[id], comm),
        }
        self.fill(victim, comm);
    }
}
