//! UCX requests as futures: per-operation state shared with UCX's completion callbacks, and the
//! guard that keeps a buffer alive until UCX is done with it even when the future is dropped.
//!
//! Ownership protocol (the one unsafe contract of the crate, see DESIGN.md rule 1):
//! * Posting an operation hands one strong `Arc<OpCore>` reference to UCX through `user_data`
//!   (`Arc::into_raw`). Exactly one of two things gives it back: the completion callback
//!   (`Arc::from_raw` there), or, when UCX completes the operation immediately and will never call
//!   the callback, the poster.
//! * The completion callback frees the UCX request (`ucp_request_free`) and marks the operation
//!   done. Callbacks run only inside UCX calls made while the worker lock is held, so "not done,
//!   checked under the lock" means the request pointer is still valid.
//! * An [`InFlight`] guard owns the buffer. Dropped before completion, it cancels a receive and
//!   parks the buffer inside the `OpCore`, which UCX's reference keeps alive until the callback.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::c_void;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskCx, Poll, Waker};

use futures::task::AtomicWaker;
use ucx_sys as sys;

use crate::worker::{Locked, ProgressMode, WorkerShared};

/// What a finished operation reported.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completion {
    pub status: sys::ucs_status_t,
    /// Received length (receives only).
    pub length: usize,
    /// The sender's raw tag (tag receives only).
    pub sender_tag: u64,
}

thread_local! {
    /// On a thread-mode worker's progress thread: tasks to wake once it has let go of the
    /// worker's lock ([`wake_deferred`], from `Locked`'s drop). Woken under the lock, a task
    /// on another thread runs at once (on a shared CPU, the kernel preempts the progress
    /// thread for it), reaches for the lock, and sleeps on it until the progress thread lets
    /// go: two more switches and two system calls per message.
    static DEFERRED_WAKES: RefCell<Option<Vec<Waker>>> = const { RefCell::new(None) };
}

/// From now on, what UCX's callbacks wake on this thread ([`wake_or_defer`]) is woken only at
/// [`wake_deferred`] (the progress thread of a thread-mode worker).
pub(crate) fn defer_wakes_on_this_thread() {
    DEFERRED_WAKES.with(|d| *d.borrow_mut() = Some(Vec::new()));
}

/// Wakes `waker` now or, on a thread that defers wakes, at its next [`wake_deferred`]. For
/// every wake from under the worker's lock (UCX's callbacks, the progress that follows them).
pub(crate) fn wake_or_defer(waker: Waker) {
    let now = DEFERRED_WAKES.with(|d| match d.borrow_mut().as_mut() {
        Some(deferred) => {
            deferred.push(waker);
            None
        }
        None => Some(waker),
    });
    if let Some(waker) = now {
        waker.wake();
    }
}

/// Wakes what [`wake_or_defer`] deferred on this thread; nothing on threads that do not defer.
pub(crate) fn wake_deferred() {
    DEFERRED_WAKES.with(|d| {
        let mut wakers = match d.borrow_mut().as_mut() {
            Some(deferred) if !deferred.is_empty() => std::mem::take(deferred),
            _ => return,
        };
        for waker in wakers.drain(..) {
            waker.wake();
        }
        // The vector goes back for the next call (no allocation per message).
        if let Some(deferred) = d.borrow_mut().as_mut() {
            if deferred.is_empty() {
                *deferred = wakers;
            }
        }
    });
}

/// State of one operation, shared between its future and UCX's callback.
#[derive(Default)]
pub(crate) struct OpCore {
    done: AtomicBool,
    status: AtomicI32,
    length: AtomicUsize,
    sender_tag: AtomicU64,
    req: AtomicPtr<c_void>,
    /// Batches ([`post_sends`], [`post_recvs`]): the parts not yet finished, plus one while
    /// posting. Read and written under the worker lock only.
    remaining: AtomicUsize,
    waker: AtomicWaker,
    parked: Mutex<Option<Box<dyn Any + Send>>>,
}

impl OpCore {
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    pub(crate) fn completion(&self) -> Completion {
        Completion {
            status: self.status.load(Ordering::Relaxed) as sys::ucs_status_t,
            length: self.length.load(Ordering::Relaxed),
            sender_tag: self.sender_tag.load(Ordering::Relaxed),
        }
    }

