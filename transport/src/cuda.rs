//! Device frames (feature `cuda`): where received CUDA frames land, and the host staging the
//! TCP backend uses.
//!
//! A frame the sender marked as device memory is received into a new
//! [`DeviceBuffer`] on the *landing stream*: the one given to
//! [`land_on`], or else GPU 0's default stream, opened on first use. The buffer comes from
//! `cuMemAlloc`, or from the allocator given to [`allocate_with`] (a memory pool's: RMM's, for
//! the Python package's Dask comm where RMM is importable). Where no GPU can be used
//! (no driver, no device) device frames arrive as host frames holding the same bytes, and a
//! warning says why once per process; messages are never refused for it.
//!
//! Per backend: `ucx://` sends and receives device frames with UCX itself (zero-copy where the
//! loaded UCX has CUDA transports, staged by `ucx-rs` otherwise); `tcp://` copies them through
//! host memory; `inproc://` moves the shared buffer.
//!
//! ```no_run
//! use transport::{Frame, Message};
//! let gpu = ucx::cuda::open(0)?;
//! let stream = gpu.default_stream();
//! transport::cuda::land_on(stream.clone()); // received device frames go to this GPU/stream
//! let frame = ucx::cuda::DeviceBuffer::from_host(&stream, &[1, 2, 3])?;
//! let msg = Message::from(vec![Frame::from(b"meta".to_vec()), Frame::from(frame)]);
//! assert!(msg.has_cuda());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::{Arc, Mutex, OnceLock};

use ucx::cuda::cudarc::driver::{CudaContext, CudaStream};
use ucx::cuda::DeviceBuffer;

use crate::message::Frame;
use crate::Result;

/// The explicitly chosen landing stream, if any.
static CHOSEN: Mutex<Option<Arc<CudaStream>>> = Mutex::new(None);

/// Makes the receive buffers of device frames: given the landing stream (its context is
/// current on the calling thread) and a frame's size, a buffer of at least that capacity,
/// usually [`DeviceBuffer::lent_for_receive`] over memory of another allocator's.
///
/// It is called on the transport's runtime, for each device frame of an arriving message
/// before its bytes are received, with no lock of `transport`'s or `ucx-rs`'s held (so it
/// may take the GIL, say). An error ends the connection, as a frame that cannot be received
/// must, with [`ProtocolError::DeviceFrame`](crate::ProtocolError::DeviceFrame) and the
/// allocator's reason.
pub type Allocator =
    Arc<dyn Fn(&Arc<CudaStream>, usize) -> ucx::Result<DeviceBuffer> + Send + Sync>;

/// The allocator of [`allocate_with`], if any.
static ALLOCATOR: Mutex<Option<Allocator>> = Mutex::new(None);

/// Receives device frames into buffers from `allocator` from now on (`None`: `cuMemAlloc`
/// again), for every connection of the process; returns the allocator it replaces.
///
/// ```no_run
/// use std::sync::Arc;
/// use ucx::cuda::{cudarc::driver::CudaStream, DeviceBuffer};
/// // Counts the buffers it makes (here: plain device buffers).
/// static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// transport::cuda::allocate_with(Some(Arc::new(|stream: &Arc<CudaStream>, size: usize| {
///     MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///     DeviceBuffer::alloc(stream, size)
/// })));
/// ```
pub fn allocate_with(allocator: Option<Allocator>) -> Option<Allocator> {
    std::mem::replace(
        &mut *ALLOCATOR.lock().unwrap_or_else(|e| e.into_inner()),
        allocator,
    )
}

/// A receive buffer of `size` bytes on `stream`: the allocator's, checked, or `cuMemAlloc`'s.
fn allocate(stream: &Arc<CudaStream>, size: usize) -> Result<DeviceBuffer> {
    // Cloned out: the allocator runs with no lock held.
    let allocator = ALLOCATOR.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let Some(allocator) = allocator else {
        return Ok(DeviceBuffer::alloc(stream, size)?);
    };
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| ucx::Error::Cuda(format!("cuCtxSetCurrent: {e}")))?;
    let b = allocator(stream, size)?;
    if b.capacity() < size || (size > 0 && b.device_ptr() == 0) {
        return Err(ucx::Error::Cuda(format!(
            "the device frame allocator gave {} bytes for a {size}-byte frame",
            b.capacity()
        ))
        .into());
    }
    Ok(b)
}

/// Makes received device frames land on `stream` (its GPU and context) from now on.
pub fn land_on(stream: Arc<CudaStream>) {
    *CHOSEN.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream);
}

/// GPU 0 opened once (its context kept for the process's life), or why it cannot be.
fn default_gpu() -> Option<&'static Arc<CudaContext>> {
    static GPU: OnceLock<Option<Arc<CudaContext>>> = OnceLock::new();
    GPU.get_or_init(|| match ucx::cuda::open(0) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            tracing::warn!(error = %e, "device frames will be received into host memory");
            None
        }
    })
    .as_ref()
}

/// Where device frames land now, or `None` when no GPU can be used.
pub fn landing_stream() -> Option<Arc<CudaStream>> {
    if let Some(s) = CHOSEN.lock().unwrap_or_else(|e| e.into_inner()).clone() {
        return Some(s);
    }
    default_gpu().map(|ctx| ctx.default_stream())
}

/// A receive buffer for a `size`-byte device frame on the landing stream.
pub(crate) fn device_buffer(size: usize) -> Result<Option<DeviceBuffer>> {
    match landing_stream() {
        Some(s) => Ok(Some(allocate(&s, size)?)),
        None => Ok(None),
    }
}

/// A device frame for `bytes` received through host memory (TCP), or a host frame where no
/// GPU can be used.
pub(crate) fn from_host(bytes: bytes::Bytes) -> Result<Frame> {
    Ok(match landing_stream() {
        Some(s) => {
            let mut d = allocate(&s, bytes.len())?;
            d.copy_from_host(&bytes)?;
            Frame::from(d)
        }
        None => Frame::Host(bytes),
    })
}
