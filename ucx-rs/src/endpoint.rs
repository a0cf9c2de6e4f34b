//! Endpoints: connecting, the UCXX handshake, tagged and stream messaging, closing.

use std::ffi::c_void;
use std::fmt;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use ucx_sys as sys;

use crate::buffer::{IoBuf, IoBufMut, MemoryType};
use crate::error::{check, Error, Result, Status};
use crate::multi::{decode_header, encode_headers, FrameInfo, HEADER_LEN, MAX_FRAMES};
use crate::request::{post, CbKind, Completion, InFlight, OpCore, Posted};
use crate::wire::{Handshake, Tag, HANDSHAKE_LEN};
use crate::worker::{as_void, Locked, ProgressMode, Worker, WorkerShared};

/// Default time limit for connecting and for each side of the handshake (UCXX uses 5 s too).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// User tags whose raw tags an endpoint keeps.
const TAG_CACHE: usize = 32;

/// Largest message [`Endpoint::recv_vec`] and [`Endpoint::recv_obj`] allocate by default.
pub const DEFAULT_MAX_MESSAGE: usize = 2 << 30;

type CloseCallback = Box<dyn FnOnce(Option<Error>) + Send>;

/// State shared by an [`Endpoint`], its in-flight operations and UCX's error callback.
pub(crate) struct EpShared {
    pub(crate) worker: Arc<WorkerShared>,
    /// The UCP endpoint; null once closing started. Read and written under the worker lock.
    ep: AtomicPtr<sys::ucp_ep>,
    /// The status UCX's error callback reported (0: none).
    error: AtomicI32,
    closed: AtomicBool,
    /// A stream receive was dropped mid-flight: UCX cannot cancel it, so it will swallow the
    /// next bytes and the stream's position is lost for later stream receives.
    stream_abandoned: AtomicBool,
    /// Receives completed through this endpoint, and the count at which it closes (0: never).
    recv_count: AtomicU64,
    close_after: AtomicU64,
    /// In-flight receives, cancelled when the endpoint fails or closes. Weak: a finished
    /// operation (and a buffer parked in it) is freed as soon as UCX lets go of it.
    pending: Mutex<Vec<Weak<OpCore>>>,
    on_close: Mutex<Option<CloseCallback>>,
    peer: Option<SocketAddr>,
}

/// How a UCP endpoint is created.
pub(crate) enum Target {
    /// Client side of a client-server connection.
    Sockaddr(SocketAddr),
    /// Server side: a connection request from a listener.
    ConnRequest(sys::ucp_conn_request_h, Option<SocketAddr>),
    /// A worker address obtained out of band ([`Worker::address`]).
    Address(Vec<u8>),
}

