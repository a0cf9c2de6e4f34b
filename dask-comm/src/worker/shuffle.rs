//! The worker's part of peer-to-peer shuffles (see [`dask_graph::shuffle`] and the scheduler's
//! `core::shuffle`): the [`ShuffleService`] installed on the worker's task threads.
//!
//! A transfer task's pieces go straight to their outputs' owners (the run the scheduler sent
//! with the task says who they are) as [`DataMsg::Put`] messages on data connections of
//! their own, at most [`BATCH_BYTES`] of pieces per message and one message per peer in
//! flight: the next waits for the peer's acknowledgement, so a transfer never has more than
//! that many bytes on the wire per peer, and it returns once every piece is stored. Pieces
//! for this worker go into its store directly. A peer stores pieces as they arrived, encoded
//! ([`Piece`]: its data server does not decode them; the unpack task does), like any value
//! (they count against its memory limit and spill to disk), under keys of their own: the
//! shuffle's name with `-piece`, and (run, output, input). An unpack task reads its output's
//! pieces of the current run and removes them; when the scheduler says a run is over
//! ([`ToWorker::ShuffleDone`](crate::protocol::ToWorker::ShuffleDone)), what is left of it
//! goes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dask_graph::shuffle::{ShuffleError, ShuffleService};
use dask_graph::{Key, Name, ShuffleId, Value};
use rustc_hash::FxHashMap;
use transport::{Address, Connection};

use super::{lock, store, Store};
use crate::net;
use crate::protocol::{DataMsg, Hello, Payload, ShuffleRun, Transfer, TRANSFER_LOG};
use crate::security::Secret;

/// Most bytes of pieces in one message to a peer (the next waits for its acknowledgement).
pub const BATCH_BYTES: usize = 8 << 20;

/// A shuffle piece as it arrived from a peer: its encoding, decoded by the unpack task.
#[derive(Debug, Clone)]
pub(crate) struct Piece(pub Payload);

impl dask_graph::Data for Piece {
    fn nbytes(&self) -> usize {
        self.0.len()
    }

    fn encode(&self) -> Result<dask_graph::Encoded, dask_graph::DataError> {
        Ok(dask_graph::Encoded {
            header: self.0.header.clone(),
            frames: self.0.frames.clone(),
        })
    }

    fn decode(
        header: &[u8],
        frames: Vec<dask_graph::Frame>,
    ) -> Result<Self, dask_graph::DataError> {
        Ok(Piece(Payload {
            header: header.to_vec(),
            nframes: frames.len() as u32,
            frames,
        }))
    }
}

/// The worker's latest transfers (its data server answers [`DataMsg::TransferLog`] with them),
/// numbered from 1 in the order they were recorded.
#[derive(Clone, Default)]
pub(crate) struct TransferLog(Arc<Mutex<(VecDeque<Transfer>, u64)>>);

impl TransferLog {
    /// Keeps `t` (its `seq` set here), forgetting the oldest past [`TRANSFER_LOG`].
    pub(crate) fn record(&self, mut t: Transfer) {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (log, seq) = &mut *guard;
        *seq += 1;
        t.seq = *seq;
        if log.len() == TRANSFER_LOG {
            log.pop_front();
        }
        log.push_back(t);
    }

    /// The deliveries remembered, oldest first.
    pub fn entries(&self) -> Vec<Transfer> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .iter()
            .cloned()
            .collect()
    }
}

/// A connection to one peer, used by one transfer at a time.
type Peer = Arc<tokio::sync::Mutex<Option<Connection>>>;

/// The worker's shuffle service.
pub(crate) struct Shuffles {
    me: String,
    store: Store,
    secret: Secret,
    handle: tokio::runtime::Handle,
    runs: Mutex<FxHashMap<ShuffleId, ShuffleRun>>,
    /// The last run of each shuffle whose pieces were dropped: later pieces of it (a freed
    /// transfer still sending) are not kept.
    dropped: Mutex<FxHashMap<ShuffleId, u32>>,
    peers: Mutex<FxHashMap<String, Peer>>,
    log: TransferLog,
}

/// The name of shuffle `id`'s piece keys.
fn piece_name(id: ShuffleId) -> Name {
    Name::new(&format!("{id}-piece"))
}

fn piece_key(name: Name, run: u32, part: u32, input: u32) -> Key {
    Key::try_new(name, &[run, part, input]).expect("three indices")
}

impl Shuffles {
    /// The service of the worker at data address `me`, keeping pieces in `store`; its
    /// transfers run on `handle`'s runtime.
    pub fn new(
        me: String,
        store: Store,
        secret: Secret,
        handle: tokio::runtime::Handle,
    ) -> Shuffles {
        Shuffles {
            me,
            store,
            secret,
            handle,
            log: TransferLog::default(),
            dropped: Mutex::new(FxHashMap::default()),
            runs: Mutex::new(FxHashMap::default()),
            peers: Mutex::new(FxHashMap::default()),
        }
    }

