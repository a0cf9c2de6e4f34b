//! The UCP worker and its three progress modes.
//!
//! Every call into a worker (and into its endpoints and listeners) is serialised by one mutex
//! (`UCS_THREAD_MODE_SERIALIZED`), so all handles are `Send + Sync` and usable from a
//! multi-threaded runtime. UCX's callbacks run inside those locked calls and only record
//! completion and wake tasks; work that must call back into UCX (cancelling the receives of a
//! failed endpoint) or user code (close callbacks) is deferred until after the call.

use std::ffi::c_void;
use std::fmt;
use std::os::fd::OwnedFd;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use ucx_sys as sys;

use std::collections::HashMap;

use crate::am::{AmAllocator, AmQueue, HostAllocator};
use crate::buffer::MemoryType;
use crate::context::{capture_file, Context, Features};
use crate::endpoint::EpShared;
use crate::error::{check, Error, Result};
use crate::listener::{Parked, Reap};
use crate::progress::{alone_on_a_cpu, blocking_progress, event_fd, thread_progress, OrphanGuard};
pub(crate) use crate::progress::{SoleWait, ASSIST};

/// How a worker makes progress. Pick per worker; see the README for measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressMode {
    /// Futures progress the worker themselves whenever polled and re-schedule themselves: the
    /// lowest latency, one core busy while anything is pending. Nothing progresses while no
    /// future of this worker is being polled.
    Polling,
    /// A tokio task sleeps on the worker's event fd (`ucp_worker_get_efd` + `ucp_worker_arm` +
    /// `AsyncFd`) and progresses when UCX signals: near-zero CPU when idle. Needs a tokio runtime.
    #[default]
    Blocking,
    /// A dedicated OS thread owns progress (spinning briefly, then sleeping on the event fd);
    /// futures only wait. Works under any executor and any number of runtime threads. In a
    /// process allowed a single CPU (`taskset -c N`), where the thread's spin would keep the
    /// CPU from the task it just woke, it yields the CPU between progress calls instead.
    Thread,
    /// Another event loop drives the worker, as UCXX's blocking mode drives its worker from
    /// asyncio: it watches [`Worker::event_fd`] and calls [`Worker::progress_and_arm`] when
    /// the fd is readable, until that returns `true`. Futures only wait, as in `Thread` mode;
    /// an operation posted while the loop sleeps signals the fd (`ucp_worker_signal`). No
    /// thread and no runtime of its own.
    External,
}

impl std::str::FromStr for ProgressMode {
    type Err = Error;

    /// `polling`, `blocking`, `thread` or `external`.
    ///
    /// ```
    /// assert_eq!("thread".parse::<ucx::ProgressMode>().unwrap(), ucx::ProgressMode::Thread);
    /// assert!("spin".parse::<ucx::ProgressMode>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "polling" => Ok(ProgressMode::Polling),
            "blocking" => Ok(ProgressMode::Blocking),
            "thread" => Ok(ProgressMode::Thread),
            "external" => Ok(ProgressMode::External),
            _ => Err(Error::InvalidArgument(format!(
                "progress mode {s:?}: expected polling, blocking, thread or external"
            ))),
        }
    }
}

pub(crate) struct RawWorker {
    handle: sys::ucp_worker_h,
    /// `ucp_worker_progress` calls so far (see [`Locked::progress_calls`]).
    progress_calls: u64,
    /// An operation's state that UCX never saw used (it completed the operation at once):
    /// the next operation posted takes it instead of allocating ([`Locked::spare_op`]).
    spare_op: std::cell::Cell<Option<Arc<crate::request::OpCore>>>,
}

// SAFETY: the raw worker is only reachable through WorkerShared's mutex, which serialises every
// call into it, as UCS_THREAD_MODE_SERIALIZED requires.
unsafe impl Send for RawWorker {}

type Deferred = Box<dyn FnOnce() + Send>;