impl EpShared {
    /// Creates the UCP endpoint with peer error handling. UCX holds one strong reference (the
    /// error handler's argument) until the endpoint's close completes.
    pub(crate) fn create(worker: &Arc<WorkerShared>, target: Target) -> Result<Arc<EpShared>> {
        let peer = match &target {
            Target::Sockaddr(a) => Some(*a),
            Target::ConnRequest(_, a) => *a,
            Target::Address(_) => None,
        };
        let shared = Arc::new(EpShared {
            worker: Arc::clone(worker),
            ep: AtomicPtr::new(ptr::null_mut()),
            error: AtomicI32::new(0),
            closed: AtomicBool::new(false),
            stream_abandoned: AtomicBool::new(false),
            recv_count: AtomicU64::new(0),
            close_after: AtomicU64::new(0),
            pending: Mutex::new(Vec::new()),
            on_close: Mutex::new(None),
            peer,
        });
        let arg = Arc::into_raw(Arc::clone(&shared));
        let mut params = sys::ucp_ep_params_t {
            field_mask: (sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64,
            err_mode: sys::UCP_ERR_HANDLING_MODE_PEER,
            err_handler: sys::ucp_err_handler_t {
                cb: Some(ep_error_cb),
                arg: as_void(arg),
            },
            ..Default::default()
        };
        let sockaddr;
        match target {
            Target::Sockaddr(addr) => {
                sockaddr = socket2::SockAddr::from(addr);
                params.field_mask |=
                    (sys::UCP_EP_PARAM_FIELD_SOCK_ADDR | sys::UCP_EP_PARAM_FIELD_FLAGS) as u64;
                params.flags = sys::UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
                params.sockaddr = sys::ucs_sock_addr_t {
                    addr: sockaddr.as_ptr() as *const sys::sockaddr,
                    addrlen: sockaddr.len(),
                };
            }
            Target::ConnRequest(req, _) => {
                params.field_mask |= sys::UCP_EP_PARAM_FIELD_CONN_REQUEST as u64;
                params.conn_request = req;
            }
            Target::Address(ref bytes) => {
                params.field_mask |= sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS as u64;
                params.address = bytes.as_ptr() as *const sys::ucp_address_t;
            }
        }
        let locked = worker.lock();
        let mut ep: sys::ucp_ep_h = ptr::null_mut();
        // SAFETY: the worker is alive and locked; params (and the sockaddr it points to) live
        // across the call; ep is an out-pointer.
        let status = unsafe { sys::ucp_ep_create(locked.handle(), &params, &mut ep) };
        if status != sys::UCS_OK {
            // SAFETY: the endpoint was not created, so UCX will never use `arg`: take it back.
            drop(unsafe { Arc::from_raw(arg) });
            return Err(Error::Ucx(Status(status)));
        }
        shared.ep.store(ep, Ordering::Release);
        Ok(shared)
    }

    /// The UCP endpoint if it can still carry operations; must be called under the lock.
    fn live(&self, _locked: &Locked<'_>) -> Result<sys::ucp_ep_h> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let ep = self.ep.load(Ordering::Acquire);
        if ep.is_null() || self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(ep)
    }

    fn failure(&self) -> Option<Error> {
        match self.error.load(Ordering::Acquire) {
            0 => None,
            st => Some(Error::Ucx(Status(st as sys::ucs_status_t))),
        }
    }

    /// Maps an operation's final status, naming the endpoint's failure for cancelled receives.
    fn outcome(&self, c: &Completion) -> Result<()> {
        match c.status {
            sys::UCS_OK => Ok(()),
            sys::UCS_ERR_CANCELED => {
                Err(self
                    .failure()
                    .unwrap_or(if self.closed.load(Ordering::Acquire) {
                        Error::Closed
                    } else {
                        Error::Canceled
                    }))
            }
            st => Err(Error::Ucx(Status(st))),
        }
    }

    fn track(&self, op: &Arc<OpCore>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.len() >= 64 && pending.len().is_power_of_two() {
            pending.retain(|o| o.upgrade().is_some_and(|o| !o.is_done()));
        }
        pending.push(Arc::downgrade(op));
    }

    /// Cancels every in-flight receive (with the worker locked) and hands back the close callback
    /// to run once the lock is released.
    pub(crate) fn fail_pending(&self, locked: &Locked<'_>) -> Option<Box<dyn FnOnce() + Send>> {
        let ops = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for op in ops.iter().filter_map(Weak::upgrade) {
            op.cancel(locked);
        }
        let cb = self
            .on_close
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        let reason = self.failure();
        Some(Box::new(move || cb(reason)))
    }

    /// Starts closing; returns the close operation if it is still in flight. Idempotent.
    fn start_close(&self, locked: &mut Locked<'_>, force: bool) -> Option<Arc<OpCore>> {
        self.closed.store(true, Ordering::Release);
        let ep = self.ep.swap(ptr::null_mut(), Ordering::AcqRel);
        if ep.is_null() {
            return None;
        }
        if let Some(cb) = self.fail_pending(locked) {
            locked.defer(cb);
        }
        self.worker.am_queue().drop_for(ep as usize, locked);
        // Receives of unknown size wait as probe waiters: wake them to see the close.
        let worker = Arc::clone(&self.worker);
        locked.defer(Box::new(move || worker.wake_probe_waiters()));
        let force = force || self.failure().is_some();
        // SAFETY: `create` handed UCX one strong reference as the error handler's argument; the
        // endpoint pointer was non-null (swapped out above), so this is the one and only time it
        // is taken back. It is kept alive until the close completes (no callback after that).
        let ucx_ref = unsafe { Arc::from_raw(self as *const EpShared) };
        let posted = post(locked, CbKind::Send, None, |param, _| {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = if force {
                sys::UCP_EP_CLOSE_FLAG_FORCE
            } else {
                0
            };
            // SAFETY: ep is a live endpoint that nobody else will use after the swap above.
            unsafe { sys::ucp_ep_close_nbx(ep, param) }
        });
        tracing::debug!(peer = ?self.peer, force, "closing UCX endpoint");
        match posted {
            Posted::Done(c) => {
                if c.status != sys::UCS_OK {
                    tracing::debug!(status = ?Status(c.status), "endpoint close reported");
                }
                drop(ucx_ref);
                None
            }
            Posted::Pending(op) => {
                op.park(Box::new(ucx_ref));
                Some(op)
            }
        }
    }

    // ---- operations ------------------------------------------------------------------------

    /// Posts one operation with a send-type callback (sends, put, get, flush) on the live
    /// endpoint, under the worker lock. `op` makes the one UCX call.
    pub(crate) fn post_live(
        &self,
        memory_type: Option<sys::ucs_memory_type_t>,
        op: impl FnOnce(sys::ucp_ep_h, &mut sys::ucp_request_param_t) -> sys::ucs_status_ptr_t,
    ) -> Result<Posted> {
        let locked = self.worker.lock();
        let ep = self.live(&locked)?;
        Ok(post(&locked, CbKind::Send, memory_type, |param, _| {
            op(ep, param)
        }))
    }

    /// Posts a send-like operation of `buf` (tag, stream, active message) on the live
    /// endpoint and waits for it. `op` makes the one UCX call: it gets the endpoint (live,
    /// under the worker lock) and the buffer's pointer and length, which stay valid until the
    /// operation completes (the buffer is owned by `InFlight`, or parked in the op).
    ///
    /// Device buffers: their stream is synchronised first, and a staged message sends a pinned
    /// host copy instead (see [`crate::cuda`]).
    async fn send_like<B: IoBuf>(
        &self,
        buf: B,
        flags: u32,
        op: impl FnOnce(
            sys::ucp_ep_h,
            *const u8,
            usize,
            &sys::ucp_request_param_t,
        ) -> sys::ucs_status_ptr_t,
    ) -> (Result<()>, B) {
        #[cfg(feature = "cuda")]
        match crate::cuda::stage_send(&self.worker, &buf) {
            Err(e) => return (Err(e), buf),
            Ok(Some(pinned)) => {
                let (r, _pinned) = self.send_like_raw(pinned, flags, op).await;
                return (r, buf);
            }
            Ok(None) => {}
        }
        self.send_like_raw(buf, flags, op).await
    }

    async fn send_like_raw<B: IoBuf>(
        &self,
        buf: B,
        flags: u32,
        op: impl FnOnce(
            sys::ucp_ep_h,
            *const u8,
            usize,
            &sys::ucp_request_param_t,
        ) -> sys::ucs_status_ptr_t,
    ) -> (Result<()>, B) {
        // Scoped so that the raw pointer is not held across the await (futures stay Send).
        let posted = {
            let (ptr, len, mt) = (buf.stable_ptr(), buf.bytes_init(), buf.memory_type());
            self.post_live(Some(mt.to_ucs()), |ep, param| {
                if flags != 0 {
                    param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
                    param.flags = flags;
                }
                op(ep, ptr, len, param)
            })
        };
        match posted {
            Ok(posted) => self.finish(posted, buf, false).await,
            Err(e) => (Err(e), buf),
        }
    }

    async fn am_send<B: IoBuf>(&self, buf: B) -> (Result<()>, B) {
        // UCXX's header: the sender's memory type, so the receiver can pick an allocator.
        let header: &'static [u8; crate::am::HEADER_LEN] =
            &crate::am::HEADERS[usize::from(buf.memory_type() == MemoryType::Cuda)];
        self.send_like(buf, sys::UCP_AM_SEND_FLAG_REPLY, move |ep, p, n, param| {
            let header = header.as_ptr();
            // SAFETY: see send_like; the header is static, valid for ever.
            unsafe {
                sys::ucp_am_send_nbx(
                    ep,
                    crate::am::AM_ID,
                    header.cast(),
                    crate::am::HEADER_LEN,
                    p.cast(),
                    n,
                    param,
                )
            }
        })
        .await
    }

    /// The next active message that came through this endpoint.
    async fn am_next(&self) -> Result<crate::am::AmMessage> {
        self.wait_for(|_| {
            let ep = self.ep.load(Ordering::Acquire) as usize;
            (ep != 0).then(|| self.worker.am_queue().take(ep)).flatten()
        })
        .await
    }

    /// Waits until `find` (called with the worker locked, after progress in polling mode)
    /// returns something, or the endpoint fails or closes. Waiters are woken after any
    /// progress that did work, and when an endpoint fails or closes. What arrived before a
    /// failure is still found.
    async fn wait_for<T>(&self, mut find: impl FnMut(&Locked<'_>) -> Option<T>) -> Result<T> {
        poll_fn(|cx| {
            let mut locked = self.worker.lock();
            if self.worker.mode() == ProgressMode::Polling {
                locked.progress();
            }
            if let Some(found) = find(&locked) {
                return Poll::Ready(Ok(found));
            }
            if let Err(e) = self.live(&locked) {
                return Poll::Ready(Err(e));
            }
            if self.worker.mode() == ProgressMode::Polling {
                cx.waker().wake_by_ref();
            } else {
                self.worker.add_probe_waiter(cx.waker());
            }
            Poll::Pending
        })
        .await
    }

    /// Receives a rendezvous active message into `buf` (which UCX writes directly, whatever
    /// its memory type), or releases the descriptor when `buf` is `None` or too small.
    async fn am_recv_rndv<B: IoBufMut>(
        &self,
        desc: usize,
        length: usize,
        buf: Result<B>,
    ) -> Result<B> {
        #[cfg(feature = "cuda")]
        let buf = match buf {
            Ok(b) if b.bytes_total() >= length => match crate::cuda::stage_recv(&self.worker, &b) {
                Ok(Some(pinned)) => {
                    let pinned = self.am_recv_rndv_raw(desc, length, Ok(pinned)).await?;
                    let mut b = b;
                    crate::cuda::unstage(&mut b, pinned.filled())?;
                    return Ok(b);
                }
                Ok(None) => Ok(b),
                Err(e) => Err(e),
            },
            other => other,
        };
        self.am_recv_rndv_raw(desc, length, buf).await
    }

    async fn am_recv_rndv_raw<B: IoBufMut>(
        &self,
        desc: usize,
        length: usize,
        buf: Result<B>,
    ) -> Result<B> {
        let refused = match &buf {
            Ok(b) if b.bytes_total() >= length => None,
            Ok(b) => Some(Error::Truncated {
                message: length,
                buffer: b.bytes_total(),
            }),
            Err(e) => Some(e.clone()),
        };
        if let Some(e) = refused {
            let locked = self.worker.lock();
            // SAFETY: the descriptor came from the AM handler and was taken out of the queue,
            // so it is released exactly once.
            unsafe { sys::ucp_am_data_release(locked.handle(), desc as *mut c_void) };
            return Err(e);
        }
        let mut buf = buf?;
        let posted = {
            let locked = self.worker.lock();
            let (p, mt) = (buf.stable_mut_ptr(), buf.memory_type());
            post(&locked, CbKind::AmRecv, Some(mt.to_ucs()), |param, imm| {
                param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_RECV_INFO;
                param.recv_info.length = imm.stream_length();
                // SAFETY: desc came from the AM handler (taken out of the queue, received
                // once); the buffer has at least `length` writable bytes until completion.
                unsafe {
                    sys::ucp_am_recv_data_nbx(
                        locked.handle(),
                        desc as *mut c_void,
                        p.cast(),
                        length,
                        param,
                    )
                }
            })
        };
        let (mut c, mut buf) = self.complete(posted, buf, true).await;
        c.length = length;
        self.received(&c, &mut buf, length)?;
        Ok(buf)
    }

    fn am_capped<T>(
        &self,
        length: usize,
        max: usize,
        alloc: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        if length > max {
            return Err(Error::Truncated {
                message: length,
                buffer: max,
            });
        }
        alloc()
    }

    async fn am_recv(&self, max: usize) -> Result<Vec<u8>> {
        let msg = self.am_next().await?;
        let (desc, length) = match msg.body {
            crate::am::AmBody::Data(v) => return Ok(v),
            crate::am::AmBody::Rndv { desc, length } => (desc, length),
        };
        let buf = self.am_capped(length, max, || {
            let mut v: Vec<u8> = Vec::new();
            v.try_reserve_exact(length)
                .map_err(|_| Error::InvalidArgument(format!("cannot allocate {length} bytes")))?;
            Ok(v)
        });
        self.am_recv_rndv(desc, length, buf).await
    }

    async fn am_recv_buf(&self, max: usize) -> Result<crate::am::AmBuffer> {
        let msg = self.am_next().await?;
        let (desc, length) = match msg.body {
            crate::am::AmBody::Data(v) => {
                let len = v.len();
                #[cfg(feature = "cuda")]
                if msg.mem == MemoryType::Cuda {
                    // Eager data arrives in host memory; a device allocator still gets it.
                    let mut b = self.worker.am_allocator(msg.mem).allocate(len)?;
                    if b.cuda_stream().is_some() {
                        crate::cuda::unstage(&mut b, &v)?;
                        return Ok(crate::am::AmBuffer {
                            sender_memory: msg.mem,
                            buffer: b,
                            len,
                        });
                    }
                }
                return Ok(crate::am::AmBuffer {
                    sender_memory: msg.mem,
                    buffer: Box::new(v),
                    len,
                });
            }
            crate::am::AmBody::Rndv { desc, length } => (desc, length),
        };
        let allocator = self.worker.am_allocator(msg.mem);
        let buf = self.am_capped(length, max, || allocator.allocate(length));
        let buffer = self.am_recv_rndv(desc, length, buf).await?;
        Ok(crate::am::AmBuffer {
            sender_memory: msg.mem,
            buffer,
            len: length,
        })
    }

    async fn tag_send<B: IoBuf>(&self, buf: B, tag: u64) -> (Result<()>, B) {
        self.send_like(buf, 0, |ep, p, n, param| {
            // SAFETY: see send_like.
            unsafe { sys::ucp_tag_send_nbx(ep, p.cast(), n, tag, param) }
        })
        .await
    }

    async fn tag_recv<B: IoBufMut>(&self, buf: B, tag: u64) -> (Result<usize>, B) {
        #[cfg(feature = "cuda")]
        match crate::cuda::stage_recv(&self.worker, &buf) {
            Err(e) => return (Err(e), buf),
            Ok(Some(pinned)) => {
                let (r, pinned) = self.tag_recv_raw(pinned, tag).await;
                return unstaged(r, buf, &pinned);
            }
            Ok(None) => {}
        }
        self.tag_recv_raw(buf, tag).await
    }

    async fn tag_recv_raw<B: IoBufMut>(&self, mut buf: B, tag: u64) -> (Result<usize>, B) {
        let cap = buf.bytes_total();
        let posted = {
            let locked = self.worker.lock();
            if let Err(e) = self.live(&locked) {
                return (Err(e), buf);
            }
            let (ptr, mt) = (buf.stable_mut_ptr(), buf.memory_type());
            let posted = post(&locked, CbKind::TagRecv, Some(mt.to_ucs()), |param, imm| {
                imm.for_tag(param);
                // SAFETY: the worker is locked; the buffer is valid for `cap` bytes of writes
                // until the operation completes (owned by InFlight or parked in the op).
                unsafe {
                    sys::ucp_tag_recv_nbx(locked.handle(), ptr.cast(), cap, tag, u64::MAX, param)
                }
            });
            if let Posted::Pending(op) = &posted {
                self.track(op);
            }
            posted
        };
        let (c, mut buf) = self.complete(posted, buf, true).await;
        let r = self.received(&c, &mut buf, cap);
        if r.is_ok() {
            self.count_recv();
        }
        (r, buf)
    }

    fn received<B: IoBufMut>(&self, c: &Completion, buf: &mut B, cap: usize) -> Result<usize> {
        if c.status == sys::UCS_ERR_MESSAGE_TRUNCATED {
            return Err(Error::Truncated {
                message: c.length,
                buffer: cap,
            });
        }
        self.outcome(c)?;
        let n = c.length.min(cap);
        // SAFETY: UCX reported writing n <= capacity bytes from the start of the buffer.
        unsafe { buf.set_init(n) };
        Ok(n)
    }

    /// Counts a completed tag receive (the handshake's stream receive does not count) and closes the endpoint when `close_after_n_recv` says so.
    fn count_recv(&self) {
        let done = self.recv_count.fetch_add(1, Ordering::AcqRel) + 1;
        if done == self.close_after.load(Ordering::Acquire) {
            tracing::debug!(peer = ?self.peer, receives = done, "closing after n receives");
            self.start_close(&mut self.worker.lock(), false);
        }
    }

    async fn stream_send<B: IoBuf>(&self, buf: B) -> (Result<()>, B) {
        self.send_like(buf, 0, |ep, p, n, param| {
            // SAFETY: see send_like.
            unsafe { sys::ucp_stream_send_nbx(ep, p.cast(), n, param) }
        })
        .await
    }

    async fn stream_recv_exact<B: IoBufMut>(&self, buf: B) -> (Result<usize>, B) {
        #[cfg(feature = "cuda")]
        match crate::cuda::stage_recv(&self.worker, &buf) {
            Err(e) => return (Err(e), buf),
            Ok(Some(pinned)) => {
                let (r, pinned) = self.stream_recv_raw(pinned).await;
                return unstaged(r, buf, &pinned);
            }
            Ok(None) => {}
        }
        self.stream_recv_raw(buf).await
    }

    async fn stream_recv_raw<B: IoBufMut>(&self, mut buf: B) -> (Result<usize>, B) {
        if self.stream_abandoned.load(Ordering::Acquire) {
            return (Err(Error::StreamAbandoned), buf);
        }
        let cap = buf.bytes_total();
        let posted = {
            let locked = self.worker.lock();
            let ep = match self.live(&locked) {
                Ok(ep) => ep,
                Err(e) => return (Err(e), buf),
            };
            let (ptr, mt) = (buf.stable_mut_ptr(), buf.memory_type());
            let posted = post(
                &locked,
                CbKind::StreamRecv,
                Some(mt.to_ucs()),
                |param, imm| {
                    param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
                    param.flags = sys::UCP_STREAM_RECV_FLAG_WAITALL;
                    // SAFETY: as in tag_recv; the length out-pointer is valid for the call.
                    unsafe {
                        sys::ucp_stream_recv_nbx(ep, ptr.cast(), cap, imm.stream_length(), param)
                    }
                },
            );
            if let Posted::Pending(op) = &posted {
                self.track(op);
            }
            posted
        };
        // ucp_request_cancel ignores stream receives: if this future is dropped mid-flight,
        // mark the stream abandoned instead of letting a later receive read shifted bytes.
        let guard = AbandonOnDrop(&self.stream_abandoned);
        let (c, mut buf) = self.complete(posted, buf, true).await;
        std::mem::forget(guard);
        (self.received(&c, &mut buf, cap), buf)
    }

    async fn finish<B: Send + 'static>(
        &self,
        posted: Posted,
        buf: B,
        cancel: bool,
    ) -> (Result<()>, B) {
        let (c, buf) = self.complete(posted, buf, cancel).await;
        (self.outcome(&c), buf)
    }

    async fn complete<B: Send + 'static>(
        &self,
        posted: Posted,
        buf: B,
        cancel: bool,
    ) -> (Completion, B) {
        match posted {
            Posted::Done(c) => (c, buf),
            Posted::Pending(op) => InFlight::new(op, buf, &self.worker, cancel).finish().await,
        }
    }