    fn finish(&self, status: sys::ucs_status_t, length: usize, sender_tag: u64) {
        self.status.store(i32::from(status), Ordering::Relaxed);
        self.length.store(length, Ordering::Relaxed);
        self.sender_tag.store(sender_tag, Ordering::Relaxed);
        self.done.store(true, Ordering::Release);
        self.wake();
    }

    /// Wakes the operation's task, if it waits ([`wake_or_defer`]).
    fn wake(&self) {
        if let Some(waker) = self.waker.take() {
            wake_or_defer(waker);
        }
    }

    /// One part of a batch finished: the batch keeps its first failure, and is done when its
    /// last part is (returns true then). Called with the worker locked only (by the poster, and
    /// by UCX's callbacks, which run under the lock), so `remaining` needs no atomic
    /// read-modify-write.
    fn part_done(&self, status: sys::ucs_status_t) -> bool {
        if status != sys::UCS_OK {
            let _ = self.status.compare_exchange(
                sys::UCS_OK as i32,
                i32::from(status),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        let left = self.remaining.load(Ordering::Relaxed) - 1;
        self.remaining.store(left, Ordering::Relaxed);
        if left == 0 {
            self.done.store(true, Ordering::Release);
            self.wake();
        }
        left == 0
    }

    /// Keeps `value` alive until the operation completes (it is dropped with the last reference).
    pub(crate) fn park(&self, value: Box<dyn Any + Send>) {
        let mut slot = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(value);
    }

    /// Cancels the operation if it is still in flight. Must be called with the worker locked.
    pub(crate) fn cancel(&self, locked: &Locked<'_>) {
        if !self.is_done() {
            let req = self.req.load(Ordering::Relaxed);
            if !req.is_null() {
                // SAFETY: the operation is not done, checked under the worker lock that every
                // callback also runs under, so UCX has not freed `req` yet.
                unsafe { sys::ucp_request_cancel(locked.handle(), req) };
            }
        }
    }
}

/// An operation in flight that an ending endpoint cancels.
pub(crate) trait Cancel: Send + Sync {
    /// What completes (and keeps parked buffers) for it.
    fn core(&self) -> &OpCore;
    /// Whether it finished.
    fn is_done(&self) -> bool {
        self.core().is_done()
    }
    /// Cancels what is still in flight. Must be called with the worker locked.
    fn cancel(&self, locked: &Locked<'_>);
}

impl Cancel for OpCore {
    fn core(&self) -> &OpCore {
        self
    }
    fn cancel(&self, locked: &Locked<'_>) {
        OpCore::cancel(self, locked)
    }
}

/// One receive of a [`RecvBatch`]; UCX's `user_data` points at it.
#[derive(Default)]
struct RecvSlot {
    /// The batch, which holds this slot (set before the receive is posted).
    owner: AtomicPtr<RecvBatch>,
    done: AtomicBool,
    status: AtomicI32,
    length: AtomicUsize,
    req: AtomicPtr<c_void>,
}

/// Tag receives posted as one ([`post_recvs`]): one allocation for the batch, one
/// completion (`core` is done when every receive is), each receive's outcome in its slot.
pub(crate) struct RecvBatch {
    core: OpCore,
    slots: Box<[RecvSlot]>,
}

impl RecvBatch {
    /// How receive `i` ended (once the batch is done).
    pub(crate) fn completion(&self, i: usize) -> Completion {
        let s = &self.slots[i];
        Completion {
            status: s.status.load(Ordering::Relaxed) as sys::ucs_status_t,
            length: s.length.load(Ordering::Relaxed),
            sender_tag: 0,
        }
    }
}

impl Cancel for RecvBatch {
    fn core(&self) -> &OpCore {
        &self.core
    }
    fn cancel(&self, locked: &Locked<'_>) {
        for s in self.slots.iter() {
            if s.done.load(Ordering::Acquire) {
                continue;
            }
            let req = s.req.load(Ordering::Relaxed);
            if !req.is_null() {
                // SAFETY: the receive is not done, checked under the worker lock that every
                // callback also runs under, so UCX has not freed `req` yet.
                unsafe { sys::ucp_request_cancel(locked.handle(), req) };
            }
        }
    }
}

/// Posts `n` tag receives as one batch: `post(i, param)` makes the `i`th UCX call, in order,
/// with the prepared parameters. Immediate completion is denied (as for every tag receive, see
/// [`ImmediateInfo::for_tag`]), so each receive reports through its slot.
pub(crate) fn post_recvs(
    locked: &Locked<'_>,
    memory_type: sys::ucs_memory_type_t,
    n: usize,
    mut post: impl FnMut(usize, &mut sys::ucp_request_param_t) -> sys::ucs_status_ptr_t,
) -> Arc<RecvBatch> {
    let batch = Arc::new(RecvBatch {
        core: OpCore::default(),
        slots: (0..n).map(|_| RecvSlot::default()).collect(),
    });
    // Every receive, plus the poster's own part. UCX holds one reference for the whole
    // batch, given back by whoever finishes its last part.
    batch.core.remaining.store(n + 1, Ordering::Relaxed);
    let hold = Arc::into_raw(Arc::clone(&batch));
    let mut in_flight = false;
    for (i, slot) in batch.slots.iter().enumerate() {
        slot.owner.store(hold.cast_mut(), Ordering::Relaxed);
        let mut param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
                | sys::UCP_OP_ATTR_FIELD_USER_DATA
                | sys::UCP_OP_ATTR_FIELD_MEMORY_TYPE
                | sys::UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
            user_data: (slot as *const RecvSlot).cast_mut().cast(),
            memory_type,
            ..Default::default()
        };
        param.cb.recv = Some(batch_recv_cb);
        let ret = post(i, &mut param);
        // SAFETY: UCS_PTR_* only inspect the pointer value.
        if unsafe { sys::ucxrs_ptr_is_ptr(ret) } != 0 {
            slot.req.store(ret, Ordering::Relaxed);
            in_flight = true;
            continue;
        }
        // Refused at once: no callback will come. Not the last part (the poster's is left).
        // SAFETY: only inspects the value.
        let status = unsafe { sys::ucxrs_ptr_status(ret) };
        slot.finish(status, 0);
        batch.core.part_done(status);
    }
    if in_flight {
        locked.posted();
    }
    if batch.core.part_done(sys::UCS_OK) {
        // SAFETY: the batch's last part finished here, so no callback will use UCX's
        // reference: it comes back, once.
        drop(unsafe { Arc::from_raw(hold) });
    }
    batch
}

impl RecvSlot {
    fn finish(&self, status: sys::ucs_status_t, length: usize) {
        self.status.store(i32::from(status), Ordering::Relaxed);
        self.length.store(length, Ordering::Relaxed);
        self.done.store(true, Ordering::Release);
    }
}

/// Which completion callback an operation uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CbKind {
    /// `ucp_send_nbx_callback_t` (sends, close, flush).
    Send,
    /// `ucp_tag_recv_nbx_callback_t`.
    TagRecv,
    /// `ucp_stream_recv_nbx_callback_t`.
    StreamRecv,
    /// `ucp_am_recv_data_nbx_callback_t` (same shape as the stream one).
    AmRecv,
}

/// The outcome of posting an operation.
pub(crate) enum Posted {
    /// UCX finished (or failed) it before returning; no callback will come.
    Done(Completion),
    /// In flight; the `OpCore` completes through the callback.
    Pending(Arc<OpCore>),
}

/// Posts one NBX operation. `post` receives the prepared parameters (callback, user data and the
/// memory type set) and must make exactly one UCX `*_nbx` call, returning its result.
/// `imm` holds what an immediately-completed receive reported through `recv_info`.
pub(crate) fn post(
    locked: &Locked<'_>,
    kind: CbKind,
    memory_type: Option<sys::ucs_memory_type_t>,
    post: impl FnOnce(&mut sys::ucp_request_param_t, &mut ImmediateInfo) -> sys::ucs_status_ptr_t,
) -> Posted {
    // The state UCX did not use last time (an operation it completed at once), if any: small
    // sends usually complete at once, and then cost no allocation.
    let op = locked
        .spare_op()
        .take()
        .unwrap_or_else(|| Arc::new(OpCore::default()));
    debug_assert!(!op.is_done() && op.req.load(Ordering::Relaxed).is_null());
    let user_data = Arc::into_raw(Arc::clone(&op)) as *mut c_void;
    let mut param = sys::ucp_request_param_t {
        op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA,
        user_data,
        ..Default::default()
    };
    match kind {
        CbKind::Send => param.cb.send = Some(send_cb),
        CbKind::TagRecv => param.cb.recv = Some(tag_recv_cb),
        CbKind::StreamRecv => param.cb.recv_stream = Some(stream_recv_cb),
        CbKind::AmRecv => param.cb.recv_am = Some(stream_recv_cb),
    }
    if let Some(mt) = memory_type {
        param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        param.memory_type = mt;
    }
    let mut imm = ImmediateInfo::default();
    let ret = post(&mut param, &mut imm);
    // SAFETY: UCS_PTR_* only inspect the pointer value.
    let is_ptr = unsafe { sys::ucxrs_ptr_is_ptr(ret) } != 0;
    if is_ptr {
        op.req.store(ret, Ordering::Relaxed);
        locked.posted();
        Posted::Pending(op)
    } else {
        // SAFETY: UCX completed immediately and will not call the callback, so the reference
        // handed out through user_data comes back here, exactly once.
        drop(unsafe { Arc::from_raw(user_data as *const OpCore) });
        // Untouched (no callback came, nothing waited on it) and nobody else's: as new.
        // (Always so here; checked rather than assumed.)
        let mut op = op;
        if Arc::get_mut(&mut op).is_some() {
            locked.spare_op().set(Some(op));
        }
        // SAFETY: as above, only inspects the value.
        let status = unsafe { sys::ucxrs_ptr_status(ret) };
        Posted::Done(Completion {
            status,
            length: imm.length.max(imm.tag.length),
            sender_tag: imm.tag.sender_tag,
        })
    }
}

/// Posts `n` send-type operations as one: `post(i, param)` makes the `i`th UCX call, in order,
/// with the prepared parameters. All share one `OpCore`, of which UCX holds one reference for
/// the whole batch, given back by whoever finishes its last part; sends that complete at once
/// cost no allocation and no atomic read-modify-write. The batch is done when the last send
/// is, with the first failure as its status. Posting stops at the first send that fails at
/// once (later ones are not posted).
pub(crate) fn post_sends(
    locked: &Locked<'_>,
    memory_type: sys::ucs_memory_type_t,
    n: usize,
    mut post: impl FnMut(usize, &mut sys::ucp_request_param_t) -> sys::ucs_status_ptr_t,
) -> Posted {
    let op = Arc::new(OpCore::default());
    // Every send, plus the poster's own part: the batch cannot finish while it is posted.
    op.remaining.store(n + 1, Ordering::Relaxed);
    let hold = Arc::into_raw(Arc::clone(&op));
    let mut posted = 0;
    let mut in_flight = false;
    for i in 0..n {
        let mut param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
                | sys::UCP_OP_ATTR_FIELD_USER_DATA
                | sys::UCP_OP_ATTR_FIELD_MEMORY_TYPE,
            user_data: hold.cast_mut().cast(),
            memory_type,
            ..Default::default()
        };
        param.cb.send = Some(batch_send_cb);
        let ret = post(i, &mut param);
        posted += 1;
        // SAFETY: UCS_PTR_* only inspect the pointer value.
        if unsafe { sys::ucxrs_ptr_is_ptr(ret) } != 0 {
            in_flight = true;
            continue;
        }
        // SAFETY: as above, only inspects the value.
        let status = unsafe { sys::ucxrs_ptr_status(ret) };
        // Completed at once: no callback will come. Not the last part (the poster's is left).
        op.part_done(status);
        if status != sys::UCS_OK {
            break;
        }
    }
    // Sends never posted are finished too (the poster's part is left: not the last).
    let left = op.remaining.load(Ordering::Relaxed) - (n - posted);
    op.remaining.store(left, Ordering::Relaxed);
    if in_flight {
        locked.posted();
    }
    if op.part_done(sys::UCS_OK) {
        // SAFETY: the batch's last part finished here, so no callback will use UCX's
        // reference: it comes back, once.
        drop(unsafe { Arc::from_raw(hold) });
        return Posted::Done(op.completion());
    }
    Posted::Pending(op)
}

