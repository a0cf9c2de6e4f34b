//! Owned buffers that UCX may read or write while an operation is in flight.
//!
//! Operations take buffers **by value** and hand them back with the result, like tokio-uring:
//! a `&mut [u8]` cannot work, because a future can be dropped (forgotten, cancelled by `select!`)
//! while UCX still owns the memory. If an operation's future is dropped mid-flight, the buffer
//! is parked with the operation and freed only after UCX's completion callback has fired.

use bytes::{Bytes, BytesMut};

/// Buffers at least this large ask the kernel for transparent huge pages (one 2 MiB page).
const HUGE_FROM: usize = 2 << 20;

/// Asks the kernel to back `v`'s allocation (its capacity) with transparent huge pages
/// (`MADV_HUGEPAGE`), as UCX does for what it allocates: every copy through memory of 4 KiB
/// pages takes a TLB miss per page. Call it before the memory is first touched: pages are
/// chosen as they fault in. Buffers under 2 MiB, and kernels without THP, are left as they
/// are. [`host_buffer`] is a zeroed buffer so advised.
///
/// ```
/// let mut v: Vec<u8> = Vec::with_capacity(8 << 20);
/// ucx::advise_huge_pages(&mut v);
/// v.resize(8 << 20, 1); // faults in (huge) pages
/// ```
pub fn advise_huge_pages(v: &mut Vec<u8>) {
    if v.capacity() < HUGE_FROM {
        return;
    }
    const PAGE: usize = 4096;
    let from = (v.as_mut_ptr() as usize).next_multiple_of(PAGE);
    let to = (v.as_mut_ptr() as usize + v.capacity()) / PAGE * PAGE;
    if to > from {
        // SAFETY: [from, to) lies inside the vector's allocation (rounded inward to whole
        // pages); MADV_HUGEPAGE only tells the kernel how to back those pages and never
        // changes their contents. A kernel that refuses (no THP) leaves them as they were.
        unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE) };
    }
}

/// A zeroed host buffer of `len` bytes for large messages. From 2 MiB up the kernel is asked
/// to back it with transparent huge pages (`MADV_HUGEPAGE`), as UCX backs what it allocates
/// (`ucx_perftest`'s buffers among them): every copy through memory of 4 KiB pages (the
/// kernel's socket copies under UCX's TCP transport, shared-memory copies) takes a TLB miss
/// per page. Across two hosts over TCP this alone made a 4 MiB ping-pong 1.4–1.9× slower.
///
/// ```
/// let buf = ucx::host_buffer(4 << 20);
/// assert_eq!(buf.len(), 4 << 20);
/// assert!(buf.iter().all(|&b| b == 0));
/// ```
pub fn host_buffer(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    advise_huge_pages(&mut v);
    v.resize(len, 0);
    v
}

/// Where a buffer's memory lives. Passed to UCX explicitly so it need not detect it per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MemoryType {
    /// Ordinary host memory.
    #[default]
    Host,
    /// CUDA device memory.
    Cuda,
}

impl MemoryType {
    pub(crate) fn to_ucs(self) -> ucx_sys::ucs_memory_type_t {
        match self {
            MemoryType::Host => ucx_sys::UCS_MEMORY_TYPE_HOST,
            MemoryType::Cuda => ucx_sys::UCS_MEMORY_TYPE_CUDA,
        }
    }
}

/// A buffer UCX can read from (send source).
///
/// # Safety
/// `stable_ptr()` must return a pointer valid for reads of `bytes_init()` bytes, and both must
/// stay the same while the value is moved around (heap memory, not inline storage), until the
/// value is dropped or mutably accessed. UCX reads through the pointer after the value has moved
/// into an operation.
pub unsafe trait IoBuf: Send + 'static {
    /// Start of the readable bytes.
    fn stable_ptr(&self) -> *const u8;
    /// Number of readable bytes.
    fn bytes_init(&self) -> usize;
    /// Memory type of the bytes.
    fn memory_type(&self) -> MemoryType {
        MemoryType::Host
    }
    /// For CUDA buffers: the stream whose work produces or consumes the bytes. It is
    /// synchronised before UCX touches the memory (UCX is not stream-ordered) and orders the
    /// staging copies (see [`cuda`](crate::cuda)). `None` for host memory.
    #[cfg(feature = "cuda")]
    fn cuda_stream(&self) -> Option<&std::sync::Arc<cudarc::driver::CudaStream>> {
        None
    }
}

