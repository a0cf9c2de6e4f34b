//! Endpoints: UCXX's tagged messages and objects over a ucx-rs endpoint.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyByteArray;

use crate::buffer::{release_pending, PyBuf};
use crate::errors::{to_py, UCXCloseError};
use crate::{core, Core, Live};

/// A connected endpoint (the Python class `ucxrs.Endpoint` wraps it).
#[pyclass(module = "ucxrs._ucxrs", frozen)]
#[derive(Debug)]
pub struct RawEndpoint {
    ep: Arc<ucx::Endpoint>,
    /// Closed or aborted here.
    closed_here: Arc<AtomicBool>,
    /// A send completed since the peer last confirmed it had taken everything in.
    sent: Arc<AtomicBool>,
    /// Keeps the worker alive as long as the endpoint.
    _core: Arc<Core>,
    /// Counted as alive until closed or aborted here.
    live: std::sync::Mutex<Option<Live>>,
}

impl RawEndpoint {
    pub(crate) fn new(ep: ucx::Endpoint, core: Arc<Core>) -> RawEndpoint {
        RawEndpoint {
            ep: Arc::new(ep),
            closed_here: Arc::default(),
            sent: Arc::default(),
            live: std::sync::Mutex::new(Some(Live::new(&core))),
            _core: core,
        }
    }

    /// The endpoint, unless it was closed here (close, abort): after its peer closed or
    /// failed, receives still deliver what had arrived, then report the end.
    fn mark_closed(&self) {
        self.closed_here.store(true, Ordering::Release);
        self.live.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn open(&self) -> PyResult<Arc<ucx::Endpoint>> {
        if self.closed_here.load(Ordering::Acquire) {
            return Err(UCXCloseError::new_err("Endpoint closed"));
        }
        Ok(self.ep.clone())
    }
}

/// How long a close waits for the peer to confirm it took in what was sent (ucx-rs peers answer
/// at once; UCXX peers never do, so closing after a send to one takes this long).
const SETTLE_LIMIT: Duration = Duration::from_millis(100);

/// Waits (bounded) until the peer has taken in everything sent on `ep`: a close that follows a
/// send at once could otherwise overtake its last bytes and fail the peer's receive (see
/// ucx-rs's `Endpoint::sync_with_peer`).
async fn settle(ep: &ucx::Endpoint) {
    let _ = tokio::time::timeout(SETTLE_LIMIT, ep.sync_with_peer()).await;
}

impl Drop for RawEndpoint {
    /// Dropped without a close (garbage-collected) after sends: settle, then close, on the
    /// runtime, as `close()` would. Otherwise the endpoint is let go of on the runtime too:
    /// dropping it takes the worker's lock (and, in polling mode, progresses the worker), which
    /// the garbage collector's thread, holding the GIL, must not wait for.
    fn drop(&mut self) {
        let ep = self.ep.clone();
        let core = self._core.clone();
        let rt = pyo3_async_runtimes::tokio::get_runtime();
        if self.closed_here.load(Ordering::Acquire) || !self.sent.load(Ordering::Acquire) {
            rt.spawn_blocking(move || drop((ep, core)));
            return;
        }
        rt.spawn(async move {
            if !ep.is_closed() {
                settle(&ep).await;
                let _ = ep.close().await;
            }
            drop(core);
        });
    }
}

/// Runs `f` attached to the interpreter, from a runtime thread; fails instead while the
/// interpreter shuts down.
fn with_python<T>(f: impl for<'py> FnOnce(Python<'py>) -> PyResult<T>) -> PyResult<T> {
    Python::try_attach(f).unwrap_or_else(|| {
        Err(crate::errors::UCXError::new_err(
            "the Python interpreter is shutting down",
        ))
    })
}

/// Buffers lent to UCX for one operation, released once UCX hands them back.
trait Lent: Send + 'static {
    fn release(self);
}

impl Lent for PyBuf {
    fn release(self) {
        crate::buffer::release_with_gil(self);
    }
}

impl Lent for Vec<PyBuf> {
    fn release(self) {
        self.into_iter().for_each(crate::buffer::release_with_gil);
    }
}

impl RawEndpoint {
    /// `op` on `ep` with `bufs` lent to UCX, as an awaitable: the buffers are released when UCX
    /// hands them back, and a send (`sends`) marks the endpoint for [`settle`] at its close.
    fn lend<'py, B, T, F, Fut>(
        &self,
        py: Python<'py>,
        ep: Arc<ucx::Endpoint>,
        bufs: B,
        sends: bool,
        op: F,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        B: Lent,
        T: for<'a> IntoPyObject<'a> + Send + 'static,
        F: FnOnce(Arc<ucx::Endpoint>, B) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = (ucx::Result<T>, B)> + Send + 'static,
    {
        let sent = sends.then(|| self.sent.clone());
        crate::awaitable(py, &self._core, async move {
            let (r, bufs) = op(ep, bufs).await;
            if let Some(sent) = sent {
                sent.store(true, Ordering::Release);
            }
            bufs.release();
            r.map_err(to_py)
        })
    }
}

