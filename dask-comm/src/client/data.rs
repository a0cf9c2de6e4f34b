//! The client's data: gathering values from the workers that hold them (directly, never
//! through the scheduler), scattering values to workers, where keys are held, and the
//! workers' transfer logs.

use std::sync::Arc;
use std::time::Duration;

use dask_graph::{ComputeError, Key, Value};
use rustc_hash::FxHashMap;
use tokio::sync::oneshot;
use transport::Address;

use super::{token, Client, DFuture, Holders, Status, GATHER_ROUNDS};
use crate::error::{Error, Result};
use crate::net;
use crate::protocol::{DataMsg, FromClient, Hello, Payload, Scattered, Transfer, WorkerId};

/// Waits until the scheduler reports one of `keys` lost (its status back to pending), or the
/// connection to it ends.
async fn reported_lost(inner: &super::Inner, keys: &[Key]) {
    loop {
        let changed = inner.changed.notified();
        {
            let s = inner.lock();
            if s.closed.is_some()
                || keys.iter().any(|k| {
                    !matches!(s.keys.get(k).map(|st| &st.status), Some(Status::Memory(..)))
                })
            {
                return;
            }
        }
        changed.await;
    }
}

impl Client {
    /// The futures' values, fetched from the workers that hold them. The first failure (in the
    /// futures' order) is the error.
    pub async fn gather(&self, futures: &[DFuture]) -> Result<Vec<Value>> {
        self.wait(futures).await?;
        self.check_failed(futures)?;
        let keys: Vec<Key> = futures.iter().map(DFuture::key).collect();
        let mut values = FxHashMap::default();
        // A value may be lost with its worker between the notice and the fetch: then it is
        // computed again and fetched once more (a bounded number of times).
        for round in 0..GATHER_ROUNDS {
            if round > 0 {
                // The scheduler may not know yet that the holder is gone: give it time to
                // say (`Lost`) before asking again.
                let changed = self.inner.changed.notified();
                self.sleep_or(changed, Duration::from_millis(100 << round))
                    .await;
                self.wait(futures).await?;
                self.check_failed(futures)?;
            }
            // Small values came with the notice; the rest from where the scheduler said they
            // are (asked again for what is not found there).
            let mut holders: Holders = Vec::new();
            {
                let s = self.inner.lock();
                for k in &keys {
                    if values.contains_key(k) {
                        continue;
                    }
                    match s.keys.get(k).map(|st| &st.status) {
                        Some(Status::Memory(_, Some(v), _)) => {
                            values.insert(*k, v.clone());
                        }
                        Some(Status::Memory(h, None, _)) => holders.push((*k, h.clone())),
                        _ => holders.push((*k, Vec::new())),
                    }
                }
            }
            if !holders.is_empty() {
                values.extend(self.fetch(holders).await?);
            }
            let missing: Vec<Key> = keys
                .iter()
                .filter(|k| !values.contains_key(k))
                .copied()
                .collect();
            if missing.is_empty() {
                break;
            }
            let again = self.who_has(missing).await?;
            values.extend(self.fetch(again).await?);
            if keys.iter().all(|k| values.contains_key(k)) {
                break;
            }
        }
        keys.iter()
            .map(|k| {
                values.remove(k).ok_or_else(|| {
                    Error::Disconnected(format!(
                        "{k} is in memory but no worker gave it ({GATHER_ROUNDS} tries)"
                    ))
                })
            })
            .collect()
    }

    /// The first future that failed, was cancelled or refused, as an error.
    fn check_failed(&self, futures: &[DFuture]) -> Result<()> {
        let s = self.inner.lock();
        for f in futures {
            match s.keys.get(&f.key).map(|k| &k.status) {
                Some(Status::Erred(cause)) => {
                    return Err(ComputeError::Failed {
                        key: f.key,
                        cause: Arc::clone(cause),
                    }
                    .into())
                }
                Some(Status::Cancelled) => {
                    return Err(ComputeError::Cancelled { key: f.key }.into())
                }
                Some(Status::Refused(why)) => return Err(Error::Unexpected(why.clone())),
                _ => {}
            }
        }
        Ok(())
    }

    /// Each worker's latest transfers ([`Transfer`]s: shuffle deliveries and fetches of
    /// values for its tasks; peer, bytes, time), by data address: what per-worker-pair
    /// transfer rates are computed from ([`crate::transfers::pair_rates`]).
    pub async fn transfer_log(&self) -> Result<Vec<(String, Vec<Transfer>)>> {
        let mut out = Vec::new();
        for w in self.workers() {
            let address = w.address.clone();
            let (name, secret) = (self.inner.name.clone(), self.inner.secret.clone());
            let entries = self
                .inner
                .rt
                .run(async move {
                    let addr: Address = address.parse().map_err(transport::Error::from)?;
                    let conn = net::dial(&addr, &secret, Hello::Data { name }).await?;
                    let reply = net::request(&conn, vec![DataMsg::TransferLog], 0).await;
                    let _ = conn.close().await;
                    let mut reply: Vec<DataMsg> = reply?;
                    match (reply.pop(), reply.is_empty()) {
                        (Some(DataMsg::Transfers { entries }), true) => Ok::<_, Error>(entries),
                        _ => Err(Error::Unexpected(
                            "a transfer log answer must be one Transfers message".into(),
                        )),
                    }
                })
                .await??;
            out.push((w.address, entries));
        }
        Ok(out)
    }

