//! Device frames of the Dask comm (built with `cuda`).
//!
//! Dask's `cuda` serialisers turn device objects (CuPy arrays, cuDF columns, RMM buffers) into
//! frames that export `__cuda_array_interface__`. [`Conn::send`](crate::comm::Conn) sends each
//! as a `transport` device frame that lends the object's memory ([`lend`]: no copy; the object
//! is held until UCX has let go of it, and released through the queue of
//! [`crate::buffer`], never under a transport or ucx-rs lock). The transport receives a device
//! frame into device memory of its landing GPU (`transport::cuda`: GPU 0's default stream
//! unless told otherwise; with one worker per GPU, as dask-cuda starts them, the worker's GPU),
//! zero-copy where the loaded UCX has CUDA transports (`cuda_ipc` between processes of one
//! node) and staged through pinned host memory where not. Python gets a [`DeviceFrame`]: bytes
//! in device memory that export `__cuda_array_interface__` (version 3, no stream: every path
//! that fills a received device buffer has finished before the frame is handed over, UCX's
//! completion or ucx-rs's copies, which wait for themselves), which Dask's CuPy, Numba and
//! cuDF deserialisers take (RMM's asks for an `rmm.DeviceBuffer` and does not); the memory
//! is freed when the last reference to it goes (a CuPy array made from it holds one).
//!
//! Where no GPU can be used, the transport delivers device frames as host frames holding the
//! same bytes (and says why, once per process); a build without `cuda` refuses to send device
//! arrays with a `TypeError` that says how to build one that can.

#[cfg(feature = "cuda")]
pub(crate) use built::*;

#[cfg(feature = "cuda")]
mod built {
    use std::sync::{Arc, Mutex};

    use pyo3::exceptions::PyRuntimeError;
    use pyo3::prelude::*;
    use pyo3::types::PyDict;
    use transport::Frame;
    use ucx::cuda::cudarc::driver::CudaStream;
    use ucx::cuda::DeviceBuffer;

    use crate::buffer::PyBuf;

    /// The transport frame for a buffer taken from a device array: a device frame that lends
    /// its memory. Host buffers are handed back.
    pub(crate) fn lend(buf: PyBuf) -> Result<Frame, PyBuf> {
        buf.into_device_buffer().map(Frame::from)
    }

    /// An empty device frame (a device array of no bytes: it has no memory to lend, and
    /// travels as a device frame so that the receiver gets a device object), on the
    /// transport's landing GPU.
    pub(crate) fn empty() -> PyResult<Frame> {
        let stream = transport::cuda::landing_stream().ok_or_else(|| {
            PyRuntimeError::new_err("CUDA: an empty device array, and no GPU to describe it on")
        })?;
        let d = DeviceBuffer::alloc(&stream, 0)
            .map_err(|e| PyRuntimeError::new_err(format!("CUDA: {e}")))?;
        Ok(Frame::from(d))
    }

    /// A received frame in device memory: `len(frame)` bytes, exported through
    /// `__cuda_array_interface__` (one dimension of `uint8`), freed when the last reference
    /// to the frame is gone.
    #[pyclass(module = "ucxrs._ucxrs", frozen)]
    #[derive(Debug)]
    pub struct DeviceFrame {
        pub(crate) buf: Arc<DeviceBuffer>,
    }

    #[pymethods]
    impl DeviceFrame {
        fn __len__(&self) -> usize {
            self.buf.len()
        }

        /// Bytes in the frame (what Dask's `nbytes` asks).
        #[getter]
        fn nbytes(&self) -> usize {
            self.buf.len()
        }

        /// Version 3 of the interface: the data is ready (no stream to wait on), writable.
        #[getter(__cuda_array_interface__)]
        fn cuda_array_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            let d = PyDict::new(py);
            d.set_item("shape", (self.buf.len(),))?;
            d.set_item("typestr", "|u1")?;
            let ptr = if self.buf.is_empty() {
                0
            } else {
                self.buf.device_ptr()
            };
            d.set_item("data", (ptr, false))?;
            d.set_item("version", 3)?;
            d.set_item("strides", py.None())?;
            d.set_item("stream", py.None())?;
            Ok(d)
        }