/// A buffer UCX can write into (receive destination).
///
/// # Safety
/// As for [`IoBuf`], and `stable_mut_ptr()` must be valid for writes of `bytes_total()` bytes.
/// `set_init(n)` is called after UCX wrote `n <= bytes_total()` bytes from the start.
pub unsafe trait IoBufMut: IoBuf {
    /// Start of the writable region.
    fn stable_mut_ptr(&mut self) -> *mut u8;
    /// Capacity of the writable region in bytes.
    fn bytes_total(&self) -> usize;
    /// Records that the first `n` bytes now hold received data.
    ///
    /// # Safety
    /// The first `n` bytes must have been written.
    unsafe fn set_init(&mut self, n: usize);
}

// SAFETY: a Vec's heap allocation does not move when the Vec value moves; len <= capacity.
unsafe impl IoBuf for Vec<u8> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

/// Receives write into the whole capacity; afterwards `len()` is the received length.
// SAFETY: the capacity region is writable heap memory that does not move with the Vec.
unsafe impl IoBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.capacity()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: the caller guarantees n <= capacity and that the first n bytes were written.
        unsafe { self.set_len(n) }
    }
}

// SAFETY: boxed slices are heap memory (or dangling for len 0, which UCX never dereferences).
unsafe impl IoBuf for Box<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

/// A boxed slice has a fixed length: the received length is the operation's return value.
// SAFETY: as above; the whole slice is writable.
unsafe impl IoBufMut for Box<[u8]> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
    unsafe fn set_init(&mut self, _n: usize) {}
}

// SAFETY: Bytes is an immutable, reference-counted view of memory that does not move.
unsafe impl IoBuf for Bytes {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: BytesMut's storage does not move when the handle moves.
unsafe impl IoBuf for BytesMut {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

/// Receives write into the whole capacity; afterwards `len()` is the received length.
// SAFETY: the capacity region is writable and does not move with the handle.
unsafe impl IoBufMut for BytesMut {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.capacity()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: the caller guarantees n <= capacity and that the first n bytes were written.
        unsafe { self.set_len(n) }
    }
}

// SAFETY: 'static slices live forever and never move.
unsafe impl IoBuf for &'static [u8] {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: delegates to the boxed buffer, whose own contract (stable pointer across moves) holds
// because moving the Box does not move the buffer value it points to.
unsafe impl IoBuf for Box<dyn IoBufMut> {
    fn stable_ptr(&self) -> *const u8 {
        (**self).stable_ptr()
    }
    fn bytes_init(&self) -> usize {
        (**self).bytes_init()
    }
    fn memory_type(&self) -> MemoryType {
        (**self).memory_type()
    }
    #[cfg(feature = "cuda")]
    fn cuda_stream(&self) -> Option<&std::sync::Arc<cudarc::driver::CudaStream>> {
        (**self).cuda_stream()
    }
}

// SAFETY: as above.
unsafe impl IoBufMut for Box<dyn IoBufMut> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        (**self).stable_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        (**self).bytes_total()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: forwarded with the caller's guarantee.
        unsafe { (**self).set_init(n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_receives_into_capacity() {
        let mut v: Vec<u8> = Vec::with_capacity(8);
        assert_eq!(v.bytes_total(), 8);
        let p = v.stable_mut_ptr();
        // SAFETY: p is valid for 8 bytes of writes (capacity 8).
        unsafe { std::ptr::write_bytes(p, 7, 3) };
        // SAFETY: 3 bytes were just written.
        unsafe { v.set_init(3) };
        assert_eq!(v, [7, 7, 7]);
        let moved = v;
        assert_eq!(moved.stable_ptr(), p as *const u8);
    }
}
