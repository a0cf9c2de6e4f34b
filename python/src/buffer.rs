//! Python buffers lent to UCX without a copy.
//!
//! A [`PyBuf`] holds memory exported by a Python object, in one of three ways:
//! - the buffer protocol (NumPy arrays of any dtype, `bytes`, `bytearray`, `memoryview`): a
//!   `Py_buffer` view, which keeps the exporter from resizing or freeing its memory;
//! - `__cuda_array_interface__` (CuPy, PyTorch, Numba device arrays; built with `cuda`): a
//!   reference to the object, which owns the device memory;
//! - DLPack (`__dlpack__`: PyTorch tensors on the CPU or a GPU, JAX, CuPy): the consumed
//!   capsule's managed tensor, whose deleter is called once UCX has let go.
//!
//! ucx-rs keeps the buffer until UCX has let go of it, also when the awaiting coroutine is
//! cancelled (the operation parks it), so a [`PyBuf`] can be dropped anywhere, including inside
//! a UCX callback under the worker's lock, where taking the GIL could deadlock against a Python
//! thread that holds the GIL and waits for that lock. So dropping one never touches Python: it
//! queues what it holds, and [`release_pending`] releases the queue later, from a thread that
//! holds the GIL and no ucx-rs lock (every call from Python starts with it).

use std::ffi::c_int;
use std::sync::Mutex;

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::dlpack;

/// What keeps a buffer's memory alive and where it is, until released with the GIL held.
enum Held {
    /// A buffer-protocol view.
    View(Box<ffi::Py_buffer>),
    /// The object that owns the memory (`__cuda_array_interface__`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Object(Py<PyAny>),
    /// A DLPack tensor taken over from its capsule: its deleter frees it.
    Dlpack(dlpack::Managed),
}

impl Held {
    /// Lets go of the memory. The GIL must be held.
    fn release(self, _py: Python<'_>) {
        match self {
            Held::View(mut v) => {
                // SAFETY: filled by a successful PyObject_GetBuffer and released once (the
                // view is consumed here); the GIL is held (`_py`).
                unsafe { ffi::PyBuffer_Release(&mut *v) };
            }
            Held::Object(o) => drop(o),
            Held::Dlpack(m) => m.delete(_py),
        }
    }
}

/// Lets go of `held`: now if the GIL is at hand, else through the queue.
struct Holder(Option<Held>);

// SAFETY: what is held is a pointer, a length and a reference to its exporter: used from other
// threads only as plain memory (UCX reads or writes the bytes), and released (which needs the
// GIL) only by `Held::release`, called with the GIL held.
unsafe impl Send for Holder {}

/// What was dropped, waiting for the GIL to be released.
static PENDING: Mutex<Vec<Holder>> = Mutex::new(Vec::new());

/// Releases every buffer dropped since the last call. Call with the GIL held and no ucx-rs lock.
pub fn release_pending(py: Python<'_>) {
    let held = std::mem::take(&mut *PENDING.lock().unwrap_or_else(|e| e.into_inner()));
    for mut h in held {
        if let Some(h) = h.0.take() {
            h.release(py);
        }
    }
}

/// Releases `buf` from a runtime thread, once the operation that used it has returned it (no
/// ucx-rs lock is held then). While the interpreter shuts down, it is queued instead.
pub fn release_with_gil(buf: PyBuf) {
    // Not attached: the closure, and `buf` with it, is dropped, which queues it.
    let _ = Python::try_attach(|py| buf.release(py));
}

/// A contiguous buffer of a Python object, readable (for sends) or writable (for receives), in
/// host or device memory.
pub struct PyBuf {
    held: Holder,
    ptr: *mut u8,
    len: usize,
    /// Bytes written by a receive (the whole buffer for a send).
    init: usize,
    mem: ucx::MemoryType,
    /// For device memory: the stream ucx-rs synchronises before UCX touches it (the producer's
    /// work was ordered before it when the buffer was taken).
    #[cfg(feature = "cuda")]
    stream: Option<std::sync::Arc<ucx::cuda::cudarc::driver::CudaStream>>,
}

// SAFETY: `ptr` is the exporter's memory, kept valid by `held` (see `Holder`); nothing else is
// thread-bound.
unsafe impl Send for PyBuf {}

impl std::fmt::Debug for PyBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyBuf")
            .field("len", &self.len)
            .field("init", &self.init)
            .field("memory", &self.mem)
            .finish()
    }
}

/// How a buffer is going to be used.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// Where a buffer lives, as taken from its exporter.
pub struct Memory {
    pub ptr: *mut u8,
    pub len: usize,
    pub device: Option<i32>,
}