/// The tag of a call: none (the endpoint's own), a user tag (hashed with the endpoint's, as
/// UCXX does), or a raw one (`force_tag=True`).
fn tag(tag: Option<i128>, force: bool) -> PyResult<ucx::Tag> {
    Ok(match (tag, force) {
        (None, _) => ucx::Tag::Default,
        (Some(t), false) => ucx::Tag::User(t),
        (Some(t), true) => ucx::Tag::Forced(u64::try_from(t).map_err(|_| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "a forced tag is a raw 64-bit UCP tag: {t} is out of range"
            ))
        })?),
    })
}

#[pymethods]
impl RawEndpoint {
    /// Sends `buffer` (any object with the buffer protocol) as one tagged message.
    #[pyo3(signature = (buffer, tag=None, force_tag=false))]
    fn send<'py>(
        &self,
        py: Python<'py>,
        buffer: &Bound<'py, PyAny>,
        tag: Option<i128>,
        force_tag: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        release_pending(py);
        let ep = self.open()?;
        let t = self::tag(tag, force_tag)?;
        let buf = PyBuf::readable(buffer)?;
        self.lend(py, ep, buf, true, move |ep, b| async move {
            ep.send(b, t).await
        })
    }

    /// Receives one tagged message into `buffer` (writable and contiguous); returns its size.
    #[pyo3(signature = (buffer, tag=None, force_tag=false))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        buffer: &Bound<'py, PyAny>,
        tag: Option<i128>,
        force_tag: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        release_pending(py);
        let ep = self.open()?;
        let t = self::tag(tag, force_tag)?;
        let buf = PyBuf::writable(buffer)?;
        self.lend(py, ep, buf, false, move |ep, b| async move {
            ep.recv(b, t).await
        })
    }

    /// Sends `buffer` as an object: its size, then its bytes (UCXX's `send_obj`).
    #[pyo3(signature = (buffer, tag=None, force_tag=false))]
    fn send_obj<'py>(
        &self,
        py: Python<'py>,
        buffer: &Bound<'py, PyAny>,
        tag: Option<i128>,
        force_tag: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        release_pending(py);
        let ep = self.open()?;
        let t = self::tag(tag, force_tag)?;
        let buf = PyBuf::readable(buffer)?;
        self.lend(py, ep, buf, true, move |ep, b| async move {
            ep.send_obj(b, t).await
        })
    }

    /// Receives an object sent with `send_obj`, as a `bytearray` (its announced size is
    /// checked against the endpoint's limit before any memory is set aside).
    #[pyo3(signature = (tag=None, force_tag=false))]
    fn recv_obj<'py>(
        &self,
        py: Python<'py>,
        tag: Option<i128>,
        force_tag: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        release_pending(py);
        let ep = self.open()?;
        let t = self::tag(tag, force_tag)?;
        crate::awaitable(py, &self._core, async move {
            let bytes = ep.recv_obj(t).await.map_err(to_py)?;
            with_python(|py| Ok(PyByteArray::new(py, &bytes).unbind()))
        })
    }

    /// Sends the buffers as one multi-buffer message (UCXX's `send_multi`: headers, then each
    /// buffer, on one tag).
    #[pyo3(signature = (buffers, tag=None, force_tag=false))]
    fn send_multi<'py>(
        &self,
        py: Python<'py>,
        buffers: Vec<Bound<'py, PyAny>>,
        tag: Option<i128>,
        force_tag: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        release_pending(py);
        let ep = self.open()?;
        let t = self::tag(tag, force_tag)?;
        let bufs = buffers
            .iter()
            .map(PyBuf::readable)
            .collect::<PyResult<Vec<_>>>()?;
        self.lend(py, ep, bufs, true, move |ep, b| async move {
            ep.send_multi(b, t).await
        })
    }

    /// Receives a message sent with `send_multi`: a list of `bytearray`s (announced sizes
    /// checked against the endpoint's limits before anything is allocated).
    #[pyo3(signature = (tag=None, force_tag=false))]
    fn recv_multi<'py>(
        &self,
        py: Python<'py>,
        tag: Option<i128>,
        force_tag: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        release_pending(py);
        let ep = self.open()?;
        let t = self::tag(tag, force_tag)?;
        crate::awaitable(py, &self._core, async move {
            let frames = ep.recv_multi(t).await.map_err(to_py)?;
            with_python(|py| {
                Ok(frames
                    .iter()
                    .map(|f| PyByteArray::new(py, f).unbind())
                    .collect::<Vec<_>>())
            })
        })
    }

    /// Sends `buffer` as one active message (the receiver allocates).
    fn am_send<'py>(
        &self,
        py: Python<'py>,
        buffer: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        release_pending(py);
        let ep = self.open()?;
        let buf = PyBuf::readable(buffer)?;
        self.lend(
            py,
            ep,
            buf,
            true,
            |ep, b| async move { ep.am_send(b).await },
        )
    }

    /// Receives the next active message from the peer, as a `bytearray`.
    fn am_recv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        release_pending(py);
        let ep = self.open()?;
        crate::awaitable(py, &self._core, async move {
            let bytes = ep.am_recv().await.map_err(to_py)?;
            with_python(|py| Ok(PyByteArray::new(py, &bytes).unbind()))
        })
    }

    /// Closes the endpoint: pending operations end with `UCXCanceledError`, the peer's with
    /// `UCXConnectionResetError` (or end of messages).
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        release_pending(py);
        let ep = self.ep.clone();
        self.mark_closed();
        let sent = self.sent.swap(false, Ordering::AcqRel);
        crate::awaitable(py, &self._core, async move {
            // Closed by its peer already (its close or failure was reported): UCX's endpoint
            // is still there, with its sockets, until it is closed here too.
            if sent && !ep.is_closed() {
                settle(&ep).await;
            }
            ep.close().await.map_err(to_py)
        })
    }

    /// Closes the endpoint at once, without waiting for anything.
    fn abort(&self, py: Python<'_>) {
        release_pending(py);
        self.mark_closed();
        let ep = self.ep.clone();
        py.detach(move || ep.abort());
    }

    /// Calls `callback()` on the running event loop once the endpoint closes (here, or by its
    /// peer's close or failure); at once if it is already closed. A later call replaces it.
    fn set_close_callback(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        release_pending(py);
        let event_loop = pyo3_async_runtimes::get_running_loop(py)?.unbind();
        let ep = self.ep.clone();
        // ucx-rs runs it after letting go of the worker lock; it only schedules the callback.
        py.detach(move || {
            ep.on_close(move |_| {
                let _ = Python::try_attach(|py| {
                    event_loop.call_method1(py, "call_soon_threadsafe", (callback,))
                });
            })
        });
        Ok(())
    }

    /// Whether the endpoint is closed (locally, or by its peer's failure or close).
    #[getter]
    fn closed(&self) -> bool {
        self.ep.is_closed()
    }

    /// The most bytes a receive that allocates may take, against what the peer announces.
    #[getter]
    fn max_message(&self) -> usize {
        self.ep.max_message()
    }

    /// A number that identifies the endpoint in this process.
    #[getter]
    fn uid(&self) -> u64 {
        Arc::as_ptr(&self.ep) as usize as u64
    }
}

