//! Multi-buffer messages in UCXX's format (`send_multi`/`recv_multi`): one or more headers,
//! then one tagged transfer per frame, all on the same tag.
//!
//! A header is 1209 bytes, written field by field in native byte order with no padding (as
//! UCXX's `Header::serialize` does): `bool next`, `size_t nframes`, `int isCUDA[100]`,
//! `size_t size[100]`. More than 100 frames chain headers with `next = true`.

use crate::am::alloc_host;
use crate::buffer::{IoBuf, MemoryType};
use crate::error::{ProtocolError, Result};
use crate::wire::Tag;
use crate::Endpoint;

/// Frames described by one header.
pub const FRAMES_PER_HEADER: usize = 100;
/// Size of one serialized header.
pub const HEADER_LEN: usize = 1 + 8 + 4 * FRAMES_PER_HEADER + 8 * FRAMES_PER_HEADER;
/// Most frames one multi-buffer message may announce (bounds what a peer can make us post).
pub const MAX_FRAMES: usize = 1 << 16;

/// One frame's description in a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameInfo {
    /// Size in bytes.
    pub size: usize,
    /// Whether the sender's frame is CUDA device memory.
    pub cuda: bool,
}

/// The headers announcing `frames` (at least one header, even for no frames).
///
/// ```
/// use ucx::multi::{encode_headers, FrameInfo, HEADER_LEN};
/// let frames = vec![FrameInfo { size: 8, cuda: false }; 150];
/// let headers = encode_headers(&frames);
/// assert_eq!(headers.len(), 2);
/// assert!(headers.iter().all(|h| h.len() == HEADER_LEN));
/// ```
pub fn encode_headers(frames: &[FrameInfo]) -> Vec<Vec<u8>> {
    let chunks: Vec<&[FrameInfo]> = if frames.is_empty() {
        vec![&[]]
    } else {
        frames.chunks(FRAMES_PER_HEADER).collect()
    };
    let last = chunks.len() - 1;
    chunks
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let mut h = Vec::with_capacity(HEADER_LEN);
            h.push(u8::from(i < last));
            h.extend_from_slice(&(chunk.len() as u64).to_ne_bytes());
            for j in 0..FRAMES_PER_HEADER {
                let cuda = chunk.get(j).is_some_and(|f| f.cuda);
                h.extend_from_slice(&i32::from(cuda).to_ne_bytes());
            }
            for j in 0..FRAMES_PER_HEADER {
                let size = chunk.get(j).map_or(0, |f| f.size as u64);
                h.extend_from_slice(&size.to_ne_bytes());
            }
            h
        })
        .collect()
}

/// Parses one header: whether another follows, and its frames. Rejects anything UCXX would
/// not have written (wrong length, a `bool` that is not 0/1, more than 100 frames).
///
/// ```
/// use ucx::multi::{decode_header, encode_headers, FrameInfo};
/// let f = [FrameInfo { size: 3, cuda: true }];
/// assert_eq!(decode_header(&encode_headers(&f)[0]), Ok((false, f.to_vec())));
/// assert!(decode_header(&[0u8; 10]).is_err());
/// ```
pub fn decode_header(bytes: &[u8]) -> Result<(bool, Vec<FrameInfo>), ProtocolError> {
    if bytes.len() != HEADER_LEN {
        return Err(ProtocolError::MultiHeaderLength {
            got: bytes.len(),
            expected: HEADER_LEN,
        });
    }
    let next = match bytes[0] {
        0 => false,
        1 => true,
        b => return Err(ProtocolError::MultiHeaderNext(b)),
    };
    let nframes = u64::from_ne_bytes(bytes[1..9].try_into().expect("8 bytes"));
    if nframes > FRAMES_PER_HEADER as u64 {
        return Err(ProtocolError::MultiHeaderFrames {
            got: nframes,
            max: FRAMES_PER_HEADER,
        });
    }
    let cuda_at = |j: usize| {
        let o = 9 + 4 * j;
        i32::from_ne_bytes(bytes[o..o + 4].try_into().expect("4 bytes"))
    };
    let size_at = |j: usize| {
        let o = 9 + 4 * FRAMES_PER_HEADER + 8 * j;
        u64::from_ne_bytes(bytes[o..o + 8].try_into().expect("8 bytes"))
    };
    let mut frames = Vec::with_capacity(nframes as usize);
    for j in 0..nframes as usize {
        let size = usize::try_from(size_at(j)).map_err(|_| ProtocolError::MultiFrameSize {
            index: j,
            size: size_at(j),
        })?;
        frames.push(FrameInfo {
            size,
            cuda: cuda_at(j) != 0,
        });
    }
    Ok((next, frames))
}

