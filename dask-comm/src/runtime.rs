//! A tokio runtime on a thread of its own, so that clients and local clusters work from
//! synchronous code and from any async executor alike, and shut down cleanly when dropped.

use std::future::Future;
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::error::{Error, Result};

#[derive(Debug)]
pub(crate) struct Runtime {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Runtime {
    /// Starts a runtime on a thread of its own. One thread: hand-offs between the tasks of a
    /// process (reader, core, writer) then cost no cross-thread wake-up, which is most of a
    /// message's latency on a busy machine (measured: 265 → see docs/scheduler.md).
    pub(crate) fn new(name: &str) -> Result<Runtime> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::os("starting a tokio runtime", e))?;
        let handle = rt.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stopped.await;
                });
                rt.shutdown_timeout(std::time::Duration::from_secs(2));
            })
            .map_err(|e| Error::os("starting the runtime's thread", e))?;
        Ok(Runtime {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Runs `f` on the runtime and waits for it from any context (a thread, or another
    /// executor's task).
    pub(crate) async fn run<F>(&self, f: F) -> Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle
            .spawn(f)
            .await
            .map_err(|e| Error::Disconnected(format!("the runtime task ended: {e}")))
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            // Dropped from one of its own tasks: it cannot wait for itself.
            if Handle::try_current().is_ok_and(|h| h.id() == self.handle.id()) {
                return;
            }
            let _ = t.join();
        }
    }
}

/// Waits for `f` on this thread (the blocking wrappers). Must not be called from inside an
/// async task.
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}
