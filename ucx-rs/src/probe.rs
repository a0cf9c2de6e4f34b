//! Probing for tagged messages, receiving a probed message by its handle, and worker-level
//! receives of raw tags from any sender.

use std::fmt;
use std::sync::Arc;

use ucx_sys as sys;

use crate::buffer::IoBufMut;
use crate::error::{Error, Result, Status};
use crate::request::{post, CbKind, Completion, InFlight, Posted};
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
        let posted = post_msg_recv(&self.worker, handle, &mut buf, if fits { cap } else { 0 });
        let (c, mut buf) = complete(&self.worker, posted, buf).await;
        if !fits {
            return (
                Err(Error::Truncated {
                    message: self.info.length,
                    buffer: cap,
                }),
                buf,
            );
        }
        if c.status != sys::UCS_OK {
            return (Err(Error::Ucx(Status(c.status))), buf);
        }
        // SAFETY: UCX wrote the whole message (length <= capacity) from the start.
        unsafe { buf.set_init(self.info.length) };
        (Ok(self.info.length), buf)
    }
}

impl Drop for ProbedMessage {
    fn drop(&mut self) {
        if self.handle == 0 {
            return;
        }
        // Unreceived: receive it into nothing, which releases it inside UCX.
        let mut empty: Vec<u8> = Vec::new();
        let posted = post_msg_recv(&self.worker, self.handle, &mut empty, 0);
        if let Posted::Pending(op) = posted {
            op.park(Box::new(empty));
        }
    }
}

fn post_msg_recv<B: IoBufMut>(
    worker: &WorkerShared,
    handle: usize,
    buf: &mut B,
    cap: usize,
) -> Posted {
    let locked = worker.lock();
    let (ptr, mt) = (buf.stable_mut_ptr(), buf.memory_type());
    post(&locked, CbKind::TagRecv, Some(mt.to_ucs()), |param, imm| {
        imm.for_tag(param);
        // SAFETY: `handle` came from ucp_tag_probe_nb(remove=1) on this worker and is received
        // exactly once (ProbedMessage gives it up when receiving); the buffer has `cap`
        // writable bytes and stays alive until completion.
        unsafe {
            sys::ucp_tag_msg_recv_nbx(
                locked.handle(),
                ptr.cast(),
                cap,
                handle as sys::ucp_tag_message_h,
                param,
            )
        }
    })
}

async fn complete<B: Send + 'static>(
    worker: &WorkerShared,
    posted: Posted,
    buf: B,
) -> (Completion, B) {
    match posted {
        Posted::Done(c) => (c, buf),
        Posted::Pending(op) => InFlight::new(op, buf, worker, true).finish().await,
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
        message: remove.then(|| ProbedMessage {
            handle: msg as usize,
            info,
            worker: Arc::clone(worker),
        }),
    })
}

impl Worker {
    /// Receives one message whose raw tag matches `tag` under `mask`, from any sender (for
    /// peers connected by worker address, or forced tags). Returns the size and sender tag.
    /// Dropping the future cancels the receive; the buffer is freed only after UCX lets go.
    pub async fn tag_recv<B: IoBufMut>(&self, buf: B, tag: u64, mask: u64) -> (Result<TagInfo>, B) {
        #[cfg(feature = "cuda")]
        match crate::cuda::stage_recv(&self.shared, &buf) {
            Err(e) => return (Err(e), buf),
            Ok(Some(pinned)) => {
                let (r, pinned) = self.tag_recv_raw(pinned, tag, mask).await;
                return match r {
                    Ok(info) => {
                        let (n, buf) = crate::endpoint::unstaged(Ok(info.length), buf, &pinned);
                        (n.map(|_| info), buf)
                    }
                    Err(e) => (Err(e), buf),
                };
            }
            Ok(None) => {}
        }
        self.tag_recv_raw(buf, tag, mask).await
    }

    async fn tag_recv_raw<B: IoBufMut>(
        &self,
        mut buf: B,
        tag: u64,
        mask: u64,
    ) -> (Result<TagInfo>, B) {
        let cap = buf.bytes_total();
        let posted = {
            let locked = self.shared.lock();
            let (ptr, mt) = (buf.stable_mut_ptr(), buf.memory_type());
            post(&locked, CbKind::TagRecv, Some(mt.to_ucs()), |param, imm| {
                imm.for_tag(param);
                // SAFETY: the worker is locked; the buffer has `cap` writable bytes until the
                // operation completes (owned by InFlight or parked in the op).
                unsafe { sys::ucp_tag_recv_nbx(locked.handle(), ptr.cast(), cap, tag, mask, param) }
            })
        };
        let (c, mut buf) = complete(&self.shared, posted, buf).await;
        let r = match c.status {
            sys::UCS_OK => {
                // SAFETY: UCX wrote c.length <= cap bytes from the start of the buffer.
                unsafe { buf.set_init(c.length.min(cap)) };
                Ok(TagInfo {
                    length: c.length,
                    sender_tag: c.sender_tag,
                })
            }
            sys::UCS_ERR_MESSAGE_TRUNCATED => Err(Error::Truncated {
                message: c.length,
                buffer: cap,
            }),
            sys::UCS_ERR_CANCELED => Err(Error::Canceled),
            st => Err(Error::Ucx(Status(st))),
        };
        (r, buf)
    }

    /// Probes for a message whose raw tag matches `tag` under `mask` (non-blocking).
    pub fn tag_probe(&self, tag: u64, mask: u64, remove: bool) -> Option<Probed> {
        probe_raw(&self.shared, tag, mask, remove)
    }
}
