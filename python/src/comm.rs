//! `transport` connections from Python, for the Dask comm backend (`ucxrs.distributed`).
//!
//! A Dask message is a list of frames; [`Conn::send`] sends them as the frames of one
//! `transport` message (one await, one crossing into Rust), and [`Conn::recv`] returns the
//! frames of one. Host frames go out without copies: each is a view of the object Dask gave
//! ([`PyBuf`]), kept until the transport has let go of it (its release is queued, never done
//! under a transport or ucx-rs lock). Received frames are [`RecvFrame`]s: writable buffers of
//! their own, as Dask's deserialisers expect (NumPy arrays and pandas blocks built on them may
//! be written to): the connections receive plain buffers (`Options::reclaimable_frames`),
//! handed to Python without a copy, and given back to the transport's receive pool when Python
//! drops them (the frames of a message of at most 64 KiB share one buffer and are copied).
//!
//! Operations are polled on the event loop's thread. In the comm's default `"loop"` mode the
//! loop progresses the transport's UCX worker itself ([`loop_worker`],
//! [`crate::awaitable::Wait::Arm`]); otherwise the transport's threads wake them through the
//! loop's transport bell ([`crate::awaitable::Wait::Transport`]). Cancelling one
//! drops its future (`recv` is cancel-safe; a `send` cancelled once posted is delivered whole
//! on `ucx://`).

use std::ffi::c_int;
use std::sync::Arc;

use bytes::Bytes;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyMemoryView};
use transport::{Address, CloseReason, Connection, Frame, Message};

use crate::awaitable::{Polled, Wait};
use crate::buffer::{self, PyBuf};
use crate::errors::{
    UCXCloseError, UCXConnectionResetError, UCXError, UCXTimedOutError, UCXUnreachableError,
};
use crate::read_ahead::ReadAhead;

/// The channel Dask messages travel on (one kind of message: the comm has no others).
const CHANNEL: u32 = 0;

/// The Python exception for a transport error: a closed connection is `UCXCloseError`, a peer
/// that failed `UCXConnectionResetError`, a time limit `UCXTimedOutError`, an address nobody
/// listens on `UCXUnreachableError`; anything else (a peer that broke the wire format, a
/// refused message) `UCXError` with the transport's words. `ucxrs.distributed` turns each
/// into Dask's `CommClosedError`.
fn to_py(e: transport::Error) -> PyErr {
    let text = e.to_string();
    match e {
        transport::Error::Closed(CloseReason::PeerFailed(_)) => {
            UCXConnectionResetError::new_err(text)
        }
        transport::Error::Closed(_) => UCXCloseError::new_err(text),
        transport::Error::Timeout(_) => UCXTimedOutError::new_err(text),
        transport::Error::Address(_) => PyValueError::new_err(text),
        transport::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            UCXUnreachableError::new_err(text)
        }
        transport::Error::Ucx(u) => crate::errors::to_py(u),
        _ => UCXError::new_err(text),
    }
}

/// `fut`, awaitable from Python, woken by the transport's threads.
fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: std::future::Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    // First: in a forked child another thread may have held the release queue's lock.
    same_process()?;
    buffer::release_pending(py);
    let how = match loop_worker()? {
        Some(worker) => Wait::Arm {
            worker,
            transport: true,
        },
        None => Wait::Transport,
    };
    Polled::wrap(py, fut, how)
}

/// The process that first used the transport (0: none yet).
static USED_BY: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Refuses a process forked after its parent used the transport: the parent's UCX worker,
/// runtime and connections did not come along (Dask starts its workers with `spawn`, which
/// is fine; `distributed.worker.multiprocessing-method: fork` is not).
fn same_process() -> PyResult<()> {
    use std::sync::atomic::Ordering;
    let me = std::process::id();
    match USED_BY.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Ok(()),
        Err(first) if first == me => Ok(()),
        Err(first) => Err(UCXError::new_err(format!(
            "ucxrs's transport was first used by process {first}, which this one ({me}) \
             forked from: UCX's worker and the runtime's threads do not survive fork. Start \
             processes with multiprocessing's 'spawn' or 'forkserver' (Dask's default)."
        ))),
    }
}