    /// The scheduler sent a shuffle task with `run`: its owners hold from now on (an earlier
    /// run's news arriving late does not replace a later one).
    pub fn set_run(&self, run: ShuffleRun) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        match runs.get(&run.id) {
            Some(r) if r.run > run.run => {}
            _ => {
                runs.insert(run.id, run);
            }
        }
    }

    /// This worker's deliveries.
    pub fn log(&self) -> &TransferLog {
        &self.log
    }

    /// Whether pieces of run `run` of shuffle `id` are dropped already.
    fn is_dropped(&self, id: ShuffleId, run: u32) -> bool {
        self.dropped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .is_some_and(|&d| run <= d)
    }

    /// Keeps pieces a peer delivered (encoded), except those of runs already over. A key that
    /// is not a piece's (a name ending in `-piece`, three indices) is an error: nothing of
    /// the message is kept.
    pub fn keep_pieces(&self, values: Vec<(Key, Payload)>) -> Result<(), String> {
        let mut ids = Vec::with_capacity(values.len());
        for (k, _) in &values {
            let id = k
                .name()
                .as_str()
                .strip_suffix("-piece")
                .filter(|_| k.indices().len() == 3)
                .ok_or_else(|| format!("{k} is not a shuffle piece's key"))?;
            ids.push(ShuffleId::new(id));
        }
        let mut store = lock(&self.store);
        for ((k, p), id) in values.into_iter().zip(ids) {
            if !self.is_dropped(id, k.indices()[0]) {
                store.insert(k, Value::new(Piece(p)));
            }
        }
        Ok(())
    }

    /// Runs up to `run` of shuffle `id` are over: their pieces go.
    pub fn done(&self, id: ShuffleId, run: u32) {
        {
            let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
            if runs.get(&id).is_some_and(|r| r.run <= run) {
                runs.remove(&id);
            }
            let mut dropped = self.dropped.lock().unwrap_or_else(|e| e.into_inner());
            let d = dropped.entry(id).or_insert(run);
            *d = (*d).max(run);
        }
        let name = piece_name(id);
        let mut store = lock(&self.store);
        let old = store
            .keys_where(|k| k.name() == name && k.indices().first().is_some_and(|&r| r <= run));
        for k in &old {
            store.remove(k);
        }
        tracing::debug!(shuffle = %id, run, pieces = old.len(), "shuffle run over");
    }

    fn run(&self, id: ShuffleId) -> Result<ShuffleRun, ShuffleError> {
        self.runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
            .ok_or(ShuffleError::NoRun { id })
    }

    fn peer(&self, address: &str) -> Peer {
        Arc::clone(
            self.peers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(address.to_string())
                .or_default(),
        )
    }
}

