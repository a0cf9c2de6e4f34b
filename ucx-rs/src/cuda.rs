//! CUDA device buffers (feature `cuda`).
//!
//! Device memory goes through the same owned-buffer API as host memory: a
//! [`cudarc::driver::CudaSlice`] or this module's [`DeviceBuffer`] can be passed to
//! [`Endpoint::send`](crate::Endpoint::send), [`Endpoint::recv`](crate::Endpoint::recv), the
//! stream and active-message calls. cudarc loads the CUDA driver at run time, so the crate builds
//! and runs on machines without CUDA; [`open`] says why no GPU can be used instead of panicking.
//!
//! Before an operation on a device buffer is posted, the buffer's CUDA stream is synchronised
//! (UCX is not stream-ordered), and the buffer stays owned by the operation until UCX is done.
//! Then one of two paths moves the bytes ([`Context::cuda_support`](crate::Context::cuda_support)
//! says which one applies):
//! - **zero-copy**: the loaded UCX has CUDA transports (`cuda_copy`, `cuda_ipc`, as in the PyPI
//!   `libucx-cu13` wheel). UCX reads and writes device memory itself, told the memory type
//!   explicitly so it does not detect it per message.
//! - **staged**: UCX cannot touch device memory (Debian's UCX, or `UCX_TLS` without `cuda`), or
//!   the message is below [`ContextBuilder::cuda_stage_below`](crate::ContextBuilder::cuda_stage_below)
//!   bytes (small device messages are cheaper through host memory than through UCX's CUDA
//!   protocols). Sends copy device→pinned host memory and send that; receives land in pinned host
//!   memory and are copied to the device. Pinned buffers come from a process-wide pool and are
//!   reused, not allocated per message.
//!
//! Staging is local to each side: the wire carries the same bytes either way, so a staged peer
//! talks to a host-memory peer, or to a zero-copy peer for messages that UCX sends eagerly.
//! Between a UCX with CUDA transports and one without, device rendezvous transfers fail
//! (measured with 16 MiB: an endpoint timeout or reset): give both sides the same `UCX_TLS`.
//!
//! Open the GPU ([`open`]) once per process and keep the returned context alive while UCX
//! uses device memory: on an H100 with UCX 1.22, opening, dropping (which destroys the primary
//! context) and opening again around `Context::new` crashed in-process device transfers.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> ucx::Result<()> {
//! use ucx::cuda::{self, DeviceBuffer};
//! let ctx = ucx::Context::new()?;
//! println!("device path: {:?}", ctx.cuda_support());
//! // Open the GPU once and keep its context for as long as UCX uses it.
//! let gpu = cuda::open(0)?; // Err, with the reason, where there is no driver or GPU
//! let stream = gpu.default_stream();
//! let worker = ucx::Worker::new(&ctx, ucx::ProgressMode::Polling)?;
//! # let port = 13337;
//! let ep = ucx::Endpoint::connect(&worker, ("127.0.0.1", port)).await?;
//! let data = DeviceBuffer::from_host(&stream, &[1, 2, 3])?;
//! let (r, _data) = ep.send(data, 0).await;
//! r?;
//! let (n, back) = ep.recv(DeviceBuffer::alloc(&stream, 3)?, 0).await;
//! assert_eq!(back.to_host()?, [1, 2, 3][..n?]);
//! # Ok(()) }
//! ```

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

pub use cudarc;
use cudarc::driver::{
    result as cur, sys as cu, CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceRepr, DriverError,
};

use crate::buffer::{IoBuf, IoBufMut, MemoryType};
use crate::error::{Error, Result};
use crate::worker::WorkerShared;

fn cuda_err(what: &str) -> impl FnOnce(DriverError) -> Error + '_ {
    move |e| Error::Cuda(format!("{what}: {e}"))
}

/// Opens the primary context of GPU `ordinal`.
///
/// Fails with [`Error::Cuda`] and the reason (no driver library, no GPU, driver error) where
/// CUDA cannot be used; never panics for a missing driver.
pub fn open(ordinal: usize) -> Result<Arc<CudaContext>> {
    // SAFETY: only tries to dlopen the driver library (and closes it again).
    if !unsafe { cu::is_culib_present() } {
        return Err(Error::Cuda(
            "the CUDA driver library (libcuda.so.1) was not found".into(),
        ));
    }
    let count = CudaContext::device_count().map_err(cuda_err("cuInit/cuDeviceGetCount"))?;
    if count <= 0 || ordinal >= count as usize {
        return Err(Error::Cuda(format!(
            "no GPU with ordinal {ordinal} ({count} present)"
        )));
    }
    CudaContext::new(ordinal).map_err(cuda_err("cuDevicePrimaryCtxRetain"))
}