    /// Probes for a message on `tag`, removing it from UCX's unexpected queue when found.
    /// A message that arrived before the peer failed is still delivered.
    /// The message handle is returned as an address so that futures holding it stay `Send`.
    async fn probe(&self, tag: u64) -> Result<(usize, usize)> {
        self.wait_for(|locked| {
            let mut info = sys::ucp_tag_recv_info_t::default();
            // SAFETY: the worker is locked; info is a valid out-pointer.
            let msg =
                unsafe { sys::ucp_tag_probe_nb(locked.handle(), tag, u64::MAX, 1, &mut info) };
            (!msg.is_null()).then_some((msg as usize, info.length))
        })
        .await
    }

    async fn recv_probed(&self, tag: u64, max: usize) -> Result<Vec<u8>> {
        let (msg, len) = self.probe(tag).await?;
        let mut buf: Vec<u8> = Vec::new();
        let fits = len <= max && buf.try_reserve_exact(len).is_ok();
        let cap = if fits { len } else { 0 };
        let posted = {
            let locked = self.worker.lock();
            let ptr = buf.as_mut_ptr();
            let msg = msg as sys::ucp_tag_message_h;
            post(
                &locked,
                CbKind::TagRecv,
                Some(MemoryType::Host.to_ucs()),
                |param, imm| {
                    imm.for_tag(param);
                    // SAFETY: msg came from ucp_tag_probe_nb with remove=1 on this worker and is
                    // received exactly once; the buffer has `cap` writable bytes. A message that
                    // does not fit is received into 0 bytes, which discards it.
                    unsafe {
                        sys::ucp_tag_msg_recv_nbx(locked.handle(), ptr.cast(), cap, msg, param)
                    }
                },
            )
        };
        let (mut c, mut buf) = self.complete(posted, buf, true).await;
        // ucp_tag_msg_recv_nbx does not report the length of an immediate completion; the
        // probe already told it.
        c.length = len;
        if !fits {
            return Err(Error::Truncated {
                message: len,
                buffer: max.min(len.saturating_sub(1)),
            });
        }
        self.received(&c, &mut buf, cap)?;
        self.count_recv();
        Ok(buf)
    }
}

