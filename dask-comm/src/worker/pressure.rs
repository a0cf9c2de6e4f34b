//! The worker's memory check, every 100 ms (see [`memory`](super::memory)): the store's
//! target from the process's RSS, a pause past `pause`, an exit past `terminate`, and the
//! warning for a stalled spill directory.

use std::time::{Duration, Instant};

use super::memory::{self, Verdict};
use super::{lock, Worker};
use crate::error::Result;

/// Past `terminate`, how long the spill thread has to bring memory down before the worker
/// exits (when it has values left to write).
pub const TERMINATE_GRACE: Duration = Duration::from_secs(1);

/// What the memory check remembers between checks.
#[derive(Default)]
pub(super) struct MemoryWatch {
    /// Paused with nothing to spill and nothing running, since.
    stuck_since: Option<Instant>,
    /// Past `terminate` with values left to spill, since.
    terminate_since: Option<Instant>,
}

impl Worker {
    /// The memory check (see [`memory`]): the store's target, a pause past `pause`, an exit
    /// past `terminate`. Spilling is the spill thread's (see [`spiller`](super::spiller)):
    /// this sets the store's target, which wakes it; past `terminate` while it still has
    /// values to write, the worker gives it [`TERMINATE_GRACE`] before exiting.
    pub(super) fn check_memory(&mut self, watch: &mut MemoryWatch) -> Result<()> {
        let mut rss = memory::rss();
        if rss > self.limits.spill() {
            // Values read back for tasks, and those spilled, were freed on other threads:
            // hand their memory back before judging.
            memory::trim();
            rss = memory::rss();
        }
        let spillable = {
            // Until the next check, values may grow to the store's target on top of the
            // process's own memory: bound them by what that memory leaves of the target, so
            // that the process, not only its values, stays near it. (Bounding values alone
            // by `target` and the process only past `spill`, as Dask does, peaked at 77 MiB of
            // 96 in the spill drill while values were made, against 60 this way.)
            let mut store = lock(&self.store);
            let unmanaged = rss.saturating_sub(store.memory_bytes());
            store.set_target(self.limits.target().saturating_sub(unmanaged));
            if let Some(stalled) = store.stall_to_tell() {
                tracing::warn!(
                    ?stalled,
                    "writing to the spill directory is stalled: values stay in memory meanwhile"
                );
            }
            store.spillable()
        };
        let verdict = self.limits.verdict(rss);
        let terminate = verdict == Verdict::Terminate
            && (spillable == 0
                || watch
                    .terminate_since
                    .get_or_insert_with(Instant::now)
                    .elapsed()
                    >= TERMINATE_GRACE);
        if verdict != Verdict::Terminate {
            watch.terminate_since = None;
        }
        if terminate {
            tracing::error!(
                rss,
                limit = self.limits.limit,
                "memory past the terminate threshold: exiting to be restarted"
            );
            // The store's directory goes with it: exit skips destructors.
            lock(&self.store).clear_disk();
            std::process::exit(memory::EXIT_MEMORY);
        }
        let mut pause = matches!(verdict, Verdict::Pause | Verdict::Terminate);
        if pause && spillable == 0 && self.executor.running() == 0 {
            // Pausing frees nothing here: nothing to spill, nothing running.
            let since = *watch.stuck_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(2) {
                if self.paused {
                    tracing::warn!(
                        rss,
                        "paused with nothing to spill and nothing running: resuming"
                    );
                }
                pause = false;
            }
        } else {
            watch.stuck_since = None;
        }
        if pause != self.paused {
            self.paused = pause;
            self.executor.set_paused(pause);
            self.report = true;
            tracing::info!(
                paused = pause,
                rss,
                limit = self.limits.limit,
                "memory pause"
            );
        }
        Ok(())
    }
}