/// Whether a CUDA driver and at least one GPU are present (checked once per process).
///
/// ```
/// // Works everywhere: false on machines without a driver or GPU.
/// let _ = ucx::cuda::gpu_available();
/// ```
pub fn gpu_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: as in `open`.
        let lib = unsafe { cu::is_culib_present() };
        lib && CudaContext::device_count().is_ok_and(|n| n > 0)
    })
}

/// An owned, fixed-capacity buffer of device memory from `cuMemAlloc`.
///
/// Unlike a [`CudaSlice`], whose memory comes from the stream-ordered pool where the device
/// supports it, `cuMemAlloc` memory can be shared with other processes through CUDA IPC, which
/// is what UCX's `cuda_ipc` transport needs for zero-copy transfers between processes on one
/// node. Receives write from the start and set [`len`](Self::len) to the message size.
///
/// A buffer can also lend memory that something else owns: to send from
/// ([`DeviceBuffer::lent`]: a CuPy or PyTorch array's, so that it travels as a device frame
/// without a copy), or to receive into ([`DeviceBuffer::lent_for_receive`]: an allocation
/// from another library's pool, RMM's say); dropping it then drops the owner instead of
/// freeing the memory, and [`owner`](Self::owner) gives the owner back.
pub struct DeviceBuffer {
    ptr: cu::CUdeviceptr,
    cap: usize,
    len: usize,
    stream: Arc<CudaStream>,
    /// For lent memory: what keeps it alive (dropped, never freed, by this buffer).
    owner: Option<Box<dyn Any + Send + Sync>>,
    /// Whether lent memory may be written (`lent_for_receive`); owned memory always may.
    writable: bool,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("capacity", &self.cap)
            .field("lent", &self.owner.is_some())
            .field("writable", &self.writable)
            .finish()
    }
}

impl DeviceBuffer {
    /// Allocates `capacity` bytes (uninitialised, length 0) on `stream`'s device.
    pub fn alloc(stream: &Arc<CudaStream>, capacity: usize) -> Result<Self> {
        stream
            .context()
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent"))?;
        let ptr = if capacity == 0 {
            0
        } else {
            // SAFETY: the context is current; the result is owned by this buffer and freed once.
            unsafe { cur::malloc_sync(capacity) }.map_err(cuda_err("cuMemAlloc"))?
        };
        Ok(DeviceBuffer {
            ptr,
            cap: capacity,
            len: 0,
            stream: Arc::clone(stream),
            owner: None,
            writable: true,
        })
    }

