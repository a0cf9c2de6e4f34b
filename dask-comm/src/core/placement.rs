//! Where tasks go.
//!
//! - A task with dependencies goes to the worker where it can start earliest: the work already
//!   assigned there per thread, plus the time to move the dependencies it does not hold
//!   (bytes over the assumed bandwidth). Ties go to the worker with fewer tasks, then the lower
//!   number (deterministic).
//! - A root task (no dependencies) goes to the least busy worker with a free slot, or waits in
//!   the queue; a worker that finishes a task takes the next queued ones. A worker has
//!   `ceil(threads × saturation)` slots. Saturation is Dask's 1.1, except for prefixes whose
//!   tasks are shorter than [`Config::latency_fill`](super::Config): they get enough slots to
//!   keep a thread busy that long (at most [`Config::max_saturation`](super::Config) per
//!   thread), so microsecond tasks are not paced by round trips to the scheduler.

use super::{Comm, Core, TaskId, WorkerId};

impl Core {
    /// Seconds a task of `prefix` is expected to take.
    pub(super) fn expected(&self, prefix: u32) -> f64 {
        self.prefixes[prefix as usize]
            .average
            .unwrap_or(self.cfg.unknown_duration.as_secs_f64())
    }

    /// Tasks per thread to hand a worker for `prefix`.
    fn saturation(&self, prefix: u32) -> f64 {
        match self.prefixes[prefix as usize].average {
            Some(avg) if avg > 0.0 => (self.cfg.latency_fill.as_secs_f64() / avg)
                .min(self.cfg.max_saturation)
                .max(self.cfg.saturation),
            Some(_) => self.cfg.max_saturation.max(self.cfg.saturation),
            None => self.cfg.saturation,
        }
    }

    fn slots(&self, w: WorkerId, prefix: u32) -> usize {
        let threads = self.workers[&w].nthreads as f64;
        (threads * self.saturation(prefix)).ceil() as usize
    }

    /// The least busy open worker with a free slot for a task of `prefix` (steals on their
    /// way to a worker take slots too).
    pub(super) fn free_worker(&self, prefix: u32) -> Option<WorkerId> {
        self.workers
            .iter()
            .filter(|(&w, ws)| ws.open() && self.busy(ws) < self.slots(w, prefix))
            .min_by(|(a, x), (b, y)| {
                let load = |ws: &super::WorkerState| self.busy(ws) as f64 / ws.nthreads as f64;
                load(x).total_cmp(&load(y)).then(a.cmp(b))
            })
            .map(|(&w, _)| w)
    }

    /// Tasks a worker has, or will have once steals towards it land.
    pub(super) fn busy(&self, ws: &super::WorkerState) -> usize {
        ws.processing.len() + ws.incoming as usize
    }

    /// Seconds to move task `id`'s dependencies that worker `w` does not hold.
    pub(super) fn transfer_time(&self, id: TaskId, w: WorkerId) -> f64 {
        let missing: u64 = self.tasks[id]
            .deps
            .iter()
            .map(|&d| &self.tasks[d])
            .filter(|dt| !dt.who_has.contains(&w))
            .map(|dt| dt.nbytes)
            .sum();
        missing as f64 / self.cfg.bandwidth
    }

    /// The open worker where task `id` (which has dependencies) can start earliest; `None`
    /// when no worker is open (all paused or retiring).
    pub(super) fn decide_worker(&self, id: TaskId) -> Option<WorkerId> {
        let mut best: Option<(f64, usize, WorkerId)> = None;
        for (&w, ws) in self.workers.iter().filter(|(_, ws)| ws.open()) {
            let start = ws.occupancy / ws.nthreads as f64 + self.transfer_time(id, w);
            let candidate = (start, ws.processing.len(), w);
            let better = best.is_none_or(|(s, n, bw)| {
                start
                    .total_cmp(&s)
                    .then(candidate.1.cmp(&n))
                    .then(w.cmp(&bw))
                    .is_lt()
            });
            if better {
                best = Some(candidate);
            }
        }
        best.map(|b| b.2)
    }

    /// Gives worker `w` queued tasks while it has free slots.
    pub(super) fn fill(&mut self, w: WorkerId, comm: &mut impl Comm) {
        if !self.workers.get(&w).is_some_and(|ws| ws.open()) {
            return;
        }
        while let Some(&(p, id)) = self.queued.first() {
            if !self.needed(id) {
                // Released while queued (its client let go): it leaves the queue for good.
                self.release(id, comm);
                continue;
            }
            let prefix = self.tasks[id].prefix;
            if self.busy(&self.workers[&w]) >= self.slots(w, prefix) {
                break;
            }
            self.queued.remove(&(p, id));
            self.assign(id, w, comm);
        }
    }
}