/// Whether the event loop progresses the transport's worker (`transport_configure`'s `"loop"`).
static LOOP_PROGRESS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The transport's worker, when the event loop progresses it: awaitables then progress it for
/// a moment before they wait (a reply on one host often comes within it), arm its event fd,
/// and the loop, watching that fd, progresses it and resolves what woke. A message then wakes
/// the thread that waits for it, and no thread in between (a UCX progress thread that wakes
/// and rings the loop is two wake-ups; from idle, on a VM, each costs hundreds of µs).
/// Fetched once: the transport never replaces an External worker (`transport::ucx_worker`),
/// and this runs for every operation.
pub(crate) fn loop_worker() -> PyResult<Option<ucx::Worker>> {
    static WORKER: std::sync::OnceLock<ucx::Worker> = std::sync::OnceLock::new();
    if !LOOP_PROGRESS.load(std::sync::atomic::Ordering::Acquire) {
        return Ok(None);
    }
    if let Some(w) = WORKER.get() {
        return Ok(Some(w.clone()));
    }
    let w = transport::ucx_worker().map_err(to_py)?;
    Ok(Some(WORKER.get_or_init(|| w).clone()))
}

/// The transport's options for the comm: its defaults (at most 65,536 frames and 4 GiB a
/// message, refused before anything is allocated), with a connect limit from Dask, and
/// received frames handed over as buffers Python may write to without a copy.
fn options(connect_timeout: Option<f64>, max_message: Option<u64>) -> PyResult<transport::Options> {
    let mut opts = transport::Options {
        reclaimable_frames: true,
        ..Default::default()
    };
    if let Some(m) = max_message {
        if m == 0 {
            return Err(PyValueError::new_err("max_message must be positive"));
        }
        opts.limits.max_message = m;
    }
    if let Some(t) = connect_timeout {
        if !t.is_finite() || t <= 0.0 {
            return Err(PyValueError::new_err(format!(
                "connect_timeout must be a positive number of seconds, not {t}"
            )));
        }
        opts.connect_timeout = std::time::Duration::from_secs_f64(t);
    }
    Ok(opts)
}

fn parse(address: &str) -> PyResult<Address> {
    address
        .parse()
        .map_err(|e| PyValueError::new_err(format!("{address:?}: {e}")))
}

/// A host frame lent by Python: the bytes of the object's buffer, kept until dropped.
struct Lent(PyBuf);

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.0.host_bytes()
    }
}

/// The frames of one message, taken from `frames`: objects with the buffer protocol (host
/// frames, lent), and with `cuda`, device arrays (`__cuda_array_interface__`: device frames,
/// lent, [`crate::device_frames`]).
fn message(frames: &Bound<'_, PyAny>) -> PyResult<(Message, usize)> {
    let mut out = Vec::new();
    let mut total = 0usize;
    for f in frames.try_iter()? {
        let f = f?;
        let buf = PyBuf::readable(&f)?;
        #[cfg(feature = "cuda")]
        let buf = match crate::device_frames::lend(buf) {
            Ok(device) => {
                total += device.len();
                out.push(device);
                continue;
            }
            Err(host) => host,
        };
        #[cfg(feature = "cuda")]
        if buf.host_bytes().is_empty()
            && f.hasattr(pyo3::intern!(f.py(), "__cuda_array_interface__"))?
        {
            out.push(crate::device_frames::empty()?);
            continue;
        }
        if !buf.is_host() {
            // DLPack-only device tensors in a build without `cuda` never get here (refused
            // when taken); this is for completeness.
            return Err(PyTypeError::new_err(
                "a device frame this build cannot send",
            ));
        }
        total += buf.host_bytes().len();
        out.push(Frame::from(Bytes::from_owner(Lent(buf))));
    }
    Ok((Message::from(out), total))
}

