//! Device arrays (built with `cuda`): the GPUs this process has opened, and
//! `__cuda_array_interface__` (version 3: CuPy, PyTorch, Numba).
//!
//! Each GPU's primary context is opened once, on first use, and kept for the life of the
//! process (UCX uses it while any transfer is in flight, and reopening it around UCX's context
//! crashed in-process device transfers: docs/gpu.md), with one stream of ours, the one ucx-rs
//! synchronises before UCX touches a buffer and that orders its staging copies.

use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use ucx::cuda::cudarc::driver::{result as cur, sys as cu, CudaContext, CudaStream};

use crate::buffer::{Access, Memory};

/// An opened GPU and our stream on it.
#[derive(Clone)]
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
}

static GPUS: Mutex<Vec<Option<Gpu>>> = Mutex::new(Vec::new());

fn cuda_error(what: &str, e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(format!("CUDA: {what}: {e}"))
}

/// GPU `ordinal`, opened on first use.
pub fn gpu(ordinal: i32) -> PyResult<Gpu> {
    let i = usize::try_from(ordinal)
        .map_err(|_| PyValueError::new_err(format!("no GPU has ordinal {ordinal}")))?;
    let mut gpus = GPUS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(g)) = gpus.get(i) {
        return Ok(g.clone());
    }
    let ctx = ucx::cuda::open(i).map_err(|e| cuda_error("opening the GPU", e))?;
    let stream = ctx
        .new_stream()
        .map_err(|e| cuda_error("creating a stream", e))?;
    let g = Gpu { ctx, stream };
    if gpus.len() <= i {
        gpus.resize(i + 1, None);
    }
    gpus[i] = Some(g.clone());
    tracing::debug!(ordinal, "GPU opened for device arrays");
    Ok(g)
}

/// The device ordinal of the memory at `ptr`.
fn ordinal_of(ptr: usize) -> PyResult<i32> {
    let g = gpu(0)?; // initialises the driver, and a context to ask in
    g.ctx
        .bind_to_thread()
        .map_err(|e| cuda_error("cuCtxSetCurrent", e))?;
    let mut ordinal: i32 = -1;
    // SAFETY: the attribute is a 32-bit int written into `ordinal`, which outlives the call;
    // any pointer value may be asked about (unknown ones return an error).
    unsafe {
        cu::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr as cu::CUdeviceptr,
        )
    }
    .result()
    .map_err(|e| {
        PyValueError::new_err(format!(
            "__cuda_array_interface__ points at {ptr:#x}, which CUDA does not know as device \
             memory: {e}"
        ))
    })?;
    Ok(ordinal)
}

/// The bytes of `obj`'s `__cuda_array_interface__`, after the producer's stream (version 3's
/// `stream`) has finished its work on them. Receives refuse read-only arrays; both refuse
/// non-contiguous ones and masked ones.
pub fn interface(obj: &Bound<'_, PyAny>, access: Access) -> PyResult<Memory> {
    let py = obj.py();
    let name = obj.get_type().name()?.to_string();
    let bad = |why: String| PyValueError::new_err(format!("{name}: {why}"));
    let cai = obj.getattr(pyo3::intern!(py, "__cuda_array_interface__"))?;
    let cai = cai.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!("{name}: __cuda_array_interface__ is not a dict"))
    })?;
    let get = |k: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        Ok(cai.get_item(k)?.filter(|v| !v.is_none()))
    };
    if get("mask")?.is_some() {
        return Err(bad("masked device arrays cannot be sent".into()));
    }
    let shape: Vec<i64> = get("shape")?
        .ok_or_else(|| bad("__cuda_array_interface__ has no shape".into()))?
        .extract()?;
    let typestr: String = get("typestr")?
        .ok_or_else(|| bad("__cuda_array_interface__ has no typestr".into()))?
        .extract()?;
    let itemsize: i64 = typestr
        .get(2..)
        .and_then(|s| s.parse().ok())
        .filter(|&n: &i64| n > 0)
        .ok_or_else(|| bad(format!("typestr {typestr:?} has no item size")))?;
    let data = get("data")?.ok_or_else(|| bad("__cuda_array_interface__ has no data".into()))?;
    let data = data
        .cast::<PyTuple>()
        .map_err(|_| bad("data is not a tuple".into()))?;
    let ptr: usize = data.get_item(0)?.extract()?;
    let readonly: bool = data.get_item(1)?.extract()?;
    if access == Access::Write && readonly {
        return Err(bad(
            "a receive needs a writable array; this one is read-only".into(),
        ));
    }
    let mut count: i64 = 1;
    for &d in &shape {
        if d < 0 {
            return Err(bad(format!("negative dimension {d}")));
        }
        count = count
            .checked_mul(d)
            .ok_or_else(|| bad("the array's size overflows".into()))?;
    }
    if let Some(strides) = get("strides")? {
        let strides: Vec<i64> = strides.extract()?;
        let in_items: Vec<i64> = strides.iter().map(|s| s / itemsize).collect();
        let whole = strides.iter().all(|s| s % itemsize == 0);
        if count > 1 && !(whole && crate::dlpack::contiguous(&shape, &in_items)) {
            return Err(bad(format!(
                "an array of shape {shape:?} with strides {strides:?} (bytes) is not \
                 contiguous: make it so first (e.g. `cupy.ascontiguousarray`)"
            )));
        }
    }
    let len = count
        .checked_mul(itemsize)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| bad("the array's size overflows".into()))?;
    if len == 0 {
        return Ok(Memory {
            ptr: std::ptr::null_mut(),
            len: 0,
            device: None,
        });
    }
    let ordinal = ordinal_of(ptr)?;
    if let Some(s) = get("stream")? {
        let s: usize = s.extract()?;
        synchronize(py, ordinal, s)?;
    }
    Ok(Memory {
        ptr: ptr as *mut u8,
        len,
        device: Some(ordinal),
    })
}

/// Waits, detached from the GIL, for the producer's stream `s` (a handle; 1 and 2 are the
/// legacy and per-thread default streams, as the interface says) on GPU `ordinal`.
fn synchronize(py: Python<'_>, ordinal: i32, s: usize) -> PyResult<()> {
    let g = gpu(ordinal)?;
    py.detach(|| {
        g.ctx.bind_to_thread()?;
        // SAFETY: `s` is a stream handle the array's producer gave for this device's context
        // (bound above), alive while the array is; the default-stream values 1 and 2 are valid
        // handles.
        unsafe { cur::stream::synchronize(s as cu::CUstream) }
    })
    .map_err(|e| cuda_error("synchronising the array's stream", e))
}
