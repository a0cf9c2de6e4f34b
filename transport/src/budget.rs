//! The process's budget for receive memory that peers have announced but not yet sent.
//!
//! A `ucx://` frame is received in one piece (a rendezvous transfer lands in the buffer posted
//! for it), so its whole buffer must exist before the first byte arrives. Before posting the
//! frames of a message, a connection takes the message's bytes from this budget, and gives
//! them back once the frames have arrived; when the budget is spent, the receive waits (and
//! the peer's rendezvous sends with it): backpressure on that connection, never an allocation.
//! A message larger than the whole budget waits for all of it and then runs alone. Messages
//! that fit in the first UCX message ([`crate::UCX_FIRST_MAX`]) and device frames do not
//! count.
//!
//! `tcp://` needs no budget: its buffers grow as bytes arrive, so a peer costs what it sent.
//!
//! ```
//! // Before the first connection (later calls are refused):
//! transport::set_receive_budget(512 << 20).unwrap();
//! assert_eq!(transport::receive_budget(), 512 << 20);
//! assert!(transport::set_receive_budget(1 << 30).is_err());
//! ```

use std::sync::{Arc, OnceLock};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget unless [`set_receive_budget`] says otherwise: 2 GiB.
pub const DEFAULT_RECEIVE_BUDGET: u64 = 2 << 30;

/// The budget is counted in units of this many bytes (the semaphore counts `u32` at a time).
const UNIT: u64 = 1 << 10;

/// The bytes of the process-wide transport's budget ([`crate::Transport::global`]), fixed by
/// [`set_receive_budget`] or at first use.
static GLOBAL_BYTES: OnceLock<u64> = OnceLock::new();

/// [`set_receive_budget`] was called after the budget was in use (or set already).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the receive budget is already {current} bytes: set it before the first connection")]
pub struct BudgetInUse {
    /// The budget in force.
    pub current: u64,
}

fn rounded(bytes: u64) -> u64 {
    bytes.div_ceil(UNIT).clamp(1, Semaphore::MAX_PERMITS as u64) * UNIT
}

/// The bytes the process-wide transport's budget has (or will have).
pub(crate) fn global_bytes() -> u64 {
    *GLOBAL_BYTES.get_or_init(|| rounded(DEFAULT_RECEIVE_BUDGET))
}

/// Sets the process-wide transport's receive budget in bytes (rounded up to KiB); only before
/// it is first used. A [`crate::Transport`] made with [`crate::Transport::new`] has its own.
pub fn set_receive_budget(bytes: u64) -> Result<(), BudgetInUse> {
    let mut fresh = Some(rounded(bytes));
    let got = *GLOBAL_BYTES.get_or_init(|| fresh.take().unwrap_or_else(|| rounded(bytes)));
    match fresh {
        None => Ok(()),
        Some(_) => Err(BudgetInUse { current: got }),
    }
}

/// The process-wide transport's receive budget in bytes.
pub fn receive_budget() -> u64 {
    global_bytes()
}

/// A receive budget: a transport's connections take from it before posting a message's
/// receives, and give back once the frames have arrived.
#[derive(Debug)]
pub(crate) struct Budget {
    bytes: u64,
    sem: Arc<Semaphore>,
}

impl Budget {
    /// A budget of `bytes` (rounded up to KiB).
    pub(crate) fn new(bytes: u64) -> Budget {
        let bytes = rounded(bytes);
        Budget {
            bytes,
            sem: Arc::new(Semaphore::new((bytes / UNIT) as usize)),
        }
    }

    /// Its size in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes `bytes` (at most the whole budget), waiting until they are free.
    pub(crate) async fn reserve(&self, bytes: u64) -> Reserved {
        if bytes == 0 {
            return Reserved(None);
        }
        let units = bytes.min(self.bytes).div_ceil(UNIT);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        if self.sem.available_permits() < units as usize {
            tracing::debug!(bytes, "receive budget spent: this receive waits");
        }
        // The semaphore is never closed, so acquiring only waits.
        Reserved(Arc::clone(&self.sem).acquire_many_owned(units).await.ok())
    }
}

/// Bytes taken from a budget; given back when dropped.
#[derive(Debug)]
pub(crate) struct Reserved(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_spent_budget_makes_receives_wait() {
        let budget = Arc::new(Budget::new(4 << 20));
        let all = budget.reserve(u64::MAX).await; // more than the budget: takes all of it
        let b = Arc::clone(&budget);
        let waiting = tokio::spawn(async move { b.reserve(1 << 20).await });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "{} bytes are all taken",
            budget.bytes()
        );
        drop(all);
        let _got = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("given back")
            .unwrap();
    }
}
