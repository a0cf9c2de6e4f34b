//! Connections between the processes of a cluster: dial and admit with the security
//! handshake and a [`Hello`], and batches of messages on the control channel.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;
use transport::frame::Limits;
use transport::{Address, Connection, Options};

use crate::error::{Error, Result};
use crate::protocol::{decode_batch, encode_batch, Hello, Payloads, PACK_BELOW, PACK_FRAME};
use crate::security::{self, Secret, HANDSHAKE_LIMITS};

/// The channel batches travel on (the handshake has its own).
pub(crate) const CONTROL: u32 = 2;

/// What an authenticated connection accepts: the transport's defaults.
pub(crate) fn limits() -> Limits {
    Limits::default()
}

/// Before the first `ucx://` use in this process: the progress mode, from
/// `DASK_COMM_UCX_PROGRESS` (`polling`, `blocking`, `thread`), blocking by default (a cluster's
/// processes share the machine's cores: spinning progress starves them); the shared-memory
/// ring each connection offers for large frames on one host, from `DASK_COMM_UCX_RING`
/// (bytes, `0` for none; [`transport::DEFAULT_SAME_HOST_RING`] by default). A program that
/// configured `transport::configure_ucx` itself keeps its choice.
pub(crate) fn prepare(addr: &Address) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if !matches!(addr, Address::Ucx { .. }) {
        return;
    }
    ONCE.call_once(|| {
        let progress = std::env::var("DASK_COMM_UCX_PROGRESS")
            .ok()
            .and_then(|m| m.parse().ok())
            .unwrap_or(ucx::ProgressMode::Blocking);
        let same_host_ring = match std::env::var("DASK_COMM_UCX_RING") {
            Ok(v) => v.trim().parse().unwrap_or_else(|_| {
                tracing::warn!(value = %v, "DASK_COMM_UCX_RING is not a number of bytes: using the default");
                transport::DEFAULT_SAME_HOST_RING
            }),
            Err(_) => transport::DEFAULT_SAME_HOST_RING,
        };
        let chosen = transport::configure_ucx(transport::UcxIntent {
            progress,
            same_host_ring,
            ..Default::default()
        });
        if let Err(e) = chosen {
            tracing::warn!(error = %e, "the UCX configuration was not applied");
        }
    });
}

/// The environment variable naming a folder with the cluster's TLS certificate for
/// `tls://` (`cert.pem`, presented and trusted, and `key.pem`; `transport-echo tls-generate
/// DIR` makes one), unless the program called [`set_tls`].
pub const ENV_TLS_DIR: &str = "DASK_COMM_TLS_DIR";

static TLS: std::sync::OnceLock<transport::tls::TlsConfig> = std::sync::OnceLock::new();

/// Sets this process's TLS configuration for `tls://` addresses (before its first use; later
/// calls are refused). Otherwise it comes from [`ENV_TLS_DIR`].
pub fn set_tls(config: transport::tls::TlsConfig) -> Result<()> {
    TLS.set(config)
        .map_err(|_| Error::Config("the TLS configuration is already set".into()))
}

/// The options a connection of this process starts with: for `tls://`, the cluster's
/// certificate.
fn options(addr: &Address) -> Result<Options> {
    let mut opts = Options::default();
    if matches!(addr, Address::Tls { .. }) {
        if TLS.get().is_none() {
            let dir = std::env::var(ENV_TLS_DIR).map_err(|_| {
                Error::Config(format!(
                    "{addr} needs the cluster's certificate: set {ENV_TLS_DIR} to a folder with \
                     cert.pem and key.pem"
                ))
            })?;
            let dir = std::path::Path::new(&dir);
            let cert = dir.join("cert.pem");
            let config =
                transport::tls::TlsConfig::from_pem_files(&cert, dir.join("key.pem"), &cert)
                    .map_err(transport::Error::from)?;
            let _ = TLS.set(config);
        }
        opts.tls = TLS.get().cloned();
    }
    Ok(opts)
}

/// Listens on `addr` (see [`prepare`]).
pub(crate) async fn listen(addr: &Address) -> Result<transport::Listener> {
    prepare(addr);
    Ok(transport::listen_with(addr, &options(addr)?).await?)
}

/// Connects to `addr`, proves the secret, and introduces itself.
pub(crate) async fn dial(addr: &Address, secret: &Secret, hello: Hello) -> Result<Connection> {
    prepare(addr);
    let conn = transport::connect_with(
        addr,
        &Options {
            limits: HANDSHAKE_LIMITS,
            ..options(addr)?
        },
    )
    .await?;
    if let Err(e) = security::connect(&conn, secret, limits()).await {
        let _ = conn.close().await;
        return Err(e.into());
    }
    send_batch(&conn, vec![hello]).await?;
    Ok(conn)
}