/// A connection of `transport` (`ucx://`, `tcp://`, `tls://` or `inproc://`).
#[pyclass(module = "ucxrs._ucxrs", frozen)]
#[derive(Debug)]
pub struct Conn {
    conn: Arc<Connection>,
    /// Its receive ahead of a read ([`crate::read_ahead`]).
    ahead: Arc<ReadAhead>,
}

impl Conn {
    /// A comm of `conn`: armed to receive ahead, in case it is written to before it reads.
    fn new(conn: Connection) -> Conn {
        let conn = Arc::new(conn);
        let ahead = Arc::new(ReadAhead::default());
        ahead.arm(&conn);
        Conn { conn, ahead }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.ahead.stop();
    }
}

#[pymethods]
impl Conn {
    /// Sends `frames` (a list of objects with the buffer protocol) as one message; returns
    /// the bytes sent.
    fn send<'py>(
        &self,
        py: Python<'py>,
        frames: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (msg, total) = message(frames)?;
        let conn = Arc::clone(&self.conn);
        awaitable(py, async move {
            conn.send(CHANNEL, msg).await.map_err(to_py)?;
            Ok(total)
        })
    }

    /// The frames of the next message, as a list of writable buffers.
    fn recv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let conn = Arc::clone(&self.conn);
        let ahead = Arc::clone(&self.ahead);
        awaitable(py, async move {
            let (channel, msg) = ahead.recv(&conn).await.map_err(to_py)?;
            ahead.arm(&conn);
            if channel != CHANNEL {
                let _ = conn.close().await;
                return Err(UCXError::new_err(format!(
                    "the peer sent on channel {channel}: not a ucxrs comm"
                )));
            }
            let mut frames = Vec::with_capacity(msg.frames.len());
            for f in msg.frames {
                match received(f) {
                    Ok(f) => frames.push(f),
                    Err(e) => {
                        // The message is lost: the connection ends rather than skip it.
                        let _ = conn.close().await;
                        return Err(UCXError::new_err(e));
                    }
                }
            }
            Ok(Frames(frames))
        })
    }

    /// Closes the connection: the peer's receive fails once it has taken what was sent before.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let conn = Arc::clone(&self.conn);
        awaitable(py, async move {
            match conn.close().await {
                Ok(()) | Err(transport::Error::Closed(_)) => Ok(()),
                Err(e) => Err(to_py(e)),
            }
        })
    }

    /// Closes without waiting (on the transport's runtime): for `Comm.abort`, which is not a
    /// coroutine.
    fn abort(&self) {
        let conn = Arc::clone(&self.conn);
        pyo3_async_runtimes::tokio::get_runtime().spawn(async move {
            let _ = conn.close().await;
        });
    }

    /// Whether the connection is closed (by either side, or failed).
    #[getter]
    fn closed(&self) -> bool {
        self.conn.is_closed()
    }

    /// Why it closed, in words, or `None` while open.
    #[getter]
    fn close_reason(&self) -> Option<String> {
        self.conn.close_reason().map(|r| r.to_string())
    }

    /// The peer's address (`ucx://host:port`; for an accepted connection, where it came from).
    #[getter]
    fn peer_address(&self) -> String {
        self.conn.peer_addr().to_string()
    }

    /// This end's address (`host:port` of its socket; what the peer's `peer_address` of an
    /// accepted connection says), when the transport knows it.
    #[getter]
    fn local_address(&self) -> Option<String> {
        self.conn.local_addr().map(|a| a.to_string())
    }

    /// Which lanes carry it: `(this side's ring, the peer's ring)` on `ucx://` (a same-host
    /// ring each way, docs/transport.md), `(False, False)` elsewhere.
    #[getter]
    fn rings(&self) -> (bool, bool) {
        self.conn.ucx_rings()
    }

    fn __repr__(&self) -> String {
        format!("<ucxrs Conn to {}>", self.conn.peer_addr())
    }
}

/// A received frame as Python gets it.
enum Received {
    Host(RecvFrame),
    #[cfg(feature = "cuda")]
    Device(crate::device_frames::DeviceFrame),
}

