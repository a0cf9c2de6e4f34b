//! The progress engines of blocking and thread mode: the tokio task that sleeps on a worker's
//! event fd and the dedicated thread, with the spin windows they keep after activity (see
//! [`ProgressMode`](crate::ProgressMode)). The worker itself, its lock and its operations are in
//! `worker.rs`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use ucx_sys as sys;

use crate::error::{check, Error, Result};
use crate::worker::{Locked, WorkerShared};

/// A duplicate of the worker's event fd: the progress engine owns the duplicate, so the fd
/// number stays valid (and is never reused by someone else) for as long as it waits on it.
pub(crate) fn event_fd(shared: &WorkerShared) -> Result<OwnedFd> {
    let locked = shared.lock();
    let mut fd: RawFd = -1;
    // SAFETY: the worker is alive and locked; fd is an out-pointer.
    check(unsafe { sys::ucp_worker_get_efd(locked.handle(), &mut fd) })?;
    // SAFETY: fd is a valid open descriptor owned by UCX; dup gives us our own.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(Error::os(
            "dup of the UCX event fd",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: dup is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// Progresses until idle, then arms. Returns whether the engine may sleep.
fn progress_then_arm(shared: &WorkerShared) -> bool {
    let mut locked = shared.lock();
    while locked.progress() != 0 {}
    match locked.arm() {
        Ok(true) => {
            shared.sleeping.store(true, Ordering::Release);
            true
        }
        Ok(false) => false,
        Err(e) => {
            tracing::error!(error = %e, "ucp_worker_arm failed; progress falls back to polling");
            false
        }
    }
}

/// Marks the worker orphaned when the blocking progress task is dropped (its runtime shut
/// down) while the worker lives. An argument of the task, so it drops even if the task never
/// ran.
pub(crate) struct OrphanGuard(pub(crate) Weak<WorkerShared>);

impl Drop for OrphanGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.0.upgrade() {
            shared.orphaned.store(true, Ordering::Release);
            tracing::debug!("the runtime progressing a UCX worker shut down");
        }
    }
}

pub(crate) async fn blocking_progress(
    weak: Weak<WorkerShared>,
    fd: tokio::io::unix::AsyncFd<OwnedFd>,
    notify: Arc<tokio::sync::Notify>,
    reschedules: bool,
    _orphaned: OrphanGuard,
) {
    let mut last_event = Instant::now();
    // The worker's lock count when this task rescheduled itself after an event.
    let mut gave_way_at: Option<usize> = None;
    // The worker's lock count when this task last stood aside for a wait that assists.
    let mut stood_aside_at: Option<usize> = None;
    loop {
        // After activity, keep polling for BLOCKING_SPIN before sleeping: a reply to what was
        // just sent often arrives within microseconds, and a sleep/wake cycle through the event
        // fd costs several system calls. Each round progresses the worker until something
        // happens or SPIN_ROUND has passed (`spin_round`).
        if last_event.elapsed() < BLOCKING_SPIN {
            let Some(shared) = weak.upgrade() else { return };
            // A wait progresses the worker in this task's place (`SoleWait`): stand aside as
            // long as something progressed the worker since this task last looked. Not an
            // event: the spin window runs down as before, so this task spins no longer than
            // it did (with the window kept open, a dask-comm chain with real work on two
            // cores measured 1.11-1.21x, docs/notes/2026-11-27-sole-wait-assists.md).
            if shared
                .sole
                .as_ref()
                .is_some_and(|s| s.assisting.load(Ordering::Acquire))
            {
                let n = shared.locks.load(Ordering::Relaxed);
                if stood_aside_at != Some(n) {
                    stood_aside_at = Some(n);
                    drop(shared);
                    tokio::task::yield_now().await;
                    continue;
                }
            }
            stood_aside_at = None;
            // Nothing used the worker since this task rescheduled itself after an event: what
            // the event woke has not run yet (tokio polls a `block_on` future only once its
            // queue is empty or every `event_interval` tasks; a task of another thread may not
            // have been scheduled). One short pass, then give way to the runtime with
            // `yield_now` whatever it found, rather than spin a whole round first.
            let untouched = gave_way_at
                .take()
                .is_some_and(|n| n == shared.locks.load(Ordering::Relaxed));
            let progressed = if untouched {
                progress_batch(&mut shared.lock())
            } else {
                spin_round(&shared)
            };
            if progressed {
                last_event = Instant::now();
            }
            if progressed && reschedules && !untouched {
                gave_way_at = Some(shared.locks.load(Ordering::Relaxed));
                drop(shared);
                // A task the event woke runs next, then this task again, straight away:
                // `yield_now` would have the runtime poll its I/O driver first (a system call
                // per message on a ping-pong).
                reschedule().await;
            } else {
                drop(shared);
                // Nothing happened (or see `untouched`): the runtime polls its I/O driver,
                // and a `block_on` future, before the next round.
                tokio::task::yield_now().await;
            }
            continue;
        }
        let may_sleep = match weak.upgrade() {
            Some(shared) => progress_then_arm(&shared),
            None => return,
        };
        if !may_sleep {
            last_event = Instant::now();
            tokio::task::yield_now().await;
            continue;
        }
        gave_way_at = None;
        tokio::select! {
            ready = fd.readable() => match ready {
                Ok(mut guard) => guard.clear_ready(),
                Err(e) => {
                    tracing::error!(error = %e, "waiting on the UCX event fd failed");
                    return;
                }
            },
            _ = notify.notified() => {}
        }
        match weak.upgrade() {
            Some(shared) => shared.sleeping.store(false, Ordering::Release),
            None => return,
        }
        last_event = Instant::now();
    }
}