    /// A buffer over `len` bytes of device memory at `ptr` that `owner` keeps alive (a device
    /// array of another library), ordered by `stream`: it holds `len` bytes of data, and
    /// dropping it drops `owner` (after synchronising `stream`) instead of freeing the memory.
    ///
    /// # Safety
    ///
    /// `ptr` must be device memory of `stream`'s context (or one UCX and CUDA can reach from
    /// it), valid for `len` bytes and not freed or moved while `owner` lives. Work on it that
    /// the sender must see has to be ordered before `stream` is synchronised (ucx-rs does that
    /// before UCX reads). The buffer is only read: it refuses
    /// [`copy_from_host`](Self::copy_from_host) and offers no room to receives (the memory may
    /// be a read-only export).
    pub unsafe fn lent(
        stream: &Arc<CudaStream>,
        ptr: cu::CUdeviceptr,
        len: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Self {
        DeviceBuffer {
            ptr,
            cap: len,
            len,
            stream: Arc::clone(stream),
            owner: Some(owner),
            writable: false,
        }
    }

    /// A receive buffer over `capacity` bytes of writable device memory at `ptr` that `owner`
    /// keeps alive (an allocation of another library's, from RMM's pool say), ordered by
    /// `stream`: it holds no data until a receive (or [`copy_from_host`](Self::copy_from_host))
    /// fills it, and dropping it drops `owner` (after synchronising `stream`) instead of
    /// freeing the memory.
    ///
    /// # Safety
    ///
    /// `ptr` must be device memory of `stream`'s context (or one UCX and CUDA can reach from
    /// it), valid for reads and writes of `capacity` bytes, not freed, moved or used by anything
    /// else while `owner` lives.
    pub unsafe fn lent_for_receive(
        stream: &Arc<CudaStream>,
        ptr: cu::CUdeviceptr,
        capacity: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Self {
        DeviceBuffer {
            ptr,
            cap: capacity,
            len: 0,
            stream: Arc::clone(stream),
            owner: Some(owner),
            writable: true,
        }
    }

    /// Whether the memory is lent ([`DeviceBuffer::lent`],
    /// [`lent_for_receive`](Self::lent_for_receive)) rather than owned.
    pub fn is_lent(&self) -> bool {
        self.owner.is_some()
    }

    /// What keeps lent memory alive (`downcast_ref` it to the type given); `None` for owned
    /// memory.
    pub fn owner(&self) -> Option<&(dyn Any + Send + Sync)> {
        self.owner.as_deref()
    }

    /// Waits for the work queued on the buffer's stream (a copy into it, a kernel), so that
    /// other streams and processes see its contents.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .and_then(|()| self.stream.synchronize())
            .map_err(cuda_err("cuStreamSynchronize"))
    }

    /// A buffer holding a copy of `data`.
    pub fn from_host(stream: &Arc<CudaStream>, data: &[u8]) -> Result<Self> {
        let mut b = Self::alloc(stream, data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }

    /// Replaces the contents with `data` (at most [`capacity`](Self::capacity) bytes; a buffer
    /// lent to send from refuses).
    pub fn copy_from_host(&mut self, data: &[u8]) -> Result<()> {
        if !self.writable {
            return Err(Error::InvalidArgument(
                "a lent device buffer is only read, never written".into(),
            ));
        }
        if data.len() > self.cap {
            return Err(Error::InvalidArgument(format!(
                "{} bytes do not fit a {}-byte device buffer",
                data.len(),
                self.cap
            )));
        }
        htod(&self.stream, self.ptr, data)?;
        self.len = data.len();
        Ok(())
    }

    /// Copies the first [`len`](Self::len) bytes to host memory.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len];
        dtoh(&self.stream, &mut out, self.ptr)?;
        Ok(out)
    }

    /// Sets how many bytes hold data, for contents written by GPU work (a kernel, a copy)
    /// rather than by a receive or [`copy_from_host`](Self::copy_from_host): sends carry the
    /// first `len` bytes. Fails past the capacity.
    ///
    /// Bytes nobody wrote hold whatever the allocation held; that is never undefined behaviour
    /// for Rust (device memory is not Rust memory), only meaningless data.
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.cap {
            return Err(Error::InvalidArgument(format!(
                "length {len} over the {}-byte capacity",
                self.cap
            )));
        }
        self.len = len;
        Ok(())
    }

    /// Bytes holding data (set by a receive, a host copy or [`set_len`](Self::set_len)).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes hold data.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allocated bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The raw device pointer (0 for a zero-capacity buffer).
    pub fn device_ptr(&self) -> cu::CUdeviceptr {
        self.ptr
    }

    /// The stream that orders work on this buffer (synchronised before UCX touches it).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            // Lent memory: the owner frees it, once the work queued on it here is done.
            if self.ptr != 0 {
                if let Err(e) = self.synchronize() {
                    tracing::warn!(error = %e, "synchronising a lent device buffer failed");
                }
            }
            drop(owner);
            return;
        }
        if self.ptr == 0 {
            return;
        }
        let freed = self
            .stream
            .context()
            .bind_to_thread()
            .and_then(|()| self.stream.synchronize())
            // SAFETY: ptr came from cuMemAlloc in `alloc` and is freed only here; no operation
            // holds it any more (operations own the buffer until UCX completes them).
            .and_then(|()| unsafe { cur::free_sync(self.ptr) });
        if let Err(e) = freed {
            tracing::warn!(error = %e, "cuMemFree of a device buffer failed");
        }
    }
}