/// Out-parameters UCX fills when a receive completes immediately.
#[derive(Default)]
pub(crate) struct ImmediateInfo {
    pub tag: sys::ucp_tag_recv_info_t,
    pub length: usize,
}

impl ImmediateInfo {
    /// Prepares a tag receive (`ucp_tag_recv_nbx`/`ucp_tag_msg_recv_nbx`) so its length is
    /// always known. UCX 1.13 does not fill `recv_info` when a receive completes immediately
    /// from the unexpected queue (measured: length 0), so immediate completion is denied and
    /// the length always arrives through the callback, which UCX then calls before returning.
    pub(crate) fn for_tag(&mut self, param: &mut sys::ucp_request_param_t) {
        param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_RECV_INFO | sys::UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        param.recv_info.tag_info = &mut self.tag;
    }

    /// Where `ucp_stream_recv_nbx` writes the length of an immediately completed receive.
    pub(crate) fn stream_length(&mut self) -> *mut usize {
        &mut self.length
    }
}

/// Completes the operation behind `user_data` and frees the UCX request.
///
/// # Safety
/// `user_data` must be the pointer `post` produced with `Arc::into_raw`, not yet reclaimed, and
/// `request` a live UCX request; called by UCX under the worker lock.
unsafe fn complete(
    request: *mut c_void,
    user_data: *mut c_void,
    status: sys::ucs_status_t,
    length: usize,
    sender_tag: u64,
) {
    // SAFETY: per this function's contract, user_data carries one strong reference for us.
    let op = unsafe { Arc::from_raw(user_data as *const OpCore) };
    // SAFETY: the request is live and nobody uses it after this (the op is marked done below,
    // under the same lock).
    unsafe { sys::ucp_request_free(request) };
    op.finish(status, length, sender_tag);
}

