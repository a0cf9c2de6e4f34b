//! The worker's spill thread, and the lock every user of the store takes.
//!
//! Writing a value to disk can take long (a large value, a slow or stalled disk), so neither
//! the worker's runtime nor the store's lock waits for it: whoever changes the store through
//! [`lock`] wakes the spill thread when the store is over its target (or has spill files to
//! delete), and that thread takes one value at a time from the store
//! ([`store::Store::next_spill`]), writes it without the lock, and gives the outcome back;
//! it deletes released spill files without the lock too. A failed write leaves the value in memory and is tried
//! again after a pause (doubling, up to [`RETRY_MAX`]); a write that stalls past
//! [`store::STALLED_WRITE`] stops counting as a way to free memory, and is reported once.
//!
//! Tasks produce values faster than a disk takes them, so the spill thread pushes back: a
//! task thread waits before starting its next task while the store is over its target
//! ([`wait_for_room`]), as long as spilling makes progress (values left to write, the last
//! write not failed, none stalled).

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::{memory, store};

/// The store and the spill thread's alarm.
pub(crate) struct Shared {
    store: Mutex<store::Store>,
    wake: Condvar,
    /// Notified after each write (for [`wait_for_room`]).
    wrote: Condvar,
}

/// Values the worker holds, shared by its runtime, its task threads, its data server and
/// its spill thread.
pub(crate) type Store = Arc<Shared>;

/// The longest pause before a failed spill is tried again.
pub const RETRY_MAX: Duration = Duration::from_secs(10);

/// A store behind its lock, and the spill thread (started when the store spills, ending when
/// the store is closed or dropped).
pub(crate) fn start(store: store::Store) -> Store {
    let spills = store.spillable_ever();
    let shared = Arc::new(Shared {
        store: Mutex::new(store),
        wake: Condvar::new(),
        wrote: Condvar::new(),
    });
    if spills {
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("dask-worker-spill".into())
            .spawn(move || run(weak))
            .expect("spawning the spill thread");
    }
    shared
}

/// The store, locked; on release, the spill thread is woken if the store is over its target.
pub(crate) fn lock(store: &Store) -> Guard<'_> {
    Guard {
        guard: store.store.lock().unwrap_or_else(|e| e.into_inner()),
        wake: &store.wake,
    }
}

/// The locked store ([`lock`]).
pub(crate) struct Guard<'a> {
    guard: MutexGuard<'a, store::Store>,
    wake: &'a Condvar,
}

impl Deref for Guard<'_> {
    type Target = store::Store;
    fn deref(&self) -> &store::Store {
        &self.guard
    }
}

impl DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut store::Store {
        &mut self.guard
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if self.guard.over_target() || self.guard.has_doomed() {
            self.wake.notify_one();
        }
    }
}

/// Waits while the store is behind its spilling (see the module docs): what a task thread
/// does before it starts a task. Each wait is woken by a write and bounded by the write's
/// stall limit.
pub(crate) fn wait_for_room(store: &Store) {
    let mut s = store.store.lock().unwrap_or_else(|e| e.into_inner());
    while s.behind() {
        s = store
            .wrote
            .wait_timeout(s, store::STALLED_WRITE)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// How long the spill thread sleeps between checks that the worker still exists.
const IDLE_CHECK: Duration = Duration::from_secs(1);

fn run(weak: Weak<Shared>) {
    let mut retry = Duration::from_millis(100);
    let mut spilled = 0u64;
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let job = {
            let mut s = shared.store.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if s.closed() || Arc::strong_count(&shared) == 1 {
                    return;
                }
                if s.has_doomed() {
                    let doomed = s.take_doomed();
                    drop(s);
                    for p in &doomed {
                        store::delete_file(p);
                    }
                    s = shared.store.lock().unwrap_or_else(|e| e.into_inner());
                    continue;
                }
                if let Some(job) = s.next_spill() {
                    break job;
                }
                if spilled > 0 {
                    // Return what the spilled values held to the system (see `memory`).
                    drop(s);
                    tracing::debug!(spilled, "spilled down to the target");
                    spilled = 0;
                    memory::trim();
                    s = shared.store.lock().unwrap_or_else(|e| e.into_inner());
                    continue;
                }
                s = shared
                    .wake
                    .wait_timeout(s, IDLE_CHECK)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        let key = job.key;
        let written = job.write();
        let outcome = shared
            .store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .spill_written(job, written);
        shared.wrote.notify_all();
        match outcome {
            store::Written::Spilled => {
                spilled += 1;
                retry = Duration::from_millis(100);
                if spilled.is_multiple_of(4) {
                    memory::trim();
                }
            }
            store::Written::Dropped => {}
            store::Written::Failed(error) => {
                tracing::warn!(%key, %error, ?retry, "spilling failed: the value stays in memory, spilling goes on after a pause");
                drop(shared);
                std::thread::sleep(retry);
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dask_graph::{Key, Value};
    use std::time::Instant;

    #[test]
    fn the_spill_thread_spills_what_goes_over_the_target_and_ends_with_the_store() {
        let d = std::env::temp_dir().join(format!(
            "dask-comm-spiller-test-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let s = start(store::Store::new(Some(d.clone()), 2500).unwrap());
        for i in 0..5u32 {
            let k = Key::new("x", &[i]);
            lock(&s).insert(k, Value::new(bytes::Bytes::from(vec![i as u8; 1000])));
        }
        // Bounded wait for the thread (not a timing assertion: it only has to happen).
        let t0 = Instant::now();
        while lock(&s).memory_bytes() > 2500 && t0.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (memory, disk) = {
            let g = lock(&s);
            (g.memory_bytes(), g.disk_bytes())
        };
        assert_eq!((memory, disk), (2000, 3000));
        let weak = Arc::downgrade(&s);
        drop(s);
        let t0 = Instant::now();
        // The last holder may be the spill thread: it drops the store (and removes the
        // directory) after the count reaches zero, so wait for both.
        while (weak.strong_count() > 0 || d.exists()) && t0.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(weak.strong_count(), 0, "the thread let go of the store");
        assert!(!d.exists(), "the store went, with its directory");
    }
}