// SAFETY: the pointer is device memory owned by the buffer (or, for a lent one, kept alive by
// its owner, as `lent`'s contract requires), valid for `len` bytes until the buffer is
// dropped, and it does not change when the value moves.
unsafe impl IoBuf for DeviceBuffer {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr as *const u8
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
    fn memory_type(&self) -> MemoryType {
        MemoryType::Cuda
    }
    fn cuda_stream(&self) -> Option<&Arc<CudaStream>> {
        Some(&self.stream)
    }
}

/// A shared device buffer can be sent (not received into): several messages may carry it.
/// GPU work that writes the buffer (through [`DeviceBuffer::device_ptr`]) while a send holds
/// it changes what is sent, as with any device buffer; it cannot corrupt Rust memory.
// SAFETY: the Arc keeps the buffer, and so its device allocation of `len` bytes, alive and at
// the same address while the operation holds this clone; `len` cannot change through a shared
// reference.
unsafe impl IoBuf for Arc<DeviceBuffer> {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr as *const u8
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
    fn memory_type(&self) -> MemoryType {
        MemoryType::Cuda
    }
    fn cuda_stream(&self) -> Option<&Arc<CudaStream>> {
        Some(&self.stream)
    }
}

// SAFETY: as above; all `cap` bytes of an owned buffer, or one lent for receives, are writable
// device memory (`lent_for_receive`'s contract). A buffer lent to send from offers none (its
// memory may be a read-only export), so nothing is written to it.
unsafe impl IoBufMut for DeviceBuffer {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr as *mut u8
    }
    fn bytes_total(&self) -> usize {
        if !self.writable {
            0
        } else {
            self.cap
        }
    }
    unsafe fn set_init(&mut self, n: usize) {
        self.len = n.min(self.cap);
    }
}

// SAFETY: a CudaSlice owns its device allocation (freed on drop), whose address does not change
// when the slice moves; it is valid for `num_bytes()` bytes. The read event cudarc records when
// the pointer is taken is harmless: the stream is synchronised before UCX reads.
unsafe impl<T: DeviceRepr + 'static> IoBuf for CudaSlice<T> {
    fn stable_ptr(&self) -> *const u8 {
        let (ptr, _record) = self.device_ptr(self.stream());
        ptr as *const u8
    }
    fn bytes_init(&self) -> usize {
        self.num_bytes()
    }
    fn memory_type(&self) -> MemoryType {
        MemoryType::Cuda
    }
    fn cuda_stream(&self) -> Option<&Arc<CudaStream>> {
        Some(self.stream())
    }
}

/// A slice has a fixed length: the received length is the operation's return value.
// SAFETY: as above; the whole allocation is writable.
unsafe impl<T: DeviceRepr + 'static> IoBufMut for CudaSlice<T> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        let stream = Arc::clone(self.stream());
        let (ptr, _record) = self.device_ptr_mut(&stream);
        ptr as *mut u8
    }
    fn bytes_total(&self) -> usize {
        self.num_bytes()
    }
    unsafe fn set_init(&mut self, _n: usize) {}
}

/// An active-message allocator that puts messages from device buffers into device memory
/// ([`DeviceBuffer`]s on `stream`). Register it with
/// [`Worker::set_am_allocator`](crate::Worker::set_am_allocator) for [`MemoryType::Cuda`].
#[derive(Debug, Clone)]
pub struct DeviceAllocator {
    stream: Arc<CudaStream>,
}

impl DeviceAllocator {
    /// Allocates on `stream`'s device.
    pub fn new(stream: &Arc<CudaStream>) -> Self {
        DeviceAllocator {
            stream: Arc::clone(stream),
        }
    }
}

impl crate::am::AmAllocator for DeviceAllocator {
    fn allocate(&self, len: usize) -> Result<Box<dyn IoBufMut>> {
        Ok(Box::new(DeviceBuffer::alloc(&self.stream, len)?))
    }
}

fn htod(stream: &CudaStream, dst: cu::CUdeviceptr, src: &[u8]) -> Result<()> {
    // SAFETY: dst is device memory with room for src.len() bytes (checked by the callers);
    // the copy is waited for before src may go away.
    copy_and_wait(stream, src.len(), "cuMemcpyHtoDAsync", |s| unsafe {
        cur::memcpy_htod_async(dst, src, s)
    })
}

