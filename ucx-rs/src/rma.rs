//! Remote memory access: registered memory, packed remote keys, put/get, flush and fence.
//!
//! Ownership rules, enforced by types:
//! * [`MemoryHandle`] owns the buffer it registers; the buffer comes back only through
//!   [`MemoryHandle::unmap`], after `ucp_mem_unmap`, so registered memory never outlives its
//!   registration in safe code.
//! * A [`RemoteKey`] borrows the [`Endpoint`] it was unpacked on, so it cannot be used after
//!   the endpoint is gone. Each in-flight put/get keeps the key's UCX handle alive until UCX
//!   completes it, even if the future (or the key) is dropped first.
//!
//! **The target must progress, and must not unmap while peers still write.** Over transports
//! without hardware RMA (TCP lanes, which UCX 1.13 puts on every client-server endpoint), a put
//! is applied by the *target's* worker when it progresses, and UCX writes to the address
//! without checking that the region is still registered. Unmapping (or dropping) a
//! [`MemoryHandle`] while a peer's puts are in flight therefore lets UCX write into freed
//! memory (seen: a segfault when a test unwound past its region). Have writers
//! [`Endpoint::flush`] and tell you they are done before you unmap.
//!
//! Packed keys travel with their region's address and length, a magic and a checksum, so a
//! truncated or corrupted key is refused before UCX parses it (UCX's own format has no length).

use std::ffi::c_void;
use std::fmt;
use std::ptr;
use std::sync::Arc;

use sha1::{Digest, Sha1};
use ucx_sys as sys;

use crate::buffer::{IoBuf, IoBufMut};
use crate::context::Context;
use crate::endpoint::Endpoint;
use crate::error::{check, Error, ProtocolError, Result, RkeyError};
use crate::worker::WorkerShared;

const MAGIC: &[u8; 4] = b"URK1";
/// magic, rkey length (u32), address (u64), region length (u64).
const FIXED: usize = 4 + 4 + 8 + 8;
const CHECKSUM: usize = 8;
/// Largest UCX rkey blob accepted (real ones are tens to hundreds of bytes).
const MAX_RKEY: usize = 64 << 10;

fn checksum(bytes: &[u8]) -> [u8; 8] {
    Sha1::digest(bytes)[..8]
        .try_into()
        .expect("SHA-1 digests are 20 bytes")
}

/// Memory registered with UCX for remote access. Owns its buffer.
pub struct MemoryHandle<B: IoBufMut> {
    buf: Option<B>,
    memh: sys::ucp_mem_h,
    context: Context,
    addr: *mut u8,
    len: usize,
}

// SAFETY: the handle is only used for context-level calls (map, pack, unmap), which UCX makes
// thread-safe for a context created with mt_workers_shared; the buffer is Send.
unsafe impl<B: IoBufMut> Send for MemoryHandle<B> {}
// SAFETY: &MemoryHandle allows packing a key and copying the contents out, nothing else.
unsafe impl<B: IoBufMut + Sync> Sync for MemoryHandle<B> {}

impl<B: IoBufMut> fmt::Debug for MemoryHandle<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryHandle")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .finish()
    }
}

impl MemoryHandle<Vec<u8>> {
    /// Allocates `len` zeroed bytes and registers them.
    pub fn alloc(context: &Context, len: usize) -> Result<Self> {
        Self::map(context, vec![0u8; len])
    }
}

