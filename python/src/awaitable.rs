//! Awaitables that poll their ucx-rs future on the event loop's own thread.
//!
//! A [`Polled`] step polls the future once (entering the runtime for its timers, detached from
//! the GIL: polling may take the worker's lock). While it is pending:
//! - in polling mode, the step yields to the loop, which runs its other ready tasks and steps
//!   it again (as UCXX's polling mode progresses the worker from the loop);
//! - in thread and blocking modes, the step hands the loop an asyncio future to wait on, and
//!   polls with a waker that rings the loop's [`Bell`]: whichever thread completes the
//!   operation pushes the awaitable's token into the bell's queue and writes one byte to its
//!   socket, which the loop watches (`add_reader`). The loop then resolves the future and the
//!   task steps the awaitable again. In thread mode that thread is UCX's progress thread: one
//!   wake-up crosses one thread boundary, where a runtime task bridged to asyncio crossed
//!   three. In blocking mode, as in UCXX's, the loop itself progresses the worker (ucx-rs's
//!   `External` mode): it watches the worker's event fd too, progresses and re-arms it when it
//!   is readable (`Bell::on_worker_event`) and after each step that leaves an operation
//!   pending, and resolves the woken futures at once.
//!
//! The waker touches no Python object (it may run inside a UCX callback, under the worker's
//! lock): tokens are plain numbers, and the asyncio futures stay in the bell, handled only on
//! the loop's thread with the GIL held.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::IntoPyObjectExt;

use crate::buffer;
use crate::errors::UCXError;
use crate::Core;

type PolledFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = PyResult<Py<PyAny>>> + Send>>;

/// What the waker side of a bell holds: no Python object.
#[derive(Debug)]
struct Ringer {
    queue: Mutex<Vec<u64>>,
    tx: UnixStream,
}

impl Ringer {
    fn ring(&self, token: u64) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let first = q.is_empty();
        q.push(token);
        drop(q);
        // One byte per batch: the loop drains the socket before it takes the queue, so a token
        // pushed after that is announced by a byte of its own.
        if first {
            let _ = (&self.tx).write(&[1]);
        }
    }
}

/// An event loop's doorbell: the socket it watches and the futures its awaitables wait on.
/// One per loop and core, made by `ucxrs.core._bell` on first use.
#[pyclass(module = "ucxrs._ucxrs")]
pub struct Bell {
    ringer: Arc<Ringer>,
    rx: UnixStream,
    /// Token -> the asyncio future its awaitable waits on (GIL held to touch it).
    waiting: Mutex<HashMap<u64, Py<PyAny>>>,
    /// The core it was made for (a reset makes a new one, and new bells); `None` for the
    /// bell of `transport`'s connections (the Dask comm), which need no UCXX-API core.
    core: Option<std::sync::Weak<Core>>,
    /// A transport bell's worker when the event loop progresses it (`transport_configure`'s
    /// `"loop"` mode).
    transport_worker: Option<ucx::Worker>,
    /// Blocking mode: our duplicate of the worker's event fd, which the loop watches.
    worker_fd: Option<std::os::fd::OwnedFd>,
}

impl std::fmt::Debug for Bell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bell")
            .field("fd", &self.rx.as_raw_fd())
            .finish()
    }
}

#[pymethods]
impl Bell {
    /// A bell for the UCXX-API core's awaitables, or with `transport=True` for those of
    /// `transport`'s connections (completed by the transport's own threads).
    #[new]
    #[pyo3(signature = (transport = false))]
    fn new(py: Python<'_>, transport: bool) -> PyResult<Bell> {
        let (tx, rx) = UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        let mut transport_worker = None;
        let (core, worker_fd) = if transport {
            match crate::comm::loop_worker()? {
                Some(w) => {
                    let fd = w.event_fd().map_err(crate::errors::to_py)?;
                    transport_worker = Some(w);
                    (None, Some(fd))
                }
                None => (None, None),
            }
        } else {
            let core = py.detach(crate::core)?;
            let fd = if core.mode == ucx::ProgressMode::Blocking {
                Some(core.worker.event_fd().map_err(crate::errors::to_py)?)
            } else {
                None
            };
            (Some(Arc::downgrade(&core)), fd)
        };
        Ok(Bell {
            ringer: Arc::new(Ringer {
                queue: Mutex::new(Vec::new()),
                tx,
            }),
            rx,
            waiting: Mutex::new(HashMap::new()),
            core,
            transport_worker,
            worker_fd,
        })
    }

    /// The socket the loop watches.
    fn fileno(&self) -> i32 {
        self.rx.as_raw_fd()
    }

    /// Blocking mode: the worker's event fd for the loop to watch (`None` in other modes).
    fn worker_fd(&self) -> Option<i32> {
        self.worker_fd.as_ref().map(|f| f.as_raw_fd())
    }

