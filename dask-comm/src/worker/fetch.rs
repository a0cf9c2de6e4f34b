//! Fetching dependencies from the workers that hold them: batched per peer (at most
//! [`BATCH_BYTES`] per request), one request in flight per peer, connections kept for reuse.
//! A holder that does not have a key, or cannot be reached, is skipped for the next one; when
//! none is left, the key is reported missing (the scheduler then finds it elsewhere or
//! recomputes it).

use std::collections::VecDeque;
use std::sync::Arc;

use dask_graph::{Key, Value};
use rustc_hash::{FxHashMap, FxHashSet};
use tokio::sync::mpsc;
use transport::{Address, Connection};

use crate::error::{Error, Result};
use crate::net;
use crate::protocol::{DataMsg, Hello, Payload};
use crate::security::Secret;

/// The most bytes asked of one peer in one request (Dask's 50 MB).
pub(crate) const BATCH_BYTES: u64 = 50 << 20;

/// What a request to a peer brought back.
pub(crate) struct Fetched {
    peer: String,
    conn: Option<Arc<Connection>>,
    asked: Vec<Key>,
    result: Result<Vec<(Key, Option<Payload>)>>,
    /// How long the request took.
    micros: u64,
    /// The request's number (0: not a request, made up here): an answer to a request that
    /// was given up on ([`Fetcher::peer_gone`]) is ignored.
    request: u64,
}

impl Fetched {
    /// For the task stream: the peer, the values asked for, the bytes that came, and how
    /// long it took (`None` when nothing was asked of anyone).
    pub(crate) fn summary(&self) -> Option<crate::protocol::Fetch> {
        if self.peer.is_empty() {
            return None;
        }
        let bytes = self.result.as_ref().map_or(0, |vs| {
            vs.iter()
                .filter_map(|(_, p)| p.as_ref().map(|p| p.len() as u64))
                .sum()
        });
        Some(crate::protocol::Fetch {
            peer: self.peer.clone(),
            keys: self.asked.len() as u32,
            bytes,
            micros: self.micros,
            ago_micros: 0,
        })
    }
}

struct Want {
    holders: VecDeque<String>,
    tried: Vec<String>,
    nbytes: u64,
}

pub(crate) struct Fetcher {
    me: String,
    secret: Secret,
    tx: mpsc::UnboundedSender<Fetched>,
    wanted: FxHashMap<Key, Want>,
    queues: FxHashMap<String, Vec<Key>>,
    busy: FxHashSet<String>,
    pool: FxHashMap<String, Arc<Connection>>,
    /// The request in flight to each busy peer: its number, its task, and what it asked.
    inflight: FxHashMap<String, (u64, tokio::task::AbortHandle, Vec<Key>)>,
    /// The last request number given.
    requests: u64,
}

/// Asks `peer` for `keys` over `conn` (or a new data connection), expected to weigh `nbytes`
/// (which bounds the wait for the answer: [`net::request`]).
pub(crate) async fn get(
    peer: &str,
    conn: Option<Arc<Connection>>,
    me: &str,
    secret: &Secret,
    keys: Vec<Key>,
    nbytes: u64,
) -> (Option<Arc<Connection>>, Result<Vec<(Key, Option<Payload>)>>) {
    let conn = match conn {
        Some(c) => c,
        None => {
            let addr: Address = match peer.parse() {
                Ok(a) => a,
                Err(e) => return (None, Err(Error::Transport(e.into()))),
            };
            match net::dial(
                &addr,
                secret,
                Hello::Data {
                    name: me.to_string(),
                },
            )
            .await
            {
                Ok(c) => Arc::new(c),
                Err(e) => return (None, Err(e)),
            }
        }
    };
    let r = async {
        let mut reply: Vec<DataMsg> =
            net::request(&conn, vec![DataMsg::Get { keys }], nbytes).await?;
        match (reply.pop(), reply.is_empty()) {
            (Some(DataMsg::Values { values }), true) => Ok(values),
            _ => Err(Error::Unexpected(
                "a data answer must be one Values message".into(),
            )),
        }
    }
    .await;
    let keep = r.is_ok().then_some(conn);
    (keep, r)
}

impl Fetcher {
    pub(crate) fn new(me: String, secret: Secret, tx: mpsc::UnboundedSender<Fetched>) -> Fetcher {
        Fetcher {
            me,
            secret,
            tx,
            wanted: FxHashMap::default(),
            queues: FxHashMap::default(),
            busy: FxHashSet::default(),
            pool: FxHashMap::default(),
            inflight: FxHashMap::default(),
            requests: 0,
        }
    }

    /// Fetch `key` from one of `holders`; `tried`: holders the scheduler named that are known
    /// not to have it (reported with the others if none has it).
    pub(crate) fn want(&mut self, key: Key, holders: Vec<String>, tried: Vec<String>, nbytes: u64) {
        let mut want = Want {
            holders: holders.into(),
            tried,
            nbytes,
        };
        match want.holders.pop_front() {
            Some(h) => {
                self.queues.entry(h).or_default().push(key);
                self.wanted.insert(key, want);
            }
            None => {
                // Nobody to ask: reported missing on the next pass.
                self.wanted.insert(key, want);
                let _ = self.tx.send(Fetched {
                    peer: String::new(),
                    conn: None,
                    asked: vec![key],
                    result: Err(Error::Unexpected("no holder".into())),
                    micros: 0,
                    request: 0,
                });
            }
        }
    }

