//! The message header: what a connection sends before a message's frames.
//!
//! Layout (little-endian): `magic: u32 = "UTM3"`, `channel: u32`, `nframes: u32`, then per
//! frame `size: u64` and `memory: u8` (0 host, 1 CUDA). Version 3 of the magic: `ucx://` first
//! messages of at most [`crate::UCX_FIRST_MAX`] bytes (65 KiB; version 2 posted 8 KiB), and
//! credits on [`crate::UCX_CREDIT_TAG`]. Everything is validated against
//! [`Limits`] before a single frame byte is allocated.

/// Magic at the start of every header.
pub const MAGIC: [u8; 4] = *b"UTM3";
/// Bytes before the per-frame entries.
pub const FIXED_LEN: usize = 12;
/// Bytes per frame entry.
pub const ENTRY_LEN: usize = 9;

/// Caps on what a peer may announce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most frames in one message.
    pub max_frames: u32,
    /// Most bytes in one message (all frames together).
    pub max_message: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frames: 65_536,
            max_message: 4 << 30,
        }
    }
}

/// One frame as the header describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameMeta {
    /// Size in bytes.
    pub size: u64,
    /// Whether the sender's frame is in CUDA device memory.
    pub cuda: bool,
}

/// Why a header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The first four bytes are not [`MAGIC`].
    #[error("bad magic {0:02x?}: not a transport message header")]
    Magic([u8; 4]),
    /// More frames than [`Limits::max_frames`].
    #[error("{got} frames announced, at most {max} allowed")]
    TooManyFrames {
        /// Announced.
        got: u32,
        /// Allowed.
        max: u32,
    },
    /// More bytes than [`Limits::max_message`].
    #[error("{got} bytes announced, at most {max} allowed")]
    TooLarge {
        /// Announced (saturating).
        got: u64,
        /// Allowed.
        max: u64,
    },
    /// A memory-type byte other than 0 or 1.
    #[error("frame {index}: unknown memory type {value}")]
    MemoryType {
        /// Frame index.
        index: usize,
        /// The byte.
        value: u8,
    },
}

/// Encodes a header for `frames` on `channel`.
///
/// ```
/// use transport::frame::{decode_entries, decode_fixed, encode, FrameMeta, Limits, FIXED_LEN};
/// let frames = [FrameMeta { size: 5, cuda: false }, FrameMeta { size: 0, cuda: false }];
/// let h = encode(7, &frames);
/// let (channel, n) = decode_fixed(h[..FIXED_LEN].try_into().unwrap(), &Limits::default()).unwrap();
/// assert_eq!((channel, n), (7, 2));
/// assert_eq!(decode_entries(&h[FIXED_LEN..], &Limits::default()).unwrap(), frames);
/// ```
pub fn encode(channel: u32, frames: &[FrameMeta]) -> Vec<u8> {
    let mut h = Vec::with_capacity(header_len(frames.len()));
    encode_into(&mut h, channel, frames.iter().copied());
    h
}

/// Bytes in the header of a message with `frames` frames.
pub fn header_len(frames: usize) -> usize {
    FIXED_LEN + ENTRY_LEN * frames
}

/// Appends the header for `frames` on `channel` to `h` (see [`encode`]).
pub fn encode_into(
    h: &mut Vec<u8>,
    channel: u32,
    frames: impl ExactSizeIterator<Item = FrameMeta>,
) {
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&channel.to_le_bytes());
    h.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    for f in frames {
        h.extend_from_slice(&f.size.to_le_bytes());
        h.push(u8::from(f.cuda));
    }
}

/// Checks the fixed part; returns (channel, frame count). The count is within the limits, so
/// `ENTRY_LEN * count` bytes may be read next.
pub fn decode_fixed(fixed: &[u8; FIXED_LEN], limits: &Limits) -> Result<(u32, u32), HeaderError> {
    let magic: [u8; 4] = fixed[..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(HeaderError::Magic(magic));
    }
    let channel = u32::from_le_bytes(fixed[4..8].try_into().expect("4 bytes"));
    let n = u32::from_le_bytes(fixed[8..12].try_into().expect("4 bytes"));
    if n > limits.max_frames {
        return Err(HeaderError::TooManyFrames {
            got: n,
            max: limits.max_frames,
        });
    }
    Ok((channel, n))
}

/// Decodes the frame entries and checks the total size.
pub fn decode_entries(entries: &[u8], limits: &Limits) -> Result<Vec<FrameMeta>, HeaderError> {
    check_entries(entries, limits)?;
    Ok(iter_entries(entries).collect())
}

