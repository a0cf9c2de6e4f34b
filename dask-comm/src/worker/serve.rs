//! A worker's data server: each data connection admitted with the secret, then answered
//! from the store (values asked for), into it (values a client puts) and into the shuffle
//! service (pieces a peer delivers).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dask_graph::Key;
use tokio::sync::mpsc;
use transport::Connection;

use super::{lock, shuffle, store, Store};
use crate::net;
use crate::protocol::{DataMsg, Hello, Payload};
use crate::security::Secret;

/// Serves data connections on `listener` until it closes; says why it ended.
///
/// A connection holds a descriptor from its accept; one that has not passed the secret
/// challenge within [`SHED_AFTER`] when the process runs out of descriptors is closed, so
/// that a burst of silent connections (a flood, peers that hung) does not keep the workers'
/// own connections waiting for the challenge's 10 s limit each.
pub(super) async fn serve(
    mut listener: transport::Listener,
    store: Store,
    secret: Secret,
    lost: mpsc::UnboundedSender<Key>,
    shuffles: Arc<shuffle::Shuffles>,
) -> String {
    let transfers = Arc::new(tokio::sync::Semaphore::new(TRANSFERS));
    // Connections not yet admitted, oldest first.
    let mut admitting: VecDeque<Admitting> = VecDeque::new();
    loop {
        let mut shed = || {
            let mut closed = 0;
            while admitting
                .front()
                .is_some_and(|a| a.since.elapsed() >= SHED_AFTER || a.done())
            {
                let a = admitting.pop_front().expect("checked above");
                if !a.done() {
                    a.task.abort();
                    closed += 1;
                }
            }
            if closed > 0 {
                tracing::warn!(
                    closed,
                    "out of descriptors: closed connections still short of the challenge"
                );
            }
            closed > 0
        };
        match net::accept(&mut listener, "the data server", &mut shed).await {
            Ok(conn) => {
                while admitting.front().is_some_and(Admitting::done) {
                    admitting.pop_front();
                }
                let admitted = Arc::new(AtomicBool::new(false));
                let task = tokio::spawn(serve_data(
                    conn,
                    Arc::clone(&store),
                    secret.clone(),
                    lost.clone(),
                    Arc::clone(&shuffles),
                    Arc::clone(&transfers),
                    Arc::clone(&admitted),
                ));
                admitting.push_back(Admitting {
                    since: Instant::now(),
                    task: task.abort_handle(),
                    admitted,
                });
            }
            Err(e) => return format!("the data server's listener closed: {e}"),
        }
    }
}

/// A connection served, from its accept until it is admitted.
struct Admitting {
    since: Instant,
    task: tokio::task::AbortHandle,
    admitted: Arc<AtomicBool>,
}

impl Admitting {
    fn done(&self) -> bool {
        self.admitted.load(Ordering::Relaxed) || self.task.is_finished()
    }
}

/// A connection still short of the challenge this long when descriptors run out is closed.
/// (The challenge takes a round trip or two; a loaded host, a few hundred milliseconds.)
const SHED_AFTER: Duration = Duration::from_millis(250);

/// Requests a data server answers at once (Dask's `distributed.worker.connections.incoming`).
const TRANSFERS: usize = 10;

/// Serves one data connection: values from the store, and values a client puts.
pub(super) async fn serve_data(
    conn: Connection,
    store: Store,
    secret: Secret,
    lost: mpsc::UnboundedSender<Key>,
    shuffles: Arc<shuffle::Shuffles>,
    transfers: Arc<tokio::sync::Semaphore>,
    admitted: Arc<AtomicBool>,
) {
    let peer = conn.peer_addr().clone();
    match net::admit(&conn, &secret).await {
        Ok(Hello::Data { .. }) => admitted.store(true, Ordering::Relaxed),
        Ok(other) => {
            tracing::warn!(%peer, ?other, "not a data connection: closed");
            let _ = conn.close().await;
            return;
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "refused a data connection");
            let _ = conn.close().await;
            return;
        }
    }
    loop {
        let msgs = match net::recv_batch::<DataMsg>(&conn).await {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "data connection ends");
                return;
            }
        };
        // At most [`TRANSFERS`] requests answered at once across the server's connections: each
        // may read spilled values back into memory. The others wait here, unread.
        let Ok(permit) = transfers.acquire().await else {
            return;
        };
        let mut reply = Vec::new();
        for m in msgs {
            match m {
                DataMsg::Get { keys } => {
                    // Where each value is, under the store's lock; spilled ones are read after,
                    // off this thread and without the lock, so a slow disk holds up neither
                    // the worker nor the other connections.
                    let located: Vec<(Key, store::Located)> = {
                        let store = lock(&store);
                        keys.into_iter().map(|k| (k, store.locate(&k))).collect()
                    };
                    let mut values = Vec::with_capacity(located.len());
                    for (k, at) in located {
                        let v = match at {
                            store::Located::Memory(v) => Some(v),
                            store::Located::Absent => None,
                            store::Located::Disk(path) => {
                                let read = {
                                    let path = path.clone();
                                    tokio::task::spawn_blocking(move || {
                                        store::read_spill(&k, &path)
                                    })
                                    .await
                                };
                                match read {
                                    Ok(Ok(v)) => Some(v),
                                    Ok(Err(e)) if lock(&store).spilled_at(&k, &path) => {
                                        tracing::warn!(%peer, error = %e, "a value asked for is lost");
                                        let _ = lost.send(k);
                                        None
                                    }
                                    // Released (its file removed) while it was being read.
                                    Ok(Err(_)) => None,
                                    Err(e) => {
                                        tracing::warn!(%peer, error = %e, "reading a spilled value panicked");
                                        None
                                    }
                                }
                            }
                        };
                        values.push((k, v));
                    }
                    let values = values
                        .into_iter()
                        .map(|(k, v)| {
                            let p = v.and_then(|v| match Payload::from_value(&v) {
                                Ok(p) => Some(p),
                                Err(e) => {
                                    tracing::warn!(key = %k, error = %e, "a value does not encode");
                                    None
                                }
                            });
                            (k, p)
                        })
                        .collect();
                    reply.push(DataMsg::Values { values });
                }
                DataMsg::Put { values } => {
                    let mut decoded = Vec::with_capacity(values.len());
                    for (k, p) in values {
                        match p.to_value() {
                            Ok(v) => decoded.push((k, v)),
                            Err(e) => {
                                tracing::warn!(%peer, key = %k, error = %e, "a put value does not decode");
                                let _ = conn.close().await;
                                return;
                            }
                        }
                    }
                    let mut store = lock(&store);
                    for (k, v) in decoded {
                        store.insert(k, v);
                    }
                    reply.push(DataMsg::Stored);
                }
                DataMsg::Pieces { values } => {
                    if let Err(e) = shuffles.keep_pieces(values) {
                        tracing::warn!(%peer, error = %e, "bad shuffle pieces: closed");
                        let _ = conn.close().await;
                        return;
                    }
                    reply.push(DataMsg::Stored);
                }
                DataMsg::TransferLog => reply.push(DataMsg::Transfers {
                    entries: shuffles.log().entries(),
                }),
                other => {
                    tracing::warn!(%peer, ?other, "unexpected on a data connection: closed");
                    let _ = conn.close().await;
                    return;
                }
            }
        }
        // Not held while the reply goes: a requester that stops reading must not hold a slot.
        drop(permit);
        if net::send_batch(&conn, reply).await.is_err() {
            return;
        }
    }
}