    /// Sends a request to every peer that has keys queued and none in flight.
    pub(crate) fn start(&mut self) {
        let ready: Vec<String> = self
            .queues
            .iter()
            .filter(|(p, ks)| !ks.is_empty() && !self.busy.contains(*p))
            .map(|(p, _)| p.clone())
            .collect();
        for peer in ready {
            let queue = self.queues.get_mut(&peer).expect("listed above");
            let mut bytes = 0u64;
            let mut n = 0;
            while n < queue.len() {
                bytes += self.wanted.get(&queue[n]).map_or(0, |w| w.nbytes);
                n += 1;
                if bytes >= BATCH_BYTES {
                    break;
                }
            }
            let keys: Vec<Key> = queue.drain(..n).collect();
            self.busy.insert(peer.clone());
            let (conn, me, secret, tx) = (
                self.pool.get(&peer).cloned(),
                self.me.clone(),
                self.secret.clone(),
                self.tx.clone(),
            );
            let asked = keys.clone();
            let p = peer.clone();
            self.requests += 1;
            let request = self.requests;
            let task = tokio::spawn(async move {
                let t0 = std::time::Instant::now();
                let (conn, result) = get(&peer, conn, &me, &secret, keys.clone(), bytes).await;
                let _ = tx.send(Fetched {
                    peer,
                    conn,
                    asked: keys,
                    result,
                    micros: t0.elapsed().as_micros() as u64,
                    request,
                });
            });
            self.inflight
                .insert(p, (request, task.abort_handle(), asked));
        }
    }

    /// The scheduler removed the worker serving at `peer`: it is asked nothing more, and what
    /// was queued for it or is in flight to it goes to the next holder (or is reported
    /// missing) now.
    pub(crate) fn peer_gone(&mut self, peer: &str) {
        for w in self.wanted.values_mut() {
            w.holders.retain(|h| h != peer);
        }
        self.pool.remove(peer);
        let mut asked = self.queues.remove(peer).unwrap_or_default();
        // A request that already ended has sent its answer: that one is taken in. One still
        // going is given up on (if its answer is sent meanwhile, it is ignored on arrival).
        if self
            .inflight
            .get(peer)
            .is_some_and(|(_, task, _)| !task.is_finished())
        {
            let (_, task, keys) = self.inflight.remove(peer).expect("present");
            task.abort();
            asked.extend(keys);
        }
        if asked.is_empty() {
            return;
        }
        tracing::info!(%peer, keys = asked.len(), "a peer was removed: its fetches go elsewhere");
        let _ = self.tx.send(Fetched {
            peer: peer.to_string(),
            conn: None,
            asked,
            result: Err(Error::Disconnected(format!(
                "{peer} was removed by the scheduler"
            ))),
            micros: 0,
            request: 0,
        });
    }

    /// Takes in what a request brought: the values that arrived, and the keys no holder had
    /// (with the holders tried).
    pub(crate) fn arrived(&mut self, f: Fetched) -> Arrivals {
        if f.request != 0 {
            match self.inflight.get(&f.peer) {
                Some((current, ..)) if *current == f.request => {
                    self.inflight.remove(&f.peer);
                }
                // The answer to a request given up on: what it asked went elsewhere.
                _ => {
                    return Arrivals {
                        values: Vec::new(),
                        missing: Vec::new(),
                    }
                }
            }
        }
        self.busy.remove(&f.peer);
        match f.conn {
            Some(c) => {
                self.pool.insert(f.peer.clone(), c);
            }
            None => {
                self.pool.remove(&f.peer);
            }
        }
        let mut arrived = Vec::new();
        let mut retry: Vec<Key> = Vec::new();
        match f.result {
            Ok(values) => {
                let mut answered = FxHashSet::default();
                for (k, p) in values {
                    answered.insert(k);
                    match p.map(|p| p.to_value()) {
                        Some(Ok(v)) if self.wanted.remove(&k).is_some() => arrived.push((k, v)),
                        Some(Ok(_)) => {} // not wanted any more
                        Some(Err(e)) => {
                            tracing::warn!(peer = %f.peer, key = %k, error = %e, "a fetched value does not decode");
                            retry.push(k);
                        }
                        None => retry.push(k),
                    }
                }
                retry.extend(f.asked.into_iter().filter(|k| !answered.contains(k)));
            }
            Err(e) => {
                if !f.peer.is_empty() {
                    tracing::info!(peer = %f.peer, error = %e, "fetching from a peer failed");
                }
                retry = f.asked;
            }
        }
        let mut missing = Vec::new();
        for k in retry {
            let Some(w) = self.wanted.get_mut(&k) else {
                continue;
            };
            if !f.peer.is_empty() {
                w.tried.push(f.peer.clone());
            }
            match w.holders.pop_front() {
                Some(h) => self.queues.entry(h).or_default().push(k),
                None => {
                    let w = self.wanted.remove(&k).expect("present");
                    missing.push((k, w.tried));
                }
            }
        }
        Arrivals {
            values: arrived,
            missing,
        }
    }
}

/// What [`Fetcher::arrived`] found.
pub(crate) struct Arrivals {
    /// Values that arrived.
    pub values: Vec<(Key, Value)>,
    /// Keys no holder had, with the holders tried.
    pub missing: Vec<(Key, Vec<String>)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker the scheduler named as a holder of a value it does not have (it dropped it
    /// on a `Free` that crossed the scheduler's news) says so: with no other holder, the key
    /// comes back missing with that worker among those tried, so the scheduler stops
    /// counting it as a holder instead of sending the task back to it forever.
    #[test]
    fn a_holder_known_not_to_have_the_value_is_reported_tried() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut f = Fetcher::new("tcp://me".into(), Secret::generate(), tx);
        let key = Key::name_only("x");
        f.want(key, Vec::new(), vec!["tcp://me".into()], 8);
        let fetched = rx.try_recv().expect("answered at once: nobody to ask");
        let a = f.arrived(fetched);
        assert!(a.values.is_empty());
        assert_eq!(a.missing, vec![(key, vec!["tcp://me".to_string()])]);
    }
}
