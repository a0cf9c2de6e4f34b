//! The UCXX wire format, as pure functions: no I/O, no UCX calls.
//!
//! * The connection handshake is 16 bytes over the UCP stream API: `u64 msg_tag`, `u64 checksum`
//!   in native byte order, where `checksum = hash64bits(msg_tag)`. The listener sends first.
//! * `hash64bits(args...)` is the first 16 hex digits of the SHA-1 of Python's `repr` of the
//!   argument tuple, read as a `u64`: `"(12345,)"` for one argument, `"(12345, 678)"` for two.
//! * A user tag `t` becomes `hash64bits(msg_tag, hash(t))` where `hash` is Python's integer hash.

use crate::error::HandshakeError;
use sha1::{Digest, Sha1};

/// Size of the handshake message in bytes.
pub const HANDSHAKE_LEN: usize = 16;

/// Python's `sys.hash_info.modulus` on 64-bit builds: 2^61 - 1.
const PY_HASH_MODULUS: i128 = (1 << 61) - 1;

/// Python's `hash()` of an integer (64-bit CPython).
///
/// ```
/// use ucx::wire::py_hash;
/// assert_eq!(py_hash(12345), 12345);
/// assert_eq!(py_hash(-1), -2);
/// assert_eq!(py_hash((1 << 61) - 1), 0);
/// ```
pub fn py_hash(t: i128) -> i64 {
    let m = t.unsigned_abs() % (PY_HASH_MODULUS as u128);
    let h = if t < 0 { -(m as i64) } else { m as i64 };
    if h == -1 {
        -2
    } else {
        h
    }
}

fn sha1_prefix(repr: &str) -> u64 {
    let digest = Sha1::digest(repr.as_bytes());
    u64::from_be_bytes(digest[..8].try_into().expect("SHA-1 digests are 20 bytes"))
}

/// `hash64bits(a)` of UCX-Py/UCXX for one integer argument.
pub fn hash64bits1(a: u64) -> u64 {
    sha1_prefix(&format!("({a},)"))
}

/// `hash64bits(a, b)` of UCX-Py/UCXX for two integer arguments.
pub fn hash64bits2(a: u64, b: i64) -> u64 {
    sha1_prefix(&format!("({a}, {b})"))
}

/// The handshake message: a side's receive tag and its checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handshake {
    /// The tag the sender of this handshake receives on (the peer sends to it).
    pub msg_tag: u64,
    /// `hash64bits(msg_tag)`.
    pub checksum: u64,
}

impl Handshake {
    /// A handshake for the given receive tag.
    pub fn new(msg_tag: u64) -> Self {
        Handshake {
            msg_tag,
            checksum: hash64bits1(msg_tag),
        }
    }

    /// The 16 bytes on the wire (native byte order, as UCXX writes a C struct).
    pub fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut out = [0u8; HANDSHAKE_LEN];
        out[..8].copy_from_slice(&self.msg_tag.to_ne_bytes());
        out[8..].copy_from_slice(&self.checksum.to_ne_bytes());
        out
    }

    /// Parses and validates the peer's handshake bytes.
    ///
    /// ```
    /// use ucx::wire::Handshake;
    /// let h = Handshake::new(42);
    /// assert_eq!(Handshake::decode(&h.encode()), Ok(h));
    /// assert!(Handshake::decode(&[0u8; 5]).is_err());
    /// ```
    pub fn decode(bytes: &[u8]) -> Result<Self, HandshakeError> {
        if bytes.len() != HANDSHAKE_LEN {
            return Err(HandshakeError::Length {
                got: bytes.len(),
                expected: HANDSHAKE_LEN,
            });
        }
        let msg_tag = u64::from_ne_bytes(bytes[..8].try_into().expect("8 bytes"));
        let checksum = u64::from_ne_bytes(bytes[8..].try_into().expect("8 bytes"));
        let expected = hash64bits1(msg_tag);
        if checksum != expected {
            return Err(HandshakeError::Checksum {
                tag: msg_tag,
                got: checksum,
                expected,
            });
        }
        Ok(Handshake { msg_tag, checksum })
    }
}

