//! Active messages: `am_send` on an endpoint, `am_recv` where the receiver allocates.
//!
//! One UCP AM handler per worker queues arriving messages by the endpoint they came from
//! (senders set `UCP_AM_SEND_FLAG_REPLY`, so UCX names the receiving side's endpoint). Eager
//! data is copied out in the handler; a rendezvous message is kept as UCX's descriptor until
//! `am_recv` allocates its buffer and calls `ucp_am_recv_data_nbx`. Descriptors nobody will
//! receive (their endpoint closed) are released with `ucp_am_data_release`.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Arc;

use ucx_sys as sys;

use crate::buffer::{IoBuf, IoBufMut, MemoryType};
use crate::endpoint::{EpShared, DEFAULT_MAX_MESSAGE};
use crate::error::{check, Error, Result};
use crate::ops::{self, Landing};
use crate::worker::{Locked, WorkerShared};
use crate::Endpoint;

/// The AM id this crate sends and handles.
pub const AM_ID: u32 = 0;

/// Allocates receive buffers for active messages of one memory type (see
/// [`Worker::set_am_allocator`](crate::Worker::set_am_allocator)).
pub trait AmAllocator: Send + Sync {
    /// A buffer with at least `len` writable bytes (`bytes_total() >= len`).
    fn allocate(&self, len: usize) -> Result<Box<dyn IoBufMut>>;
}

/// The default allocator: host memory (`Vec<u8>`).
#[derive(Debug, Default, Clone, Copy)]
pub struct HostAllocator;

impl AmAllocator for HostAllocator {
    fn allocate(&self, len: usize) -> Result<Box<dyn IoBufMut>> {
        Ok(Box::new(alloc_host(len)?))
    }
}

/// An active message received with [`Endpoint::am_recv_buf`](crate::Endpoint::am_recv_buf).
pub struct AmBuffer {
    /// The memory type the sender's buffer had.
    pub sender_memory: MemoryType,
    /// The data: from the allocator registered for `sender_memory` (rendezvous messages, which
    /// UCX writes straight into it, or staged for device memory), or a host `Vec` (eager
    /// messages, which UCX delivers in host memory; with the `cuda` feature, eager messages
    /// from device buffers are copied into a device allocator's buffer when one is set).
    pub buffer: Box<dyn IoBufMut>,
    /// Message size in bytes.
    pub len: usize,
}

impl std::fmt::Debug for AmBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmBuffer")
            .field("sender_memory", &self.sender_memory)
            .field("buffer_memory", &self.buffer.memory_type())
            .field("len", &self.len)
            .finish()
    }
}

/// Length of UCXX 0.52's active-message header: the sender's `ucs_memory_type_t` (u32,
/// native-endian) and then, all zero for a plain message, "no receiver callback", the default
/// allocation policy and an empty user header. Observed on the wire from `ucxx-cu12` 0.52 (14
/// bytes for host memory); earlier UCXX versions read only the first 5 bytes (memory type and
/// the callback flag), so the same bytes suit them too.
pub const HEADER_LEN: usize = 14;

/// Header bytes for each memory type, static so they outlive every send (UCX 1.13 has no
/// `UCP_AM_SEND_FLAG_COPY_HEADER`).
pub(crate) static HEADERS: [[u8; HEADER_LEN]; 2] = [header(0), header(1)];

const fn header(memory_type: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    let t = memory_type.to_ne_bytes();
    h[0] = t[0];
    h[1] = t[1];
    h[2] = t[2];
    h[3] = t[3];
    h
}

/// The sender's memory type from an active-message header: UCXX's (and ours) start with a
/// native-endian u32 `ucs_memory_type_t`; a 1-byte header (older ucx-rs) is that type's value.
/// Anything else, or an unknown type, is host memory.
///
/// ```
/// use ucx::{am::header_memory_type, MemoryType};
/// assert_eq!(header_memory_type(&[1, 0, 0, 0, 0]), MemoryType::Cuda);
/// assert_eq!(header_memory_type(b"anything else"), MemoryType::Host);
/// ```
pub fn header_memory_type(header: &[u8]) -> MemoryType {
    let t = match header {
        [b] => u32::from(*b),
        [a, b, c, d, ..] => u32::from_ne_bytes([*a, *b, *c, *d]),
        _ => 0,
    };
    if t == sys::UCS_MEMORY_TYPE_CUDA {
        MemoryType::Cuda
    } else {
        MemoryType::Host
    }
}

