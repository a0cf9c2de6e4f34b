//! A worker's side of liveness (see `docs/resilience.md`): how long it waits for word from its
//! scheduler, how it tells its own stall from the scheduler's silence, what it reads when its
//! connection ends, and the exit codes its supervisor acts on.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::protocol::ToWorker;

/// How long a worker or client waits for any word from the scheduler (heartbeats are
/// answered) before it takes the scheduler for lost.
pub const DEFAULT_SCHEDULER_TIMEOUT: Duration = Duration::from_secs(60);

/// The scheduler timeout from `DASK_COMM_SCHEDULER_TIMEOUT` (seconds, fractions allowed), or
/// [`DEFAULT_SCHEDULER_TIMEOUT`].
pub fn scheduler_timeout_from_env() -> Duration {
    std::env::var("DASK_COMM_SCHEDULER_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(DEFAULT_SCHEDULER_TIMEOUT)
}

/// Waits up to [`LAST_WORD`] for messages the scheduler sent before the connection ended:
/// `Some` when one of them was a removal or a close.
pub(super) async fn last_word(
    rx: &mut mpsc::UnboundedReceiver<Result<Vec<ToWorker>>>,
) -> Option<Result<()>> {
    let deadline = tokio::time::Instant::now() + LAST_WORD;
    while let Ok(Some(Ok(msgs))) = tokio::time::timeout_at(deadline, rx.recv()).await {
        for m in msgs {
            match m {
                ToWorker::Removed { reason } => {
                    tracing::error!(%reason, "the scheduler removed this worker: it exits to be started afresh");
                    return Some(Err(Error::Removed(reason)));
                }
                ToWorker::Close => return Some(Ok(())),
                _ => {}
            }
        }
    }
    None
}

/// A heartbeat tick this much later than due (or four periods, if more) means the process was
/// stopped: silence is counted afresh.
pub(crate) const STALLED: Duration = Duration::from_secs(1);

/// The next delivery of `signal`, or never when there is none.
pub(super) async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// What a worker whose scheduler connection failed makes of it: whether the scheduler may
/// live (this worker was cut off on its side: out of descriptors, its transport broken) or
/// is gone. The probe is a plain TCP connection to the scheduler's port (`ucx://` and
/// `tls://` listen on TCP too), which the scheduler's kernel answers whatever state this
/// process's transport is in: refused (nothing listens: the scheduler is gone) or timed out
/// (the host or the network is gone) means gone; connected means it lives; any other error
/// is this side's (no descriptor to connect with), and the scheduler may live.
pub(super) async fn scheduler_may_live(address: &transport::Address) -> bool {
    let (host, port) = match address {
        transport::Address::Tcp { host, port }
        | transport::Address::Tls { host, port }
        | transport::Address::Ucx { host, port } => (host.clone(), *port),
        transport::Address::Inproc(_) => return false,
    };
    let probe = tokio::net::TcpStream::connect((host.as_str(), port));
    match tokio::time::timeout(PROBE_LIMIT, probe).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            tracing::info!(%address, "the scheduler's port refuses connections: it is gone");
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(%address, error = %e, "probing the scheduler failed on this side");
            true
        }
        Err(_) => {
            tracing::info!(%address, "the scheduler's port does not answer: it is gone");
            false
        }
    }
}

/// How long a probe of the scheduler ([`scheduler_may_live`]) waits.
pub(super) const PROBE_LIMIT: Duration = Duration::from_secs(3);

/// How long a worker that lost its scheduler connection waits for the messages still on
/// their way in.
pub(super) const LAST_WORD: Duration = Duration::from_secs(1);

/// How often a worker with a [`WorkerOptions::parent`](super::WorkerOptions::parent) checks that its parent lives.
pub(super) const PARENT_CHECK: Duration = Duration::from_millis(250);

/// A worker process's exit code when the scheduler removed it (it was silent past the
/// heartbeat timeout: stopped, swapping, partitioned), or its scheduler connection failed
/// while the scheduler still answers new ones (cut off on this side: out of descriptors, a
/// transport failure): its supervisor (`LocalCluster`, the nanny, a launcher's rank) starts
/// it again.
pub const EXIT_REMOVED: i32 = 76;
/// A worker process's exit code when it lost its scheduler (silent past the scheduler
/// timeout, or its connection failed and a new one is not answered): not restarted, there
/// is nothing to join.
pub const EXIT_SCHEDULER_LOST: i32 = 77;

/// The exit code for a worker that ended with `r`.
pub fn exit_code(r: &Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(Error::Removed(_)) => EXIT_REMOVED,
        Err(Error::Disconnected(_)) => EXIT_SCHEDULER_LOST,
        Err(_) => 1,
    }
}