/// A frame of a received message, ready for Python; `Err` if it cannot be handed over (no
/// memory for a host frame's buffer).
fn received(f: Frame) -> Result<Received, String> {
    match f {
        Frame::Host(b) => RecvFrame::from_bytes(b).map(Received::Host),
        #[cfg(feature = "cuda")]
        Frame::Cuda(d) => Ok(Received::Device(crate::device_frames::DeviceFrame {
            buf: d,
        })),
        #[allow(unreachable_patterns)] // `Frame` is non-exhaustive
        _ => Err("a frame of a kind this build does not know".into()),
    }
}

/// The received frames, turned into a Python list on the loop's thread: writable
/// `memoryview`s for host frames (what Dask's TCP comm gives: sliceable, with `nbytes`), and
/// for device frames the objects `receive_device_frames_with`'s allocator made (RMM's
/// `DeviceBuffer`s), or else `DeviceFrame`s.
struct Frames(Vec<Received>);

impl<'py> IntoPyObject<'py> for Frames {
    type Target = PyList;
    type Output = Bound<'py, PyList>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .0
            .into_iter()
            .map(|f| -> PyResult<Bound<'py, PyAny>> {
                match f {
                    Received::Host(f) => {
                        Ok(PyMemoryView::from(Bound::new(py, f)?.as_any())?.into_any())
                    }
                    // A frame received into the allocator's object (RMM's) is that object.
                    #[cfg(feature = "cuda")]
                    Received::Device(f) => match crate::device_frames::allocated_object(&f.buf, py)
                    {
                        Some(obj) => Ok(obj.into_bound(py)),
                        None => Ok(Bound::new(py, f)?.into_any()),
                    },
                }
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }
}

/// A received frame: a writable buffer of its own (a `memoryview(frame)` is writable), whose
/// memory goes back to the transport's receive pool when the last view of it is gone.
#[pyclass(module = "ucxrs._ucxrs")]
#[derive(Debug)]
pub struct RecvFrame {
    data: bytes::BytesMut,
}

impl RecvFrame {
    /// The frame's memory, without a copy: the comm's connections receive plain buffers
    /// (`Options::reclaimable_frames`), each the only handle to its memory. The frames of a
    /// message of at most 64 KiB in all arrive together in one buffer (the transport's first
    /// UCX message) and are copied out, a few KiB each.
    fn from_bytes(b: Bytes) -> Result<RecvFrame, String> {
        let len = b.len();
        let data = transport::writable(b)
            .ok_or_else(|| format!("no memory for a received frame of {len} bytes"))?;
        Ok(RecvFrame { data })
    }
}

impl Drop for RecvFrame {
    fn drop(&mut self) {
        transport::recycle_buffer(std::mem::take(&mut self.data).into());
    }
}

#[pymethods]
impl RecvFrame {
    fn __len__(&self) -> usize {
        self.data.len()
    }

    /// The buffer protocol: one-dimensional bytes, writable. A view pins the frame (Python
    /// keeps the object alive while a view exists, and nothing here resizes it).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("a null view"));
        }
        let (ptr, len) = {
            let mut me = slf
                .try_borrow_mut()
                .map_err(|e| PyBufferError::new_err(e.to_string()))?;
            (me.data.as_mut_ptr(), me.data.len())
        };
        // SAFETY: `view` is the Py_buffer the interpreter asks us to fill (checked non-null);
        // PyBuffer_FillInfo takes a reference to the owner (released with the view), and
        // `ptr` stays valid and unmoved while the owner lives: the frame's `BytesMut` is the
        // only handle to its memory, is never resized, and is given back (`Drop`) only when
        // the object is freed, after its last view.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr.cast(),
                len as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if rc == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("<ucxrs RecvFrame of {} bytes>", self.data.len())
    }
}

/// A listener of `transport`.
#[pyclass(module = "ucxrs._ucxrs", frozen)]
#[derive(Debug)]
pub struct Listen {
    inner: Arc<tokio::sync::Mutex<Option<transport::Listener>>>,
    address: String,
}