pub(crate) struct WorkerShared {
    raw: Mutex<RawWorker>,
    mode: ProgressMode,
    /// A `Thread` worker in a process allowed one CPU: a task awaiting an operation progresses
    /// the worker itself for a while ([`ASSIST`]) before it parks, so a reply that comes soon
    /// costs no switch from the progress thread to the task's thread on that CPU. (Blocking
    /// workers assist differently: one wait at a time, only while no other wait is parked,
    /// for a few polls; see [`SoleWait`].)
    assists: bool,
    /// Whether waits assist now: they stop after one outlasted the assist, and start again
    /// after one that parked ended within twice the assist.
    hot: AtomicBool,
    /// A `Blocking` worker on a current-thread runtime: a task awaiting an operation while no
    /// other wait is parked progresses the worker itself for a few polls, in the progress
    /// task's place (see [`SoleWait`]).
    pub(crate) sole: Option<Arc<SoleWait>>,
    context: Context,
    /// The progress engine (blocking task or thread) is asleep on the event fd.
    pub(crate) sleeping: AtomicBool,
    /// The blocking-mode progress task ended while the worker lived (its runtime shut down).
    pub(crate) orphaned: AtomicBool,
    notify: Arc<tokio::sync::Notify>,
    /// Endpoints whose error callback fired; handled after the current UCX call.
    failed: Mutex<Vec<Arc<EpShared>>>,
    has_failed: AtomicBool,
    /// Dropped listeners kept alive for a while, refusing connections (`listener::LINGER`).
    parked: Mutex<Vec<Parked>>,
    has_parked: AtomicBool,
    /// Tasks waiting for an unexpected message to probe (receives of unknown size).
    probe_waiters: Mutex<Vec<Waker>>,
    probe_count: AtomicUsize,
    /// How many times the worker was locked (wrapping; counted in blocking mode only, under
    /// the lock): the blocking-mode progress task tells from it whether anything used the
    /// worker while it gave way.
    pub(crate) locks: AtomicUsize,
    /// Arrived active messages (filled by the AM handler under the worker lock).
    am: Mutex<AmQueue>,
    /// Receive-buffer allocators for active messages, by the sender's memory type.
    am_allocators: Mutex<HashMap<MemoryType, Arc<dyn AmAllocator>>>,
    /// Answers awaited by [`crate::Endpoint::sync_with_peer`] (filled by the AM handler).
    pongs: Mutex<crate::sync::Pongs>,
    /// The CUDA context of the first device buffer used on this worker: made current on every
    /// thread that calls into UCX for this worker (UCX's CUDA transports use the current one).
    #[cfg(feature = "cuda")]
    cuda: std::sync::OnceLock<Arc<cudarc::driver::CudaContext>>,
}

impl WorkerShared {
    pub(crate) fn mode(&self) -> ProgressMode {
        self.mode
    }

    /// Whether tasks awaiting operations progress the worker themselves for up to [`ASSIST`]
    /// (see the field).
    pub(crate) fn assists(&self) -> bool {
        self.assists
    }

    /// Whether waits assist now (see the field).
    pub(crate) fn hot(&self) -> bool {
        self.hot.load(Ordering::Relaxed)
    }

    /// The sole-wait bookkeeping of a `Blocking` worker on a current-thread runtime.
    pub(crate) fn sole(&self) -> Option<&Arc<SoleWait>> {
        self.sole.as_ref()
    }

