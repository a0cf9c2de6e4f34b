//! Posting helpers, one per kind of UCX receive, shared by endpoints, probed messages and
//! worker-level receives; [`complete`], the one way to wait for a posted operation; and
//! [`Landing`], the one place where a receive into a device buffer is staged through pinned
//! host memory.
//!
//! Sends are posted by the endpoint (`EpShared::post_live`), the one place that knows whether
//! the endpoint can still carry them.

use ucx_sys as sys;

use crate::buffer::{IoBuf, IoBufMut, MemoryType};
use crate::error::{Result, Status};
use crate::request::{post, CbKind, Complete, Completion, InFlight, Posted};
use crate::worker::{Locked, WorkerShared};

/// Waits for a posted operation and gives `buf` back with how it ended. Until then `buf` is
/// owned by an [`InFlight`] guard: a future dropped mid-flight parks it (and, with `cancel`,
/// cancels the operation) until UCX lets go of it.
pub(crate) fn complete<B: Send + 'static>(
    worker: &WorkerShared,
    posted: Posted,
    buf: B,
    cancel: bool,
) -> Complete<'_, B> {
    match posted {
        Posted::Done(c) => Complete::Done(Some((c, buf))),
        Posted::Pending(op) => {
            Complete::InFlight(InFlight::new(op, buf, worker, cancel), Default::default())
        }
    }
}

/// A finished receive of at most `cap` bytes into `buf`: maps its status (see
/// [`crate::error::received`]) and records how many bytes `buf` now holds.
pub(crate) fn filled<B: IoBufMut + ?Sized>(
    c: &Completion,
    buf: &mut B,
    cap: usize,
    ended_by: Option<Status>,
) -> Result<usize> {
    let n = crate::error::received(c.status, c.length, cap, ended_by)?;
    // SAFETY: UCX reported writing n <= capacity bytes from the start of the buffer.
    unsafe { buf.set_init(n) };
    Ok(n)
}

/// Posts `ucp_tag_recv_nbx` into the whole capacity of `buf`, for tags matching `tag` under
/// `mask`.
///
/// # Safety
/// `buf` must stay alive, and its memory in place, until the operation completes: pass it to
/// [`complete`] (or park it in the operation) right after.
pub(crate) unsafe fn tag_recv<B: IoBufMut + ?Sized>(
    locked: &Locked<'_>,
    buf: &mut B,
    tag: u64,
    mask: u64,
) -> Posted {
    let (ptr, cap, mt) = (buf.stable_mut_ptr(), buf.bytes_total(), buf.memory_type());
    post(locked, CbKind::TagRecv, Some(mt.to_ucs()), |param, imm| {
        imm.for_tag(param);
        // SAFETY: the worker is locked; the buffer has `cap` writable bytes until completion
        // (this function's contract).
        unsafe { sys::ucp_tag_recv_nbx(locked.handle(), ptr.cast(), cap, tag, mask, param) }
    })
}