/// Marks the endpoint's stream abandoned when dropped (forgotten on completion).
struct AbandonOnDrop<'a>(&'a AtomicBool);

impl Drop for AbandonOnDrop<'_> {
    fn drop(&mut self) {
        tracing::debug!("stream receive dropped in flight: the stream is abandoned");
        self.0.store(true, Ordering::Release);
    }
}

unsafe extern "C" fn ep_error_cb(arg: *mut c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    let raw = arg as *const EpShared;
    // SAFETY: `arg` is the strong reference `create` handed to UCX, alive until the endpoint's
    // close completes, and UCX calls this only before that. We take one more reference for the
    // deferred work instead of consuming UCX's.
    let shared = unsafe {
        Arc::increment_strong_count(raw);
        Arc::from_raw(raw)
    };
    shared.error.store(i32::from(status), Ordering::Release);
    // A peer closing normally shows up as a reset too, so this is not a warning.
    tracing::info!(peer = ?shared.peer, status = %Status(status), "UCX endpoint failed or closed by peer");
    let worker = Arc::clone(&shared.worker);
    worker.defer_failed(shared);
}

/// Options for [`Endpoint::connect_with`].
#[derive(Debug, Clone, Copy)]
pub struct ConnectOptions {
    /// Limit for resolving, connecting and the handshake together.
    pub timeout: Duration,
    /// Run the UCXX handshake (default). Without it the endpoint has no default tags: use
    /// [`Tag::Forced`] or the stream API (for speaking other protocols, or testing peers).
    pub handshake: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            timeout: DEFAULT_TIMEOUT,
            handshake: true,
        }
    }
}