    /// Whether the progress engine sleeps on the event fd.
    pub(crate) fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::Acquire)
    }

    pub(crate) fn set_hot(&self, hot: bool) {
        if self.hot.load(Ordering::Relaxed) != hot {
            self.hot.store(hot, Ordering::Relaxed);
        }
    }

    /// Wakes the progress engine (blocking task or thread) if it sleeps on the event fd.
    pub(crate) fn wake_progress(&self) {
        if !self.sleeping.load(Ordering::Acquire) {
            return;
        }
        match self.mode {
            ProgressMode::Polling => {}
            ProgressMode::Blocking => self.notify.notify_one(),
            ProgressMode::Thread | ProgressMode::External => {
                // SAFETY: the worker is alive (`self` holds it); ucp_worker_signal may be
                // called from any thread at any time.
                unsafe { sys::ucp_worker_signal(self.raw_handle()) };
            }
        }
    }

    /// Progresses the worker unless another thread holds it (its progress thread: that one
    /// is progressing it already).
    pub(crate) fn try_progress(&self) {
        if let Some(mut locked) = self.try_lock() {
            locked.progress();
        }
    }

    /// Locks the worker unless another thread holds it. (Thread mode only: not counted in
    /// `locks`, which blocking mode keeps.)
    pub(crate) fn try_lock(&self) -> Option<Locked<'_>> {
        let guard = match self.raw.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        #[cfg(feature = "cuda")]
        if let Some(ctx) = self.cuda.get() {
            if let Err(e) = ctx.bind_to_thread() {
                tracing::warn!(error = %e, "cannot make the CUDA context current");
            }
        }
        Some(Locked {
            guard: Some(guard),
            shared: self,
            after_unlock: Vec::new(),
        })
    }

    /// The worker's handle, for calls UCX allows from any thread without the lock.
    pub(crate) fn raw_handle(&self) -> sys::ucp_worker_h {
        self.raw.lock().unwrap_or_else(|e| e.into_inner()).handle
    }

    /// Locks the worker for a sequence of UCX calls.
    pub(crate) fn lock(&self) -> Locked<'_> {
        #[cfg(feature = "cuda")]
        if let Some(ctx) = self.cuda.get() {
            if let Err(e) = ctx.bind_to_thread() {
                tracing::warn!(error = %e, "cannot make the CUDA context current");
            }
        }
        let guard = self.raw.lock().unwrap_or_else(|e| e.into_inner());
        if self.mode == ProgressMode::Blocking {
            // Under the lock: a load and a store, no read-modify-write needed.
            let n = self.locks.load(Ordering::Relaxed);
            self.locks.store(n.wrapping_add(1), Ordering::Relaxed);
        }
        Locked {
            guard: Some(guard),
            shared: self,
            after_unlock: Vec::new(),
        }
    }

    /// Called from UCX's endpoint error callback (under the lock).
    pub(crate) fn defer_failed(&self, ep: Arc<EpShared>) {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ep);
        self.has_failed.store(true, Ordering::Release);
    }

    /// Remembers the CUDA context device buffers on this worker live in, and makes it current.
    #[cfg(feature = "cuda")]
    pub(crate) fn adopt_cuda(&self, ctx: &Arc<cudarc::driver::CudaContext>) {
        if self.cuda.set(Arc::clone(ctx)).is_ok() {
            tracing::debug!(ordinal = ctx.ordinal(), "worker uses a CUDA context");
        }
        if let Err(e) = ctx.bind_to_thread() {
            tracing::warn!(error = %e, "cannot make the CUDA context current");
        }
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn context(&self) -> &Context {
        &self.context
    }

    /// The tokens [`crate::Endpoint::sync_with_peer`] waits for.
    pub(crate) fn pongs(&self) -> MutexGuard<'_, crate::sync::Pongs> {
        self.pongs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The allocator for active messages from `mem` buffers (host memory when none is set).
    pub(crate) fn am_allocator(&self, mem: MemoryType) -> Arc<dyn AmAllocator> {
        self.am_allocators
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&mem)
            .cloned()
            .unwrap_or_else(|| Arc::new(HostAllocator))
    }

    /// The queue of arrived active messages.
    pub(crate) fn am_queue(&self) -> MutexGuard<'_, AmQueue> {
        self.am.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a task to be woken after the next progress that did something.
    pub(crate) fn add_probe_waiter(&self, w: &Waker) {
        let mut ws = self.probe_waiters.lock().unwrap_or_else(|e| e.into_inner());
        if !ws.iter().any(|x| x.will_wake(w)) {
            ws.push(w.clone());
            self.probe_count.fetch_add(1, Ordering::Release);
        }
    }

    pub(crate) fn wake_probe_waiters(&self) {
        if self.probe_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let ws = std::mem::take(&mut *self.probe_waiters.lock().unwrap_or_else(|e| e.into_inner()));
        self.probe_count.fetch_sub(ws.len(), Ordering::Release);
        ws.into_iter().for_each(crate::request::wake_or_defer);
    }
}

impl Drop for WorkerShared {
    fn drop(&mut self) {
        for parked in std::mem::take(self.parked.get_mut().unwrap_or_else(|e| e.into_inner())) {
            // SAFETY: the worker is alive and, being dropped, used by nobody else.
            unsafe { parked.destroy() };
        }
        let raw = self.raw.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: signalling is allowed from any thread; it only wakes a sleeping progress thread
        // so that it notices the worker is gone.
        unsafe { sys::ucp_worker_signal(raw.handle) };
        self.notify.notify_one();
        // SAFETY: this is the last reference: no endpoint, listener or operation (they all hold
        // an Arc) can use the worker any more, and the progress engines hold only Weak refs.
        unsafe { sys::ucp_worker_destroy(raw.handle) };
        tracing::debug!("UCX worker destroyed");
    }
}