impl PyBuf {
    /// The bytes of `obj`, to send. Any C- or Fortran-contiguous buffer is taken as its bytes.
    pub fn readable(obj: &Bound<'_, PyAny>) -> PyResult<PyBuf> {
        let mut buf = Self::take(obj, Access::Read)?;
        buf.init = buf.len;
        Ok(buf)
    }

    /// The memory of `obj`, to receive into: it must be writable and contiguous.
    pub fn writable(obj: &Bound<'_, PyAny>) -> PyResult<PyBuf> {
        Self::take(obj, Access::Write)
    }

    fn take(obj: &Bound<'_, PyAny>, access: Access) -> PyResult<PyBuf> {
        // The buffer protocol first (the fast path for host memory); device arrays may have
        // it too and refuse it (CuPy raises TypeError), so a refusal tries the others.
        // SAFETY: `obj` is a live object and the GIL is held; the check only reads its type.
        let refused = if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } != 0 {
            match Self::view(obj, access) {
                Ok(buf) => return Ok(buf),
                Err(e) => Some(e),
            }
        } else {
            None
        };
        let py = obj.py();
        if obj.hasattr(pyo3::intern!(py, "__cuda_array_interface__"))? {
            return Self::cuda_array(obj, access);
        }
        if obj.hasattr(pyo3::intern!(py, "__dlpack__"))? {
            return Self::dlpack(obj, access);
        }
        if let Some(e) = refused {
            return Err(e);
        }
        Err(PyTypeError::new_err(format!(
            "{} has neither the buffer protocol, __cuda_array_interface__ nor __dlpack__: \
             pass a bytes-like object, a NumPy, CuPy or PyTorch array",
            obj.get_type().name()?
        )))
    }

    fn view(obj: &Bound<'_, PyAny>, access: Access) -> PyResult<PyBuf> {
        let mut flags = ffi::PyBUF_ANY_CONTIGUOUS | ffi::PyBUF_FORMAT;
        if access == Access::Write {
            flags |= ffi::PyBUF_WRITABLE;
        }
        // SAFETY: Py_buffer is a plain C struct; all-zero is a valid "not yet filled" value.
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `obj` is a live object (bound to the GIL, which is held) and `view` points at
        // writable, owned memory that outlives the call; on success it must be released once,
        // which `Held::release` does.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags as c_int) };
        if rc != 0 {
            let e = PyErr::fetch(obj.py());
            if access == Access::Write && e.is_instance_of::<PyBufferError>(obj.py()) {
                return Err(PyValueError::new_err(format!(
                    "a receive needs a writable, contiguous buffer (a bytearray, a NumPy \
                     array, a writable memoryview): {e}"
                )));
            }
            return Err(e);
        }
        let memory = Memory {
            ptr: view.buf.cast(),
            len: view.len.max(0) as usize,
            device: None,
        };
        Self::new(Held::View(view), memory, obj.py())
    }

    #[cfg(feature = "cuda")]
    fn cuda_array(obj: &Bound<'_, PyAny>, access: Access) -> PyResult<PyBuf> {
        let memory = crate::device::interface(obj, access)?;
        Self::new(Held::Object(obj.clone().unbind()), memory, obj.py())
    }

    #[cfg(not(feature = "cuda"))]
    fn cuda_array(obj: &Bound<'_, PyAny>, _access: Access) -> PyResult<PyBuf> {
        Err(no_cuda(obj))
    }

    fn dlpack(obj: &Bound<'_, PyAny>, access: Access) -> PyResult<PyBuf> {
        let (managed, memory) = dlpack::take(obj, access)?;
        Self::new(Held::Dlpack(managed), memory, obj.py())
    }

    /// A buffer over `memory`, on the device it names (opened, with its stream, if need be).
    fn new(held: Held, memory: Memory, _py: Python<'_>) -> PyResult<PyBuf> {
        let mut buf = PyBuf {
            held: Holder(Some(held)),
            ptr: memory.ptr,
            len: memory.len,
            init: 0,
            mem: ucx::MemoryType::Host,
            #[cfg(feature = "cuda")]
            stream: None,
        };
        if buf.ptr.is_null() {
            // An empty array may have no memory at all: UCX needs a pointer, never read.
            if buf.len != 0 {
                return Err(PyValueError::new_err("the buffer's memory is NULL"));
            }
            buf.ptr = std::ptr::NonNull::dangling().as_ptr();
        }
        if let Some(ordinal) = memory.device {
            #[cfg(feature = "cuda")]
            {
                // Empty device arrays are sent as empty host messages: nothing to read.
                if buf.len > 0 {
                    buf.mem = ucx::MemoryType::Cuda;
                    if buf.stream.is_none() {
                        buf.stream = Some(crate::device::gpu(ordinal)?.stream);
                    }
                }
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = ordinal;
                return Err(PyTypeError::new_err(NO_CUDA));
            }
        }
        Ok(buf)
    }

    /// Where the memory starts, and its length in bytes.
    #[cfg(feature = "cuda")]
    pub fn memory(&self) -> (*mut u8, usize) {
        (self.ptr, self.len)
    }

    /// The object that owns the memory (a new reference), for memory taken through
    /// `__cuda_array_interface__`.
    #[cfg(feature = "cuda")]
    pub fn owner_object(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        match &self.held.0 {
            Some(Held::Object(o)) => Some(o.clone_ref(py)),
            _ => None,
        }
    }

    /// Whether the memory is the host's.
    pub fn is_host(&self) -> bool {
        self.mem == ucx::MemoryType::Host
    }

    /// The bytes, for a host buffer taken to send (empty for device memory).
    pub fn host_bytes(&self) -> &[u8] {
        if !self.is_host() || self.init == 0 {
            return &[];
        }
        // SAFETY: host memory of at least `init` bytes, kept valid and unmoved by `held` for
        // as long as `self` lives (see `IoBuf` below); the slice borrows `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.init) }
    }

    /// For device memory taken to send: a device buffer that lends it (no copy) and holds
    /// this buffer, and so the array, until it is dropped (the release then queued as any
    /// other). Host memory is handed back.
    #[cfg(feature = "cuda")]
    pub fn into_device_buffer(self) -> Result<ucx::cuda::DeviceBuffer, PyBuf> {
        let stream = match &self.stream {
            Some(s) if self.mem == ucx::MemoryType::Cuda => std::sync::Arc::clone(s),
            _ => return Err(self),
        };
        let (ptr, len) = (self.ptr as u64, self.init);
        // SAFETY: `ptr` is the device array's memory on the GPU whose stream this is (taken
        // from its `__cuda_array_interface__` or DLPack tensor, after the producer's stream
        // was synchronised), valid for `init` bytes while the array is held; the buffer is
        // only sent from, never received into; it holds `self`, which holds the array.
        Ok(unsafe { ucx::cuda::DeviceBuffer::lent(&stream, ptr, len, Box::new(Holding(self))) })
    }

    /// Releases it now (the GIL is held, and no ucx-rs lock: call it once the operation that
    /// used the buffer has returned it).
    pub fn release(mut self, py: Python<'_>) {
        if let Some(h) = self.held.0.take() {
            h.release(py);
        }
    }
}