/// Checks the frame entries (memory types, total size) without allocating; returns the
/// total size of the frames.
pub fn check_entries(entries: &[u8], limits: &Limits) -> Result<u64, HeaderError> {
    let mut total = 0u64;
    for (index, e) in entries.chunks_exact(ENTRY_LEN).enumerate() {
        if e[8] > 1 {
            return Err(HeaderError::MemoryType { index, value: e[8] });
        }
        total = total.saturating_add(entry_size(e));
        if total > limits.max_message {
            return Err(HeaderError::TooLarge {
                got: total,
                max: limits.max_message,
            });
        }
    }
    Ok(total)
}

/// The entries as [`FrameMeta`]s, for entries that passed [`check_entries`].
pub fn iter_entries(entries: &[u8]) -> impl ExactSizeIterator<Item = FrameMeta> + '_ {
    entries.chunks_exact(ENTRY_LEN).map(|e| FrameMeta {
        size: entry_size(e),
        cuda: e[8] == 1,
    })
}

/// What the first UCX message of a `ucx://` message says (see [`parse_first`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum First<'a> {
    /// The close marker: the peer closed the connection.
    Close,
    /// The header goes on in a second UCX message of exactly `rest` bytes: call
    /// [`parse_first`] again with it.
    Split {
        /// Bytes of the header's second part.
        rest: usize,
    },
    /// The header; each frame follows in a UCX message of its own.
    Framed {
        /// The message's channel.
        channel: u32,
        /// Its frames.
        frames: Vec<FrameMeta>,
    },
    /// The whole message: the header, then `bytes`, the frames' bytes one after the other.
    Inline {
        /// The message's channel.
        channel: u32,
        /// Its frames (their sizes add up to `bytes.len()`).
        frames: Vec<FrameMeta>,
        /// The frames' bytes.
        bytes: &'a [u8],
        /// What follows: more whole messages bundled into the same UCX message by a batched
        /// send, each laid out the same way (parse it with `parse_first` again); empty for a
        /// message sent alone.
        more: &'a [u8],
    },
}

/// Parses the first UCX message of a `ucx://` message (at most [`crate::UCX_FIRST_MAX`]
/// bytes): the whole message inlined (perhaps with more whole messages bundled behind it), or
/// its header (split in two UCX messages when longer than `UCX_FIRST_MAX`: pass the second
/// part as `rest`). Checks everything against `limits`; allocates only the frame list, which
/// the limits bound.
///
/// ```
/// use transport::frame::{encode, parse_first, First, FrameMeta, Limits};
/// let l = Limits::default();
/// let mut m = encode(3, &[FrameMeta { size: 2, cuda: false }]);
/// m.extend_from_slice(b"hi");
/// let Ok(First::Inline { channel: 3, bytes, more, .. }) = parse_first(&m, None, &l) else { panic!() };
/// assert_eq!((bytes, more), (&b"hi"[..], &b""[..]));
/// assert!(parse_first(&m[..m.len() - 1], None, &l).is_err());
/// // A bundle: two whole messages in one UCX message.
/// let one = m.clone();
/// m.extend_from_slice(&one);
/// let Ok(First::Inline { bytes, more, .. }) = parse_first(&m, None, &l) else { panic!() };
/// assert_eq!((bytes, more), (&b"hi"[..], &one[..]));
/// ```
pub fn parse_first<'a>(
    first: &'a [u8],
    rest: Option<&[u8]>,
    limits: &Limits,
) -> Result<First<'a>, crate::ProtocolError> {
    use crate::ProtocolError::HeaderParts;
    let got = first.len() + rest.map_or(0, <[u8]>::len);
    let Some(fixed) = first.first_chunk::<FIXED_LEN>() else {
        return Err(HeaderParts { frames: 0, got });
    };
    let (channel, n) = decode_fixed(fixed, limits)?;
    if channel == crate::CLOSE_CHANNEL {
        return Ok(First::Close);
    }
    let entries_end = header_len(n as usize);
    if first.len() < entries_end {
        // A long header arrives in two parts: UCX_FIRST_MAX bytes, then the rest, exactly.
        let want = entries_end - first.len();
        match rest {
            _ if first.len() != crate::UCX_FIRST_MAX => Err(HeaderParts { frames: n, got }),
            None => Ok(First::Split { rest: want }),
            Some(r) if r.len() != want => Err(HeaderParts { frames: n, got }),
            Some(r) => {
                let entries = [&first[FIXED_LEN..], r].concat();
                let total = check_entries(&entries, limits)?;
                let frames = iter_entries(&entries).collect();
                // Nothing follows a split header in its own message.
                Ok(if total == 0 {
                    First::Inline {
                        channel,
                        frames,
                        bytes: &[],
                        more: &[],
                    }
                } else {
                    First::Framed { channel, frames }
                })
            }
        }
    } else {
        if rest.is_some() {
            return Err(HeaderParts { frames: n, got });
        }
        if let Some(i) = next_inline(first, limits)? {
            return Ok(First::Inline {
                channel,
                frames: i.frames().collect(),
                bytes: i.bytes,
                more: i.more,
            });
        }
        // Not inlined: a header with nothing after it, whose frames follow.
        let entries = &first[FIXED_LEN..entries_end];
        check_entries(entries, limits)?;
        Ok(First::Framed {
            channel,
            frames: iter_entries(entries).collect(),
        })
    }
}