/// The worker, locked. UCX calls go through here; deferred work runs when it is dropped.
pub(crate) struct Locked<'a> {
    guard: Option<MutexGuard<'a, RawWorker>>,
    shared: &'a WorkerShared,
    after_unlock: Vec<Deferred>,
}

impl Locked<'_> {
    pub(crate) fn handle(&self) -> sys::ucp_worker_h {
        self.guard.as_ref().expect("locked until drop").handle
    }

    /// How many times the worker was progressed: a polling-mode future that sees it moved
    /// since its last poll knows another one is progressing the worker.
    pub(crate) fn progress_calls(&self) -> u64 {
        self.guard
            .as_ref()
            .expect("locked until drop")
            .progress_calls
    }

    /// Where an operation's state can be kept for the next one ([`crate::request::post`]).
    pub(crate) fn spare_op(&self) -> &std::cell::Cell<Option<Arc<crate::request::OpCore>>> {
        &self.guard.as_ref().expect("locked until drop").spare_op
    }

    /// One `ucp_worker_progress` call plus the deferred work it produced.
    pub(crate) fn progress(&mut self) -> u32 {
        if let Some(raw) = self.guard.as_mut() {
            raw.progress_calls = raw.progress_calls.wrapping_add(1);
        }
        // SAFETY: the worker is alive and locked.
        let n = unsafe { sys::ucp_worker_progress(self.handle()) };
        self.after_progress(n);
        n
    }

    pub(crate) fn after_progress(&mut self, n: u32) {
        // Read before it is cleared: a polling-mode wait progresses up to 8 times per poll,
        // and an atomic swap costs more than a load when (nearly always) nothing failed.
        if self.shared.has_failed.load(Ordering::Acquire)
            && self.shared.has_failed.swap(false, Ordering::AcqRel)
        {
            // A peer's close or failure can be reported (by the connection manager, over its
            // own socket) before what the peer sent ahead of it (over shared memory: the last
            // fragments of a message, a rendezvous' final notice) has been progressed. Progress
            // what has arrived first, so that receives it completes are not cancelled below.
            for _ in 0..FAILED_DRAIN_ROUNDS {
                // SAFETY: the worker is alive and locked.
                if unsafe { sys::ucp_worker_progress(self.handle()) } == 0 {
                    break;
                }
            }
            let failed =
                std::mem::take(&mut *self.shared.failed.lock().unwrap_or_else(|e| e.into_inner()));
            for ep in failed {
                let cb = ep.fail_pending(self);
                self.after_unlock.extend(cb);
            }
            self.shared.wake_probe_waiters();
        }
        if n > 0 {
            self.shared.wake_probe_waiters();
        }
        if self.shared.has_parked.load(Ordering::Relaxed) {
            self.reap_listeners(Reap::Expired);
        }
    }

    /// Keeps a dropped listener alive, refusing connections, for `listener::LINGER`.
    pub(crate) fn park_listener(&mut self, parked: Parked) {
        let mut all = self.shared.parked.lock().unwrap_or_else(|e| e.into_inner());
        all.push(parked);
        self.shared.has_parked.store(true, Ordering::Relaxed);
    }

    /// Whether the listener whose handle is `id` is parked still.
    pub(crate) fn is_parked(&self, id: usize) -> bool {
        let all = self.shared.parked.lock().unwrap_or_else(|e| e.into_inner());
        all.iter().any(|p| p.id() == id)
    }

    /// Refuses the connection requests that reached parked listeners, and destroys those
    /// `reap` picks.
    pub(crate) fn reap_listeners(&mut self, reap: Reap) {
        let mut all = self.shared.parked.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = Vec::with_capacity(all.len());
        for mut parked in all.drain(..) {
            // SAFETY: the worker is locked and the parked listener alive. First: a request
            // refused now starts its linger again.
            unsafe { parked.reject_queued() };
            if parked.due(reap) {
                // SAFETY: the worker is locked; the parked listener is alive and leaves the list.
                unsafe { parked.destroy() };
            } else {
                kept.push(parked);
            }
        }
        *all = kept;
        self.shared
            .has_parked
            .store(!all.is_empty(), Ordering::Relaxed);
    }

    /// Runs `f` after the lock is released (user callbacks must never run under it).
    pub(crate) fn defer(&mut self, f: Deferred) {
        self.after_unlock.push(f);
    }

    /// Tells the progress engine that an operation was posted and may need progress.
    pub(crate) fn posted(&self) {
        if self.shared.sleeping.load(Ordering::Acquire) {
            match self.shared.mode {
                ProgressMode::Polling => {}
                ProgressMode::Blocking => self.shared.notify.notify_one(),
                ProgressMode::Thread | ProgressMode::External => {
                    // SAFETY: the worker is alive; ucp_worker_signal may be called at any time.
                    unsafe { sys::ucp_worker_signal(self.handle()) };
                }
            }
        }
    }

    /// Arms the event fd. `Ok(true)`: armed, safe to sleep; `Ok(false)`: events are pending.
    pub(crate) fn arm(&mut self) -> Result<bool> {
        // SAFETY: the worker is alive and locked.
        match unsafe { sys::ucp_worker_arm(self.handle()) } {
            sys::UCS_OK => Ok(true),
            sys::UCS_ERR_BUSY => Ok(false),
            st => check(st).map(|_| false),
        }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // Checked first: most locks defer nothing, and draining an empty vector is not free
        // (measured with callgrind: 66 instructions per 8 B round trip).
        if !self.after_unlock.is_empty() {
            for f in std::mem::take(&mut self.after_unlock) {
                f();
            }
        }
        // After the deferred work, which may wake tasks too (probe waiters).
        if self.shared.mode == ProgressMode::Thread {
            crate::request::wake_deferred();
        }
    }
}

