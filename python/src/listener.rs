//! Listeners: each accepted, handshaken endpoint is handed to a Python callback on the event
//! loop that created the listener.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;

use crate::buffer::release_pending;
use crate::endpoint::RawEndpoint;
use crate::errors::to_py;
use crate::{core, Live};

/// A listening socket (the Python class `ucxrs.Listener` wraps it).
#[pyclass(module = "ucxrs._ucxrs", frozen)]
#[derive(Debug)]
pub struct RawListener {
    port: u16,
    ip: String,
    task: tokio::task::JoinHandle<()>,
    /// The UCX listener, polled by `task`, one poll at a time under this lock: `close` (and
    /// the drop) take it out and drop it there and then, so the port is free when `close`
    /// returns (an aborted task drops what it owns later, on the runtime).
    slot: Slot,
    /// Counted as alive until closed.
    live: std::sync::Mutex<Option<Live>>,
    /// Connection requests UCX reported...
    arrivals: ucx::Arrivals,
    /// ...and those done with: failed, or handed to the handler and its call returned.
    served: Arc<AtomicUsize>,
}

/// What the event loop calls with an accepted endpoint: the handler, then the connection
/// counts as served.
#[pyclass(module = "ucxrs._ucxrs", frozen)]
struct Handoff {
    handler: Py<PyAny>,
    served: Arc<AtomicUsize>,
}

#[pymethods]
impl Handoff {
    fn __call__(&self, py: Python<'_>, ep: Py<RawEndpoint>) -> PyResult<Py<PyAny>> {
        let called = self.handler.call1(py, (ep,));
        self.served.fetch_add(1, Ordering::AcqRel);
        called
    }
}

#[pymethods]
impl RawListener {
    /// The port it listens on.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// The address it listens on.
    #[getter]
    fn ip(&self) -> String {
        self.ip.clone()
    }

    /// Connections coming that its handler has not yet been given (UCX reported them; their
    /// handshake, or the event loop's call, is pending).
    #[getter]
    fn arriving(&self) -> usize {
        // Served first: both only grow, so the difference never dips below what is coming.
        let served = self.served.load(Ordering::Acquire);
        self.arrivals.total().saturating_sub(served)
    }

    /// Whether it was closed.
    #[getter]
    fn closed(&self) -> bool {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
            || self.task.is_finished()
    }

    /// Stops listening (endpoints already accepted stay open); the port is free on return.
    fn close(&self, py: Python<'_>) {
        release_pending(py);
        self.task.abort();
        // Dropping it takes the worker's lock: not while holding the GIL.
        let listener = take(&self.slot);
        crate::detach(py, move || drop(listener));
        self.live.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

impl Drop for RawListener {
    fn drop(&mut self) {
        self.task.abort();
        let listener = take(&self.slot);
        if listener.is_some() {
            // Dropped by Python (it holds the GIL here): let go of it for the worker's lock.
            Python::attach(|py| crate::detach(py, move || drop(listener)));
        }
    }
}

/// Where a listener's UCX listener lives (see [`RawListener::slot`]).
type Slot = Arc<std::sync::Mutex<Option<ucx::Listener>>>;

fn take(slot: &Slot) -> Option<ucx::Listener> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// The next connection of the listener in `slot`, polled under its lock; `Closed` once it
/// was taken out.
async fn accept(slot: &Slot) -> ucx::Result<ucx::Endpoint> {
    use futures_core::Stream;
    std::future::poll_fn(|cx| {
        let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_mut() {
            None => std::task::Poll::Ready(Err(ucx::Error::Closed)),
            Some(l) => match std::pin::Pin::new(l).poll_next(cx) {
                std::task::Poll::Ready(Some(r)) => std::task::Poll::Ready(r),
                std::task::Poll::Ready(None) => std::task::Poll::Ready(Err(ucx::Error::Closed)),
                std::task::Poll::Pending => std::task::Poll::Pending,
            },
        }
    })
    .await
}

/// Listens on `port` (0: any free port) of every IPv4 interface, as UCXX does; each accepted
/// endpoint is passed to `handler(endpoint)`, called on the running event loop.
#[pyfunction]
#[pyo3(signature = (handler, port=0, handshake_timeout=None))]
pub fn listen(
    py: Python<'_>,
    handler: Py<PyAny>,
    port: u16,
    handshake_timeout: Option<f64>,
) -> PyResult<RawListener> {
    release_pending(py);
    let event_loop = pyo3_async_runtimes::get_running_loop(py)?.unbind();
    let core = py.detach(core)?;
    let rt = pyo3_async_runtimes::tokio::get_runtime();
    // Binding takes the worker's lock: not while holding the GIL.
    let mut listener = py
        .detach(|| {
            let _rt = rt.enter();
            ucx::Listener::bind(&core.worker, ([0, 0, 0, 0], port).into())
        })
        .map_err(to_py)?;
    if let Some(t) = handshake_timeout {
        listener.set_handshake_timeout(crate::seconds("connect_timeout", t)?);
    }
    let (port, ip) = (listener.port(), listener.ip().to_string());
    let live = Live::new(&core);
    let arrivals = listener.arrivals();
    let served = Arc::new(AtomicUsize::new(0));
    let handoff = Py::new(
        py,
        Handoff {
            handler,
            served: Arc::clone(&served),
        },
    )?;
    let served_here = Arc::clone(&served);
    let slot: Slot = Arc::new(std::sync::Mutex::new(Some(listener)));
    let polled = Arc::clone(&slot);
    let task = rt.spawn(async move {
        loop {
            let ep = match accept(&polled).await {
                Ok(ep) => ep,
                Err(ucx::Error::Closed) => break,
                Err(e) => {
                    // Per connection (a stranger, a failed handshake): the listener goes on.
                    served_here.fetch_add(1, Ordering::AcqRel);
                    tracing::debug!(error = %e, "a connection was refused");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
            };
            let raw = RawEndpoint::new(ep, Arc::clone(&core));
            let handed = Python::try_attach(|py| -> PyResult<()> {
                let ep = Py::new(py, raw)?;
                let call = (handoff.clone_ref(py), ep);
                event_loop.call_method1(py, "call_soon_threadsafe", call)?;
                Ok(())
            });
            match handed {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    // The loop was closed: nobody is left to take connections.
                    tracing::debug!(error = %e, "the listener's event loop is gone");
                    break;
                }
                None => break, // the interpreter is shutting down
            }
        }
    });
    Ok(RawListener {
        port,
        ip,
        task,
        slot,
        live: std::sync::Mutex::new(Some(live)),
        arrivals,
        served,
    })
}