/// A connection to one peer, speaking UCXX's wire format.
///
/// Operations take owned buffers and return them with the result. All methods take `&self`,
/// so sends and receives can run concurrently (`tokio::join!`, or share it in an `Arc`).
/// Dropping an operation's future mid-flight is safe: receives are cancelled and the buffer is
/// freed only after UCX lets go of it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> ucx::Result<()> {
/// use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};
/// let ctx = Context::new()?;
/// let worker = Worker::new(&ctx, ProgressMode::Blocking)?;
/// let mut listener = Listener::bind(&worker, "127.0.0.1:0".parse().unwrap())?;
/// let addr = listener.local_addr();
/// let (server, client) = tokio::join!(listener.accept(), Endpoint::connect(&worker, addr));
/// let (server, client) = (server?, client?);
/// let (sent, recvd) = tokio::join!(client.send(b"hello".to_vec(), 7), server.recv(vec![0u8; 64], 7));
/// sent.0?;
/// let (n, buf) = recvd;
/// assert_eq!(&buf[..n?], b"hello");
/// client.close().await?;
/// # Ok(()) }
/// ```
pub struct Endpoint {
    shared: Arc<EpShared>,
    /// Base of send tags: the peer's handshake tag.
    send_base: u64,
    /// Base of receive tags: our handshake tag.
    recv_base: u64,
    tag_cache: Mutex<Vec<(i128, u64, u64)>>,
    max_message: usize,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("peer", &self.shared.peer)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Endpoint {
    /// Connects to a UCXX-compatible listener (ours or UCXX's) and runs the handshake.
    pub async fn connect(
        worker: &Worker,
        addr: impl tokio::net::ToSocketAddrs,
    ) -> Result<Endpoint> {
        Self::connect_with(worker, addr, ConnectOptions::default()).await
    }

    /// [`connect`](Self::connect) with a time limit and handshake choice.
    pub async fn connect_with(
        worker: &Worker,
        addr: impl tokio::net::ToSocketAddrs,
        opts: ConnectOptions,
    ) -> Result<Endpoint> {
        // Timers and name resolution are tokio's: fail cleanly instead of panicking without it.
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime("Endpoint::connect"))?;
        let attempt = async {
            let addr = tokio::net::lookup_host(addr)
                .await
                .map_err(|e| Error::os("resolving the address", e))?
                .next()
                .ok_or_else(|| Error::InvalidArgument("address resolved to nothing".into()))?;
            let span = tracing::debug_span!("ucx_connect", %addr);
            let _g = span.enter();
            tracing::debug!("connecting");
            drop(_g);
            worker.context().check_address_family(&addr)?;
            let ep =
                Endpoint::unhandshaken(EpShared::create(&worker.shared, Target::Sockaddr(addr))?);
            let ep = if opts.handshake {
                Endpoint::handshake(ep, false).await?
            } else {
                ep
            };
            tracing::debug!(%addr, "connected");
            Ok(ep)
        };
        match tokio::time::timeout(opts.timeout, attempt).await {
            Ok(r) => r.inspect_err(|e| tracing::warn!(error = %e, "connect failed")),
            Err(_) => {
                tracing::warn!(timeout = ?opts.timeout, "connect timed out");
                Err(Error::Timeout(opts.timeout))
            }
        }
    }

    /// Connects to a worker by its UCP address (from [`Worker::address`], exchanged out of
    /// band). There is no handshake: both tag bases are 0, so [`Tag::Default`] and user tags
    /// match between two address-connected endpoints, and [`Tag::Forced`] works with anyone.
    ///
    /// Address-connected endpoints pick transports like `ucx_perftest` does (shared memory
    /// alone on one host), while client-server endpoints also carry TCP lanes.
    ///
    /// # Safety
    /// `address` must be the unmodified bytes of [`Worker::address`] of some worker (in this
    /// process or another). UCX parses addresses without validating them: corrupted bytes
    /// make it abort the process (seen with UCX 1.13), so bytes from an untrusted peer must
    /// not reach this call.
    pub unsafe fn connect_address(worker: &Worker, address: &[u8]) -> Result<Endpoint> {
        if address.len() < 8 {
            return Err(Error::InvalidArgument(format!(
                "a UCP worker address of {} bytes is too short",
                address.len()
            )));
        }
        let shared = EpShared::create(&worker.shared, Target::Address(address.to_vec()))?;
        tracing::debug!(len = address.len(), "connected by worker address");
        Ok(Endpoint::from_parts(shared, 0, 0))
    }

