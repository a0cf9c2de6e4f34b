//! Process exit while progress threads run.
//!
//! A [`ProgressMode::Thread`](crate::ProgressMode::Thread) worker is progressed by a thread of
//! its own, which holds a reference to the worker while it progresses; when the program drops
//! its last handle, that thread is often the one that destroys the worker, a moment later. If
//! `main` returns in that moment, `exit` runs UCX's library destructors (its async handlers,
//! its object registry) while the thread still progresses or destroys the worker: UCX 1.13
//! then aborts (`failed to modify N event handler`, `vfs_obj.c` assertions, double frees; the
//! `many_clients` example, about 1 run in 60 on 2 cores).
//!
//! So the first progress thread registers an `atexit` handler, which runs before the
//! libraries' destructors (those are registered earlier, so run later). It tells every
//! progress thread to stop, wakes the sleeping ones, and waits (at most [`EXIT_WAIT`]) until
//! each has finished what it was doing, destroying its worker where it held the last
//! reference. Workers the program still holds at exit are left to the process's end, as on a
//! thread with no progress thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, Once, Weak};
use std::time::{Duration, Instant};

use ucx_sys as sys;

use crate::worker::WorkerShared;

/// The longest the exit handler waits for progress threads.
pub(crate) const EXIT_WAIT: Duration = Duration::from_secs(2);

/// Set once the process exits: progress threads stop.
static EXITING: AtomicBool = AtomicBool::new(false);

/// The worker of each running progress thread (to wake it at exit; the exit handler waits
/// until the list is empty).
static THREADS: Mutex<Vec<Weak<WorkerShared>>> = Mutex::new(Vec::new());
static DONE: Condvar = Condvar::new();

/// Whether the process is exiting: a progress thread must stop.
pub(crate) fn exiting() -> bool {
    EXITING.load(Ordering::Acquire)
}

/// A running progress thread, counted until dropped (when the thread ends, after it dropped
/// its reference to the worker).
pub(crate) struct ProgressThread {
    worker: Weak<WorkerShared>,
}

impl ProgressThread {
    /// Counts a progress thread of `worker`, registering the exit handler on the first.
    pub(crate) fn enter(worker: Weak<WorkerShared>) -> ProgressThread {
        static REGISTER: Once = Once::new();
        REGISTER.call_once(|| {
            // SAFETY: `on_exit` is an `extern "C" fn()` taking nothing, as `atexit` requires;
            // it cannot unwind into C (a panic in an `extern "C" fn` aborts), and it takes
            // poisoned locks as they are rather than panicking.
            if unsafe { libc::atexit(on_exit) } != 0 {
                tracing::warn!("cannot register the UCX progress threads' exit handler");
            }
        });
        // No pruning of entries whose worker is gone: such a thread may be destroying its
        // worker right now, which is what the exit handler must wait for. Each thread removes
        // its own entry when it ends.
        let mut threads = THREADS.lock().unwrap_or_else(|e| e.into_inner());
        threads.push(worker.clone());
        ProgressThread { worker }
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        let mut threads = THREADS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = threads.iter().position(|w| w.ptr_eq(&self.worker)) {
            threads.swap_remove(i);
        }
        DONE.notify_all();
    }
}

extern "C" fn on_exit() {
    EXITING.store(true, Ordering::Release);
    let deadline = Instant::now() + EXIT_WAIT;
    let mut threads = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    // Wake the sleeping threads. A worker whose last reference is taken here is destroyed
    // here, which is as safe: its thread can no longer reach it.
    let workers: Vec<_> = threads.iter().filter_map(Weak::upgrade).collect();
    drop(threads);
    for w in &workers {
        // SAFETY: the worker is alive (we hold a reference); signalling is allowed from any
        // thread.
        unsafe { sys::ucp_worker_signal(w.raw_handle()) };
    }
    drop(workers);
    threads = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    while !threads.is_empty() {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        threads = DONE
            .wait_timeout(threads, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}