        fn __repr__(&self) -> String {
            format!("<ucxrs DeviceFrame of {} bytes>", self.buf.len())
        }
    }

    /// A receive buffer made by the Python allocator of [`receive_device_frames_with`] (an
    /// `rmm.DeviceBuffer`), held by the device buffer over it; the received frame is handed
    /// to Python as that object.
    pub(crate) struct Allocated(PyBuf);

    // SAFETY: nothing is reached through a shared reference but `owner_object`, which needs
    // the GIL (a clone of the reference); `PyBuf` is `Send`, and dropping it queues the release.
    unsafe impl Sync for Allocated {}

    /// The Python object a received device frame was allocated as, if it was.
    pub(crate) fn allocated_object(buf: &DeviceBuffer, py: Python<'_>) -> Option<Py<PyAny>> {
        buf.owner()?
            .downcast_ref::<Allocated>()
            .and_then(|a| a.0.owner_object(py))
    }

    /// The allocator given to [`receive_device_frames_with`], as given.
    static GIVEN: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

    /// A receive buffer for a `size`-byte device frame from `allocate(size)`: an object with
    /// `__cuda_array_interface__` (an `rmm.DeviceBuffer`) of at least `size` writable bytes.
    /// On the transport's runtime, with no transport or ucx-rs lock held (its contract); the
    /// GIL is taken here.
    fn allocate_in_python(
        allocate: &Py<PyAny>,
        stream: &Arc<CudaStream>,
        size: usize,
    ) -> ucx::Result<DeviceBuffer> {
        Python::attach(|py| {
            let bad = |why: String| ucx::Error::Cuda(format!("the device frame allocator: {why}"));
            let made = allocate
                .bind(py)
                .call1((size,))
                .and_then(|obj| PyBuf::writable(&obj))
                .map_err(|e| bad(e.to_string()))?;
            let (ptr, len) = made.memory();
            if len < size {
                return Err(bad(format!("{len} bytes for a {size}-byte frame")));
            }
            if size > 0 && made.is_host() {
                return Err(bad("host memory for a device frame".into()));
            }
            let ptr = if size == 0 { 0 } else { ptr as u64 };
            // SAFETY: `ptr` is the writable device memory (`PyBuf::writable`, taken from its
            // `__cuda_array_interface__`) of the object `made` holds, at least `size` bytes,
            // kept alive and unmoved while the buffer holds `made`; a new allocation, which
            // nothing else uses.
            Ok(unsafe {
                DeviceBuffer::lent_for_receive(stream, ptr, size, Box::new(Allocated(made)))
            })
        })
    }

    /// Receives the Dask comm's device frames (and every transport connection's) into buffers
    /// from `allocate(nbytes)` (an `rmm.DeviceBuffer`, say), which the received message then
    /// holds as they are; `None` goes back to the transport's own device memory.
    ///
    /// `allocate` runs on the transport's thread, on the landing GPU (its context current),
    /// once per device frame before the frame's bytes are received; what it returns must
    /// export `__cuda_array_interface__` with at least `nbytes` writable bytes. An exception
    /// (or a buffer too small, or in host memory) ends the connection the frame came on.
    #[pyfunction]
    #[pyo3(signature = (allocate))]
    pub fn receive_device_frames_with(py: Python<'_>, allocate: Option<Py<PyAny>>) -> PyResult<()> {
        if let Some(f) = &allocate {
            if !f.bind(py).is_callable() {
                return Err(pyo3::exceptions::PyTypeError::new_err(
                    "receive_device_frames_with: pass a callable taking a size, or None",
                ));
            }
        }
        let allocator = allocate.as_ref().map(|f| {
            let f = f.clone_ref(py);
            let a: transport::cuda::Allocator =
                Arc::new(move |stream: &Arc<CudaStream>, size: usize| {
                    allocate_in_python(&f, stream, size)
                });
            a
        });
        // Both previous values are dropped here, outside the locks (a finaliser may call back).
        let previous = transport::cuda::allocate_with(allocator);
        let given = std::mem::replace(
            &mut *GIVEN.lock().unwrap_or_else(|e| e.into_inner()),
            allocate,
        );
        drop((previous, given));
        Ok(())
    }

    /// The allocator of [`receive_device_frames_with`], or `None`.
    #[pyfunction]
    pub fn device_frame_allocator(py: Python<'_>) -> Option<Py<PyAny>> {
        GIVEN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|f| f.clone_ref(py))
    }
}

/// Whether this build sends and receives device frames (built with `cuda`; whether a GPU can
/// be used is the transport's matter, see the module).
#[pyo3::pyfunction]
pub fn transport_device_frames() -> bool {
    cfg!(feature = "cuda")
}