    /// Fetches values from their holders (the first of each), all workers at once. Keys
    /// without a holder, or not given, are left out.
    async fn fetch(&self, holders: Holders) -> Result<FxHashMap<Key, Value>> {
        let mut by_worker: FxHashMap<String, Vec<Key>> = FxHashMap::default();
        for (k, hs) in holders {
            if let Some(h) = hs.into_iter().next() {
                by_worker.entry(h).or_default().push(k);
            }
        }
        let mut fetches = Vec::new();
        for (worker, ks) in by_worker {
            let inner = Arc::clone(&self.inner);
            // The sizes the scheduler announced bound the wait for the answer
            // (`net::request`); a key whose size is not known counts as a small one.
            let nbytes: u64 = {
                let s = self.inner.lock();
                ks.iter()
                    .map(|k| match s.keys.get(k).map(|st| &st.status) {
                        Some(Status::Memory(_, _, n)) => *n,
                        _ => 0,
                    })
                    .fold(0u64, u64::saturating_add)
            };
            fetches.push(self.inner.rt.run(async move {
                // Taken out of the pool while in use: two gathers never share a connection,
                // so their replies cannot cross.
                let conn = inner.data.lock().await.remove(&worker);
                let fetch = crate::worker::fetch::get(
                    &worker,
                    conn,
                    &inner.name,
                    &inner.secret,
                    ks.clone(),
                    nbytes,
                );
                // A value the scheduler reports lost meanwhile (its holder died or was
                // removed) is computed again elsewhere: this fetch is abandoned at once.
                let (conn, r) = tokio::select! {
                    r = fetch => r,
                    () = reported_lost(&inner, &ks) => {
                        tracing::info!(%worker, "values being fetched were reported lost: fetching them again");
                        (None, Ok(Vec::new()))
                    }
                };
                if let Some(c) = conn {
                    inner.data.lock().await.insert(worker.clone(), c);
                }
                if let Err(e) = &r {
                    tracing::info!(%worker, error = %e, "fetching from a worker failed");
                }
                r.unwrap_or_default()
            }));
        }
        let mut values = FxHashMap::default();
        for f in futures::future::join_all(fetches).await {
            for (k, p) in f? {
                if let Some(p) = p {
                    values.insert(k, p.to_value()?);
                }
            }
        }
        Ok(values)
    }

    async fn who_has(&self, keys: Vec<Key>) -> Result<Holders> {
        let (tx, rx) = oneshot::channel();
        // The request and its place in the reply queue, together (replies come in order).
        {
            let mut s = self.inner.lock();
            s.connected()?;
            s.who_has.push_back(tx);
            self.inner
                .to_scheduler
                .send(vec![FromClient::WhoHas { keys }])
                .map_err(|_| Error::Disconnected("the client's writer ended".into()))?;
        }
        rx.await.map_err(|_| self.inner.gone())
    }

    /// Where the futures' values are: each future's key and the data addresses of the
    /// workers holding it (none while it is not computed).
    pub async fn holders(&self, futures: &[DFuture]) -> Result<Vec<(Key, Vec<String>)>> {
        self.who_has(futures.iter().map(DFuture::key).collect())
            .await
    }

    /// Puts values on workers (spread over them) and returns futures for them.
    pub async fn scatter(&self, values: Vec<Value>) -> Result<Vec<DFuture>> {
        self.wait_for_workers(1, Duration::from_secs(30)).await?;
        let workers = self.workers();
        let name = dask_graph::Name::new(&format!("scatter-{}", token()));
        let mut per: FxHashMap<usize, Vec<(Key, Payload, u64)>> = FxHashMap::default();
        let mut keys = Vec::with_capacity(values.len());
        for (i, v) in values.iter().enumerate() {
            let key = Key::at(name, &[i as u32]);
            per.entry(i % workers.len()).or_default().push((
                key,
                Payload::from_value(v)?,
                v.nbytes() as u64,
            ));
            keys.push(key);
        }
        let futures: Vec<DFuture> = keys.iter().map(|&k| self.future(k)).collect();
        let mut puts = Vec::new();
        for (w, items) in per {
            let (address, id) = (workers[w].address.clone(), workers[w].id);
            let (name, secret) = (self.inner.name.clone(), self.inner.secret.clone());
            puts.push(self.inner.rt.run(async move {
                let addr: Address = address.parse().map_err(transport::Error::from)?;
                let conn = net::dial(&addr, &secret, Hello::Data { name }).await?;
                let sizes: Vec<(Key, u64)> = items.iter().map(|(k, _, n)| (*k, *n)).collect();
                let bytes = items.iter().map(|(_, p, _)| p.len() as u64).sum();
                // Bounded like a fetch of as many bytes: a worker that stops mid-put fails the
                // scatter rather than hang it.
                let reply = net::request(
                    &conn,
                    vec![DataMsg::Put {
                        values: items.into_iter().map(|(k, p, _)| (k, p)).collect(),
                    }],
                    bytes,
                )
                .await;
                let _ = conn.close().await;
                let reply: Vec<DataMsg> = reply?;
                if reply != [DataMsg::Stored] {
                    return Err(Error::Unexpected("a put was not stored".into()));
                }
                Ok::<_, Error>((id, sizes))
            }));
        }
        let mut scattered = Vec::new();
        for r in futures::future::join_all(puts).await {
            let (worker, sizes): (WorkerId, _) = r??;
            scattered.extend(sizes.into_iter().map(|(key, nbytes)| Scattered {
                key,
                worker,
                nbytes,
            }));
        }
        self.send(FromClient::Scattered { keys: scattered })?;
        Ok(futures)
    }
}