    fn from_parts(shared: Arc<EpShared>, send_base: u64, recv_base: u64) -> Endpoint {
        Endpoint {
            shared,
            send_base,
            recv_base,
            tag_cache: Mutex::new(Vec::new()),
            max_message: DEFAULT_MAX_MESSAGE,
        }
    }

    /// Runs the UCXX handshake: the listener side sends first, the client receives first.
    /// An endpoint before its handshake: dropping it closes the UCP endpoint, so a handshake
    /// that fails or is abandoned never leaks one.
    pub(crate) fn unhandshaken(shared: Arc<EpShared>) -> Endpoint {
        Endpoint::from_parts(shared, 0, 0)
    }

    /// Runs the UCXX handshake: the listener side sends first, the client receives first.
    pub(crate) async fn handshake(mut ep: Endpoint, listener_side: bool) -> Result<Endpoint> {
        let ours = Handshake::new(rand::random::<u64>());
        ep.recv_base = ours.msg_tag;
        if listener_side {
            ep.send_handshake(&ours).await?;
        }
        let (r, buf) = ep
            .shared
            .stream_recv_exact(Vec::with_capacity(HANDSHAKE_LEN))
            .await;
        r.map_err(|e| handshake_error("receiving", e))?;
        let theirs = Handshake::decode(&buf).map_err(Error::Handshake)?;
        if !listener_side {
            ep.send_handshake(&ours).await?;
        }
        ep.send_base = theirs.msg_tag;
        Ok(ep)
    }

    async fn send_handshake(&self, ours: &Handshake) -> Result<()> {
        let (r, _) = self.shared.stream_send(ours.encode().to_vec()).await;
        r.map_err(|e| handshake_error("sending", e))
    }