    /// Whether this bell belongs to the current core (false after a `reset`); a transport
    /// bell always does.
    fn current(&self) -> bool {
        match &self.core {
            None => true,
            Some(core) => core.upgrade().is_some_and(|c| crate::is_current(&c)),
        }
    }

    /// The worker's event fd is readable: progresses and re-arms the worker (detached from
    /// the GIL), then resolves the futures of the awaitables that woke. Returns `"armed"`,
    /// `"busy"` when UCX still had events after a few rounds (the fd is not armed: the loop
    /// must call again soon rather than wait on it), or `"gone"` once the bell's core is gone
    /// (the loop should stop watching the fd).
    fn on_worker_event(&self, py: Python<'_>) -> PyResult<&'static str> {
        let worker = match (&self.core, &self.transport_worker) {
            (_, Some(w)) => w.clone(),
            (Some(core), None) => match core.upgrade() {
                Some(core) => core.worker.clone(),
                None => return Ok("gone"),
            },
            (None, None) => return Ok("gone"),
        };
        let armed = crate::detach(py, || arm(&worker));
        drop(worker);
        buffer::release_pending(py);
        self.ring(py)?;
        Ok(if armed { "armed" } else { "busy" })
    }

    /// Resolves the futures of every awaitable woken since the last ring (the loop calls it
    /// when the socket is readable).
    fn ring(&self, py: Python<'_>) -> PyResult<()> {
        let mut sink = [0u8; 256];
        while matches!((&self.rx).read(&mut sink), Ok(n) if n > 0) {}
        let tokens =
            std::mem::take(&mut *self.ringer.queue.lock().unwrap_or_else(|e| e.into_inner()));
        for t in tokens {
            let fut = self
                .waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&t);
            if let Some(fut) = fut {
                let fut = fut.bind(py);
                if !fut.call_method0(pyo3::intern!(py, "done"))?.is_truthy()? {
                    fut.call_method1(pyo3::intern!(py, "set_result"), (py.None(),))?;
                }
            }
        }
        Ok(())
    }
}

/// Progresses and arms a blocking-mode worker, a bounded number of times; false when UCX
/// still had events to handle (the caller then steps again instead of sleeping).
fn arm(worker: &ucx::Worker) -> bool {
    for _ in 0..8 {
        match worker.progress_and_arm() {
            Ok(true) => return true,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "arming the worker's event fd failed");
                return false;
            }
        }
    }
    false
}

/// Wakes one awaitable through its loop's bell.
struct Token {
    ringer: Arc<Ringer>,
    token: u64,
}

impl Wake for Token {
    fn wake(self: Arc<Self>) {
        self.ringer.ring(self.token);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.ringer.ring(self.token);
    }
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// How long a blocking- or polling-mode step progresses the worker itself before it hands
/// the loop back: ucx-rs's own blocking mode spins as long after activity (`BLOCKING_SPIN`).
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// The running loop's bell (`ucxrs.core._bell()`), or its transport bell
/// (`ucxrs.core._transport_bell()`).
fn running_bell(py: Python<'_>, transport: bool) -> PyResult<Py<Bell>> {
    static BELL_OF: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    static TRANSPORT_BELL_OF: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let (cell, name) = if transport {
        (&TRANSPORT_BELL_OF, "_transport_bell")
    } else {
        (&BELL_OF, "_bell")
    };
    let f = cell.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(py.import("ucxrs.core")?.getattr(name)?.unbind())
    })?;
    Ok(f.bind(py).call0()?.cast_into::<Bell>()?.unbind())
}

/// How a pending awaitable waits.
#[derive(Debug)]
pub(crate) enum Wait {
    /// Yields to the loop, which steps it again (polling mode).
    Yield,
    /// Waits for its bell (thread mode).
    Bell,
    /// Waits for the loop's transport bell: a `transport` connection's operation, completed
    /// by the transport's own threads (the Dask comm, whatever the progress mode).
    Transport,
    /// Arms the worker's event fd, which the loop watches, then waits for its bell (blocking
    /// mode; and the transport's worker in its `"loop"` mode, then with the transport bell).
    Arm {
        worker: ucx::Worker,
        transport: bool,
    },
}

/// An awaitable over a Rust future, polled on the event loop's thread (see the module).
#[pyclass(module = "ucxrs._ucxrs")]
pub struct Polled {
    fut: Mutex<Option<PolledFuture>>,
    how: Wait,
    /// The bell and waker, made at the first pending poll.
    waker: Mutex<Option<(Py<Bell>, u64, Waker)>>,
}

impl std::fmt::Debug for Polled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let done = self.fut.lock().map_or(true, |f| f.is_none());
        f.debug_struct("Polled")
            .field("done", &done)
            .field("how", &self.how)
            .finish()
    }
}