unsafe extern "C" fn send_cb(
    request: *mut c_void,
    status: sys::ucs_status_t,
    user_data: *mut c_void,
) {
    // SAFETY: UCX passes back the user_data `post` registered for this request.
    unsafe { complete(request, user_data, status, 0, 0) }
}

unsafe extern "C" fn batch_send_cb(
    request: *mut c_void,
    status: sys::ucs_status_t,
    user_data: *mut c_void,
) {
    let raw = user_data as *const OpCore;
    // SAFETY: user_data is the batch `post_sends` registered, kept alive by UCX's reference
    // until its last part finishes.
    let op = unsafe { &*raw };
    // SAFETY: the request is live and nobody uses it after this.
    unsafe { sys::ucp_request_free(request) };
    if op.part_done(status) {
        // SAFETY: the last part finished: UCX's reference comes back, once.
        drop(unsafe { Arc::from_raw(raw) });
    }
}

unsafe extern "C" fn batch_recv_cb(
    request: *mut c_void,
    status: sys::ucs_status_t,
    info: *const sys::ucp_tag_recv_info_t,
    user_data: *mut c_void,
) {
    // SAFETY: user_data is a slot `post_recvs` registered, inside a batch kept alive by UCX's
    // reference until its last part finishes.
    let slot = unsafe { &*(user_data as *const RecvSlot) };
    let owner = slot.owner.load(Ordering::Relaxed).cast_const();
    // SAFETY: as above.
    let batch = unsafe { &*owner };
    // SAFETY: when non-null, UCX's info points to a valid record for the duration of the call.
    let length = unsafe { info.as_ref() }.map_or(0, |i| i.length);
    // SAFETY: the request is live and nobody uses it after this (the slot is marked done
    // below, under the same lock).
    unsafe { sys::ucp_request_free(request) };
    slot.finish(status, length);
    if batch.core.part_done(sys::UCS_OK) {
        // SAFETY: the last part finished: UCX's reference comes back, once.
        drop(unsafe { Arc::from_raw(owner) });
    }
}

