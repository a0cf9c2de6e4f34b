//! DLPack: tensors taken over from `__dlpack__` capsules (PyTorch tensors on the CPU or a GPU,
//! JAX and CuPy arrays), the consumer's side of the protocol.
//!
//! The producer's `__dlpack__` returns a capsule named `dltensor` holding a `DLManagedTensor`;
//! the consumer renames it `used_dltensor` (so the capsule's destructor leaves it alone) and
//! calls the tensor's deleter once done, here once UCX has let go of the memory. For a tensor
//! on a GPU, `__dlpack__(stream=s)` orders the producer's pending work before our stream `s`,
//! which ucx-rs synchronises before UCX touches the memory.

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::buffer::{Access, Memory};

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// DLPack's device types that we take.
const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;
const KDL_CUDA_MANAGED: i32 = 13;

const DLTENSOR: &CStr = c"dltensor";
const USED_DLTENSOR: &CStr = c"used_dltensor";

/// A tensor taken over from its capsule; [`delete`](Self::delete) hands it back to its
/// producer.
pub struct Managed(NonNull<DLManagedTensor>);

impl Managed {
    /// Calls the producer's deleter. The GIL must be held (deleters release Python objects).
    pub fn delete(self, _py: Python<'_>) {
        let p = self.0.as_ptr();
        // SAFETY: `p` was taken from a `dltensor` capsule, which gave us its ownership; the
        // deleter is called once (`self` is consumed), with the GIL held.
        unsafe {
            if let Some(deleter) = (*p).deleter {
                deleter(p);
            }
        }
    }
}

/// The bytes of `obj`'s DLPack tensor; it must be contiguous (C or Fortran order).
pub fn take(obj: &Bound<'_, PyAny>, _access: Access) -> PyResult<(Managed, Memory)> {
    let py = obj.py();
    let (kind, id): (i32, i32) = obj
        .call_method0(pyo3::intern!(py, "__dlpack_device__"))?
        .extract()?;
    let capsule = match kind {
        KDL_CPU | KDL_CUDA_HOST => obj.call_method0(pyo3::intern!(py, "__dlpack__"))?,
        KDL_CUDA | KDL_CUDA_MANAGED => device_capsule(obj, id)?,
        other => {
            return Err(PyTypeError::new_err(format!(
                "{}: DLPack device type {other} is neither a CPU nor a CUDA device",
                obj.get_type().name()?
            )))
        }
    };
    // SAFETY: `capsule` is a live object; the name is NUL-terminated. A NULL result sets an
    // exception (not a `dltensor` capsule: a versioned one, or not a capsule).
    let p = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), DLTENSOR.as_ptr()) };
    let Some(p) = NonNull::new(p.cast::<DLManagedTensor>()) else {
        return Err(PyErr::take(py).unwrap_or_else(|| {
            PyTypeError::new_err("__dlpack__ did not return a `dltensor` capsule")
        }));
    };
    // SAFETY: a `dltensor` capsule points at a valid DLManagedTensor, which the capsule still
    // owns (it is alive: `capsule`).
    let memory = unsafe { memory(&(*p.as_ptr()).dl_tensor, kind) }
        .map_err(|why| PyValueError::new_err(format!("{}: {why}", type_name(obj))))?;
    // SAFETY: as above; renaming the capsule takes the tensor over from it (its destructor
    // then leaves it alone), so we own it from here and `Managed` deletes it.
    if unsafe { ffi::PyCapsule_SetName(capsule.as_ptr(), USED_DLTENSOR.as_ptr()) } != 0 {
        return Err(PyErr::fetch(py));
    }
    Ok((Managed(p), memory))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// `obj.__dlpack__(stream=s)` with `s` our stream on GPU `id`.
#[cfg(feature = "cuda")]
fn device_capsule<'py>(obj: &Bound<'py, PyAny>, id: i32) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let gpu = crate::device::gpu(id)?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("stream", gpu.stream.cu_stream() as usize)?;
    obj.call_method(pyo3::intern!(py, "__dlpack__"), (), Some(&kwargs))
}

#[cfg(not(feature = "cuda"))]
fn device_capsule<'py>(obj: &Bound<'py, PyAny>, _id: i32) -> PyResult<Bound<'py, PyAny>> {
    Err(PyTypeError::new_err(format!(
        "{} is a device tensor, and {}",
        obj.get_type().name()?,
        crate::buffer::NO_CUDA
    )))
}

/// Where `t`'s bytes are, if they are contiguous.
///
/// # Safety
/// `t` must be a valid DLTensor: `shape` (and `strides`, unless NULL) point at `ndim` values.
unsafe fn memory(t: &DLTensor, kind: i32) -> Result<Memory, String> {
    let bits = usize::from(t.dtype.bits) * usize::from(t.dtype.lanes);
    if bits % 8 != 0 {
        return Err(format!(
            "elements of {bits} bits are not whole bytes (dtype code {})",
            t.dtype.code
        ));
    }
    let ndim = usize::try_from(t.ndim).map_err(|_| "negative ndim".to_string())?;
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract: `shape` holds `ndim` values.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let strides: Option<&[i64]> = (!t.strides.is_null() && ndim > 0)
        // SAFETY: the caller's contract: non-NULL `strides` holds `ndim` values.
        .then(|| unsafe { std::slice::from_raw_parts(t.strides, ndim) });
    let mut count: usize = 1;
    for &d in shape {
        let d = usize::try_from(d).map_err(|_| format!("negative dimension {d}"))?;
        count = count
            .checked_mul(d)
            .ok_or_else(|| "the tensor's size overflows".to_string())?;
    }
    if let Some(strides) = strides {
        if count > 1 && !contiguous(shape, strides) {
            return Err(format!(
                "a tensor of shape {shape:?} with strides {strides:?} (in elements) is not \
                 contiguous: make it so first (e.g. `.contiguous()`)"
            ));
        }
    }
    let len = count
        .checked_mul(bits / 8)
        .ok_or_else(|| "the tensor's size overflows".to_string())?;
    let ptr = t.data.cast::<u8>().wrapping_add(t.byte_offset as usize);
    Ok(Memory {
        ptr,
        len,
        device: matches!(kind, KDL_CUDA | KDL_CUDA_MANAGED).then_some(t.device.device_id),
    })
}

/// Whether `strides` (in elements) lay `shape` out in C or Fortran order (size-1 dimensions
/// may have any stride).
pub fn contiguous(shape: &[i64], strides: &[i64]) -> bool {
    let walk = |order: &mut dyn Iterator<Item = (&i64, &i64)>| {
        let mut expect = 1i64;
        for (&d, &s) in order {
            if d != 1 && s != expect {
                return false;
            }
            expect = expect.saturating_mul(d);
        }
        true
    };
    walk(&mut shape.iter().zip(strides).rev()) || walk(&mut shape.iter().zip(strides))
}
