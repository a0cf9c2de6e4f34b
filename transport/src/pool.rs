//! Receive buffers for large frames, reused once the application drops the frame.
//!
//! A received frame is handed out as [`Bytes`]; for frames of [`POOL_MIN`] bytes and more the
//! `Bytes` owns a pooled `Vec` that goes back to the pool when the last clone is dropped. The
//! next receive of a similar size gets memory that is already mapped and, for UCX, already in
//! its registration cache: allocating 64 MiB per message costs more than moving it.

use std::sync::Mutex;

use bytes::Bytes;

/// Asks the kernel to back `v`'s allocation with transparent huge pages from 2 MiB up
/// (`ucx::advise_huge_pages`), as UCX backs the buffers it allocates: the kernel's and the
/// transports' copies through memory of 4 KiB pages take a TLB miss every 4 KiB. Measured
/// across two namespaces at 4 MiB: `ucx_perftest` (whose buffers are huge pages) 1.4–1.9×
/// faster than ucx-rs between buffers of 4 KiB pages, and even with them (docs/transport.md). Builds
/// without the `ucx` feature leave buffers as they are.
pub(crate) fn advise_huge_pages(v: &mut Vec<u8>) {
    #[cfg(feature = "ucx")]
    ucx::advise_huge_pages(v);
    #[cfg(not(feature = "ucx"))]
    let _ = v;
}

/// Frames smaller than this are plain allocations (cheap, and not worth caching).
pub(crate) const POOL_MIN: usize = 64 << 10;
/// Most bytes the pool keeps.
const POOL_LIMIT: usize = 512 << 20;

static FREE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A buffer with capacity for at least `size` bytes: a pooled one whose capacity is at most
/// twice `size`, or a new one; `None` where the memory cannot be had (rather than aborting the
/// process). Its contents are unspecified; its length is 0 for new buffers and whatever was
/// last received for pooled ones (callers overwrite what they use).
#[cfg_attr(not(feature = "ucx"), allow(dead_code))]
pub(crate) fn try_take(size: usize) -> Option<Vec<u8>> {
    take_pooled(size).or_else(|| {
        let mut v = Vec::new();
        v.try_reserve_exact(size).ok()?;
        advise_huge_pages(&mut v);
        Some(v)
    })
}

/// A pooled buffer for `size` bytes (capacity at most twice `size`), if the pool has one: memory
/// this process already holds.
pub(crate) fn take_pooled(size: usize) -> Option<Vec<u8>> {
    if size < POOL_MIN {
        return None;
    }
    let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
    let best = free
        .iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= size && v.capacity() / 2 <= size)
        .min_by_key(|(_, v)| v.capacity())
        .map(|(i, _)| i)?;
    Some(free.swap_remove(best))
}

/// Wraps a received buffer (its length is the frame size) as `Bytes`, returning it to the pool
/// when dropped; or, `reclaimable`, as plain `Vec`-backed `Bytes` that `crate::writable` turns
/// back into the buffer (`Options::reclaimable_frames`).
pub(crate) fn into_bytes(mut v: Vec<u8>, reclaimable: bool) -> Bytes {
    if reclaimable {
        // The application may keep the frame for long (Dask stores what it receives), and
        // counts its length: a pooled buffer may be up to twice that. Give the slack back
        // (for large allocations `realloc` shrinks in place).
        if v.capacity() - v.len() > v.len() / 8 {
            v.shrink_to_fit();
        }
        Bytes::from(v)
    } else if v.capacity() >= POOL_MIN {
        Bytes::from_owner(Pooled(v))
    } else {
        Bytes::from(v)
    }
}

struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        recycle(std::mem::take(&mut self.0));
    }
}

/// Keeps `v` for a later receive when it is large enough and the pool has room; frees it
/// otherwise.
pub(crate) fn recycle(v: Vec<u8>) {
    if v.capacity() < POOL_MIN {
        return;
    }
    let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
    let cached: usize = free.iter().map(Vec::capacity).sum();
    if cached + v.capacity() <= POOL_LIMIT {
        free.push(v);
    }
}

/// A copy of `src` in a buffer of its own, from the pool when `src` is large (see
/// [`crate::writable`]).
pub(crate) fn owned_copy(src: &[u8]) -> Option<Vec<u8>> {
    let mut v = try_take(src.len())?;
    v.clear();
    v.extend_from_slice(src);
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "ucx")]
    /// Whether the kernel may back the mapping holding `addr` with huge pages (`THPeligible`
    /// in /proc/self/smaps), or `None` where it cannot say.
    fn huge_page_eligible(addr: usize) -> Option<bool> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((from, to)) = first.split_once('-') {
                if let (Ok(from), Ok(to)) = (
                    usize::from_str_radix(from, 16),
                    usize::from_str_radix(to, 16),
                ) {
                    inside = (from..to).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix("THPeligible:") {
                    return Some(v.trim() == "1");
                }
            }
        }
        None
    }

    /// Large buffers (the pool's, and `host_buffer`'s) may be backed by huge pages where the
    /// kernel has them on request (`madvise`); small ones are left alone.
    #[cfg(feature = "ucx")]
    #[test]
    fn large_buffers_ask_for_huge_pages() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !thp.contains("[madvise]") {
            eprintln!("skipped: transparent huge pages are not on request here ({thp:?})");
            return;
        }
        let mut pooled = try_take(8 << 20).unwrap();
        let zeroed = crate::host_buffer(8 << 20);
        for (what, at) in [
            ("pooled", pooled.as_mut_ptr() as usize),
            ("host_buffer", zeroed.as_ptr() as usize),
        ] {
            // The middle of the buffer: whole 2 MiB pages lie around it.
            let middle = at + (4 << 20);
            assert_eq!(
                huge_page_eligible(middle),
                Some(true),
                "{what}: not eligible for huge pages"
            );
        }
    }

    /// A dropped large frame's memory is what the next receive of that size gets.
    #[test]
    fn large_frames_are_reused() {
        let size = POOL_MIN * 3 + 5;
        let mut v = try_take(size).unwrap();
        v.resize(size, 7);
        let ptr = v.as_ptr();
        let b = into_bytes(v, false);
        assert_eq!(b.len(), size);
        assert!(b.iter().all(|&x| x == 7));
        let clone = b.clone();
        drop(b);
        drop(clone);
        // Other tests may use the pool too: look for ours among what comes back.
        let got: Vec<Vec<u8>> = (0..8).map(|_| try_take(size).unwrap()).collect();
        assert!(
            got.iter().any(|v| v.as_ptr() == ptr),
            "the buffer was not reused"
        );
        // Small sizes never get a big pooled buffer.
        assert!(try_take(10).unwrap().capacity() < POOL_MIN);
    }
}
