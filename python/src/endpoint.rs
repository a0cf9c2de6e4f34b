//! Endpoints: UCXX's tagged messages and objects over a ucx-rs endpoint.

use std::sync::Arc;

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
    closed_here: Arc<std::sync::atomic::AtomicBool>,
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
            _core: core,
            live: std::sync::Mutex::new(Some(Live::new())),
        }
    }

    /// The endpoint, unless it was closed here (close, abort): after its peer closed or
    /// failed, receives still deliver what had arrived, then report the end.
    fn mark_closed(&self) {
        self.closed_here
            .store(true, std::sync::atomic::Ordering::Release);
        self.live.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn open(&self) -> PyResult<Arc<ucx::Endpoint>> {
        if self.closed_here.load(std::sync::atomic::Ordering::Acquire) {
            return Err(UCXCloseError::new_err("Endpoint closed"));
        }
        Ok(self.ep.clone())
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
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let (r, buf) = ep.send(buf, t).await;
            Python::attach(|py| buf.release(py));
            r.map_err(to_py)
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
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let (r, buf) = ep.recv(buf, t).await;
            Python::attach(|py| buf.release(py));
            r.map_err(to_py)
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
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let (r, buf) = ep.send_obj(buf, t).await;
            Python::attach(|py| buf.release(py));
            r.map_err(to_py)
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
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let bytes = ep.recv_obj(t).await.map_err(to_py)?;
            Python::attach(|py| Ok(PyByteArray::new(py, &bytes).unbind()))
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
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let (r, bufs) = ep.send_multi(bufs, t).await;
            Python::attach(|py| bufs.into_iter().for_each(|b| b.release(py)));
            r.map_err(to_py)
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
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let frames = ep.recv_multi(t).await.map_err(to_py)?;
            Python::attach(|py| {
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
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let (r, buf) = ep.am_send(buf).await;
            Python::attach(|py| buf.release(py));
            r.map_err(to_py)
        })
    }

    /// Receives the next active message from the peer, as a `bytearray`.
    fn am_recv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        release_pending(py);
        let ep = self.open()?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let bytes = ep.am_recv().await.map_err(to_py)?;
            Python::attach(|py| Ok(PyByteArray::new(py, &bytes).unbind()))
        })
    }

    /// Closes the endpoint: pending operations end with `UCXCanceledError`, the peer's with
    /// `UCXConnectionResetError` (or end of messages).
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        release_pending(py);
        let ep = self.ep.clone();
        self.mark_closed();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            if ep.is_closed() {
                return Ok(());
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

    /// Whether the endpoint is closed (locally, or by its peer's failure or close).
    #[getter]
    fn closed(&self) -> bool {
        self.ep.is_closed()
    }

    /// A number that identifies the endpoint in this process.
    #[getter]
    fn uid(&self) -> u64 {
        Arc::as_ptr(&self.ep) as usize as u64
    }
}

/// Connects to a UCXX-compatible listener (ours or UCXX's) at `host:port`.
#[pyfunction]
pub fn connect(py: Python<'_>, host: String, port: u16) -> PyResult<Bound<'_, PyAny>> {
    release_pending(py);
    let core = py.detach(core)?;
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let opts = ucx::ConnectOptions {
            timeout: core.connect_timeout,
            ..Default::default()
        };
        let ep = ucx::Endpoint::connect_with(&core.worker, (host.as_str(), port), opts)
            .await
            .map_err(to_py)?;
        Ok(RawEndpoint::new(ep, core))
    })
}