unsafe extern "C" fn tag_recv_cb(
    request: *mut c_void,
    status: sys::ucs_status_t,
    info: *const sys::ucp_tag_recv_info_t,
    user_data: *mut c_void,
) {
    // SAFETY: when non-null, UCX's info points to a valid record for the duration of the call.
    let (length, tag) = unsafe { info.as_ref() }.map_or((0, 0), |i| (i.length, i.sender_tag));
    // SAFETY: UCX passes back the user_data `post` registered for this request.
    unsafe { complete(request, user_data, status, length, tag) }
}

unsafe extern "C" fn stream_recv_cb(
    request: *mut c_void,
    status: sys::ucs_status_t,
    length: usize,
    user_data: *mut c_void,
) {
    // SAFETY: UCX passes back the user_data `post` registered for this request.
    unsafe { complete(request, user_data, status, length, 0) }
}

/// Owns an in-flight operation's buffer until the operation completes; see the module docs.
/// `T` is the operation: one ([`OpCore`]) or a batch of receives ([`RecvBatch`]).
pub(crate) struct InFlight<'w, B: Send + 'static, T: Cancel + ?Sized = OpCore> {
    op: Arc<T>,
    buf: Option<B>,
    worker: &'w WorkerShared,
    cancel_on_drop: bool,
}