/// The waits of a `Blocking` worker on a current-thread runtime. A wait that finds no other
/// wait parked, and the progress task awake, progresses the worker itself (as a polling-mode
/// wait does) for its first few polls (`SOLE_POLLS` in `request.rs`), while the progress task
/// stands aside: a reply that comes soon is then found by the task that awaits it, not found
/// by the progress task and handed over through a wake (one more task switch per message:
/// `transport` `ucx://` on one host at 8 B, 1.29 before against 1.12 us). A wait stops
/// assisting, and parks, once another wait has parked, the progress task sleeps, or its polls
/// are spent: each such poll returns to the runtime without letting it poll its I/O driver
/// or take tasks woken from other threads (it does so every 61 and 31 polls), so a long
/// assist delays those.
#[derive(Debug, Default)]
pub(crate) struct SoleWait {
    /// Waits parked (their wakers registered with their operations).
    pub(crate) parked: AtomicUsize,
    /// A wait assists now.
    pub(crate) assisting: AtomicBool,
}

/// How long the blocking-mode task keeps progressing the worker after its last event before
/// it arms the fd and sleeps: about what its former 64 rounds of one progress call and one
/// I/O driver poll each took over TCP (a progress call on an idle TCP worker costs
/// 0.25-0.33 us here), so the CPU spins no longer than before.
const BLOCKING_SPIN: Duration = Duration::from_micros(50);

/// Progress calls the blocking-mode task makes under one take of the worker's lock while it
/// spins (as a polling-mode wait makes per poll).
const SPIN_CALLS: usize = 8;

/// How long one round of the blocking-mode task's spin progresses the worker before it
/// yields to the runtime, unless something happens first. Long enough that a reply on one
/// host (about 1 us) usually comes within the round rather than after a poll of the runtime's
/// I/O driver (a system call); short beside what a task may take between awaits.
const SPIN_ROUND: Duration = Duration::from_micros(2);