/// An inlined message at the start of a UCX message, as [`next_inline`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inlined<'a> {
    /// The message's channel.
    pub channel: u32,
    /// Its frame entries (checked).
    pub entries: &'a [u8],
    /// The frames' bytes.
    pub bytes: &'a [u8],
    /// What follows in the UCX message: more whole messages of a bundle, or nothing.
    pub more: &'a [u8],
}

impl Inlined<'_> {
    /// The message's frames.
    pub fn frames(&self) -> impl ExactSizeIterator<Item = FrameMeta> + '_ {
        iter_entries(self.entries)
    }
}

/// The whole inlined message at the start of `buf` (see [`parse_first`]), found without
/// allocating: `None` if `buf` starts with something else (the close marker, a header whose
/// frames follow, a header longer than `buf`). Checks everything against `limits`.
///
/// ```
/// use transport::frame::{encode, next_inline, FrameMeta, Limits};
/// let mut m = encode(3, &[FrameMeta { size: 2, cuda: false }]);
/// m.extend_from_slice(b"hi!");
/// let i = next_inline(&m, &Limits::default()).unwrap().unwrap();
/// assert_eq!((i.channel, i.bytes, i.more), (3, &b"hi"[..], &b"!"[..]));
/// ```
pub fn next_inline<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<Inlined<'a>>, crate::ProtocolError> {
    let Some(fixed) = buf.first_chunk::<FIXED_LEN>() else {
        return Err(crate::ProtocolError::HeaderParts {
            frames: 0,
            got: buf.len(),
        });
    };
    let (channel, n) = decode_fixed(fixed, limits)?;
    let entries_end = header_len(n as usize);
    if channel == crate::CLOSE_CHANNEL || buf.len() < entries_end {
        return Ok(None);
    }
    let entries = &buf[FIXED_LEN..entries_end];
    let total = check_entries(entries, limits)?;
    let after = &buf[entries_end..];
    if after.is_empty() && total > 0 {
        return Ok(None);
    }
    // An inlined message: the frames' bytes follow the entries; after them, only more
    // messages of a bundle.
    if (after.len() as u64) < total {
        return Err(crate::ProtocolError::Inline {
            got: after.len(),
            announced: total,
        });
    }
    let (bytes, more) = after.split_at(total as usize);
    Ok(Some(Inlined {
        channel,
        entries,
        bytes,
        more,
    }))
}

fn entry_size(e: &[u8]) -> u64 {
    u64::from_le_bytes(
        e[..8]
            .try_into()
            .expect("an entry starts with 8 size bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(h: &[u8]) -> [u8; FIXED_LEN] {
        h[..FIXED_LEN].try_into().unwrap()
    }

    #[test]
    fn refuses_what_it_must() {
        let l = Limits {
            max_frames: 4,
            max_message: 100,
        };
        let mut h = encode(
            1,
            &[FrameMeta {
                size: 1,
                cuda: false,
            }],
        );
        h[0] = b'X';
        assert!(matches!(
            decode_fixed(&fixed(&h), &l),
            Err(HeaderError::Magic(_))
        ));
        let h = encode(
            1,
            &[FrameMeta {
                size: 1,
                cuda: false,
            }; 5],
        );
        assert!(matches!(
            decode_fixed(&fixed(&h), &l),
            Err(HeaderError::TooManyFrames { got: 5, max: 4 })
        ));
        let h = encode(
            1,
            &[FrameMeta {
                size: u64::MAX,
                cuda: false,
            }; 2],
        );
        assert!(matches!(
            decode_entries(&h[FIXED_LEN..], &l),
            Err(HeaderError::TooLarge { .. })
        ));
        let mut h = encode(
            1,
            &[FrameMeta {
                size: 1,
                cuda: false,
            }],
        );
        h[FIXED_LEN + 8] = 9;
        assert!(matches!(
            decode_entries(&h[FIXED_LEN..], &l),
            Err(HeaderError::MemoryType { index: 0, value: 9 })
        ));
    }

    #[test]
    fn random_bytes_never_panic() {
        // A small deterministic generator: no decoder input may panic or over-allocate.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let l = Limits::default();
        for _ in 0..10_000 {
            let mut b = [0u8; FIXED_LEN + 3 * ENTRY_LEN];
            for byte in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *byte = x as u8;
            }
            if x.is_multiple_of(3) {
                b[..4].copy_from_slice(&MAGIC);
            }
            if let Ok((_, n)) = decode_fixed(&fixed(&b), &l) {
                let n = (n as usize).min(3);
                let _ = decode_entries(&b[FIXED_LEN..FIXED_LEN + n * ENTRY_LEN], &l);
            }
        }
    }
}
