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

/// How long a worker that lost its scheduler connection waits for the messages still on
/// their way in.
pub(super) const LAST_WORD: Duration = Duration::from_secs(1);

/// How often a worker with a [`WorkerOptions::parent`](super::WorkerOptions::parent) checks that its parent lives.
pub(super) const PARENT_CHECK: Duration = Duration::from_millis(250);

/// A worker process's exit code when the scheduler removed it (it was silent past the
/// heartbeat timeout: stopped, swapping, partitioned): its supervisor (`LocalCluster`, the
/// nanny, a launcher's rank) starts it again.
pub const EXIT_REMOVED: i32 = 76;
/// A worker process's exit code when it lost its scheduler (silent past the scheduler
/// timeout, or its connection failed): not restarted, there is nothing to join.
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
