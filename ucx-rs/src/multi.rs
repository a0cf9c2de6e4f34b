//! Multi-buffer messages in UCXX's format (`send_multi`/`recv_multi`): one or more headers,
//! then one tagged transfer per frame, all on the same tag.
//!
//! A header is 1209 bytes, written field by field in native byte order with no padding (as
//! UCXX's `Header::serialize` does): `bool next`, `size_t nframes`, `int isCUDA[100]`,
//! `size_t size[100]`. More than 100 frames chain headers with `next = true`.

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
pub fn decode_header(bytes: &[u8]) -> Result<(bool, Vec<FrameInfo>), String> {
    if bytes.len() != HEADER_LEN {
        return Err(format!(
            "multi-buffer header of {} bytes, expected {HEADER_LEN}",
            bytes.len()
        ));
    }
    let next = match bytes[0] {
        0 => false,
        1 => true,
        b => return Err(format!("multi-buffer header: `next` is {b}, not a bool")),
    };
    let nframes = u64::from_ne_bytes(bytes[1..9].try_into().expect("8 bytes"));
    if nframes > FRAMES_PER_HEADER as u64 {
        return Err(format!(
            "multi-buffer header announces {nframes} frames, at most {FRAMES_PER_HEADER}"
        ));
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
        let size = usize::try_from(size_at(j))
            .map_err(|_| format!("multi-buffer frame {j} has size {}", size_at(j)))?;
        frames.push(FrameInfo {
            size,
            cuda: cuda_at(j) != 0,
        });
    }
    Ok((next, frames))
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
        assert!(decode_header(&h).unwrap_err().contains("not a bool"));
        h[0] = 0;
        h[1..9].copy_from_slice(&101u64.to_ne_bytes());
        assert!(decode_header(&h).unwrap_err().contains("101"));
        assert!(decode_header(&h[..100]).is_err());
    }
}