/// A buffer held by a lent device buffer, only to be dropped.
#[cfg(feature = "cuda")]
struct Holding(#[allow(dead_code)] PyBuf);

// SAFETY: nothing is ever reached through a shared reference to it (it is held, then dropped,
// which queues the release); `PyBuf` is `Send`.
#[cfg(feature = "cuda")]
unsafe impl Sync for Holding {}

/// Why a device array cannot be used by this build.
#[cfg(not(feature = "cuda"))]
pub const NO_CUDA: &str = "this ucxrs was built without CUDA support, so it cannot send or \
                           receive device arrays: build it with `--features cuda` (docs/python.md)";

#[cfg(not(feature = "cuda"))]
fn no_cuda(obj: &Bound<'_, PyAny>) -> PyErr {
    let name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    PyTypeError::new_err(format!("{name} is a device array, and {NO_CUDA}"))
}

impl Drop for PyBuf {
    fn drop(&mut self) {
        if let Some(h) = self.held.0.take() {
            PENDING
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Holder(Some(h)));
        }
    }
}

// SAFETY: the exporter keeps the memory at `ptr` valid and unmoved while it is held (the buffer
// protocol's guarantee: e.g. a bytearray with an export refuses to resize; a device array or
// DLPack tensor owns its allocation until released), and it is held until the PyBuf is dropped;
// `len` bytes are readable.
unsafe impl ucx::IoBuf for PyBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn bytes_init(&self) -> usize {
        self.init
    }
    fn memory_type(&self) -> ucx::MemoryType {
        self.mem
    }
    #[cfg(feature = "cuda")]
    fn cuda_stream(&self) -> Option<&std::sync::Arc<ucx::cuda::cudarc::driver::CudaStream>> {
        self.stream.as_ref()
    }
}

// SAFETY: as for IoBuf; a writable export (PyBUF_WRITABLE, or a device array not marked
// read-only) lets `len` bytes be written.
unsafe impl ucx::IoBufMut for PyBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
    unsafe fn set_init(&mut self, n: usize) {
        self.init = n;
    }
}