fn dtoh(stream: &CudaStream, dst: &mut [u8], src: cu::CUdeviceptr) -> Result<()> {
    let len = dst.len();
    // SAFETY: src is device memory with at least dst.len() readable bytes (callers); the copy
    // is waited for before dst is used.
    copy_and_wait(stream, len, "cuMemcpyDtoHAsync", |s| unsafe {
        cur::memcpy_dtoh_async(dst, src, s)
    })
}

/// Makes the stream's context current, issues `copy` (`len` bytes) on the stream and waits.
fn copy_and_wait(
    stream: &CudaStream,
    len: usize,
    what: &str,
    copy: impl FnOnce(cu::CUstream) -> std::result::Result<(), DriverError>,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(cuda_err("cuCtxSetCurrent"))?;
    copy(stream.cu_stream()).map_err(cuda_err(what))?;
    stream
        .synchronize()
        .map_err(cuda_err("cuStreamSynchronize"))
}

// ---- staging through pinned host memory --------------------------------------------------

/// Most pinned bytes the pool keeps for reuse.
const POOL_LIMIT: usize = 4 << 30;
/// Smallest pinned block (small messages share one size class).
const MIN_BLOCK: usize = 64 << 10;

/// Who owns a pinned block's memory.
enum Owner {
    /// `cuMemHostAlloc` memory, freed with `cuMemFreeHost` in this context.
    Cuda(Arc<CudaContext>),
    /// Heap memory standing in for pinned memory in unit tests.
    #[cfg(test)]
    Heap(std::alloc::Layout),
}

/// One pinned allocation.
struct Block {
    ptr: *mut u8,
    cap: usize,
    owner: Owner,
}

// SAFETY: pinned host memory is ordinary process memory; the block owns it exclusively.
unsafe impl Send for Block {}

impl Drop for Block {
    fn drop(&mut self) {
        match &self.owner {
            Owner::Cuda(ctx) => {
                let freed = ctx
                    .bind_to_thread()
                    // SAFETY: ptr came from cuMemHostAlloc and is freed once, here.
                    .and_then(|()| unsafe { cur::free_host(self.ptr.cast::<c_void>()) });
                if let Err(e) = freed {
                    tracing::warn!(error = %e, "cuMemFreeHost of a staging buffer failed");
                }
            }
            #[cfg(test)]
            // SAFETY: allocated with this layout by the test allocator.
            Owner::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr, *layout) },
        }
    }
}

/// Pinned blocks kept for reuse, best fit first, at most `limit` bytes in all.
struct Pool {
    free: Mutex<Vec<Block>>,
    limit: usize,
}

impl Pool {
    const fn new(limit: usize) -> Pool {
        Pool {
            free: Mutex::new(Vec::new()),
            limit,
        }
    }

    /// Pinned memory for at least `cap` bytes: the smallest free block that fits, or a new one
    /// of the next power of two (at least [`MIN_BLOCK`]) from `alloc`.
    fn take(
        &'static self,
        cap: usize,
        alloc: impl FnOnce(usize) -> Result<Block>,
    ) -> Result<Pinned> {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.cap >= cap)
                .min_by_key(|(_, b)| b.cap)
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        let block = match reused {
            Some(b) => b,
            None => alloc(
                cap.max(MIN_BLOCK)
                    .checked_next_power_of_two()
                    .unwrap_or(cap),
            )?,
        };
        Ok(Pinned {
            block: Some(block),
            pool: self,
            cap,
            len: 0,
        })
    }

    /// Keeps `block` unless that would cache more than the limit.
    fn give_back(&self, block: Block) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let cached: usize = free.iter().map(|b| b.cap).sum();
        if cached + block.cap <= self.limit {
            free.push(block);
        } else {
            drop(free);
            drop(block);
        }
    }
}

static POOL: Pool = Pool::new(POOL_LIMIT);

/// Pinned host memory standing in for a device buffer during one operation. Goes back to the
/// pool when dropped.
pub(crate) struct Pinned {
    block: Option<Block>,
    pool: &'static Pool,
    /// The capacity the operation may use (the device buffer's).
    cap: usize,
    len: usize,
}