impl Polled {
    pub(crate) fn wrap<F, T>(py: Python<'_>, fut: F, how: Wait) -> PyResult<Bound<'_, PyAny>>
    where
        F: std::future::Future<Output = PyResult<T>> + Send + 'static,
        T: for<'a> IntoPyObject<'a> + Send + 'static,
    {
        let fut = async move {
            let v = fut.await?;
            Python::try_attach(|py| v.into_py_any(py)).unwrap_or_else(|| {
                Err(UCXError::new_err("the Python interpreter is shutting down"))
            })
        };
        Ok(Bound::new(
            py,
            Polled {
                fut: Mutex::new(Some(Box::pin(fut))),
                how,
                waker: Mutex::new(None),
            },
        )?
        .into_any())
    }

    /// Polls once, detached from the GIL: `None` when already finished, else the poll. In
    /// blocking and polling modes a pending poll is followed by up to [`SPIN`] of progress and
    /// polls: a reply on one host usually comes within it, which saves the loop a sleep on
    /// the event fd and its wake-up (blocking), or a pass through the loop (a `select` call)
    /// per progress call (polling: 64 MiB took 8.2 ms a message that way, 4.9 ms in blocking
    /// mode with the spin).
    fn poll_once(&self, py: Python<'_>, waker: &Waker) -> Option<Poll<PyResult<Py<PyAny>>>> {
        let rt = pyo3_async_runtimes::tokio::get_runtime();
        let spin = !matches!(self.how, Wait::Bell | Wait::Transport);
        let external = match &self.how {
            Wait::Arm { worker, .. } => Some(worker),
            _ => None,
        };
        // The awaitable's own lock is only ever contended by a misuse (two loops awaiting
        // it), which then waits its turn.
        crate::detach(py, || {
            let mut slot = self.fut.lock().unwrap_or_else(|e| e.into_inner());
            let fut = slot.as_mut()?;
            let _rt = rt.enter();
            let mut cx = Context::from_waker(waker);
            let mut polled = fut.as_mut().poll(&mut cx);
            if spin && polled.is_pending() {
                let deadline = std::time::Instant::now() + SPIN;
                while polled.is_pending() && std::time::Instant::now() < deadline {
                    // A polling worker's futures progress it when polled; an external one is
                    // progressed here.
                    if external.is_none_or(|w| w.progress() > 0) {
                        polled = fut.as_mut().poll(&mut cx);
                    }
                }
            }
            if polled.is_ready() {
                *slot = None;
            }
            Some(polled)
        })
    }
}

#[pymethods]
impl Polled {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// One step: the result (as `StopIteration`), the error, or what to wait on: `None` (yield
    /// to the loop) or an asyncio future that the bell resolves.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let wake = !matches!(self.how, Wait::Yield);
        let waker = if wake {
            let mut w = self.waker.lock().unwrap_or_else(|e| e.into_inner());
            if w.is_none() {
                let transport = matches!(
                    self.how,
                    Wait::Transport
                        | Wait::Arm {
                            transport: true,
                            ..
                        }
                );
                let bell = running_bell(py, transport)?;
                let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
                let ringer = Arc::clone(&bell.borrow(py).ringer);
                *w = Some((bell, token, Waker::from(Arc::new(Token { ringer, token }))));
            }
            w.as_ref().map(|(_, _, waker)| waker.clone())
        } else {
            None
        };
        let polled = self.poll_once(py, waker.as_ref().unwrap_or(Waker::noop()));
        match polled {
            None => Err(PyStopIteration::new_err(py.None())),
            Some(Poll::Ready(r)) => {
                buffer::release_pending(py);
                Err(PyStopIteration::new_err(r?))
            }
            Some(Poll::Pending) if !wake => Ok(Some(py.None())),
            Some(Poll::Pending) => {
                if let Wait::Arm { worker, .. } = &self.how {
                    // The loop sleeps on the worker's event fd only once it is armed; when UCX
                    // still had events after a few rounds, step again soon instead.
                    let worker = worker.clone();
                    if !crate::detach(py, || arm(&worker)) {
                        return Ok(Some(py.None()));
                    }
                }
                // A future for the task to wait on, resolved by the bell when woken (a wake
                // that came during the poll is already queued: the bell rings after this).
                let w = self.waker.lock().unwrap_or_else(|e| e.into_inner());
                let (bell, token, _) = w.as_ref().expect("set above");
                let event_loop = pyo3_async_runtimes::get_running_loop(py)?;
                let fut = event_loop.call_method0(pyo3::intern!(py, "create_future"))?;
                fut.setattr(pyo3::intern!(py, "_asyncio_future_blocking"), true)?;
                bell.borrow(py)
                    .waiting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(*token, fut.clone().unbind());
                Ok(Some(fut.unbind()))
            }
        }
    }
}

impl Drop for Polled {
    fn drop(&mut self) {
        // A cancelled awaitable leaves its future in the bell: take it out (a pyclass is
        // dropped by Python, with the GIL held).
        let w = self
            .waker
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((bell, token, _)) = w {
            Python::attach(|py| {
                bell.borrow(py)
                    .waiting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&token);
            });
        }
    }
}