/// The accepting side: the peer must prove the secret, then say who it is.
pub(crate) async fn admit(conn: &Connection, secret: &Secret) -> Result<Hello> {
    security::accept(conn, secret, limits()).await?;
    let mut hello: Vec<Hello> = tokio::time::timeout(security::HANDSHAKE_TIMEOUT, recv_batch(conn))
        .await
        .map_err(|_| Error::Timeout("no hello after the handshake".into()))??;
    match (hello.pop(), hello.is_empty()) {
        (Some(h), true) => Ok(h),
        _ => Err(Error::Unexpected("a hello must be one message".into())),
    }
}

/// Sends a batch on the control channel.
pub(crate) async fn send_batch<M: Serialize + Payloads>(
    conn: &Connection,
    msgs: Vec<M>,
) -> Result<()> {
    conn.send(CONTROL, encode_batch(msgs)).await?;
    Ok(())
}

/// Receives a batch from the control channel.
pub(crate) async fn recv_batch<M: DeserializeOwned + Payloads>(
    conn: &Connection,
) -> Result<Vec<M>> {
    let (channel, msg) = conn.recv().await?;
    if channel != CONTROL {
        return Err(Error::Unexpected(format!("a message on channel {channel}")));
    }
    Ok(decode_batch(msg)?)
}

/// How long a peer may take to answer a request of no bytes (see [`request`]).
pub(crate) const REPLY_BASE: std::time::Duration = std::time::Duration::from_secs(30);
/// The slowest rate at which a request's bytes may travel before it counts as unanswered
/// (8 MiB/s, on top of [`REPLY_BASE`]).
pub(crate) const REPLY_FLOOR_BYTES_PER_SEC: u64 = 8 << 20;

/// Sends `msgs` and receives the peer's answer, all within [`REPLY_BASE`] plus the time
/// `bytes` (what the request and its answer should carry) take at
/// [`REPLY_FLOOR_BYTES_PER_SEC`]: a peer that took the connection and never answers (or
/// stops reading) is treated as unreachable, not waited for forever. Its connection should
/// not be used again.
pub(crate) async fn request<Q, A>(conn: &Connection, msgs: Vec<Q>, bytes: u64) -> Result<Vec<A>>
where
    Q: Serialize + Payloads,
    A: DeserializeOwned + Payloads,
{
    let limit = REPLY_BASE
        + std::time::Duration::from_millis(bytes.saturating_mul(1000) / REPLY_FLOOR_BYTES_PER_SEC);
    let exchange = async {
        send_batch(conn, msgs).await?;
        recv_batch(conn).await
    };
    match tokio::time::timeout(limit, exchange).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(peer = %conn.peer_addr(), ?limit, bytes, "a peer did not answer in time");
            Err(Error::Timeout(format!(
                "{} did not answer within {limit:?}",
                conn.peer_addr()
            )))
        }
    }
}

/// Sends what arrives on `rx` to `conn`, coalescing batches that are already waiting into one
/// message. Ends when `rx` closes or the connection fails.
pub(crate) async fn writer<M: Serialize + Payloads>(
    conn: Arc<Connection>,
    rx: mpsc::UnboundedReceiver<Vec<M>>,
) {
    writer_counted(conn, rx, None).await
}

/// [`writer`], taking from `queued` what it takes from `rx` (the sender counts in with
/// [`Queued::add`]), so that the sender sees how much waits for a slow peer.
pub(crate) async fn writer_counted<M: Serialize + Payloads>(
    conn: Arc<Connection>,
    mut rx: mpsc::UnboundedReceiver<Vec<M>>,
    queued: Option<Arc<Queued>>,
) {
    while let Some(mut batch) = rx.recv().await {
        while let Ok(more) = rx.try_recv() {
            batch.extend(more);
        }
        if let Some(q) = &queued {
            q.take(&mut batch);
        }
        for part in split(batch, BATCH_FRAMES, BATCH_BYTES) {
            if let Err(e) = send_batch(&conn, part).await {
                // A message the transport refuses (one value past its 4 GiB), or a connection
                // that failed: close it, so that both sides take the ordinary disconnect path
                // rather than wait for what will never come.
                tracing::warn!(peer = %conn.peer_addr(), error = %e, "a send failed: closing the connection");
                let _ = tokio::time::timeout(CLOSE_LIMIT, conn.close()).await;
                return;
            }
        }
    }
}

/// How long the writer gives a connection to close after a failed send.
/// Messages and payload bytes handed to a writer and not yet taken by it.
#[derive(Debug, Default)]
pub(crate) struct Queued {
    messages: std::sync::atomic::AtomicUsize,
    bytes: std::sync::atomic::AtomicU64,
}

impl Queued {
    fn size<M: Payloads>(msgs: &mut [M]) -> (usize, u64) {
        let mut bytes = 0u64;
        for m in msgs.iter_mut() {
            m.payloads(&mut |p| bytes += p.len() as u64);
        }
        (msgs.len(), bytes)
    }

    /// Counts `msgs` in; returns what is queued now.
    pub(crate) fn add<M: Payloads>(&self, msgs: &mut [M]) -> (usize, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let (n, b) = Self::size(msgs);
        (
            self.messages.fetch_add(n, Relaxed) + n,
            self.bytes.fetch_add(b, Relaxed) + b,
        )
    }

