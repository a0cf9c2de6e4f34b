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
    pub(super) fn retire(&mut self, c: ClientId, addresses: Vec<String>, comm: &mut impl Comm) {
        let mut ids = Vec::with_capacity(addresses.len());
        let mut refused = None;
        for a in &addresses {
            match self.workers.iter().find(|(_, ws)| ws.address == *a) {
                Some((&w, _)) if !ids.contains(&w) => ids.push(w),
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
            .filter(|(w, ws)| !ws.retiring && !ids.contains(w))
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
                    workers: Vec::new(),
                    refused: Some(reason),
                },
            );
            return;
        }
        for &w in &ids {
            let ws = self.workers.get_mut(&w).expect("found above");
            tracing::info!(worker = w.0, name = %ws.name, "retiring");
            ws.retiring = true;
        }
        self.retirements.push(Retirement {
            client: c,
            workers: ids,
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
                            && self.retirements[r].attempts.get(&id).copied().unwrap_or(0)
                                < MOVE_ATTEMPTS
                    })
                    .collect();
                to_move.sort_unstable();
                if to_move.is_empty() {
                    closing.push(w);
                    continue;
                }
                for id in to_move {
                    if self.retirements[r].moving.iter().any(|&(m, _)| m == id) {
                        continue;
                    }
                    let Some(target) = self.copy_target(&acquire) else {
                        continue;
                    };
                    let t = &self.tasks[id];
                    acquire.entry(target).or_default().push(Dep {
                        key: t.key,
                        holders: self.addresses(&t.who_has),
                        nbytes: t.nbytes,
                    });
                    let re = &mut self.retirements[r];
                    re.moving.push((id, target));
                    *re.attempts.entry(id).or_default() += 1;
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

    /// Worker `w` fetched copies it was asked for (and could not fetch others).
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
                // Released meanwhile: the copy has no use.
                _ => comm.send_worker(w, ToWorker::Free { keys: vec![key] }),
            }
            self.moved(id, w);
        }
        for key in failed {
            tracing::info!(worker = w.0, %key, "could not copy a value off a retiring worker");
            let id = self.by_key.get(&key).copied();
            self.moved(id, w);
        }
    }

    fn moved(&mut self, id: Option<TaskId>, w: WorkerId) {
        if let Some(id) = id {
            for r in &mut self.retirements {
                r.moving.retain(|&m| m != (id, w));
            }
        }
    }
}