impl<B: IoBufMut> MemoryHandle<B> {
    /// Registers the whole capacity of `buf` (`bytes_total()`), taking ownership of it.
    pub fn map(context: &Context, mut buf: B) -> Result<Self> {
        let len = buf.bytes_total();
        if len == 0 {
            return Err(Error::InvalidArgument("cannot register 0 bytes".into()));
        }
        let addr = buf.stable_mut_ptr();
        let params = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH)
                as u64,
            address: addr.cast(),
            length: len,
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        // SAFETY: addr is valid for len bytes and stays so while `buf` is owned here (it is
        // only handed back after ucp_mem_unmap); memh is an out-pointer.
        check(unsafe { sys::ucp_mem_map(context.handle(), &params, &mut memh) })?;
        Ok(MemoryHandle {
            buf: Some(buf),
            memh,
            context: context.clone(),
            addr,
            len,
        })
    }

    /// Start address of the region (what remote puts and gets address).
    pub fn address(&self) -> u64 {
        self.addr as u64
    }

    /// Length of the region in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty regions cannot be registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A remote key for the whole region, with its address and length, for the peer's
    /// [`Endpoint::unpack_rkey`].
    pub fn pack_rkey(&self) -> Result<Vec<u8>> {
        let mut raw: *mut c_void = ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: context and memh are alive; raw/size are out-pointers.
        check(unsafe {
            sys::ucp_rkey_pack(self.context.handle(), self.memh, &mut raw, &mut size)
        })?;
        // SAFETY: UCX returned `size` readable bytes at `raw`.
        let rkey = unsafe { std::slice::from_raw_parts(raw as *const u8, size) }.to_vec();
        // SAFETY: raw came from ucp_rkey_pack and is released once.
        unsafe { sys::ucp_rkey_buffer_release(raw) };
        let mut out = Vec::with_capacity(FIXED + rkey.len() + CHECKSUM);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(rkey.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.address().to_le_bytes());
        out.extend_from_slice(&(self.len as u64).to_le_bytes());
        out.extend_from_slice(&rkey);
        let sum = checksum(&out);
        out.extend_from_slice(&sum);
        Ok(out)
    }

    /// Copies the region's current contents. Remote writers must have flushed first.
    pub fn read(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        // SAFETY: addr is valid for len bytes (owned, registered buffer); raw copy without
        // creating a reference to memory that peers may write.
        unsafe { ptr::copy_nonoverlapping(self.addr, out.as_mut_ptr(), self.len) };
        out
    }

    /// Writes `data` at `offset` (for peers to get). Fails if it does not fit.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        if offset
            .checked_add(data.len())
            .is_none_or(|end| end > self.len)
        {
            return Err(Error::InvalidArgument(format!(
                "{} bytes at offset {offset} do not fit a {}-byte region",
                data.len(),
                self.len
            )));
        }
        // SAFETY: bounds checked above; the region is owned and valid.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.addr.add(offset), data.len()) };
        Ok(())
    }

    /// Unregisters the memory and gives the buffer back.
    pub fn unmap(mut self) -> Result<B> {
        let r = self.unmap_inner();
        let buf = self.buf.take().expect("buffer present until unmap");
        r.map(|_| buf)
    }

    fn unmap_inner(&mut self) -> Result<()> {
        if self.memh.is_null() {
            return Ok(());
        }
        let memh = std::mem::replace(&mut self.memh, ptr::null_mut());
        // SAFETY: memh came from ucp_mem_map on this context and is unmapped once.
        check(unsafe { sys::ucp_mem_unmap(self.context.handle(), memh) })
    }
}

impl<B: IoBufMut> Drop for MemoryHandle<B> {
    fn drop(&mut self) {
        if let Err(e) = self.unmap_inner() {
            tracing::warn!(error = %e, "ucp_mem_unmap failed");
        }
    }
}

/// A UCX remote key handle, destroyed when the last operation using it is done.
struct RkeyInner {
    rkey: sys::ucp_rkey_h,
    worker: Arc<WorkerShared>,
}

// SAFETY: the rkey is only used under the worker lock (posting operations, destroy).
unsafe impl Send for RkeyInner {}
// SAFETY: as above.
unsafe impl Sync for RkeyInner {}

impl Drop for RkeyInner {
    fn drop(&mut self) {
        let _locked = self.worker.lock();
        // SAFETY: no operation uses the key any more (each holds an Arc until completion).
        unsafe { sys::ucp_rkey_destroy(self.rkey) };
    }
}

/// A peer's registered region, reachable through one endpoint.
pub struct RemoteKey<'ep> {
    inner: Arc<RkeyInner>,
    ep: &'ep Endpoint,
    addr: u64,
    len: usize,
}

impl fmt::Debug for RemoteKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteKey")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .finish()
    }
}

/// Checks a key packed by [`MemoryHandle::pack_rkey`], as a peer sent it: returns the UCX key's
/// bytes, the region's address and its length. Besides the envelope (magic, lengths,
/// checksum) the UCX key's own layout is walked, because `ucp_ep_rkey_unpack` takes no length
/// and trusts it: a forged key that would make UCX read past its end is refused here.
///
/// ```
/// use ucx::{parse_packed_rkey, RkeyError};
/// assert_eq!(parse_packed_rkey(&[0; 8]), Err(RkeyError::TooShort(8)));
/// ```
pub fn parse_packed_rkey(packed: &[u8]) -> Result<(&[u8], u64, usize), RkeyError> {
    if packed.len() < FIXED + CHECKSUM {
        return Err(RkeyError::TooShort(packed.len()));
    }
    if &packed[..4] != MAGIC {
        return Err(RkeyError::Magic);
    }
    let rkey_len = u32::from_le_bytes(packed[4..8].try_into().expect("4")) as usize;
    if rkey_len > MAX_RKEY || packed.len() != FIXED + rkey_len + CHECKSUM {
        return Err(RkeyError::Length {
            got: packed.len(),
            rkey: rkey_len,
        });
    }
    let (body, sum) = packed.split_at(FIXED + rkey_len);
    if checksum(body) != sum {
        return Err(RkeyError::Checksum);
    }
    let addr = u64::from_le_bytes(packed[8..16].try_into().expect("8"));
    let len = u64::from_le_bytes(packed[16..24].try_into().expect("8"));
    let len = usize::try_from(len).map_err(|_| RkeyError::RegionLength(len))?;
    let raw = &packed[FIXED..FIXED + rkey_len];
    check_ucx_layout(raw).map_err(|at| RkeyError::Layout(FIXED + at))?;
    Ok((raw, addr, len))
}