impl<'w, B: Send + 'static, T: Cancel + ?Sized> InFlight<'w, B, T> {
    pub(crate) fn new(op: Arc<T>, buf: B, worker: &'w WorkerShared, cancel_on_drop: bool) -> Self {
        InFlight {
            op,
            buf: Some(buf),
            worker,
            cancel_on_drop,
        }
    }

    /// Waits for completion, then takes the buffer back.
    async fn take_when_done(&mut self) -> B {
        wait(self.op.core(), self.worker).await;
        self.buf.take().expect("buffer present until finish")
    }

    /// Waits for completion and gives the operation and the buffer back.
    pub(crate) async fn done(mut self) -> (Arc<T>, B) {
        let buf = self.take_when_done().await;
        (Arc::clone(&self.op), buf)
    }
}

impl<B: Send + 'static, T: Cancel + ?Sized> Drop for InFlight<'_, B, T> {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        if self.op.is_done() {
            return;
        }
        let locked = self.worker.lock();
        if self.op.is_done() {
            return;
        }
        tracing::trace!("operation dropped in flight: parking its buffer until UCX completes it");
        self.op.core().park(Box::new(buf));
        if self.cancel_on_drop {
            self.op.cancel(&locked);
        }
    }
}

/// Waits until `op` is done, progressing the worker itself in polling mode.
pub(crate) fn wait<'a>(op: &'a OpCore, worker: &'a WorkerShared) -> Wait<'a> {
    Wait {
        op,
        worker,
        state: WaitState::default(),
    }
}

pub(crate) struct Wait<'a> {
    op: &'a OpCore,
    worker: &'a WorkerShared,
    state: WaitState,
}

impl Future for Wait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<()> {
        let this = self.get_mut();
        this.state.poll(this.op, this.worker, cx)
    }
}

/// Where a wait for an operation stands between polls.
#[derive(Default)]
pub(crate) struct WaitState {
    /// Whether this wait was polled before (polling mode).
    polled: bool,
    /// When this wait began progressing an assisting worker itself (`WorkerShared::assists`).
    assisting_since: Option<std::time::Instant>,
    /// Done assisting (or never did): waiting for the progress engine to wake this future.
    parked: bool,
    /// A blocking-mode wait's part in [`crate::worker::SoleWait`].
    sole: Option<SoleToken>,
}

/// A blocking-mode wait's part in [`crate::worker::SoleWait`]: released when the wait ends
/// or is dropped.
struct SoleToken {
    sole: Arc<crate::worker::SoleWait>,
    /// Polls this wait has assisted in (each a return to the runtime that skips its I/O
    /// driver and the tasks woken from other threads).
    polls: u32,
    assisting: bool,
    parked: bool,
}

impl SoleToken {
    fn new(sole: &Arc<crate::worker::SoleWait>) -> Self {
        SoleToken {
            sole: Arc::clone(sole),
            polls: 0,
            assisting: false,
            parked: false,
        }
    }

