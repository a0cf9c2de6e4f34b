//! Listeners: each accepted, handshaken endpoint is handed to a Python callback on the event
//! loop that created the listener.

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
    /// Counted as alive until closed.
    live: std::sync::Mutex<Option<Live>>,
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

    /// Whether it was closed.
    #[getter]
    fn closed(&self) -> bool {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
            || self.task.is_finished()
    }

    /// Stops listening (endpoints already accepted stay open).
    fn close(&self, py: Python<'_>) {
        release_pending(py);
        self.task.abort();
        self.live.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

impl Drop for RawListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Listens on `port` (0: any free port) of every IPv4 interface, as UCXX does; each accepted
/// endpoint is passed to `handler(endpoint)`, called on the running event loop.
#[pyfunction]
#[pyo3(signature = (handler, port=0))]
pub fn listen(py: Python<'_>, handler: Py<PyAny>, port: u16) -> PyResult<RawListener> {
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
    let (port, ip) = (listener.port(), listener.ip().to_string());
    let task = rt.spawn(async move {
        loop {
            let ep = match listener.accept().await {
                Ok(ep) => ep,
                Err(ucx::Error::Closed) => break,
                Err(e) => {
                    // Per connection (a stranger, a failed handshake): the listener goes on.
                    tracing::debug!(error = %e, "a connection was refused");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
            };
            let raw = RawEndpoint::new(ep, Arc::clone(&core));
            let handed = Python::try_attach(|py| -> PyResult<()> {
                let ep = Py::new(py, raw)?;
                event_loop.call_method1(py, "call_soon_threadsafe", (handler.clone_ref(py), ep))?;
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
        live: std::sync::Mutex::new(Some(Live::new())),
    })
}