    /// The raw (send, receive) tags for `tag`. User tags cost two SHA-1s, so the most recent
    /// ones are cached (a short list: applications use few tags, and a scan beats hashing).
    fn tag_pair(&self, tag: Tag) -> (u64, u64) {
        let Tag::User(t) = tag else {
            return (tag.resolve(self.send_base), tag.resolve(self.recv_base));
        };
        let mut cache = self.tag_cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, s, r)) = cache.iter().find(|(k, _, _)| *k == t) {
            return (s, r);
        }
        let pair = (tag.resolve(self.send_base), tag.resolve(self.recv_base));
        if cache.len() >= TAG_CACHE {
            cache.remove(0);
        }
        cache.push((t, pair.0, pair.1));
        pair
    }

    /// Sends `buf` as one tagged message. Completes when the buffer may be reused.
    pub async fn send<B: IoBuf>(&self, buf: B, tag: impl Into<Tag>) -> (Result<()>, B) {
        let (t, _) = self.tag_pair(tag.into());
        self.shared.tag_send(buf, t).await
    }

    /// Receives one tagged message into `buf` (into its whole capacity for `Vec`/`BytesMut`,
    /// whose length is then set to the message size). Returns the message size.
    ///
    /// A message larger than the buffer fails with [`Error::Truncated`].
    pub async fn recv<B: IoBufMut>(&self, buf: B, tag: impl Into<Tag>) -> (Result<usize>, B) {
        let (_, t) = self.tag_pair(tag.into());
        self.shared.tag_recv(buf, t).await
    }

    /// Receives one tagged message of unknown size: probes it, then allocates exactly its size
    /// (refusing more than [`max_message`](Self::set_max_message)).
    pub async fn recv_vec(&self, tag: impl Into<Tag>) -> Result<Vec<u8>> {
        let (_, t) = self.tag_pair(tag.into());
        self.shared.recv_probed(t, self.max_message).await
    }

    /// Limits what [`recv_vec`](Self::recv_vec) and [`recv_obj`](Self::recv_obj) allocate.
    pub fn set_max_message(&mut self, bytes: usize) {
        self.max_message = bytes;
    }

    /// UCXX's `send_obj`: an 8-byte native-endian length message, then the payload, same tag.
    pub async fn send_obj<B: IoBuf>(&self, buf: B, tag: impl Into<Tag>) -> (Result<()>, B) {
        let (t, _) = self.tag_pair(tag.into());
        let header = (buf.bytes_init() as u64).to_ne_bytes().to_vec();
        let (h, (p, buf)) = futures::join!(
            self.shared.tag_send(header, t),
            self.shared.tag_send(buf, t)
        );
        (h.0.and(p), buf)
    }

    /// UCXX's `recv_obj`: receives the length message, then exactly that many bytes.
    pub async fn recv_obj(&self, tag: impl Into<Tag>) -> Result<Vec<u8>> {
        let (_, t) = self.tag_pair(tag.into());
        let (r, header) = self.shared.tag_recv(Vec::with_capacity(8), t).await;
        if r? != 8 {
            return Err(Error::InvalidArgument(format!(
                "recv_obj: the length message has {} bytes, expected 8",
                header.len()
            )));
        }
        let announced = u64::from_ne_bytes(header[..8].try_into().expect("8 bytes"));
        let body = self.shared.recv_probed(t, self.max_message).await?;
        if body.len() as u64 != announced {
            return Err(Error::InvalidArgument(format!(
                "recv_obj: announced {announced} bytes, the message has {}",
                body.len()
            )));
        }
        Ok(body)
    }

    /// UCXX's `send_multi`: sends the buffers as one logical message (headers, then one
    /// transfer per buffer, all on `tag`) and hands them back in order.
    pub async fn send_multi<B: IoBuf>(
        &self,
        bufs: Vec<B>,
        tag: impl Into<Tag>,
    ) -> (Result<()>, Vec<B>) {
        let (t, _) = self.tag_pair(tag.into());
        let frames: Vec<FrameInfo> = bufs
            .iter()
            .map(|b| FrameInfo {
                size: b.bytes_init(),
                cuda: b.memory_type() == MemoryType::Cuda,
            })
            .collect();
        let headers = encode_headers(&frames);
        // join_all polls in order on its first poll, so UCX sees the sends in this order.
        let (hs, fs) = futures::join!(
            futures::future::join_all(headers.into_iter().map(|h| self.shared.tag_send(h, t))),
            futures::future::join_all(bufs.into_iter().map(|b| self.shared.tag_send(b, t)))
        );
        let mut result = Ok(());
        for (r, _) in &hs {
            if let (Ok(()), Err(e)) = (&result, r) {
                result = Err(e.clone());
            }
        }
        let mut bufs = Vec::with_capacity(fs.len());
        for (r, b) in fs {
            if let (Ok(()), Err(e)) = (&result, r) {
                result = Err(e);
            }
            bufs.push(b);
        }
        (result, bufs)
    }

    /// UCXX's `recv_multi`: receives the headers, then every frame into host memory.
    /// Announced sizes are checked before anything is allocated: at most
    /// [`multi::MAX_FRAMES`](crate::multi::MAX_FRAMES) frames and
    /// [`max_message`](Self::set_max_message) bytes in all.
    pub async fn recv_multi(&self, tag: impl Into<Tag>) -> Result<Vec<Vec<u8>>> {
        let (_, t) = self.tag_pair(tag.into());
        let mut frames = Vec::new();
        loop {
            let (r, h) = self
                .shared
                .tag_recv(Vec::with_capacity(HEADER_LEN), t)
                .await;
            r?;
            let (next, more) = decode_header(&h).map_err(Error::InvalidArgument)?;
            frames.extend(more);
            if frames.len() > MAX_FRAMES {
                return Err(Error::InvalidArgument(format!(
                    "multi-buffer message announces over {MAX_FRAMES} frames"
                )));
            }
            if !next {
                break;
            }
        }
        let total = frames
            .iter()
            .try_fold(0usize, |acc, f| acc.checked_add(f.size));
        if total.is_none_or(|t| t > self.max_message) {
            return Err(Error::InvalidArgument(format!(
                "multi-buffer message announces more than {} bytes",
                self.max_message
            )));
        }
        let mut bufs = Vec::with_capacity(frames.len());
        for f in &frames {
            let mut b: Vec<u8> = Vec::new();
            b.try_reserve_exact(f.size).map_err(|_| {
                Error::InvalidArgument(format!("cannot allocate a {}-byte frame", f.size))
            })?;
            bufs.push(b);
        }
        let got =
            futures::future::join_all(bufs.into_iter().map(|b| self.shared.tag_recv(b, t))).await;
        let mut out = Vec::with_capacity(got.len());
        for ((r, b), f) in got.into_iter().zip(&frames) {
            let n = r?;
            if n != f.size {
                return Err(Error::InvalidArgument(format!(
                    "multi-buffer frame of {n} bytes, the header announced {}",
                    f.size
                )));
            }
            out.push(b);
        }
        Ok(out)
    }

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

    /// Unpacks a peer's key (from [`MemoryHandle::pack_rkey`](crate::MemoryHandle::pack_rkey))
    /// for puts and gets through this endpoint. Truncated or corrupted keys are refused.
    pub fn unpack_rkey(&self, packed: &[u8]) -> Result<crate::RemoteKey<'_>> {
        let (raw, addr, len) = crate::rma::parse_packed(packed)?;
        let locked = self.shared.worker.lock();
        let ep = self.shared.live(&locked)?;
        let mut rkey: sys::ucp_rkey_h = ptr::null_mut();
        // SAFETY: ep is live under the lock; `raw` is a key blob produced by ucp_rkey_pack
        // (magic, length and checksum verified above); rkey is an out-pointer.
        check(unsafe { sys::ucp_ep_rkey_unpack(ep, raw.as_ptr().cast(), &mut rkey) })?;
        drop(locked);
        let inner = crate::RemoteKey::make_inner(rkey, Arc::clone(&self.shared.worker));
        Ok(crate::RemoteKey::new(inner, self, addr, len))
    }

    pub(crate) async fn rma_put<B: IoBuf>(
        &self,
        buf: B,
        remote: u64,
        key: &Arc<crate::rma::RkeyInner>,
    ) -> (Result<()>, B) {
        #[cfg(feature = "cuda")]
        if let Err(e) = crate::cuda::require_zero_copy(&self.shared.worker, &buf) {
            return (Err(e), buf);
        }
        let posted = {
            let rkey = crate::RemoteKey::raw(key);
            let (p, len, mt) = (buf.stable_ptr(), buf.bytes_init(), buf.memory_type());
            self.shared.post_live(Some(mt.to_ucs()), |ep, param| {
                // SAFETY: ep live under the lock; the buffer and the rkey stay alive until the
                // operation completes (both owned by InFlight or parked in the op).
                unsafe { sys::ucp_put_nbx(ep, p.cast(), len, remote, rkey, param) }
            })
        };
        let posted = match posted {
            Ok(posted) => posted,
            Err(e) => return (Err(e), buf),
        };
        let (c, (buf, _key)) = self
            .shared
            .complete(posted, (buf, Arc::clone(key)), false)
            .await;
        (self.shared.outcome(&c), buf)
    }

    pub(crate) async fn rma_get<B: IoBufMut>(
        &self,
        mut buf: B,
        remote: u64,
        key: &Arc<crate::rma::RkeyInner>,
    ) -> (Result<usize>, B) {
        #[cfg(feature = "cuda")]
        if let Err(e) = crate::cuda::require_zero_copy(&self.shared.worker, &buf) {
            return (Err(e), buf);
        }
        let len = buf.bytes_total();
        let posted = {
            let rkey = crate::RemoteKey::raw(key);
            let (p, mt) = (buf.stable_mut_ptr(), buf.memory_type());
            self.shared.post_live(Some(mt.to_ucs()), |ep, param| {
                // SAFETY: as in rma_put; the buffer is writable for `len` bytes.
                unsafe { sys::ucp_get_nbx(ep, p.cast(), len, remote, rkey, param) }
            })
        };
        let posted = match posted {
            Ok(posted) => posted,
            Err(e) => return (Err(e), buf),
        };
        let (c, (mut buf, _key)) = self
            .shared
            .complete(posted, (buf, Arc::clone(key)), false)
            .await;
        if let Err(e) = self.shared.outcome(&c) {
            return (Err(e), buf);
        }
        // SAFETY: the get completed: UCX wrote `len` bytes from the start of the buffer.
        unsafe { buf.set_init(len) };
        (Ok(len), buf)
    }

    /// Waits until every operation posted on this endpoint (puts included) has completed
    /// remotely (`ucp_ep_flush_nbx`).
    pub async fn flush(&self) -> Result<()> {
        let posted = self.shared.post_live(None, |ep, param| {
            // SAFETY: ep is live under the lock.
            unsafe { sys::ucp_ep_flush_nbx(ep, param) }
        })?;
        let (c, ()) = self.shared.complete(posted, (), false).await;
        self.shared.outcome(&c)
    }

    /// Like [`am_recv`](Self::am_recv), but a rendezvous message is received into a buffer
    /// from the allocator registered for the sender's memory type
    /// ([`Worker::set_am_allocator`]); UCX writes it there directly.
    pub async fn am_recv_buf(&self) -> Result<crate::am::AmBuffer> {
        self.shared.am_recv_buf(self.max_message).await
    }

    /// Sends bytes on the endpoint's UCP stream (ordered byte stream, no tags).
    pub async fn stream_send<B: IoBuf>(&self, buf: B) -> (Result<()>, B) {
        self.shared.stream_send(buf).await
    }

    /// Receives exactly `buf.bytes_total()` bytes from the UCP stream.
    pub async fn stream_recv_exact<B: IoBufMut>(&self, buf: B) -> (Result<usize>, B) {
        self.shared.stream_recv_exact(buf).await
    }

    /// Probes for a message on `tag` (non-blocking). With `remove`, the message is taken out
    /// of UCX's queue and must be received through [`Probed::message`]; a message that
    /// arrived before the peer closed can still be received that way.
    pub fn tag_probe(&self, tag: impl Into<Tag>, remove: bool) -> Option<crate::Probed> {
        let (_, t) = self.tag_pair(tag.into());
        crate::probe::probe_raw(&self.shared.worker, t, u64::MAX, remove)
    }

    /// Closes the endpoint (flushing) once `n` receives have completed on it, counted from its
    /// creation or, with `count_from_now`, from this call (UCX-Py's `close_after_n_recv`).
    /// `recv_obj` counts as two receives, as in UCX-Py.
    pub fn close_after_n_recv(&self, n: u64, count_from_now: bool) -> Result<()> {
        let now = self.shared.recv_count.load(Ordering::Acquire);
        let target = if count_from_now {
            now.saturating_add(n)
        } else {
            n
        };
        if target < now {
            return Err(Error::InvalidArgument(format!(
                "close_after_n_recv({n}): {now} receives already completed"
            )));
        }
        self.shared.close_after.store(target, Ordering::Release);
        if target == now {
            self.shared
                .start_close(&mut self.shared.worker.lock(), false);
        }
        Ok(())
    }

    /// UCX's description of this endpoint: its lanes and the transports they use
    /// (`ucp_ep_print_info`).
    pub fn transports(&self) -> Result<String> {
        let locked = self.shared.worker.lock();
        let ep = self.shared.live(&locked)?;
        crate::context::capture_file(|f| {
            // SAFETY: ep is live under the worker lock; f is an open stream.
            unsafe { sys::ucp_ep_print_info(ep, f) }
        })
    }

    /// Flushes outstanding sends, then closes. Pending receives fail with [`Error::Closed`].
    pub async fn close(&self) -> Result<()> {
        let op = self
            .shared
            .start_close(&mut self.shared.worker.lock(), false);
        if let Some(op) = op {
            crate::request::wait(&op, &self.shared.worker).await;
            let c = op.completion();
            if c.status != sys::UCS_OK && c.status != sys::UCS_ERR_CANCELED {
                tracing::debug!(status = %Status(c.status), "endpoint close completed with error");
                return Err(Error::Ucx(Status(c.status)));
            }
        }
        tracing::debug!(peer = ?self.shared.peer, "endpoint closed");
        Ok(())
    }

    /// Closes at once without flushing; outstanding operations fail.
    pub fn abort(&self) {
        let mut locked = self.shared.worker.lock();
        self.shared.start_close(&mut locked, true);
        tracing::debug!(peer = ?self.shared.peer, "endpoint aborted");
    }

    /// Whether the endpoint was closed locally or failed.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire) || self.shared.failure().is_some()
    }

    /// The error that closed the endpoint from the peer's side, if any.
    pub fn peer_error(&self) -> Option<Error> {
        self.shared.failure()
    }

    /// Calls `f` once when the endpoint closes: with `None` for a local close, or the error
    /// when the peer failed or closed. Called at once if it is already closed.
    pub fn on_close(&self, f: impl FnOnce(Option<Error>) + Send + 'static) {
        // Under the worker lock, so that a close or failure cannot slip between the check
        // and the store (callbacks and closes run under it too).
        let locked = self.shared.worker.lock();
        if !self.is_closed() {
            *self
                .shared
                .on_close
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(Box::new(f));
            return;
        }
        drop(locked);
        f(self.shared.failure());
    }

    /// The peer's socket address, when known.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.shared.peer
    }

    /// The raw UCP tags this endpoint sends to and receives on (UCXX's `msg_send`/`msg_recv`).
    pub fn raw_tags(&self) -> (u64, u64) {
        (self.send_base, self.recv_base)
    }

    /// The worker this endpoint lives on.
    pub fn worker(&self) -> Worker {
        Worker {
            shared: Arc::clone(&self.shared.worker),
        }
    }
}