/// Walks a key in `ucp_rkey_pack`'s layout (UCX 1.13 to 1.20): the memory-domain map (a
/// native-endian `u64`), the memory type (a byte), then per domain in the map a length byte and
/// that many bytes, then optionally the system device (a byte) and 3 bytes per device distance.
/// Returns the offset where the bytes stop fitting that layout.
fn check_ucx_layout(raw: &[u8]) -> Result<(), usize> {
    const MAP: usize = 8;
    let Some(map) = raw.first_chunk::<MAP>() else {
        return Err(raw.len());
    };
    match raw.get(MAP) {
        Some(&t) if u32::from(t) < sys::UCS_MEMORY_TYPE_LAST => {}
        _ => return Err(MAP),
    }
    let mut at = MAP + 1;
    for _ in 0..u64::from_ne_bytes(*map).count_ones() {
        let Some(&size) = raw.get(at) else {
            return Err(at);
        };
        at += 1 + usize::from(size);
        if at > raw.len() {
            return Err(at - 1 - usize::from(size));
        }
    }
    // The device part: nothing, or a device byte and up to 64 three-byte distances.
    match raw.len() - at {
        0 => Ok(()),
        rest if rest % 3 == 1 && rest <= 1 + 3 * 64 => Ok(()),
        _ => Err(at),
    }
}

impl<'ep> RemoteKey<'ep> {
    fn new(inner: RkeyInner, ep: &'ep Endpoint, addr: u64, len: usize) -> Self {
        RemoteKey {
            inner: Arc::new(inner),
            ep,
            addr,
            len,
        }
    }

    /// Length of the remote region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the remote region is empty (never, for keys from `pack_rkey`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn target(&self, offset: usize, n: usize) -> Result<u64> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(self.addr + offset as u64),
            _ => Err(Error::InvalidArgument(format!(
                "{n} bytes at offset {offset} are outside the {}-byte remote region",
                self.len
            ))),
        }
    }

    /// Writes `buf` into the remote region at `offset`. Completes when `buf` may be reused;
    /// call [`Endpoint::flush`] before telling the peer the data is there.
    pub async fn put<B: IoBuf>(&self, buf: B, offset: usize) -> (Result<()>, B) {
        match self.target(offset, buf.bytes_init()) {
            Ok(at) => self.ep.rma_put(buf, at, &self.inner).await,
            Err(e) => (Err(e), buf),
        }
    }

    /// Reads `buf.bytes_total()` bytes from the remote region at `offset` into `buf`.
    pub async fn get<B: IoBufMut>(&self, buf: B, offset: usize) -> (Result<usize>, B) {
        match self.target(offset, buf.bytes_total()) {
            Ok(at) => self.ep.rma_get(buf, at, &self.inner).await,
            Err(e) => (Err(e), buf),
        }
    }
}