/// How many times at most the worker is progressed, when a peer's failure or close is
/// reported, before its endpoint's pending operations are cancelled (each round that finds
/// nothing ends the drain).
const FAILED_DRAIN_ROUNDS: usize = 64;

/// A UCP worker: the progress engine that endpoints and listeners live on.
///
/// Cheap to clone (shared handle), `Send + Sync`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> ucx::Result<()> {
/// let ctx = ucx::Context::new()?;
/// let worker = ucx::Worker::new(&ctx, ucx::ProgressMode::Blocking)?;
/// assert!(!worker.address()?.is_empty());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Worker {
    pub(crate) shared: Arc<WorkerShared>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("mode", &self.shared.mode)
            .finish()
    }
}

impl Worker {
    /// Creates a worker on `context` with the given progress mode.
    ///
    /// `Blocking` must be called inside a tokio runtime; `Blocking` and `Thread` need the
    /// context's `WAKEUP` feature.
    pub fn new(context: &Context, mode: ProgressMode) -> Result<Worker> {
        if mode != ProgressMode::Polling && !context.features().contains(Features::WAKEUP) {
            return Err(Error::InvalidArgument(format!(
                "{mode:?} progress needs the context's WAKEUP feature"
            )));
        }
        let runtime = match mode {
            ProgressMode::Blocking => Some(
                tokio::runtime::Handle::try_current()
                    .map_err(|_| Error::NoRuntime("ProgressMode::Blocking"))?,
            ),
            _ => None,
        };
        let params = sys::ucp_worker_params_t {
            field_mask: sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64,
            thread_mode: sys::UCS_THREAD_MODE_SERIALIZED,
            ..Default::default()
        };
        // A multi-threaded runtime answers a task that wakes itself by waking an idle worker
        // thread to share the work (a system call, and the task may move between threads):
        // there the progress task only ever yields, and waits do not assist.
        let reschedules = runtime
            .as_ref()
            .is_some_and(|r| r.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        let mut handle: sys::ucp_worker_h = ptr::null_mut();
        // SAFETY: the context is alive (we keep a clone); params is valid; handle is an out-ptr.
        check(unsafe { sys::ucp_worker_create(context.handle(), &params, &mut handle) })?;
        let shared = Arc::new(WorkerShared {
            raw: Mutex::new(RawWorker {
                handle,
                progress_calls: 0,
                spare_op: Default::default(),
            }),
            mode,
            assists: mode == ProgressMode::Thread && alone_on_a_cpu(),
            hot: AtomicBool::new(true),
            sole: reschedules.then(|| Arc::new(SoleWait::default())),
            context: context.clone(),
            sleeping: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            notify: Arc::new(tokio::sync::Notify::new()),
            failed: Mutex::new(Vec::new()),
            has_failed: AtomicBool::new(false),
            parked: Mutex::new(Vec::new()),
            has_parked: AtomicBool::new(false),
            probe_waiters: Mutex::new(Vec::new()),
            probe_count: AtomicUsize::new(0),
            locks: AtomicUsize::new(0),
            am: Mutex::new(AmQueue::default()),
            am_allocators: Mutex::new(HashMap::new()),
            pongs: Mutex::new(crate::sync::Pongs::default()),
            #[cfg(feature = "cuda")]
            cuda: std::sync::OnceLock::new(),
        });
        if context.features().contains(Features::AM) {
            crate::am::register(&shared)?;
            crate::sync::register(&shared)?;
        }
        match mode {
            ProgressMode::Polling | ProgressMode::External => {}
            ProgressMode::Blocking => {
                let fd = event_fd(&shared)?;
                let afd = {
                    let _enter = runtime.as_ref().map(|r| r.enter());
                    // SAFETY: `fd` is an OwnedFd that the AsyncFd owns: open, and referring to the
                    // same file description, for the AsyncFd's whole lifetime.
                    unsafe {
                        tokio::io::unix::AsyncFd::register_with_interest(
                            fd,
                            tokio::io::Interest::READABLE,
                        )
                    }
                    .map_err(|e| Error::os("registering the UCX event fd with tokio", e.into()))?
                };
                let weak = Arc::downgrade(&shared);
                let notify = Arc::clone(&shared.notify);
                let runtime = runtime.expect("checked above");
                runtime.spawn(blocking_progress(
                    weak.clone(),
                    afd,
                    notify,
                    reschedules,
                    OrphanGuard(weak),
                ));
            }
            ProgressMode::Thread => {
                let fd = event_fd(&shared)?;
                let weak = Arc::downgrade(&shared);
                std::thread::Builder::new()
                    .name("ucx-progress".into())
                    .spawn(move || thread_progress(weak, fd))
                    .map_err(|e| Error::os("spawning the UCX progress thread", e))?;
            }
        }
        tracing::debug!(?mode, "UCX worker created");
        Ok(Worker { shared })
    }

    /// The progress mode.
    pub fn mode(&self) -> ProgressMode {
        self.shared.mode
    }

    /// Whether something still progresses this worker. A `Blocking` worker's progress task
    /// lives on the runtime it was created in: once that runtime shuts down, nothing completes
    /// the worker's operations unless a future is polled on a `Polling` worker. Code that keeps
    /// a worker beyond one runtime (a process-wide worker, say) checks this and makes a new one.
    ///
    /// ```
    /// let ctx = ucx::Context::new().unwrap();
    /// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    /// let w = rt.block_on(async { ucx::Worker::new(&ctx, ucx::ProgressMode::Blocking) }).unwrap();
    /// assert!(w.is_progressing());
    /// drop(rt);
    /// assert!(!w.is_progressing());
    /// ```
    pub fn is_progressing(&self) -> bool {
        !self.shared.orphaned.load(Ordering::Acquire)
    }

    /// Whether `self` and `other` are handles of the same worker.
    ///
    /// ```
    /// let ctx = ucx::Context::new().unwrap();
    /// let w = ucx::Worker::new(&ctx, ucx::ProgressMode::Polling).unwrap();
    /// let other = ucx::Worker::new(&ctx, ucx::ProgressMode::Polling).unwrap();
    /// assert!(w.same_as(&w.clone()) && !w.same_as(&other));
    /// ```
    pub fn same_as(&self, other: &Worker) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// The context this worker belongs to.
    pub fn context(&self) -> &Context {
        &self.shared.context
    }

    /// Progresses the worker once; returns UCX's count of events processed. Only needed to drive
    /// a `Polling` worker while none of its futures is being polled.
    pub fn progress(&self) -> u32 {
        self.shared.lock().progress()
    }

    /// Sets the allocator that [`Endpoint::am_recv_buf`](crate::Endpoint::am_recv_buf) uses for
    /// active messages whose sender's buffer had memory type `mem` (host memory by default).
    pub fn set_am_allocator(&self, mem: MemoryType, allocator: Arc<dyn AmAllocator>) {
        self.shared
            .am_allocators
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(mem, allocator);
    }

    /// Waits until every operation posted on this worker has completed remotely
    /// (`ucp_worker_flush_nbx`).
    pub async fn flush(&self) -> Result<()> {
        let posted = {
            let locked = self.shared.lock();
            crate::request::post(&locked, crate::request::CbKind::Send, None, |param, _| {
                // SAFETY: the worker is alive and locked.
                unsafe { sys::ucp_worker_flush_nbx(locked.handle(), param) }
            })
        };
        let (c, ()) = crate::ops::complete(&self.shared, posted, (), false).await;
        check(c.status)
    }

    /// Orders the worker's operations: those posted after the fence complete remotely after
    /// those posted before (`ucp_worker_fence`).
    pub fn fence(&self) -> Result<()> {
        let locked = self.shared.lock();
        // SAFETY: the worker is alive and locked.
        check(unsafe { sys::ucp_worker_fence(locked.handle()) })
    }

    /// A duplicate of the worker's event fd (owned by the caller), for the event loop that
    /// drives a [`ProgressMode::External`] worker: watch it for readability, and on each
    /// wake-up call [`progress_and_arm`](Self::progress_and_arm) until it returns `true`.
    pub fn event_fd(&self) -> Result<OwnedFd> {
        event_fd(&self.shared)
    }

    /// Progresses a [`ProgressMode::External`] worker until it is idle, then arms its event fd
    /// (`ucp_worker_arm`): `Ok(true)` when armed (the fd becomes readable at the next event,
    /// so the caller may sleep on it), `Ok(false)` when UCX had more to do first (call again).
    /// Refused for the other modes, whose progress engine (or futures) own the progress.
    ///
    /// ```
    /// let ctx = ucx::Context::new()?;
    /// let worker = ucx::Worker::new(&ctx, ucx::ProgressMode::External)?;
    /// let _fd = worker.event_fd()?; // what the loop watches
    /// let armed = (0..100).any(|_| worker.progress_and_arm().unwrap());
    /// assert!(armed, "an idle worker arms");
    /// let polling = ucx::Worker::new(&ctx, ucx::ProgressMode::Polling)?;
    /// assert!(polling.progress_and_arm().is_err());
    /// # Ok::<(), ucx::Error>(())
    /// ```
    pub fn progress_and_arm(&self) -> Result<bool> {
        if self.shared.mode != ProgressMode::External {
            return Err(Error::InvalidArgument(format!(
                "progress_and_arm drives an external-mode worker; this one is in {:?} mode",
                self.shared.mode
            )));
        }
        self.shared.sleeping.store(false, Ordering::Release);
        let mut locked = self.shared.lock();
        while locked.progress() != 0 {}
        let armed = locked.arm()?;
        if armed {
            // Posts from now on signal the fd (`Locked::posted`).
            self.shared.sleeping.store(true, Ordering::Release);
        }
        Ok(armed)
    }

    /// The worker's UCP address, for connecting to it out of band.
    pub fn address(&self) -> Result<Vec<u8>> {
        let locked = self.shared.lock();
        let mut addr: *mut sys::ucp_address_t = ptr::null_mut();
        let mut len: usize = 0;
        // SAFETY: the worker is alive and locked; addr/len are out-pointers.
        check(unsafe { sys::ucp_worker_get_address(locked.handle(), &mut addr, &mut len) })?;
        // SAFETY: UCX returned `len` readable bytes at `addr`.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
        // SAFETY: the address came from ucp_worker_get_address on this worker; released once.
        unsafe { sys::ucp_worker_release_address(locked.handle(), addr) };
        Ok(bytes)
    }

    /// UCX's description of the worker (`ucp_worker_print_info`): transports, address.
    pub fn info(&self) -> Result<String> {
        let locked = self.shared.lock();
        capture_file(|f| {
            // SAFETY: the worker is alive and locked; f is an open stream.
            unsafe { sys::ucp_worker_print_info(locked.handle(), f) }
        })
    }
}

/// Used by endpoint/listener code that needs a raw void pointer for UCX callbacks.
pub(crate) fn as_void<T>(p: *const T) -> *mut c_void {
    p as *mut c_void
}