impl Pinned {
    /// Pinned memory for at least `cap` bytes from the process-wide pool.
    fn take(ctx: &Arc<CudaContext>, cap: usize) -> Result<Pinned> {
        POOL.take(cap, |size| {
            ctx.bind_to_thread().map_err(cuda_err("cuCtxSetCurrent"))?;
            // SAFETY: the context is current; the block owns the allocation.
            let ptr = unsafe { cur::malloc_host(size, cu::CU_MEMHOSTALLOC_PORTABLE) }
                .map_err(cuda_err("cuMemHostAlloc"))?;
            // SAFETY: size bytes were just allocated; zero them once so that slices over the
            // block are always initialised memory.
            unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, size) };
            tracing::debug!(bytes = size, "allocated a pinned staging buffer");
            Ok(Block {
                ptr: ptr.cast(),
                cap: size,
                owner: Owner::Cuda(Arc::clone(ctx)),
            })
        })
    }

    fn ptr(&self) -> *mut u8 {
        self.block.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr)
    }

    /// The bytes a receive wrote.
    pub(crate) fn filled(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the block holds at least cap >= len bytes, the first len of them written.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    fn whole_mut(&mut self) -> &mut [u8] {
        if self.cap == 0 {
            return &mut [];
        }
        // SAFETY: the block holds at least cap bytes owned by self, initialised (blocks are
        // zero-filled when allocated).
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.cap) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.pool.give_back(block);
        }
    }
}

// SAFETY: pinned host memory owned by the Pinned value (it does not move with it).
unsafe impl IoBuf for Pinned {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
}

// SAFETY: as above; `cap` bytes are writable.
unsafe impl IoBufMut for Pinned {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr()
    }
    fn bytes_total(&self) -> usize {
        self.cap
    }
    unsafe fn set_init(&mut self, n: usize) {
        self.len = n.min(self.cap);
    }
}

/// For a device buffer: makes its context current on the worker and waits for its stream
/// (UCX is not stream-ordered), then returns the stream. `None` for host memory.
fn settle<'b, B: IoBuf + ?Sized>(
    worker: &WorkerShared,
    buf: &'b B,
) -> Result<Option<&'b Arc<CudaStream>>> {
    let Some(stream) = buf.cuda_stream() else {
        return Ok(None);
    };
    worker.adopt_cuda(stream.context());
    stream
        .synchronize()
        .map_err(cuda_err("cuStreamSynchronize"))?;
    Ok(Some(stream))
}

/// Gets a device buffer ready for a send: makes its context current on the worker, waits for
/// its stream, and when this message is staged copies it to pinned memory, returned to send in
/// its place. `Ok(None)`: host memory, or UCX reads the device memory itself.
pub(crate) fn stage_send<B: IoBuf + ?Sized>(
    worker: &WorkerShared,
    buf: &B,
) -> Result<Option<Pinned>> {
    let Some(stream) = settle(worker, buf)? else {
        return Ok(None);
    };
    let len = buf.bytes_init();
    if !worker.context().stages_cuda(len) {
        return Ok(None);
    }
    let mut pinned = Pinned::take(stream.context(), len)?;
    dtoh(
        stream,
        &mut pinned.whole_mut()[..len],
        buf.stable_ptr() as u64,
    )?;
    pinned.len = len;
    Ok(Some(pinned))
}

/// As [`stage_send`], for a receive: pinned memory of the buffer's capacity to receive into,
/// copied to the device with [`unstage`] afterwards.
pub(crate) fn stage_recv<B: IoBufMut + ?Sized>(
    worker: &WorkerShared,
    buf: &B,
) -> Result<Option<Pinned>> {
    let Some(stream) = settle(worker, buf)? else {
        return Ok(None);
    };
    let cap = buf.bytes_total();
    if !worker.context().stages_cuda(cap) {
        return Ok(None);
    }
    Ok(Some(Pinned::take(stream.context(), cap)?))
}

/// Copies received host bytes into the device buffer `buf` and sets its length.
pub(crate) fn unstage<B: IoBufMut + ?Sized>(buf: &mut B, src: &[u8]) -> Result<()> {
    let Some(stream) = buf.cuda_stream().cloned() else {
        return Err(Error::InvalidArgument(
            "unstage: not a CUDA buffer".to_string(),
        ));
    };
    if src.len() > buf.bytes_total() {
        return Err(Error::Truncated {
            message: src.len(),
            buffer: buf.bytes_total(),
        });
    }
    htod(&stream, buf.stable_mut_ptr() as u64, src)?;
    // SAFETY: the first src.len() <= capacity bytes were just written.
    unsafe { buf.set_init(src.len()) };
    Ok(())
}

