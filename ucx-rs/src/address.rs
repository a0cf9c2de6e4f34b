//! Worker addresses sealed for their trip out of band.
//!
//! UCX parses a worker address without checking it: a truncated or corrupted one, or one made
//! by another UCX version (whose address format differs), can make it read past the bytes or
//! abort the process. [`Worker::sealed_address`] wraps the address with a header (a magic
//! string, the UCX version, the length and a hash of the rest) and
//! [`Endpoint::connect_sealed`] connects only to a sealed address whose header checks out, so
//! an address that was cut, padded, bit-flipped, mixed up with other bytes or made by another
//! UCX is refused with [`Error::InvalidArgument`]. The seal detects accidents, not forgery: a
//! peer that means harm can seal bytes of its choosing (as it can send them to a listener,
//! whose UCX unpacks the client's address just as trustingly).

use crate::error::{Error, Result};
use crate::{Endpoint, Worker};

const MAGIC: &[u8; 8] = b"ucx-rs\x01\x00";
/// Magic, UCX version (major, minor, release: u16 each), length (u32), hash (u64).
const HEADER: usize = 8 + 6 + 4 + 8;

/// FNV-1a, 64 bits: cheap, and enough to tell an intact address from an altered one.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The loaded UCX's version as 6 bytes.
fn version_bytes() -> [u8; 6] {
    let loaded = crate::library::loaded_version();
    let mut v = [0u8; 6];
    v[0..2].copy_from_slice(&(loaded.major as u16).to_le_bytes());
    v[2..4].copy_from_slice(&(loaded.minor as u16).to_le_bytes());
    v[4..6].copy_from_slice(&(loaded.release as u16).to_le_bytes());
    v
}

fn version_text(v: &[u8]) -> String {
    let n = |i: usize| u16::from_le_bytes([v[i], v[i + 1]]);
    format!("{}.{}.{}", n(0), n(2), n(4))
}

/// Seals `raw`, an address of this process's UCX.
pub(crate) fn seal(raw: &[u8]) -> Result<Vec<u8>> {
    let len = u32::try_from(raw.len())
        .map_err(|_| Error::InvalidArgument("a worker address over 4 GiB".into()))?;
    let version = version_bytes();
    let mut out = Vec::with_capacity(HEADER + raw.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&version);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&fnv1a(&[&version, &len.to_le_bytes(), raw]).to_le_bytes());
    out.extend_from_slice(raw);
    Ok(out)
}

/// The raw address inside `sealed`, if its header checks out against this process's UCX.
pub(crate) fn unseal(sealed: &[u8]) -> Result<&[u8]> {
    let bad = |why: String| Error::InvalidArgument(format!("not a usable worker address: {why}"));
    if sealed.len() < HEADER || &sealed[..8] != MAGIC {
        return Err(bad(format!(
            "{} bytes without ucx-rs's seal (get it from Worker::sealed_address)",
            sealed.len()
        )));
    }
    let (version, rest) = sealed[8..].split_at(6);
    let (len, rest) = rest.split_at(4);
    let (hash, raw) = rest.split_at(8);
    let ours = version_bytes();
    // Releases of one minor version share the address format; minors may not.
    if version[..4] != ours[..4] {
        return Err(bad(format!(
            "made by UCX {}, and this process runs UCX {}",
            version_text(version),
            version_text(&ours)
        )));
    }
    let announced = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
    if announced != raw.len() {
        return Err(bad(format!(
            "its header announces {announced} bytes of address, {} follow",
            raw.len()
        )));
    }
    if fnv1a(&[version, len, raw]).to_le_bytes() != hash {
        return Err(bad("its bytes differ from those sealed (corrupted)".into()));
    }
    Ok(raw)
}

impl Worker {
    /// The worker's address, sealed for [`Endpoint::connect_sealed`] (see [`address`](crate::address)
    /// for what the seal catches). Send it out of band, unchanged, to the process that
    /// connects.
    pub fn sealed_address(&self) -> Result<Vec<u8>> {
        seal(&self.address()?)
    }
}

impl Endpoint {
    /// Connects to a worker by its sealed address ([`Worker::sealed_address`]), safely: an
    /// address that was altered on its way, or made by another UCX version, is refused with
    /// [`Error::InvalidArgument`] before UCX sees it. Otherwise as
    /// [`connect_address`](Self::connect_address): no handshake, tag bases 0.
    ///
    /// ```no_run
    /// # fn f(worker: &ucx::Worker, other: &ucx::Worker) -> ucx::Result<()> {
    /// let sealed = other.sealed_address()?; // sent out of band
    /// let ep = ucx::Endpoint::connect_sealed(worker, &sealed)?;
    /// assert!(ucx::Endpoint::connect_sealed(worker, &sealed[..sealed.len() - 1]).is_err());
    /// # Ok(()) }
    /// ```
    pub fn connect_sealed(worker: &Worker, sealed: &[u8]) -> Result<Endpoint> {
        let raw = unseal(sealed)?;
        // SAFETY: `raw` is, byte for byte, what a worker of this UCX version sealed (the
        // header's length and hash match), i.e. the unmodified bytes of a worker's address,
        // which is connect_address's contract (up to deliberate forgery, see the module).
        unsafe { Endpoint::connect_address(worker, raw) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_address_unseals_and_every_alteration_is_refused() {
        let raw: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
        let sealed = seal(&raw).unwrap();
        assert_eq!(unseal(&sealed).unwrap(), &raw[..]);
        // Truncated, extended, each byte flipped, raw bytes: all refused.
        assert!(unseal(&sealed[..sealed.len() - 1]).is_err());
        let mut longer = sealed.clone();
        longer.push(0);
        assert!(unseal(&longer).is_err());
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x10;
            assert!(unseal(&bad).is_err(), "a flip at byte {i} was accepted");
        }
        assert!(unseal(&raw).is_err());
        assert!(unseal(&[]).is_err());
    }

    #[test]
    fn another_ucx_minor_version_is_refused_by_name() {
        let mut sealed = seal(b"address").unwrap();
        sealed[10] ^= 1; // minor version
        let e = unseal(&sealed).unwrap_err().to_string();
        assert!(e.contains("made by UCX"), "{e}");
    }
}