    /// What is queued now: messages and payload bytes.
    pub(crate) fn now(&self) -> (usize, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.messages.load(Relaxed), self.bytes.load(Relaxed))
    }

    fn take<M: Payloads>(&self, msgs: &mut [M]) {
        use std::sync::atomic::Ordering::Relaxed;
        let (n, b) = Self::size(msgs);
        self.messages.fetch_sub(n, Relaxed);
        self.bytes.fetch_sub(b, Relaxed);
    }
}

/// The next connection on `listener` (named `what` in logs). An accept that fails for a reason
/// that may pass (out of descriptors or memory, say) is tried again after a wait, 10 ms doubled
/// on each failure in a row up to 1 s, rather than end the loop or spin on the error; only a
/// closed listener ends it. Out of descriptors, `full` is called first: when it freed some
/// (true), the next try comes after the shortest wait.
pub(crate) async fn accept(
    listener: &mut transport::Listener,
    what: &str,
    full: &mut (dyn FnMut() -> bool + Send),
) -> std::result::Result<Connection, transport::Error> {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(10);
    const LONGEST: std::time::Duration = std::time::Duration::from_secs(1);
    let mut backoff = FIRST;
    loop {
        match listener.accept().await {
            Ok(c) => return Ok(c),
            Err(e) if e.is_closed() => {
                tracing::warn!(error = %e, "{what}'s listener closed");
                return Err(e);
            }
            Err(e) => {
                if out_of_descriptors(&e) && full() {
                    backoff = FIRST;
                }
                tracing::warn!(error = %e, ?backoff, "{what}: accepting a connection failed, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(LONGEST);
            }
        }
    }
}

/// Whether `e` says the process (or the system) is out of file descriptors.
fn out_of_descriptors(e: &transport::Error) -> bool {
    matches!(e, transport::Error::Io(io)
        if matches!(io.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)))
}

const CLOSE_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);
/// The most frames of their own (payload frames of [`PACK_BELOW`] bytes or more, and one per
/// pack) and payload bytes one message takes from the writer's merged queue: well within the
/// transport's limits (65,536 frames, 4 GiB), which an unbounded merge would pass.
const BATCH_FRAMES: usize = 16_384;
const BATCH_BYTES: usize = 512 << 20;

/// Splits `msgs`, in order, into runs within `max_frames` and `max_bytes` (see [`BATCH_FRAMES`]);
/// a message past either alone goes alone (the transport then says whether it fits).
pub(crate) fn split<M: Payloads>(msgs: Vec<M>, max_frames: usize, max_bytes: usize) -> Vec<Vec<M>> {
    // A run's frames: its own frames, and the packs its small frames fill (each pack holds
    // at least PACK_FRAME - PACK_BELOW bytes before the next starts).
    let frames_of = |own: usize, small: usize| own + small.div_ceil(PACK_FRAME - PACK_BELOW);
    let mut out: Vec<Vec<M>> = Vec::new();
    let (mut own, mut small, mut bytes) = (0usize, 0usize, 0usize);
    for mut m in msgs {
        let (mut o, mut sm, mut b) = (0usize, 0usize, 0usize);
        m.payloads(&mut |p| {
            b += p.len();
            for fr in &p.frames {
                if fr.len() >= PACK_BELOW {
                    o += 1;
                } else {
                    sm += fr.len();
                }
            }
        });
        match out.last_mut() {
            Some(run) if frames_of(own + o, small + sm) <= max_frames && bytes + b <= max_bytes => {
                (own, small, bytes) = (own + o, small + sm, bytes + b);
                run.push(m);
            }
            _ => {
                (own, small, bytes) = (o, sm, b);
                out.push(vec![m]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{DataMsg, Payload};
    use dask_graph::{Key, Value};

    fn put(n: usize) -> DataMsg {
        let v = Value::new(bytes::Bytes::from(vec![7u8; n]));
        DataMsg::Put {
            values: vec![(Key::name_only("k"), Payload::from_value(&v).unwrap())],
        }
    }

    #[test]
    fn the_writer_splits_merged_batches_by_frames_and_bytes() {
        // Forty own frames in runs of at most sixteen; small ones hardly count.
        let runs = split((0..40).map(|_| put(PACK_BELOW)).collect(), 16, usize::MAX);
        assert_eq!(runs.iter().map(Vec::len).collect::<Vec<_>>(), [16, 16, 8]);
        let runs = split((0..10_000).map(|_| put(8)).collect(), 16, usize::MAX);
        assert_eq!(runs.len(), 1);
        // Bytes: three of 1 MiB under a 2.5 MiB budget; one past the budget goes alone.
        let runs = split((0..3).map(|_| put(1 << 20)).collect(), 100, 5 << 19);
        assert_eq!(runs.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1]);
        let runs = split(vec![put(8), put(4 << 20), put(8)], 100, 1 << 20);
        assert_eq!(runs.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1]);
        // Order kept, nothing lost.
        let runs = split((1..=50).map(put).collect(), 2, usize::MAX);
        assert_eq!(runs.iter().map(Vec::len).sum::<usize>(), 50);
    }
}
