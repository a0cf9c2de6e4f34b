//! The core's handlers for clients: graphs submitted, data scattered, keys wanted and released.

use super::*;

impl Core {
    /// A client connected; it is welcomed with the workers there are.
    pub fn on_client_added(&mut self, name: String, comm: &mut impl Comm) -> ClientId {
        let id = ClientId(self.next_client);
        self.next_client += 1;
        tracing::debug!(client = id.0, %name, "client added");
        self.clients.insert(
            id,
            ClientState {
                name,
                last_seen: None,
            },
        );
        comm.send_client(
            id,
            ToClient::Welcome {
                id,
                heartbeat_ms: heartbeat_every(self.cfg.client_timeout),
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

    /// Client `c` was heard from at `now` (any message): its silence clock restarts.
    pub fn on_client_heard(&mut self, c: ClientId, now: Instant) {
        if let Some(client) = self.clients.get_mut(&c) {
            client.last_seen = Some(now);
        }
    }

    /// Clients silent past the client timeout are dropped: their connection closes and their
    /// futures are released, as if they had left.
    pub(super) fn remove_silent_clients(&mut self, now: Instant, comm: &mut impl Comm) {
        let timeout = self.cfg.client_timeout;
        let silent: Vec<ClientId> = self
            .clients
            .iter_mut()
            .filter_map(|(&c, client)| {
                let seen = *client.last_seen.get_or_insert(now);
                (now.saturating_duration_since(seen) > timeout).then_some(c)
            })
            .collect();
        for c in silent {
            tracing::warn!(
                client = c.0,
                ?timeout,
                "a client was silent past the client timeout: dropping it"
            );
            self.stats.clients_dropped += 1;
            self.on_client_removed(c, comm);
            comm.drop_client(c, format!("silent for more than {timeout:?}"));
        }
    }

    /// A message from client `c`.
    pub fn on_client_message(&mut self, c: ClientId, msg: FromClient, comm: &mut impl Comm) {
        if !self.clients.contains_key(&c) {
            return;
        }
        match msg {
            FromClient::Heartbeat => comm.send_client(c, ToClient::Alive),
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
            FromClient::Retire { id, workers } => self.retire(c, id, workers, comm),
            // The scheduler process stops; nothing for the books.
            FromClient::Shutdown => tracing::debug!(client = c.0, "shutdown asked"),
        }
    }

    pub(super) fn update_graph(
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
            let mut t = TaskState::new(
                d.key,
                Some(d.spec),
                Priority(self.generation, d.order),
                prefix,
            );
            t.retries = d.retries;
            t.shuffle = d.shuffle;
            if let Some(role) = d.shuffle {
                self.shuffle_task_added(d.key, role);
            }
            let id = self.tasks.insert(t);
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

    pub(super) fn scattered(&mut self, c: ClientId, items: Vec<Scattered>, comm: &mut impl Comm) {
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
                    let id = self.tasks.insert(TaskState::new(
                        s.key,
                        None,
                        Priority(self.generation, 0),
                        prefix,
                    ));
                    self.by_key.insert(s.key, id);
                    id
                }
            };
            if !self.tasks[id].wanted_by.contains(&c) {
                self.tasks[id].wanted_by.push(c);
            }
            if self.tasks[id].status != Status::Memory {
                // A value for a task not computed yet: the task is taken off its worker (or
                // its queue) first, so that its worker's news of it is stale and what it
                // made there is freed.
                let (p, on) = (self.tasks[id].priority, self.tasks[id].processing_on);
                match self.tasks[id].status {
                    Status::Processing => {
                        self.unassign(id);
                        if let Some(w) = on {
                            comm.send_worker(w, ToWorker::Free { keys: vec![s.key] });
                            self.fill(w, comm);
                        }
                    }
                    Status::Queued => {
                        self.queued.remove(&(p, id));
                    }
                    Status::NoWorker => {
                        self.no_worker.remove(&(p, id));
                    }
                    _ => {}
                }
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
    pub(super) fn unwant(&mut self, ids: &[TaskId], c: ClientId, comm: &mut impl Comm) {
        for &id in ids {
            self.tasks[id].wanted_by.retain(|&x| x != c);
        }
        for &id in ids {
            if self.tasks.get(id).is_some() && !self.needed(id) {
                self.release(id, comm);
            }
        }
    }
}