fn handshake_error(step: &str, e: Error) -> Error {
    match e {
        // A peer that is unreachable or refused is reported as the UCX error it is.
        Error::Ucx(s)
            if step == "receiving"
                && matches!(s.0, sys::UCS_ERR_UNREACHABLE | sys::UCS_ERR_REJECTED) =>
        {
            e
        }
        e => Error::Handshake(format!("{step} the handshake: {e}")),
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let op = self
            .shared
            .start_close(&mut self.shared.worker.lock(), false);
        // A polling worker has no background progress: finish the close here, bounded.
        if let (Some(op), ProgressMode::Polling) = (op, self.shared.worker.mode()) {
            let deadline = Instant::now() + Duration::from_millis(500);
            while !op.is_done() && Instant::now() < deadline {
                self.shared.worker.lock().progress();
            }
        }
    }
}

/// Finishes a staged receive: copies what arrived in pinned memory into the device buffer.
#[cfg(feature = "cuda")]
pub(crate) fn unstaged<B: IoBufMut>(
    r: Result<usize>,
    mut buf: B,
    pinned: &crate::cuda::Pinned,
) -> (Result<usize>, B) {
    let r = r.and_then(|n| crate::cuda::unstage(&mut buf, pinned.filled()).map(|()| n));
    (r, buf)
}
