//! Python buffers lent to UCX without a copy.
//!
//! A [`PyBuf`] holds a `Py_buffer` exported by any object with the buffer protocol (NumPy
//! arrays of any dtype, `bytes`, `bytearray`, `memoryview`): UCX reads or writes the exporter's
//! own memory, which stays pinned (the exporter cannot resize or free it) until the view is
//! released. ucx-rs keeps the buffer until UCX has let go of it, also when the awaiting
//! coroutine is cancelled (the operation parks it), so a [`PyBuf`] can be dropped anywhere,
//! including inside a UCX callback under the worker's lock, where taking the GIL could deadlock
//! against a Python thread that holds the GIL and waits for that lock. So dropping one never
//! touches Python: it queues the view, and [`release_pending`] releases the queue later, from a
//! thread that holds the GIL and no ucx-rs lock (every call from Python starts with it).

use std::ffi::c_int;
use std::sync::Mutex;

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

/// A view exported by a Python object, owned here until released.
struct View(Box<ffi::Py_buffer>);

// SAFETY: the view is only a pointer, a length and a reference to its exporter; it is used from
// other threads only as plain memory (UCX reads or writes the bytes), and it is released
// (`PyBuffer_Release`, which needs the GIL) only by `release_pending`, which holds the GIL.
unsafe impl Send for View {}

/// Views whose buffers were dropped, waiting for the GIL to be released.
static PENDING: Mutex<Vec<View>> = Mutex::new(Vec::new());

/// Releases every view dropped since the last call. Call with the GIL held and no ucx-rs lock.
pub fn release_pending(_py: Python<'_>) {
    let views = std::mem::take(&mut *PENDING.lock().unwrap_or_else(|e| e.into_inner()));
    for mut v in views {
        // SAFETY: each view was filled by a successful PyObject_GetBuffer and is released once
        // (it left the queue); the GIL is held (`_py`).
        unsafe { ffi::PyBuffer_Release(&mut *v.0) };
    }
}

/// Releases `buf`'s view from a runtime thread, once the operation that used it has returned
/// it (no ucx-rs lock is held then). While the interpreter shuts down, it is queued instead.
pub fn release_with_gil(buf: PyBuf) {
    // Not attached: the closure, and `buf` with it, is dropped, which queues the view.
    let _ = Python::try_attach(|py| buf.release(py));
}

/// A contiguous buffer of a Python object, readable (for sends) or writable (for receives).
pub struct PyBuf {
    view: Option<View>,
    /// Bytes written by a receive (the whole buffer for a send).
    init: usize,
}

impl std::fmt::Debug for PyBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyBuf")
            .field("len", &self.len())
            .field("init", &self.init)
            .finish()
    }
}

impl PyBuf {
    /// The bytes of `obj`, to send. Any C- or Fortran-contiguous buffer is taken as its bytes.
    pub fn readable(obj: &Bound<'_, PyAny>) -> PyResult<PyBuf> {
        let mut buf = Self::export(obj, ffi::PyBUF_ANY_CONTIGUOUS | ffi::PyBUF_FORMAT)?;
        buf.init = buf.len();
        Ok(buf)
    }

    /// The memory of `obj`, to receive into: it must be writable and contiguous.
    pub fn writable(obj: &Bound<'_, PyAny>) -> PyResult<PyBuf> {
        let buf = Self::export(
            obj,
            ffi::PyBUF_ANY_CONTIGUOUS | ffi::PyBUF_FORMAT | ffi::PyBUF_WRITABLE,
        )
        .map_err(|e| {
            let why = if e.is_instance_of::<PyBufferError>(obj.py()) {
                "a receive needs a writable, contiguous buffer (a bytearray, a NumPy array, \
                 a writable memoryview)"
            } else {
                "a receive needs an object with the buffer protocol"
            };
            PyValueError::new_err(format!("{why}: {e}"))
        })?;
        Ok(buf)
    }

    fn export(obj: &Bound<'_, PyAny>, flags: c_int) -> PyResult<PyBuf> {
        // SAFETY: Py_buffer is a plain C struct; all-zero is a valid "not yet filled" value.
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `obj` is a live object (bound to the GIL, which is held) and `view` points at
        // writable, owned memory that outlives the call; on success it must be released once,
        // which `release_pending` does.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(PyBuf {
            view: Some(View(view)),
            init: 0,
        })
    }

    /// Releases the view now (the GIL is held, and no ucx-rs lock: call it once the operation
    /// that used the buffer has returned it).
    pub fn release(mut self, _py: Python<'_>) {
        if let Some(mut v) = self.view.take() {
            // SAFETY: filled by a successful PyObject_GetBuffer, released once (taken out of
            // `self`); the GIL is held (`_py`).
            unsafe { ffi::PyBuffer_Release(&mut *v.0) };
        }
    }

    /// Size of the buffer in bytes.
    pub fn len(&self) -> usize {
        self.view.as_ref().map_or(0, |v| v.0.len.max(0) as usize)
    }

    fn ptr(&self) -> *mut u8 {
        self.view
            .as_ref()
            .map_or(std::ptr::NonNull::dangling().as_ptr(), |v| v.0.buf.cast())
    }
}

impl Drop for PyBuf {
    fn drop(&mut self) {
        if let Some(v) = self.view.take() {
            PENDING.lock().unwrap_or_else(|e| e.into_inner()).push(v);
        }
    }
}

// SAFETY: the exporter keeps the memory at `buf` valid and unmoved while the view is held (the
// buffer protocol's guarantee: e.g. a bytearray with an export refuses to resize), and the view
// is held until the PyBuf is dropped; `len` bytes are readable.
unsafe impl ucx::IoBuf for PyBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr()
    }
    fn bytes_init(&self) -> usize {
        self.init
    }
}

// SAFETY: as for IoBuf; a writable view (PyBUF_WRITABLE) lets `len` bytes be written.
unsafe impl ucx::IoBufMut for PyBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
    unsafe fn set_init(&mut self, n: usize) {
        self.init = n;
    }
}
