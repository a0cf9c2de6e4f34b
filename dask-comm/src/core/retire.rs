//! Retiring workers gracefully: they take no new task, finish (or give back to thieves) what
//! they hold, and the values others still need are copied to open workers before they are
//! told to close. Nothing is recomputed: a retirement loses no value unless a copy fails
//! [`MOVE_ATTEMPTS`] times (then the value is recomputed when the worker leaves, like a
//! lost one).

use super::*;

/// Tries to copy one value off a retiring worker before leaving it to be recomputed.
pub const MOVE_ATTEMPTS: u32 = 3;

impl Core {
    /// Client `c` asks to retire the workers at `addresses`.
    pub(super) fn retire(
        &mut self,
        c: ClientId,
        id: u64,
        addresses: Vec<String>,
        comm: &mut impl Comm,
    ) {
        let mut ws_ids = Vec::with_capacity(addresses.len());
        let mut refused = None;
        for a in &addresses {
            match self.workers.iter().find(|(_, ws)| ws.address == *a) {
                Some((&w, _)) if !ws_ids.contains(&w) => ws_ids.push(w),
                Some(_) => {}
                None => {
                    refused = Some(format!("no worker has the address {a}"));
                    break;
                }
            }
        }
        let staying = self
            .workers
            .iter()
            .filter(|(w, ws)| !ws.retiring && !ws_ids.contains(w))
            .count();
        if refused.is_none() && staying == 0 {
            refused = Some(
                "that would retire every worker: at least one must stay to hold the data".into(),
            );
        }
        if let Some(reason) = refused {
            tracing::warn!(client = c.0, %reason, "refused a retirement");
            comm.send_client(
                c,
                ToClient::Retired {
                    id,
                    workers: Vec::new(),
                    refused: Some(reason),
                },
            );
            return;
        }
        for &w in &ws_ids {
            let ws = self.workers.get_mut(&w).expect("found above");
            tracing::info!(worker = w.0, name = %ws.name, "retiring");
            ws.retiring = true;
        }
        self.retirements.push(Retirement {
            client: c,
            id,
            workers: ws_ids,
            addresses,
            moving: Vec::new(),
            attempts: Default::default(),
        });
        self.balance(comm);
        self.advance_retirements(comm);
    }

    /// Moves retirements on: copies what idle retiring workers hold that others need, closes
    /// those with nothing left to copy, and answers the requests whose workers are all gone.
    pub(super) fn advance_retirements(&mut self, comm: &mut impl Comm) {
        if self.retirements.is_empty() {
            return;
        }
        let mut closing = Vec::new();
        let mut acquire: BTreeMap<WorkerId, Vec<Dep>> = BTreeMap::new();
        for r in 0..self.retirements.len() {
            for wi in 0..self.retirements[r].workers.len() {
                let w = self.retirements[r].workers[wi];
                let Some(ws) = self.workers.get(&w) else {
                    continue;
                };
                if !ws.processing.is_empty() {
                    continue; // still draining
                }
                let mut to_move: Vec<TaskId> = ws
                    .has
                    .iter()
                    .copied()
                    .filter(|&id| {
                        let t = &self.tasks[id];
                        self.needed(id)
                            && !t
                                .who_has
                                .iter()
                                .any(|h| self.workers.get(h).is_some_and(|hs| !hs.retiring))
                            && self.retirements[r]
                                .attempts
                                .get(&t.key)
                                .copied()
                                .unwrap_or(0)
                                < MOVE_ATTEMPTS
                    })
                    .collect();
                to_move.sort_unstable();
                if to_move.is_empty() {
                    closing.push(w);
                    continue;
                }
                let Some(target) = self.copy_target(&acquire) else {
                    // Nowhere to copy to (every other worker is retiring or gone): it leaves,
                    // and what it held is recomputed if needed.
                    closing.push(w);
                    continue;
                };
                for id in to_move {
                    let key = self.tasks[id].key;
                    if self.retirements[r].moving.iter().any(|&(m, _)| m == key) {
                        continue;
                    }
                    let t = &self.tasks[id];
                    acquire.entry(target).or_default().push(Dep {
                        key,
                        holders: self.addresses(&t.who_has),
                        nbytes: t.nbytes,
                    });
                    let re = &mut self.retirements[r];
                    re.moving.push((key, target));
                    *re.attempts.entry(key).or_default() += 1;
                }
            }
        }
        for (target, keys) in acquire {
            tracing::debug!(
                worker = target.0,
                keys = keys.len(),
                "copying values off retiring workers"
            );
            comm.send_worker(target, ToWorker::Acquire { keys });
        }
        for w in closing {
            comm.send_worker(w, ToWorker::Close);
            self.remove_worker(w, false, comm);
        }
        let (done, pending): (Vec<Retirement>, Vec<Retirement>) =
            std::mem::take(&mut self.retirements)
                .into_iter()
                .partition(|r| r.workers.iter().all(|w| !self.workers.contains_key(w)));
        self.retirements = pending;
        for r in done {
            if self.clients.contains_key(&r.client) {
                comm.send_client(
                    r.client,
                    ToClient::Retired {
                        id: r.id,
                        workers: r.addresses,
                        refused: None,
                    },
                );
            }
        }
    }

    /// The open worker that should receive a copy: the one storing least, counting copies
    /// already planned in this pass.
    fn copy_target(&self, planned: &BTreeMap<WorkerId, Vec<Dep>>) -> Option<WorkerId> {
        self.workers
            .iter()
            .filter(|(_, ws)| !ws.retiring)
            .min_by_key(|(w, ws)| {
                let extra: u64 = planned
                    .get(w)
                    .map_or(0, |ds| ds.iter().map(|d| d.nbytes).sum());
                (ws.paused, ws.stored + extra, **w)
            })
            .map(|(&w, _)| w)
    }

    /// Worker `w` holds copies it was asked for, and could not fetch others. A copy of a key
    /// that is not in memory any more is freed (unless the key is being computed again on `w`
    /// itself: `Free` would cancel that run).
    pub(super) fn acquired(
        &mut self,
        w: WorkerId,
        keys: Vec<(Key, u64)>,
        failed: Vec<Key>,
        comm: &mut impl Comm,
    ) {
        for (key, _nbytes) in keys {
            let id = self.by_key.get(&key).copied();
            let held = id.is_some_and(|id| self.tasks[id].status == Status::Memory);
            match id {
                Some(id) if held => {
                    if !self.tasks[id].who_has.contains(&w) {
                        self.tasks[id].who_has.push(w);
                        if let Some(ws) = self.workers.get_mut(&w) {
                            ws.has.insert(id);
                        }
                    }
                }
                // Lost and being computed again, on this very worker: `Free` would cancel
                // that run too. Its result will replace the copy.
                Some(id) if self.tasks[id].processing_on == Some(w) => {}
                // Released or lost meanwhile: the copy has no use.
                _ => comm.send_worker(w, ToWorker::Free { keys: vec![key] }),
            }
            self.moved(key, w);
        }
        for key in failed {
            tracing::info!(worker = w.0, %key, "could not copy a value off a retiring worker");
            self.moved(key, w);
        }
    }

    fn moved(&mut self, key: Key, w: WorkerId) {
        for r in &mut self.retirements {
            r.moving.retain(|&m| m != (key, w));
        }
    }

    /// Worker `w` is gone: copies it was fetching will not come.
    pub(super) fn copies_lost(&mut self, w: WorkerId) {
        for r in &mut self.retirements {
            r.moving.retain(|&(_, target)| target != w);
        }
    }
}
