//! Probing for tagged messages, receiving a probed message by its handle, and worker-level
//! receives of raw tags from any sender.

use std::fmt;
use std::sync::Arc;

use ucx_sys as sys;

use crate::buffer::IoBufMut;
use crate::error::{Error, Result};
use crate::ops::{self, Landing};
use crate::request::Posted;
use crate::worker::{Worker, WorkerShared};

/// What a receive or a probe reports about a tagged message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagInfo {
    /// Size of the message in bytes.
    pub length: usize,
    /// The raw UCP tag the sender used.
    pub sender_tag: u64,
}

/// The result of a probe that found a message.
#[derive(Debug)]
pub struct Probed {
    /// Size and sender tag of the message.
    pub info: TagInfo,
    /// With `remove = true`, the message itself, taken out of UCX's matching queue: receive it
    /// with [`ProbedMessage::recv`]. Dropping it unreceived discards the message.
    pub message: Option<ProbedMessage>,
}

/// A message removed from UCX's queue by a probe, waiting to be received exactly once.
pub struct ProbedMessage {
    handle: usize,
    info: TagInfo,
    worker: Arc<WorkerShared>,
}

impl fmt::Debug for ProbedMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProbedMessage")
            .field("info", &self.info)
            .finish()
    }
}

impl ProbedMessage {
    /// A message `ucp_tag_probe_nb` removed from `worker`'s queue (`handle`, not null).
    pub(crate) fn taken(handle: usize, info: TagInfo, worker: &Arc<WorkerShared>) -> Self {
        ProbedMessage {
            handle,
            info,
            worker: Arc::clone(worker),
        }
    }

    /// Size and sender tag of the message.
    pub fn info(&self) -> TagInfo {
        self.info
    }

    /// Receives the message into `buf`. A buffer smaller than the message gets
    /// [`Error::Truncated`] (and the message is discarded). This works even after the sender's
    /// endpoint closed: the message had already arrived.
    ///
    /// A device buffer needs a UCX with CUDA transports here ([`Error::Cuda`] otherwise, and
    /// the message is discarded); staged device receives go through [`Endpoint::recv`].
    ///
    /// [`Endpoint::recv`]: crate::Endpoint::recv
    pub async fn recv<B: IoBufMut>(mut self, mut buf: B) -> (Result<usize>, B) {
        #[cfg(feature = "cuda")]
        if let Err(e) = crate::cuda::require_zero_copy(&self.worker, &buf) {
            return (Err(e), buf);
        }
        // Taken only once the future runs: a future dropped unpolled drops `self`, whose Drop
        // discards the message, so it is never leaked inside UCX.
        let handle = std::mem::replace(&mut self.handle, 0);
        let cap = buf.bytes_total();
        let fits = self.info.length <= cap;
        let posted = {
            let locked = self.worker.lock();
            // SAFETY: the handle came from a removing probe on this worker and is received
            // exactly once (taken out of `self` above); the buffer goes to `complete` below.
            // A buffer that is too small receives 0 bytes, which discards the message.
            unsafe { ops::msg_recv(&locked, handle, &mut buf, if fits { cap } else { 0 }) }
        };
        let (mut c, mut buf) = ops::complete(&self.worker, posted, buf, true).await;
        if !fits {
            return (
                Err(Error::Truncated {
                    message: self.info.length,
                    buffer: cap,
                }),
                buf,
            );
        }
        // ucp_tag_msg_recv_nbx does not report the length of an immediate completion; the
        // probe already told it.
        c.length = self.info.length;
        let r = ops::filled(&c, &mut buf, cap, None);
        (r, buf)
    }
}

impl Drop for ProbedMessage {
    fn drop(&mut self) {
        if self.handle == 0 {
            return;
        }
        // Unreceived: receive it into nothing, which releases it inside UCX.
        let mut empty: Vec<u8> = Vec::new();
        let posted = {
            let locked = self.worker.lock();
            // SAFETY: the handle is unreceived (non-zero) and received here exactly once; the
            // empty buffer is parked in the operation below until it completes.
            unsafe { ops::msg_recv(&locked, self.handle, &mut empty, 0) }
        };
        if let Posted::Pending(op) = posted {
            op.park(Box::new(empty));
        }
    }
}

/// Probes the worker's unexpected queue for a message matching `tag` under `mask`.
pub(crate) fn probe_raw(
    worker: &Arc<WorkerShared>,
    tag: u64,
    mask: u64,
    remove: bool,
) -> Option<Probed> {
    let mut locked = worker.lock();
    locked.progress();
    let mut info = sys::ucp_tag_recv_info_t::default();
    // SAFETY: the worker is locked; info is a valid out-pointer.
    let msg =
        unsafe { sys::ucp_tag_probe_nb(locked.handle(), tag, mask, i32::from(remove), &mut info) };
    if msg.is_null() {
        return None;
    }
    let info = TagInfo {
        length: info.length,
        sender_tag: info.sender_tag,
    };
    Some(Probed {
        info,
        message: remove.then(|| ProbedMessage::taken(msg as usize, info, worker)),
    })
}

impl Worker {
    /// Receives one message whose raw tag matches `tag` under `mask`, from any sender (for
    /// peers connected by worker address, or forced tags). Returns the size and sender tag.
    /// Dropping the future cancels the receive; the buffer is freed only after UCX lets go.
    pub async fn tag_recv<B: IoBufMut>(&self, buf: B, tag: u64, mask: u64) -> (Result<TagInfo>, B) {
        let mut landing = match Landing::new(&self.shared, buf) {
            Ok(l) => l,
            Err((e, buf)) => return (Err(e), buf),
        };
        let cap = landing.bytes_total();
        let posted = {
            let locked = self.shared.lock();
            // SAFETY: the landing goes to `complete` right below.
            unsafe { ops::tag_recv(&locked, &mut landing, tag, mask) }
        };
        let (c, mut landing) = ops::complete(&self.shared, posted, landing, true).await;
        let r = ops::filled(&c, &mut landing, cap, None).map(|_| TagInfo {
            length: c.length,
            sender_tag: c.sender_tag,
        });
        landing.land(r)
    }

    /// Probes for a message whose raw tag matches `tag` under `mask` (non-blocking).
    pub fn tag_probe(&self, tag: u64, mask: u64, remove: bool) -> Option<Probed> {
        probe_raw(&self.shared, tag, mask, remove)
    }
}