/// Connects to a UCXX-compatible listener (ours or UCXX's) at `host:port`.
#[pyfunction]
#[pyo3(signature = (host, port, timeout=None))]
pub fn connect(
    py: Python<'_>,
    host: String,
    port: u16,
    timeout: Option<f64>,
) -> PyResult<Bound<'_, PyAny>> {
    release_pending(py);
    let core = py.detach(core)?;
    let timeout = match timeout {
        Some(t) => crate::seconds("connect_timeout", t)?,
        None => core.connect_timeout,
    };
    crate::awaitable(py, &core.clone(), async move {
        let opts = ucx::ConnectOptions {
            timeout,
            ..Default::default()
        };
        let ep = ucx::Endpoint::connect_with(&core.worker, (host.as_str(), port), opts)
            .await
            .map_err(to_py)?;
        Ok(RawEndpoint::new(ep, core))
    })
}

/// Connects to a worker by the sealed address its `get_worker_address` gave (no handshake:
/// tags as between two such endpoints). An altered address, or one of another UCX version, is
/// refused before UCX sees it (ucx-rs's `Endpoint::connect_sealed`).
#[pyfunction]
pub fn connect_address(py: Python<'_>, address: Vec<u8>) -> PyResult<RawEndpoint> {
    release_pending(py);
    let core = py.detach(core)?;
    let ep = py
        .detach(|| ucx::Endpoint::connect_sealed(&core.worker, &address))
        .map_err(to_py)?;
    Ok(RawEndpoint::new(ep, core))
}

/// Receives into `buffer` one message sent to this process's worker with the raw tag `tag`
/// (a forced tag: `force_tag=True` on the sender), from any endpoint: UCXX's `ucxx.recv`, for
/// peers connected by worker address. `None` once it has landed.
#[pyfunction]
pub fn worker_recv<'py>(
    py: Python<'py>,
    buffer: &Bound<'py, PyAny>,
    tag: u64,
) -> PyResult<Bound<'py, PyAny>> {
    release_pending(py);
    let core = py.detach(crate::core)?;
    let buf = PyBuf::writable(buffer)?;
    let worker = core.worker.clone();
    crate::awaitable(py, &core, async move {
        let (r, buf) = worker.tag_recv(buf, tag, u64::MAX).await;
        Lent::release(buf);
        r.map(|_| ()).map_err(to_py)
    })
}