/// A message waiting in the worker's queue.
pub(crate) struct AmMessage {
    /// The receiving side's `ucp_ep_h` for the sender (0 when the sender asked no reply).
    pub ep: usize,
    /// The sender's memory type, from the header.
    pub mem: MemoryType,
    pub body: AmBody,
}

pub(crate) enum AmBody {
    /// Eager data, already copied.
    Data(Vec<u8>),
    /// A rendezvous descriptor for `length` bytes, to receive with `ucp_am_recv_data_nbx`.
    Rndv { desc: usize, length: usize },
}

/// The worker's queue of arrived active messages.
#[derive(Default)]
pub(crate) struct AmQueue {
    messages: VecDeque<AmMessage>,
}

impl AmQueue {
    /// Takes the oldest message that came through endpoint `ep`.
    pub(crate) fn take(&mut self, ep: usize) -> Option<AmMessage> {
        let i = self.messages.iter().position(|m| m.ep == ep)?;
        self.messages.remove(i)
    }

    /// Releases what endpoint `ep` left behind (rendezvous descriptors go back to UCX).
    pub(crate) fn drop_for(&mut self, ep: usize, locked: &Locked<'_>) {
        self.messages.retain(|m| {
            if m.ep != ep {
                return true;
            }
            if let AmBody::Rndv { desc, .. } = m.body {
                // SAFETY: the descriptor came from the AM handler (returned UCS_INPROGRESS)
                // and is released exactly once, here, with the worker locked.
                unsafe { sys::ucp_am_data_release(locked.handle(), desc as *mut c_void) };
            }
            false
        });
    }
}

/// Registers the crate's AM handler on a freshly created worker.
pub(crate) fn register(worker: &Arc<WorkerShared>) -> Result<()> {
    set_handler(worker, AM_ID, am_recv_cb)
}

