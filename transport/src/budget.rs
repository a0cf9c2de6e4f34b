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

use std::sync::OnceLock;

use tokio::sync::{Semaphore, SemaphorePermit};

/// The budget unless [`set_receive_budget`] says otherwise: 2 GiB.
pub const DEFAULT_RECEIVE_BUDGET: u64 = 2 << 30;

/// The budget is counted in units of this many bytes (the semaphore counts `u32` at a time).
const UNIT: u64 = 1 << 10;

static BUDGET: OnceLock<(u64, Semaphore)> = OnceLock::new();

/// [`set_receive_budget`] was called after the budget was in use (or set already).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the receive budget is already {current} bytes: set it before the first connection")]
pub struct BudgetInUse {
    /// The budget in force.
    pub current: u64,
}

fn budget() -> &'static (u64, Semaphore) {
    BUDGET.get_or_init(|| make(DEFAULT_RECEIVE_BUDGET))
}

fn make(bytes: u64) -> (u64, Semaphore) {
    let units = bytes.div_ceil(UNIT).clamp(1, Semaphore::MAX_PERMITS as u64);
    (units * UNIT, Semaphore::new(units as usize))
}

/// Sets the process's receive budget in bytes (rounded up to KiB); only before it is first
/// used.
pub fn set_receive_budget(bytes: u64) -> Result<(), BudgetInUse> {
    let mut fresh = Some(make(bytes));
    let got = BUDGET.get_or_init(|| fresh.take().unwrap_or_else(|| make(bytes)));
    match fresh {
        None => Ok(()),
        Some(_) => Err(BudgetInUse { current: got.0 }),
    }
}

/// The process's receive budget in bytes.
pub fn receive_budget() -> u64 {
    budget().0
}

/// Bytes taken from the budget; given back when dropped.
#[derive(Debug)]
pub(crate) struct Reserved(#[allow(dead_code)] Option<SemaphorePermit<'static>>);

/// Takes `bytes` (at most the whole budget) from the budget, waiting until they are free.
pub(crate) async fn reserve(bytes: u64) -> Reserved {
    if bytes == 0 {
        return Reserved(None);
    }
    let (total, sem) = budget();
    let units = bytes.min(*total).div_ceil(UNIT);
    let units = u32::try_from(units).unwrap_or(u32::MAX);
    let waited = sem.available_permits() < units as usize;
    if waited {
        tracing::debug!(bytes, "receive budget spent: this receive waits");
    }
    // The semaphore is never closed, so acquiring only waits.
    Reserved(sem.acquire_many(units).await.ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_spent_budget_makes_receives_wait() {
        let total = receive_budget();
        let all = reserve(u64::MAX).await; // more than the budget: takes all of it
        let waiting = tokio::spawn(reserve(1 << 20));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "{total} bytes are all taken");
        drop(all);
        let _got = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("given back")
            .unwrap();
    }
}