/// For operations that cannot be staged (RMA, probed receives): waits for the buffer's stream
/// and fails when UCX cannot access device memory itself.
pub(crate) fn require_zero_copy<B: IoBuf + ?Sized>(worker: &WorkerShared, buf: &B) -> Result<()> {
    if settle(worker, buf)?.is_none() {
        return Ok(());
    }
    if worker.context().cuda_support() != crate::CudaSupport::ZeroCopy {
        return Err(Error::Cuda(
            "this operation needs a UCX with CUDA transports to reach device memory".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heap_block(size: usize) -> Result<Block> {
        let layout = std::alloc::Layout::from_size_align(size, 4096).expect("layout");
        // SAFETY: size >= MIN_BLOCK > 0.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Ok(Block {
            ptr,
            cap: size,
            owner: Owner::Heap(layout),
        })
    }

    fn leaked_pool(limit: usize) -> &'static Pool {
        Box::leak(Box::new(Pool::new(limit)))
    }

    /// Staging buffers are reused, not allocated per message: a second take of a size that
    /// fits gets the same memory back, and no allocation happens.
    #[test]
    fn staging_buffers_are_reused() {
        let pool = leaked_pool(1 << 30);
        let first = pool.take(100, heap_block).unwrap();
        let ptr = first.ptr();
        assert_eq!(first.bytes_total(), 100);
        drop(first);
        for size in [1, 100, MIN_BLOCK] {
            let again = pool
                .take(size, |_| panic!("allocated although a block was free"))
                .unwrap();
            assert_eq!(again.ptr(), ptr);
            assert_eq!(again.bytes_total(), size);
        }
    }

    /// The smallest free block that fits is used; larger needs allocate a power of two.
    #[test]
    fn staging_takes_the_best_fit() {
        let pool = leaked_pool(1 << 30);
        let big = pool.take(3 << 20, heap_block).unwrap();
        let small = pool.take(10, heap_block).unwrap();
        assert_eq!(big.block.as_ref().unwrap().cap, 4 << 20);
        assert_eq!(small.block.as_ref().unwrap().cap, MIN_BLOCK);
        let (big_ptr, small_ptr) = (big.ptr(), small.ptr());
        drop((big, small));
        assert_eq!(pool.take(5, heap_block).unwrap().ptr(), small_ptr);
        assert_eq!(pool.take(MIN_BLOCK + 1, heap_block).unwrap().ptr(), big_ptr);
    }

    /// The pool keeps at most its limit; what is over is freed.
    #[test]
    fn staging_pool_is_bounded() {
        let pool = leaked_pool(2 * MIN_BLOCK);
        let blocks: Vec<_> = (0..4).map(|_| pool.take(1, heap_block).unwrap()).collect();
        drop(blocks);
        assert_eq!(pool.free.lock().unwrap().len(), 2);
    }

    /// A receive into staging memory exposes exactly what was written.
    #[test]
    fn staged_receive_exposes_the_written_prefix() {
        let pool = leaked_pool(1 << 30);
        let mut p = pool.take(16, heap_block).unwrap();
        assert!(p.filled().is_empty());
        p.whole_mut()[..5].copy_from_slice(b"hello");
        // SAFETY: five bytes were written above.
        unsafe { p.set_init(5) };
        assert_eq!(p.filled(), b"hello");
        // A length past the capacity is clamped.
        // SAFETY: clamped to cap, all of which is initialised.
        unsafe { p.set_init(99) };
        assert_eq!(p.filled().len(), 16);
        assert_eq!(p.memory_type(), MemoryType::Host);
    }

    /// Without a driver (CI), opening a GPU is an error with a reason, not a panic.
    #[test]
    fn open_reports_instead_of_panicking() {
        match open(0) {
            Ok(ctx) => eprintln!("GPU present: {:?}", ctx.name()),
            Err(e) => {
                eprintln!("no GPU: {e}");
                assert!(matches!(e, Error::Cuda(_)));
                assert!(!e.to_string().is_empty());
            }
        }
        let _ = gpu_available();
    }
}