/// One round of the blocking-mode spin: batches of SPIN_CALLS progress calls until one
/// makes progress or SPIN_ROUND has passed (at least one batch). Whether anything progressed.
fn spin_round(shared: &WorkerShared) -> bool {
    let start = Instant::now();
    loop {
        if progress_batch(&mut shared.lock()) {
            return true;
        }
        if start.elapsed() >= SPIN_ROUND {
            return false;
        }
    }
}

/// Up to SPIN_CALLS progress calls under one take of the lock, until one makes progress.
/// Whether one did.
fn progress_batch(locked: &mut Locked<'_>) -> bool {
    (0..SPIN_CALLS).any(|_| locked.progress() > 0)
}

/// Returns to the runtime once, the task woken already. On a current-thread runtime, the tasks
/// queued before it run first, but (unlike `tokio::task::yield_now`) the runtime does not poll
/// its I/O driver for this, nor its `block_on` future (it does either only once its queue is
/// empty or every `event_interval` tasks).
async fn reschedule() {
    let mut rescheduled = false;
    std::future::poll_fn(|cx| {
        if rescheduled {
            return Poll::Ready(());
        }
        rescheduled = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Progress calls without events before the thread arms the fd and sleeps.
const THREAD_SPIN: u32 = 2_000;

/// How long a task awaiting an operation on an assisting worker progresses it itself before
/// it parks (see `WorkerShared::assists`). Shorter than the progress thread's own spin after
/// activity (THREAD_SPIN calls of at least 0.25 us each over TCP: half a millisecond or
/// more), so the CPU is hardly busier than without. Long enough for a 64 KiB round trip
/// across hosts: with 50 us, a client waiting for 64 KiB echoes (a 75 us round trip across
/// two namespaces) stopped assisting, parked, and was woken by the progress thread: 2.2-2.8
/// context switches per round trip and a 70-82 us one-way median in half the processes,
/// against 0.05-0.1 and 38-46 us in all with 200 (`perf stat -e context-switches` of the client).
pub(crate) const ASSIST: Duration = Duration::from_micros(200);

/// Whether this process may run on one CPU only.
pub(crate) fn alone_on_a_cpu() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() == 1)
}

pub(crate) fn thread_progress(weak: Weak<WorkerShared>, fd: OwnedFd) {
    // Counted until this thread ends, after its reference to the worker is gone (crate::exit).
    let _running = crate::exit::ProgressThread::enter(weak.clone());
    // With one CPU to share with the threads it wakes, spinning on it only delays them.
    let shares_cpu = alone_on_a_cpu();
    crate::request::defer_wakes_on_this_thread();
    tracing::debug!(shares_cpu, "UCX progress thread started");
    let mut idle = 0u32;
    loop {
        if crate::exit::exiting() {
            return;
        }
        let Some(shared) = weak.upgrade() else { return };
        // Another thread holds the worker (a task posting, or assisting): it is using it now,
        // so let it be rather than sleep on the lock (the holder would then pay a system call
        // to wake this thread when it lets go).
        let Some(mut locked) = shared.try_lock() else {
            drop(shared);
            idle += 1;
            if shares_cpu {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        };
        let events = locked.progress();
        drop(locked);
        if events > 0 {
            idle = 0;
            if shares_cpu {
                // What the events woke runs now, on this CPU.
                std::thread::yield_now();
            }
            continue;
        }
        idle += 1;
        if idle < THREAD_SPIN {
            if shares_cpu {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        idle = 0;
        let may_sleep = progress_then_arm(&shared);
        drop(shared);
        if may_sleep {
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: pfd is a valid pollfd array of length 1 for the duration of the call.
            unsafe { libc::poll(&mut pfd, 1, POLL_TIMEOUT.as_millis() as libc::c_int) };
            if let Some(shared) = weak.upgrade() {
                shared.sleeping.store(false, Ordering::Release);
            }
        }
    }
}

/// Upper bound on one sleep of the progress thread (a safety net; wake-ups come from UCX).
const POLL_TIMEOUT: Duration = Duration::from_millis(100);