/// A message tag as the caller names it.
///
/// * [`Tag::Default`]: UCXX's "no tag": the endpoint's own handshake tags.
/// * [`Tag::User`]: an integer, combined with the endpoint's tags exactly as UCXX does, so a
///   Python peer using the same integer matches. Negative integers are allowed, as in Python.
/// * [`Tag::Forced`]: a raw UCP tag used as is (UCXX's `force_tag=True`).
///
/// Integers convert into [`Tag::User`]: `ep.send(buf, 7)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Tag {
    /// The endpoint's default tag.
    #[default]
    Default,
    /// A user tag (any Python integer in `i128`'s range).
    User(i128),
    /// A raw UCP tag.
    Forced(u64),
}

impl Tag {
    /// The raw UCP tag for this tag on an endpoint whose own tag is `base`.
    pub fn resolve(self, base: u64) -> u64 {
        match self {
            Tag::Default => base,
            Tag::User(t) => hash64bits2(base, py_hash(t)),
            Tag::Forced(raw) => raw,
        }
    }
}

macro_rules! tag_from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Tag {
            fn from(t: $t) -> Self {
                Tag::User(i128::from(t))
            }
        }
    )*};
}
tag_from_int!(i8, i16, i32, i64, u8, u16, u32, u64);

impl From<Option<i64>> for Tag {
    fn from(t: Option<i64>) -> Self {
        t.map_or(Tag::Default, |t| Tag::User(i128::from(t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash64bits_matches_python() {
        // Values from CPython: int(hashlib.sha1(b"(12345,)").hexdigest()[:16], 16), etc.
        assert_eq!(
            format!("{:016x}", hash64bits1(12345)),
            &hex_sha1("(12345,)")[..16]
        );
        assert_eq!(
            format!("{:016x}", hash64bits2(12345, -2)),
            &hex_sha1("(12345, -2)")[..16]
        );
    }

    fn hex_sha1(s: &str) -> String {
        Sha1::digest(s.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn known_sha1_vector() {
        // SHA-1("abc") from FIPS 180-1; guards against a wrong hash crate or byte order.
        assert_eq!(hex_sha1("abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
    }

    #[test]
    fn python_integer_hash() {
        assert_eq!(py_hash(0), 0);
        assert_eq!(py_hash(-1), -2);
        assert_eq!(py_hash(-2), -2);
        assert_eq!(py_hash(PY_HASH_MODULUS), 0);
        assert_eq!(py_hash(PY_HASH_MODULUS + 5), 5);
        assert_eq!(py_hash(-(PY_HASH_MODULUS + 5)), -5);
        assert_eq!(
            py_hash(i128::from(u64::MAX)),
            (u64::MAX % ((1 << 61) - 1)) as i64
        );
    }

    #[test]
    fn handshake_round_trip_and_rejects() {
        let h = Handshake::new(0xdead_beef_0123_4567);
        let mut b = h.encode();
        assert_eq!(Handshake::decode(&b).unwrap(), h);
        b[9] ^= 1;
        assert!(matches!(
            Handshake::decode(&b),
            Err(HandshakeError::Checksum {
                tag: 0xdead_beef_0123_4567,
                ..
            })
        ));
        assert!(Handshake::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("bad checksum"));
        assert_eq!(
            Handshake::decode(&b[..15]),
            Err(HandshakeError::Length {
                got: 15,
                expected: 16
            })
        );
    }

    #[test]
    fn tags_resolve_like_ucxx() {
        assert_eq!(Tag::Default.resolve(77), 77);
        assert_eq!(Tag::Forced(5).resolve(77), 5);
        assert_eq!(Tag::from(3).resolve(77), hash64bits2(77, 3));
        assert_eq!(Tag::from(-1i64).resolve(77), hash64bits2(77, -2));
        assert_ne!(Tag::from(1).resolve(77), Tag::from(2).resolve(77));
        assert_eq!(Tag::from(None), Tag::Default);
    }
}