/// Connects to a peer this many times before its pieces count as undeliverable, pausing
/// [`DIAL_RETRY_FIRST`] doubled each time up to [`DIAL_RETRY_MAX`] (about 5 s in all).
const DIAL_TRIES: u32 = 6;
const DIAL_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(150);
const DIAL_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// Sends `batches` (each one `Put`) to `address` one after another, each acknowledged before
/// the next; the connection is kept for the next transfer unless something failed.
async fn deliver(
    peer: Peer,
    address: String,
    me: String,
    secret: Secret,
    batches: Vec<Vec<(Key, Payload)>>,
    log: TransferLog,
) -> Result<(), String> {
    let mut slot = peer.lock().await;
    let t0 = Instant::now();
    let bytes: usize = batches.iter().flatten().map(|(_, p)| p.len()).sum();
    let conn = match slot.take() {
        Some(c) => c,
        None => {
            let addr: Address = address.parse().map_err(|e| format!("{e}"))?;
            tracing::debug!(peer = %address, "shuffle connection");
            // Nothing is sent before the connection is up, so a failed connect is tried
            // again (a peer, or this process, briefly out of descriptors), as Dask's P2P
            // retries its sends, rather than restart the whole shuffle at once.
            let mut pause = DIAL_RETRY_FIRST;
            let mut tries = 1;
            loop {
                match net::dial(&addr, &secret, Hello::Data { name: me.clone() }).await {
                    Ok(c) => break c,
                    Err(e) if tries < DIAL_TRIES => {
                        tracing::warn!(peer = %address, error = %e, ?pause, "shuffle connection failed: trying again");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(DIAL_RETRY_MAX);
                        tries += 1;
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
    };
    for values in batches {
        let n: u64 = values.iter().map(|(_, p)| p.len() as u64).sum();
        let reply: Vec<DataMsg> = net::request(&conn, vec![DataMsg::Pieces { values }], n)
            .await
            .map_err(|e| e.to_string())?;
        if reply != [DataMsg::Stored] {
            return Err("the peer did not acknowledge the pieces".into());
        }
    }
    *slot = Some(conn);
    log.record(Transfer {
        peer: address,
        bytes: bytes as u64,
        micros: t0.elapsed().as_micros() as u64,
        fetched: false,
        seq: 0,
    });
    Ok(())
}

impl ShuffleService for Shuffles {
    fn send(
        &self,
        id: ShuffleId,
        input: u32,
        pieces: Vec<(u32, Value)>,
    ) -> Result<(), ShuffleError> {
        let run = self.run(id)?;
        let name = piece_name(id);
        // Each peer's pieces, encoded, in batches of at most BATCH_BYTES.
        let mut outgoing: FxHashMap<&str, Vec<Vec<(Key, Payload)>>> = FxHashMap::default();
        let mut sizes: FxHashMap<&str, usize> = FxHashMap::default();
        let mut mine = Vec::new();
        for (part, v) in pieces {
            let owner = run.owner(part).ok_or(ShuffleError::NoRun { id })?;
            let key = piece_key(name, run.run, part, input);
            if owner == self.me {
                mine.push((key, v));
                continue;
            }
            let p = Payload::from_value(&v).map_err(|e| ShuffleError::Data {
                id,
                reason: e.to_string(),
            })?;
            let size = sizes.entry(owner).or_default();
            let batches = outgoing.entry(owner).or_default();
            if batches.is_empty() || (*size > 0 && *size + p.len() > BATCH_BYTES) {
                batches.push(Vec::new());
                *size = 0;
            }
            *size += p.len();
            batches.last_mut().expect("pushed above").push((key, p));
        }
        if !self.is_dropped(id, run.run) {
            let mut store = lock(&self.store);
            for (k, v) in mine {
                store.insert(k, v);
            }
        }
        if outgoing.is_empty() {
            return Ok(());
        }
        // Every peer at once, each on its own connection; this thread waits for all.
        let (tx, rx) = std::sync::mpsc::channel();
        let n = outgoing.len();
        for (address, batches) in outgoing {
            let (peer, address) = (self.peer(address), address.to_string());
            let (me, secret, tx) = (self.me.clone(), self.secret.clone(), tx.clone());
            let log = self.log.clone();
            self.handle.spawn(async move {
                let r = deliver(peer, address.clone(), me, secret, batches, log).await;
                let _ = tx.send((address, r));
            });
        }
        drop(tx);
        let mut first_error = None;
        for _ in 0..n {
            match rx.recv() {
                Ok((_, Ok(()))) => {}
                Ok((peer, Err(reason))) => {
                    tracing::warn!(shuffle = %id, %peer, %reason, "shuffle pieces not delivered");
                    first_error.get_or_insert(ShuffleError::Unreachable { id, peer, reason });
                }
                Err(_) => {
                    first_error.get_or_insert(ShuffleError::Unreachable {
                        id,
                        peer: String::new(),
                        reason: "the worker's runtime stopped".into(),
                    });
                    break;
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn receive(&self, id: ShuffleId, part: u32, inputs: u32) -> Result<Vec<Value>, ShuffleError> {
        let run = self.run(id)?;
        let name = piece_name(id);
        let keys: Vec<Key> = (0..inputs)
            .map(|i| piece_key(name, run.run, part, i))
            .collect();
        // Where each piece is, under the store's lock (in memory: `Ok`, spilled: the file);
        // spilled ones are read after, without it.
        let mut located: Vec<Result<Value, std::path::PathBuf>> = Vec::with_capacity(keys.len());
        {
            let store = lock(&self.store);
            for (input, k) in (0..inputs).zip(&keys) {
                located.push(match store.locate(k) {
                    store::Located::Absent => {
                        return Err(ShuffleError::Missing { id, part, input })
                    }
                    store::Located::Memory(v) => Ok(v),
                    store::Located::Disk(path) => Err(path),
                });
            }
        }
        let mut out = Vec::with_capacity(keys.len());
        for ((input, k), at) in (0..inputs).zip(&keys).zip(located) {
            let path = match at {
                Ok(v) => {
                    out.push(v);
                    continue;
                }
                Err(path) => path,
            };
            match store::read_spill(k, &path) {
                Ok(v) => out.push(v),
                Err(e) => {
                    tracing::warn!(shuffle = %id, error = %e, "a shuffle piece is lost");
                    let mut store = lock(&self.store);
                    if store.spilled_at(k, &path) {
                        store.remove(k);
                    }
                    return Err(ShuffleError::Missing { id, part, input });
                }
            }
        }
        {
            let mut store = lock(&self.store);
            for k in &keys {
                store.remove(k);
            }
        }
        // Pieces from peers are decoded here, on the task's thread.
        out.into_iter()
            .map(|v| match v.downcast_ref::<Piece>() {
                Some(p) => p.0.to_value().map_err(|e| ShuffleError::Data {
                    id,
                    reason: e.to_string(),
                }),
                None => Ok(v),
            })
            .collect()
    }
}