/// Posts `ucp_tag_msg_recv_nbx` of a probed message into the first `cap` bytes of `buf` (0
/// discards the message).
///
/// # Safety
/// `handle` must come from `ucp_tag_probe_nb` with `remove` on this worker and be received
/// exactly once; `cap <= buf.bytes_total()`; and `buf` as for [`tag_recv`].
pub(crate) unsafe fn msg_recv<B: IoBufMut + ?Sized>(
    locked: &Locked<'_>,
    handle: usize,
    buf: &mut B,
    cap: usize,
) -> Posted {
    let (ptr, mt) = (buf.stable_mut_ptr(), buf.memory_type());
    post(locked, CbKind::TagRecv, Some(mt.to_ucs()), |param, imm| {
        imm.for_tag(param);
        // SAFETY: the handle is a probed message received once, the buffer has `cap` writable
        // bytes until completion (this function's contract); the worker is locked.
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

/// Posts `ucp_stream_recv_nbx` for exactly `buf.bytes_total()` bytes from `ep`'s stream.
///
/// # Safety
/// `ep` must be a live endpoint of the locked worker; `buf` as for [`tag_recv`].
pub(crate) unsafe fn stream_recv<B: IoBufMut + ?Sized>(
    locked: &Locked<'_>,
    ep: sys::ucp_ep_h,
    buf: &mut B,
) -> Posted {
    let (ptr, cap, mt) = (buf.stable_mut_ptr(), buf.bytes_total(), buf.memory_type());
    post(
        locked,
        CbKind::StreamRecv,
        Some(mt.to_ucs()),
        |param, imm| {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = sys::UCP_STREAM_RECV_FLAG_WAITALL;
            // SAFETY: ep is live under the lock; the buffer has `cap` writable bytes until
            // completion; the length out-pointer is valid for the call.
            unsafe { sys::ucp_stream_recv_nbx(ep, ptr.cast(), cap, imm.stream_length(), param) }
        },
    )
}

/// Posts `ucp_am_recv_data_nbx`: receives the rendezvous active message behind `desc`
/// (`length` bytes) into `buf`.
///
/// # Safety
/// `desc` must be a descriptor the AM handler kept (taken out of the queue, received once);
/// `buf` must have at least `length` writable bytes, and stay as for [`tag_recv`].
pub(crate) unsafe fn am_recv_data<B: IoBufMut + ?Sized>(
    locked: &Locked<'_>,
    desc: usize,
    buf: &mut B,
    length: usize,
) -> Posted {
    let (ptr, mt) = (buf.stable_mut_ptr(), buf.memory_type());
    post(locked, CbKind::AmRecv, Some(mt.to_ucs()), |param, imm| {
        param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_RECV_INFO;
        param.recv_info.length = imm.stream_length();
        // SAFETY: this function's contract: a kept descriptor, received once, into a buffer
        // with `length` writable bytes until completion; the worker is locked.
        unsafe {
            sys::ucp_am_recv_data_nbx(
                locked.handle(),
                desc as *mut std::ffi::c_void,
                ptr.cast(),
                length,
                param,
            )
        }
    })
}

/// Where a receive lands: the caller's buffer, or, for a device buffer whose messages are
/// staged (feature `cuda`, see [`crate::cuda`]), pinned host memory that [`Landing::land`]
/// copies to the device afterwards.
pub(crate) enum Landing<B> {
    /// UCX writes into the caller's buffer.
    Direct(B),
    /// UCX writes into pinned memory standing in for the device buffer.
    #[cfg(feature = "cuda")]
    Staged {
        pinned: crate::cuda::Pinned,
        device: B,
    },
}

impl<B: IoBufMut> Landing<B> {
    /// Prepares a receive into `buf`: a device buffer's stream is synchronised first, and a
    /// staged one gets pinned memory of its capacity. On error, `buf` comes back.
    pub(crate) fn new(worker: &WorkerShared, buf: B) -> Result<Self, (crate::Error, B)> {
        #[cfg(feature = "cuda")]
        match crate::cuda::stage_recv(worker, &buf) {
            Err(e) => return Err((e, buf)),
            Ok(Some(pinned)) => {
                return Ok(Landing::Staged {
                    pinned,
                    device: buf,
                })
            }
            Ok(None) => {}
        }
        let _ = worker;
        Ok(Landing::Direct(buf))
    }

    /// After the receive ended with `r`: a staged receive that succeeded is copied to the
    /// device. Gives the caller's buffer back.
    pub(crate) fn land<T>(self, r: Result<T>) -> (Result<T>, B) {
        match self {
            Landing::Direct(buf) => (r, buf),
            #[cfg(feature = "cuda")]
            Landing::Staged { pinned, mut device } => {
                let r =
                    r.and_then(|v| crate::cuda::unstage(&mut device, pinned.filled()).map(|()| v));
                (r, device)
            }
        }
    }
}

impl<B: IoBufMut> Landing<B> {
    /// The buffer UCX writes into.
    fn target(&self) -> &dyn IoBufMut {
        match self {
            Landing::Direct(b) => b,
            #[cfg(feature = "cuda")]
            Landing::Staged { pinned, .. } => pinned,
        }
    }

    fn target_mut(&mut self) -> &mut dyn IoBufMut {
        match self {
            Landing::Direct(b) => b,
            #[cfg(feature = "cuda")]
            Landing::Staged { pinned, .. } => pinned,
        }
    }
}

// SAFETY: delegates to the buffer UCX writes into (the caller's, or the pinned block), which
// meets the contract itself; moving the enum does not move that memory.
unsafe impl<B: IoBufMut> IoBuf for Landing<B> {
    fn stable_ptr(&self) -> *const u8 {
        self.target().stable_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.target().bytes_init()
    }
    fn memory_type(&self) -> MemoryType {
        self.target().memory_type()
    }
    #[cfg(feature = "cuda")]
    fn cuda_stream(&self) -> Option<&std::sync::Arc<cudarc::driver::CudaStream>> {
        self.target().cuda_stream()
    }
}

// SAFETY: as above.
unsafe impl<B: IoBufMut> IoBufMut for Landing<B> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.target_mut().stable_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.target().bytes_total()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: forwarded with the caller's guarantee.
        unsafe { self.target_mut().set_init(n) }
    }
}