/// An AM handler as UCX calls it.
pub(crate) type AmCallback = unsafe extern "C" fn(
    *mut c_void,
    *const c_void,
    usize,
    *mut c_void,
    usize,
    *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t;

/// Registers `cb` for whole messages of AM id `id`; its first argument is `worker`'s
/// `WorkerShared`.
pub(crate) fn set_handler(worker: &Arc<WorkerShared>, id: u32, cb: AmCallback) -> Result<()> {
    let locked = worker.lock();
    let param = sys::ucp_am_handler_param_t {
        field_mask: (sys::UCP_AM_HANDLER_PARAM_FIELD_ID
            | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
            | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG
            | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS) as u64,
        id,
        flags: sys::UCP_AM_FLAG_WHOLE_MSG,
        cb: Some(cb),
        arg: Arc::as_ptr(worker) as *mut c_void,
    };
    // SAFETY: the worker is alive and locked; `arg` points to the WorkerShared that owns this
    // worker, so it is valid whenever UCX calls the handler (only inside calls on the worker).
    check(unsafe { sys::ucp_worker_set_am_recv_handler(locked.handle(), &param) })
}

unsafe extern "C" fn am_recv_cb(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the WorkerShared this handler was registered for (see `register`).
    let worker = unsafe { &*(arg as *const WorkerShared) };
    // SAFETY: UCX passes a valid parameter record for the duration of the call.
    let param = unsafe { &*param };
    let rndv = param.recv_attr & u64::from(sys::UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    let body = if rndv {
        if length > DEFAULT_MAX_MESSAGE {
            tracing::warn!(length, "refusing an oversized active message");
            // The sender's am_send completes with this status.
            return sys::UCS_ERR_MESSAGE_TRUNCATED;
        }
        AmBody::Rndv {
            desc: data as usize,
            length,
        }
    } else if length == 0 || data.is_null() {
        AmBody::Data(Vec::new())
    } else {
        // SAFETY: for eager messages UCX passes `length` readable bytes at `data`, valid until
        // the callback returns; they are copied here.
        AmBody::Data(unsafe { std::slice::from_raw_parts(data as *const u8, length) }.to_vec())
    };
    let header: &[u8] = if header_length == 0 || header.is_null() {
        &[]
    } else {
        // SAFETY: UCX passes `header_length` readable header bytes, valid during the call.
        unsafe { std::slice::from_raw_parts(header as *const u8, header_length) }
    };
    tracing::trace!(?header, length, rndv, "active message");
    let mem = header_memory_type(header);
    worker.am_queue().push_back(AmMessage {
        ep: param.reply_ep as usize,
        mem,
        body,
    });
    if rndv {
        sys::UCS_INPROGRESS
    } else {
        sys::UCS_OK
    }
}

impl AmQueue {
    fn push_back(&mut self, m: AmMessage) {
        self.messages.push_back(m);
    }
}

/// An empty `Vec` with room for exactly `len` bytes, or [`Error::Alloc`].
pub(crate) fn alloc_host(len: usize) -> Result<Vec<u8>> {
    let mut v: Vec<u8> = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| Error::Alloc { bytes: len })?;
    crate::buffer::advise_huge_pages(&mut v);
    Ok(v)
}

impl EpShared {
    async fn am_send<B: IoBuf>(&self, buf: B) -> (Result<()>, B) {
        // UCXX's header: the sender's memory type, so the receiver can pick an allocator.
        let header: &'static [u8; HEADER_LEN] =
            &HEADERS[usize::from(buf.memory_type() == MemoryType::Cuda)];
        self.send_like(buf, sys::UCP_AM_SEND_FLAG_REPLY, move |ep, p, n, param| {
            let header = header.as_ptr();
            // SAFETY: see send_like; the header is static, valid for ever.
            unsafe {
                sys::ucp_am_send_nbx(ep, AM_ID, header.cast(), HEADER_LEN, p.cast(), n, param)
            }
        })
        .await
    }

    /// The next active message that came through this endpoint.
    async fn am_next(&self) -> Result<AmMessage> {
        self.wait_for(|_| {
            let ep = self.raw();
            (ep != 0).then(|| self.worker.am_queue().take(ep)).flatten()
        })
        .await
    }

    /// Receives a rendezvous active message into `buf` (which UCX writes directly, whatever
    /// its memory type, or through pinned memory for a staged device buffer), or releases the
    /// descriptor when `buf` is an error or too small.
    async fn am_recv_rndv<B: IoBufMut>(
        &self,
        desc: usize,
        length: usize,
        buf: Result<B>,
    ) -> Result<B> {
        let landing = buf.and_then(|b| {
            if b.bytes_total() < length {
                return Err(Error::Truncated {
                    message: length,
                    buffer: b.bytes_total(),
                });
            }
            Landing::new(&self.worker, b).map_err(|(e, _)| e)
        });
        let mut landing = match landing {
            Ok(l) => l,
            Err(e) => {
                let locked = self.worker.lock();
                // SAFETY: the descriptor came from the AM handler and was taken out of the
                // queue, so it is released exactly once.
                unsafe { sys::ucp_am_data_release(locked.handle(), desc as *mut c_void) };
                return Err(e);
            }
        };
        let posted = {
            let locked = self.worker.lock();
            // SAFETY: desc came from the AM handler (taken out of the queue, received once);
            // the landing has at least `length` writable bytes (checked above) and goes to
            // `complete` right below.
            unsafe { ops::am_recv_data(&locked, desc, &mut landing, length) }
        };
        let (mut c, mut landing) = self.complete(posted, landing, true).await;
        c.length = length;
        let r = self.received(&c, &mut landing, length);
        let (r, buf) = landing.land(r);
        r.map(|_| buf)
    }

    async fn am_recv(&self, max: usize) -> Result<Vec<u8>> {
        let msg = self.am_next().await?;
        let (desc, length) = match msg.body {
            AmBody::Data(v) => return Ok(v),
            AmBody::Rndv { desc, length } => (desc, length),
        };
        let buf = capped(length, max).and_then(|()| alloc_host(length));
        self.am_recv_rndv(desc, length, buf).await
    }

    async fn am_recv_buf(&self, max: usize) -> Result<AmBuffer> {
        let msg = self.am_next().await?;
        let (desc, length) = match msg.body {
            AmBody::Data(v) => {
                let len = v.len();
                #[cfg(feature = "cuda")]
                if msg.mem == MemoryType::Cuda {
                    // Eager data arrives in host memory; a device allocator still gets it.
                    let mut b = self.worker.am_allocator(msg.mem).allocate(len)?;
                    if b.cuda_stream().is_some() {
                        crate::cuda::unstage(&mut b, &v)?;
                        return Ok(AmBuffer {
                            sender_memory: msg.mem,
                            buffer: b,
                            len,
                        });
                    }
                }
                return Ok(AmBuffer {
                    sender_memory: msg.mem,
                    buffer: Box::new(v),
                    len,
                });
            }
            AmBody::Rndv { desc, length } => (desc, length),
        };
        let allocator = self.worker.am_allocator(msg.mem);
        let buf = capped(length, max).and_then(|()| allocator.allocate(length));
        let buffer = self.am_recv_rndv(desc, length, buf).await?;
        Ok(AmBuffer {
            sender_memory: msg.mem,
            buffer,
            len: length,
        })
    }
}

/// Refuses a rendezvous message over the receiver's limit.
fn capped(length: usize, max: usize) -> Result<()> {
    if length > max {
        return Err(Error::Truncated {
            message: length,
            buffer: max,
        });
    }
    Ok(())
}

/// Active messages.
impl Endpoint {
    /// Sends `buf` as one active message. The receiver allocates ([`am_recv`](Self::am_recv));
    /// small messages go eagerly, large ones by rendezvous.
    pub async fn am_send<B: IoBuf>(&self, buf: B) -> (Result<()>, B) {
        self.shared.am_send(buf).await
    }

    /// Receives the next active message sent through this connection, allocating exactly its
    /// size (rendezvous messages over [`max_message`](Self::set_max_message) are refused).
    /// Messages that arrived before the peer failed are still delivered.
    pub async fn am_recv(&self) -> Result<Vec<u8>> {
        self.shared.am_recv(self.max_message).await
    }

    /// Like [`am_recv`](Self::am_recv), but a rendezvous message is received into a buffer
    /// from the allocator registered for the sender's memory type
    /// ([`Worker::set_am_allocator`](crate::Worker::set_am_allocator)); UCX writes it there
    /// directly.
    pub async fn am_recv_buf(&self) -> Result<AmBuffer> {
        self.shared.am_recv_buf(self.max_message).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our header is UCXX's: 14 bytes, the memory type first, the rest zero.
    #[test]
    fn headers_are_ucxx_headers() {
        assert_eq!(HEADERS[0], [0u8; HEADER_LEN]);
        assert_eq!(&HEADERS[1][..4], &1u32.to_ne_bytes());
        assert!(HEADERS[1][4..].iter().all(|&b| b == 0));
        assert_eq!(header_memory_type(&HEADERS[1]), MemoryType::Cuda);
        assert_eq!(header_memory_type(&HEADERS[0]), MemoryType::Host);
    }

    /// Older and odd headers: one byte (earlier ucx-rs), UCXX < 0.52's five bytes, nothing,
    /// garbage; unknown types are host memory.
    #[test]
    fn header_memory_types() {
        assert_eq!(header_memory_type(&[1]), MemoryType::Cuda);
        assert_eq!(header_memory_type(&[0]), MemoryType::Host);
        assert_eq!(header_memory_type(&[1, 0, 0, 0, 0]), MemoryType::Cuda);
        assert_eq!(header_memory_type(&[]), MemoryType::Host);
        assert_eq!(header_memory_type(&[1, 2]), MemoryType::Host);
        assert_eq!(header_memory_type(&[9, 9, 9, 9, 9]), MemoryType::Host);
    }
}