    /// Whether this wait may progress the worker itself now (taking the assist if free).
    fn may_assist(&mut self, worker: &WorkerShared) -> bool {
        if self.sole.parked.load(Ordering::Acquire) != 0
            || worker.is_sleeping()
            || self.polls >= SOLE_POLLS
        {
            return false;
        }
        if !self.assisting {
            if self
                .sole
                .assisting
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return false;
            }
            self.assisting = true;
        }
        self.polls += 1;
        true
    }

    /// This wait parks: it stops assisting and counts as parked.
    fn park(&mut self) {
        if std::mem::take(&mut self.assisting) {
            self.sole.assisting.store(false, Ordering::Release);
        }
        if !self.parked {
            self.parked = true;
            self.sole.parked.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Drop for SoleToken {
    fn drop(&mut self) {
        if self.assisting {
            self.sole.assisting.store(false, Ordering::Release);
        }
        if self.parked {
            self.sole.parked.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Waits for a posted operation and gives its buffer back with how it ended: what
/// [`crate::ops::complete`] returns. A plain future rather than an `async fn` (which keeps a
/// copy of its arguments beside each future it awaits): every send and receive holds one,
/// and moves it while it is being set up.
pub(crate) enum Complete<'w, B: Send + 'static> {
    /// Finished when posted (taken by the first poll).
    Done(Option<(Completion, B)>),
    /// In flight: the guard owns the buffer until the operation completes.
    InFlight(InFlight<'w, B>, WaitState),
}

// Nothing in a `Complete` is ever pinned: the buffer is moved out of it once done (an
// `InFlight` dropped before that parks it in the operation, as ever).
impl<B: Send + 'static> Unpin for Complete<'_, B> {}

impl<B: Send + 'static> Future for Complete<'_, B> {
    type Output = (Completion, B);
    fn poll(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<(Completion, B)> {
        match self.get_mut() {
            Complete::Done(done) => Poll::Ready(done.take().expect("polled after completion")),
            Complete::InFlight(guard, state) => {
                std::task::ready!(state.poll(&guard.op, guard.worker, cx));
                let buf = guard.buf.take().expect("polled after completion");
                Poll::Ready((guard.op.completion(), buf))
            }
        }
    }
}

/// Polls a blocking-mode sole wait assists in before it parks.
const SOLE_POLLS: u32 = 4;

/// Progress calls a polling-mode wait makes per poll (after its first) before it yields.
const SPIN: usize = 8;

impl WaitState {
    /// One poll of a wait that progresses the worker itself: up to [`SPIN`] progress calls
    /// (none on its first poll, which only yields), then done, or rescheduled.
    fn progress_here(
        &mut self,
        op: &OpCore,
        worker: &WorkerShared,
        cx: &mut TaskCx<'_>,
    ) -> Poll<()> {
        if self.polled {
            let mut locked = worker.lock();
            for _ in 0..SPIN {
                locked.progress();
                if op.is_done() {
                    break;
                }
            }
        }
        self.polled = true;
        if op.is_done() {
            self.sole = None;
            return Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn poll(&mut self, op: &OpCore, worker: &WorkerShared, cx: &mut TaskCx<'_>) -> Poll<()> {
        if op.is_done() {
            if let (true, Some(since)) = (self.parked, self.assisting_since) {
                // Parked, yet done soon (wake-ups included): the next wait assists again.
                worker.set_hot(since.elapsed() < 2 * crate::worker::ASSIST);
            }
            self.sole = None;
            return Poll::Ready(());
        }
        if worker.mode() == ProgressMode::Polling {
            // A few progress calls per poll (SPIN), then yield: each return to the runtime
            // and back through the caller's futures costs more than a progress call, but a
            // long spin would delay sibling futures (in a `join!` the send is posted only
            // after the receive's poll returns: 18 us instead of 1.1 us per 8 B round trip
            // with 64 spins on the first poll). Measured A/B of 8 rather than 1 (one host,
            // 8 B, 5 interleaved rounds): ucx-rs 0.45-0.50 -> 0.41-0.43 us, transport
            // `ucx://` 0.67 -> 0.63 us; the message rate of 64 sends in flight unchanged.
            //
            // The first poll only yields: in a `join!(recv, send)` the send is then posted
            // before the receive's first progress call. Measured A/B (3 interleaved rounds,
            // 8 B ping-pong): client-server 1.30 -> 0.97 us, direct 0.42 -> 0.39 us; the
            // cost is the 8 B message rate on client-server endpoints, 3.5 -> 2.35 M/s
            // (direct endpoints unchanged at 3.7 M/s).
            return self.progress_here(op, worker, cx);
        }
        if worker.assists() && !self.parked {
            // A thread-mode worker on a lone CPU: progress here for a while rather than wait
            // for the progress thread to wake this task (a switch between the two threads on
            // that CPU per message). Only while waits end soon (`WorkerShared::hot`). The
            // first poll only yields, as in polling mode.
            let since = *self
                .assisting_since
                .get_or_insert_with(std::time::Instant::now);
            if worker.hot() && since.elapsed() < crate::worker::ASSIST {
                if self.polled {
                    worker.try_progress();
                }
                self.polled = true;
                if op.is_done() {
                    return Poll::Ready(());
                }
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // Parking: waits that outlast the assist stop assisting. If this task progressed
            // the worker, the progress thread may have armed the event fd and gone to sleep
            // before those calls: wake it to progress and arm afresh.
            self.parked = true;
            if self.polled {
                worker.set_hot(false);
                worker.wake_progress();
            }
        }
        if let (Some(sole), false) = (worker.sole(), self.parked) {
            // A blocking worker's sole wait: progress here in the progress task's place while
            // no other wait is parked (`SoleWait`). The first poll only yields, as in polling
            // mode.
            let token = self.sole.get_or_insert_with(|| SoleToken::new(sole));
            if token.may_assist(worker) {
                return self.progress_here(op, worker, cx);
            }
            token.park();
            self.parked = true;
            worker.wake_progress();
        }
        op.waker.register(cx.waker());
        if op.is_done() {
            self.sole = None;
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, Worker};

    /// A blocking worker's sole-wait bookkeeping: one wait assists at a time, for at most
    /// `SOLE_POLLS` polls, none while another wait is parked, and a wait that parks, ends or
    /// is dropped gives back what it held.
    #[tokio::test]
    async fn the_sole_wait_assists_alone_and_gives_back_what_it_held() {
        let ctx = Context::new().unwrap();
        let worker = Worker::new(&ctx, ProgressMode::Blocking).unwrap();
        let shared = &worker.shared;
        let sole = shared.sole().expect("blocking on a current-thread runtime");
        // Nothing below awaits, so the progress task (spawned on this thread) has not run:
        // it is awake, and stays so.
        assert!(!shared.is_sleeping());

        let mut first = SoleToken::new(sole);
        let mut second = SoleToken::new(sole);
        assert!(first.may_assist(shared));
        assert!(sole.assisting.load(Ordering::Acquire));
        assert!(!second.may_assist(shared), "one wait assists at a time");
        // The first parks: it stops assisting, and while it is parked no wait assists.
        first.park();
        assert!(!sole.assisting.load(Ordering::Acquire));
        assert_eq!(sole.parked.load(Ordering::Acquire), 1);
        assert!(!second.may_assist(shared), "another wait is parked");
        drop(first);
        assert_eq!(sole.parked.load(Ordering::Acquire), 0);
        // Now the second may, for SOLE_POLLS polls in all; then it parks.
        for _ in 0..SOLE_POLLS {
            assert!(second.may_assist(shared));
        }
        assert!(!second.may_assist(shared), "its polls are spent");
        second.park();
        assert!(!sole.assisting.load(Ordering::Acquire));
        drop(second);
        assert_eq!(sole.parked.load(Ordering::Acquire), 0);
        // A wait dropped while it assists gives the assist back.
        let mut third = SoleToken::new(sole);
        assert!(third.may_assist(shared));
        drop(third);
        assert!(!sole.assisting.load(Ordering::Acquire));
        assert!(SoleToken::new(sole).may_assist(shared));
    }
}