#[pymethods]
impl Listen {
    /// The next connection. Raises `UCXCloseError` once the listener is closed.
    fn accept<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = Arc::clone(&self.inner);
        awaitable(py, async move {
            let mut l = inner.lock().await;
            let Some(l) = l.as_mut() else {
                return Err(UCXCloseError::new_err("the listener is closed"));
            };
            let conn = l.accept().await.map_err(to_py)?;
            Ok(Conn::new(conn))
        })
    }

    /// Stops listening (an `accept` in progress must be cancelled first, or it keeps the
    /// listener until it returns).
    fn close(&self) {
        if let Ok(mut l) = self.inner.try_lock() {
            l.take();
        } else {
            let inner = Arc::clone(&self.inner);
            pyo3_async_runtimes::tokio::get_runtime().spawn(async move {
                inner.lock().await.take();
            });
        }
    }

    /// The bound address (port 0 resolved): `ucx://host:port`.
    #[getter]
    fn address(&self) -> &str {
        &self.address
    }

    fn __repr__(&self) -> String {
        format!("<ucxrs Listen on {}>", self.address)
    }
}

/// Listens on `address` (`ucx://host:port`, port 0 for any); its connections take messages of
/// at most `max_message` bytes (the transport's 4 GiB by default), refused before anything is
/// allocated.
#[pyfunction]
#[pyo3(signature = (address, max_message = None))]
pub fn transport_listen<'py>(
    py: Python<'py>,
    address: &str,
    max_message: Option<u64>,
) -> PyResult<Bound<'py, PyAny>> {
    let addr = parse(address)?;
    let opts = options(None, max_message)?;
    awaitable(py, async move {
        let l = transport::listen_with(&addr, &opts).await.map_err(to_py)?;
        let address = l.local_addr().to_string();
        Ok(Listen {
            inner: Arc::new(tokio::sync::Mutex::new(Some(l))),
            address,
        })
    })
}

/// Chooses how `transport`'s `ucx://` backend runs, before its first use in this process:
/// `progress` is `"loop"` (the event loop that awaits the operations progresses the worker:
/// it watches the worker's event fd), `"thread"` (UCX's progress thread, the transport's
/// default) or `"blocking"` (a task of the runtime sleeping on the worker's event fd);
/// `same_host_ring` the bytes of each connection's same-host ring (0: none). Returns the
/// configuration in words. Raises `UCXConfigError` when the backend already runs with
/// another.
#[pyfunction]
#[pyo3(signature = (progress = None, same_host_ring = None))]
pub fn transport_configure(
    progress: Option<&str>,
    same_host_ring: Option<u64>,
) -> PyResult<String> {
    let mut intent = transport::UcxIntent::default();
    if let Some(p) = progress {
        intent.progress = match p {
            "thread" => ucx::ProgressMode::Thread,
            "blocking" => ucx::ProgressMode::Blocking,
            "loop" => ucx::ProgressMode::External,
            other => {
                return Err(PyValueError::new_err(format!(
                    "progress mode {other:?}: \"loop\", \"thread\" or \"blocking\""
                )))
            }
        };
    }
    if let Some(r) = same_host_ring {
        intent.same_host_ring = r;
    }
    let external = intent.progress == ucx::ProgressMode::External;
    let text = transport::configure_ucx(intent)
        .map_err(|e| crate::errors::UCXConfigError::new_err(e.to_string()))?;
    LOOP_PROGRESS.store(external, std::sync::atomic::Ordering::Release);
    Ok(text)
}

/// Connects to `address`, within `timeout` seconds (the transport's 10 s by default), taking
/// messages of at most `max_message` bytes (4 GiB by default).
#[pyfunction]
#[pyo3(signature = (address, timeout = None, max_message = None))]
pub fn transport_connect<'py>(
    py: Python<'py>,
    address: &str,
    timeout: Option<f64>,
    max_message: Option<u64>,
) -> PyResult<Bound<'py, PyAny>> {
    let addr = parse(address)?;
    let opts = options(timeout, max_message)?;
    awaitable(py, async move {
        let conn = transport::connect_with(&addr, &opts).await.map_err(to_py)?;
        Ok(Conn::new(conn))
    })
}