/// Multi-buffer messages.
impl Endpoint {
    /// UCXX's `send_multi`: sends the buffers as one logical message (headers, then one
    /// transfer per buffer, all on `tag`) and hands them back in order.
    pub async fn send_multi<B: IoBuf>(
        &self,
        bufs: Vec<B>,
        tag: impl Into<Tag>,
    ) -> (Result<()>, Vec<B>) {
        let (t, _) = self.tag_pair(tag.into());
        let frames: Vec<FrameInfo> = bufs
            .iter()
            .map(|b| FrameInfo {
                size: b.bytes_init(),
                cuda: b.memory_type() == MemoryType::Cuda,
            })
            .collect();
        let headers = encode_headers(&frames);
        // join_all polls in order on its first poll, so UCX sees the sends in this order.
        let (hs, fs) = futures::join!(
            futures::future::join_all(headers.into_iter().map(|h| self.shared.tag_send(h, t))),
            futures::future::join_all(bufs.into_iter().map(|b| self.shared.tag_send(b, t)))
        );
        let mut result = Ok(());
        for (r, _) in &hs {
            if let (Ok(()), Err(e)) = (&result, r) {
                result = Err(e.clone());
            }
        }
        let mut bufs = Vec::with_capacity(fs.len());
        for (r, b) in fs {
            if let (Ok(()), Err(e)) = (&result, r) {
                result = Err(e);
            }
            bufs.push(b);
        }
        (result, bufs)
    }

    /// UCXX's `recv_multi`: receives the headers, then every frame into host memory.
    /// Announced sizes are checked before anything is allocated: at most [`MAX_FRAMES`] frames
    /// and [`max_message`](Self::set_max_message) bytes in all.
    pub async fn recv_multi(&self, tag: impl Into<Tag>) -> Result<Vec<Vec<u8>>> {
        let (_, t) = self.tag_pair(tag.into());
        let mut frames = Vec::new();
        loop {
            let (r, h) = self
                .shared
                .tag_recv(Vec::with_capacity(HEADER_LEN), t)
                .await;
            r?;
            let (next, more) = decode_header(&h)?;
            frames.extend(more);
            if frames.len() > MAX_FRAMES {
                return Err(ProtocolError::TooManyFrames { max: MAX_FRAMES }.into());
            }
            if !next {
                break;
            }
        }
        let total = frames
            .iter()
            .try_fold(0usize, |acc, f| acc.checked_add(f.size));
        if total.is_none_or(|t| t > self.max_message) {
            return Err(ProtocolError::TooLarge {
                max: self.max_message,
            }
            .into());
        }
        let bufs = frames
            .iter()
            .map(|f| alloc_host(f.size))
            .collect::<Result<Vec<_>>>()?;
        let got =
            futures::future::join_all(bufs.into_iter().map(|b| self.shared.tag_recv(b, t))).await;
        let mut out = Vec::with_capacity(got.len());
        for ((r, b), f) in got.into_iter().zip(&frames) {
            let n = r?;
            if n != f.size {
                return Err(ProtocolError::SizeMismatch {
                    got: n,
                    announced: f.size,
                }
                .into());
            }
            out.push(b);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_packed_native_fields() {
        let h = &encode_headers(&[FrameInfo {
            size: 0x0102,
            cuda: true,
        }])[0];
        assert_eq!(h.len(), 1209);
        assert_eq!(h[0], 0);
        assert_eq!(u64::from_ne_bytes(h[1..9].try_into().unwrap()), 1);
        assert_eq!(i32::from_ne_bytes(h[9..13].try_into().unwrap()), 1);
        assert_eq!(u64::from_ne_bytes(h[409..417].try_into().unwrap()), 0x0102);
    }

    #[test]
    fn chains_and_round_trips() {
        let frames: Vec<FrameInfo> = (0..250)
            .map(|i| FrameInfo {
                size: i * 3,
                cuda: i % 7 == 0,
            })
            .collect();
        let hs = encode_headers(&frames);
        assert_eq!(hs.len(), 3);
        let mut back = Vec::new();
        for (i, h) in hs.iter().enumerate() {
            let (next, f) = decode_header(h).unwrap();
            assert_eq!(next, i < 2);
            back.extend(f);
        }
        assert_eq!(back, frames);
        assert_eq!(encode_headers(&[]).len(), 1);
    }

    #[test]
    fn rejects_bad_headers() {
        let mut h = encode_headers(&[FrameInfo {
            size: 1,
            cuda: false,
        }])
        .remove(0);
        h[0] = 2;
        assert_eq!(decode_header(&h), Err(ProtocolError::MultiHeaderNext(2)));
        h[0] = 0;
        h[1..9].copy_from_slice(&101u64.to_ne_bytes());
        assert_eq!(
            decode_header(&h),
            Err(ProtocolError::MultiHeaderFrames { got: 101, max: 100 })
        );
        assert!(decode_header(&h[..100]).is_err());
    }
}