/// Remote memory access through an endpoint.
impl Endpoint {
    /// Unpacks a peer's key (from [`MemoryHandle::pack_rkey`]) for puts and gets through this
    /// endpoint. Truncated or corrupted keys are refused ([`ProtocolError::RemoteKey`]).
    pub fn unpack_rkey(&self, packed: &[u8]) -> Result<RemoteKey<'_>> {
        let (raw, addr, len) = parse_packed_rkey(packed).map_err(ProtocolError::RemoteKey)?;
        let locked = self.shared.worker.lock();
        let ep = self.shared.live(&locked)?;
        let mut rkey: sys::ucp_rkey_h = ptr::null_mut();
        // SAFETY: ep is live under the lock; `raw` has the layout ucp_rkey_pack gives (walked by
        // parse_packed_rkey, so UCX reads nothing past it); rkey is an out-pointer.
        check(unsafe { sys::ucp_ep_rkey_unpack(ep, raw.as_ptr().cast(), &mut rkey) })?;
        drop(locked);
        let inner = RkeyInner {
            rkey,
            worker: Arc::clone(&self.shared.worker),
        };
        Ok(RemoteKey::new(inner, self, addr, len))
    }

    async fn rma_put<B: IoBuf>(
        &self,
        buf: B,
        remote: u64,
        key: &Arc<RkeyInner>,
    ) -> (Result<()>, B) {
        #[cfg(feature = "cuda")]
        if let Err(e) = crate::cuda::require_zero_copy(&self.shared.worker, &buf) {
            return (Err(e), buf);
        }
        let posted = {
            let rkey = key.rkey;
            let (p, len, mt) = (buf.stable_ptr(), buf.bytes_init(), buf.memory_type());
            self.shared.post_live(Some(mt.to_ucs()), |ep, param| {
                // SAFETY: ep live under the lock; the buffer and the rkey stay alive until the
                // operation completes (both owned by InFlight or parked in the op).
                unsafe { sys::ucp_put_nbx(ep, p.cast(), len, remote, rkey, param) }
            })
        };
        let posted = match posted {
            Ok(posted) => posted,
            Err(e) => return (Err(e), buf),
        };
        let (c, (buf, _key)) = self
            .shared
            .complete(posted, (buf, Arc::clone(key)), false)
            .await;
        (self.shared.outcome(&c), buf)
    }

    async fn rma_get<B: IoBufMut>(
        &self,
        mut buf: B,
        remote: u64,
        key: &Arc<RkeyInner>,
    ) -> (Result<usize>, B) {
        #[cfg(feature = "cuda")]
        if let Err(e) = crate::cuda::require_zero_copy(&self.shared.worker, &buf) {
            return (Err(e), buf);
        }
        let len = buf.bytes_total();
        let posted = {
            let rkey = key.rkey;
            let (p, mt) = (buf.stable_mut_ptr(), buf.memory_type());
            self.shared.post_live(Some(mt.to_ucs()), |ep, param| {
                // SAFETY: as in rma_put; the buffer is writable for `len` bytes.
                unsafe { sys::ucp_get_nbx(ep, p.cast(), len, remote, rkey, param) }
            })
        };
        let posted = match posted {
            Ok(posted) => posted,
            Err(e) => return (Err(e), buf),
        };
        let (mut c, (mut buf, _key)) = self
            .shared
            .complete(posted, (buf, Arc::clone(key)), false)
            .await;
        // A get reports no length: on success UCX wrote all `len` bytes.
        c.length = len;
        let r = self.shared.received(&c, &mut buf, len);
        (r, buf)
    }

    /// Waits until every operation posted on this endpoint (puts included) has completed
    /// remotely (`ucp_ep_flush_nbx`).
    pub async fn flush(&self) -> Result<()> {
        let posted = self.shared.post_live(None, |ep, param| {
            // SAFETY: ep is live under the lock.
            unsafe { sys::ucp_ep_flush_nbx(ep, param) }
        })?;
        let (c, ()) = self.shared.complete(posted, (), false).await;
        self.shared.outcome(&c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(rkey: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(rkey.len() as u32).to_le_bytes());
        out.extend_from_slice(&0x1000u64.to_le_bytes());
        out.extend_from_slice(&64u64.to_le_bytes());
        out.extend_from_slice(rkey);
        let sum = checksum(&out);
        out.extend_from_slice(&sum);
        out
    }

    #[test]
    fn packed_keys_are_validated() {
        // Two memory domains (keys of 3 and 2 bytes), host memory, then a device and one
        // distance.
        let mut key = 0b101u64.to_ne_bytes().to_vec();
        key.extend_from_slice(&[0, 3, 7, 7, 7, 2, 7, 7, 1, 9, 9, 9]);
        let p = packed(&key);
        let (k, addr, len) = parse_packed_rkey(&p).unwrap();
        assert_eq!((k, addr, len), (&key[..], 0x1000, 64));
        // A forged key UCX would read past: its layout is walked, not trusted.
        for (cut, at) in [
            (18, FIXED + 16),
            (15, FIXED + 13),
            (12, FIXED + 9),
            (8, FIXED + 8),
        ] {
            let p = packed(&key[..cut]);
            assert_eq!(
                parse_packed_rkey(&p),
                Err(RkeyError::Layout(at)),
                "cut at {cut}"
            );
        }
        let mut more = key.clone();
        more[0] = 0b111;
        assert!(matches!(
            parse_packed_rkey(&packed(&more)),
            Err(RkeyError::Layout(_))
        ));
        more = key.clone();
        more[8] = 200;
        assert_eq!(
            parse_packed_rkey(&packed(&more)),
            Err(RkeyError::Layout(FIXED + 8))
        );
        assert!(parse_packed_rkey(&p[..p.len() - 1]).is_err(), "truncated");
        let mut bad = p.clone();
        bad[30] ^= 1;
        assert_eq!(parse_packed_rkey(&bad).unwrap_err(), RkeyError::Checksum);
        let mut bad = p.clone();
        bad[0] = b'X';
        assert!(parse_packed_rkey(&bad).is_err());
        assert!(parse_packed_rkey(&[]).is_err());
    }
}
