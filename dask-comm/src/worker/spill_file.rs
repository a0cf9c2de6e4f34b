//! The spill file's format: what a worker writes for a value it spills, and reads back.
//!
//! `MAGIC`, a checksum of the rest (u64, FxHash over the parts below), header length (u32),
//! header, frame count (u32), then each frame as its length (u64; the top bit marks a device
//! frame, [`DEVICE_FRAME`]) and bytes. A file that does not parse or check is an error for its
//! key ([`super::store`]).

use std::hash::Hasher;
use std::path::Path;

use bytes::Bytes;
use dask_graph::Frame;

use crate::protocol::Payload;

const MAGIC: &[u8; 8] = b"dcspill1";

fn checksum(parts: &[&[u8]]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    for p in parts {
        h.write(p);
    }
    h.finish()
}

/// A spilled frame's length word with this bit set was a device frame (spill goes device →
/// host → disk, and back to the device when read, as dask-cuda's does).
const DEVICE_FRAME: u64 = 1 << 63;

/// The parts a spill file sums and holds after `MAGIC` and the checksum: the head (header
/// length, header, frame count), then each frame's length word ([`DEVICE_FRAME`] set for a
/// device frame) and bytes (a device frame's copied to host memory first).
type Parts = (Vec<u8>, Vec<[u8; 8]>, Vec<Bytes>);

fn parts(p: &Payload) -> std::io::Result<Parts> {
    let mut head = Vec::with_capacity(16 + p.header.len());
    head.extend_from_slice(&(p.header.len() as u32).to_le_bytes());
    head.extend_from_slice(&p.header);
    head.extend_from_slice(&(p.frames.len() as u32).to_le_bytes());
    let mut lens = Vec::with_capacity(p.frames.len());
    let mut bytes = Vec::with_capacity(p.frames.len());
    for f in &p.frames {
        let kind = if f.is_device() { DEVICE_FRAME } else { 0 };
        lens.push((f.len() as u64 | kind).to_le_bytes());
        bytes.push(f.to_host().map_err(std::io::Error::other)?);
    }
    Ok((head, lens, bytes))
}

/// `MAGIC`, the checksum, then the parts ([`parts`]), written in order by `out`.
fn emit(
    (head, lens, bytes): &Parts,
    mut out: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut all: Vec<&[u8]> = vec![head];
    for (len, b) in lens.iter().zip(bytes) {
        all.push(len);
        all.push(b);
    }
    out(MAGIC)?;
    out(&checksum(&all).to_le_bytes())?;
    for part in all {
        out(part)?;
    }
    Ok(())
}

/// `MAGIC`, checksum of the rest (u64), header length (u32), header, frame count (u32), then
/// each frame as length (u64, [`DEVICE_FRAME`] set for a device frame) and bytes (a device
/// frame's copied to host memory first).
pub(super) fn write_spill(path: &Path, p: &Payload) -> std::io::Result<()> {
    use std::io::Write;
    let parts = parts(p)?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    emit(&parts, |b| f.write_all(b))?;
    f.into_inner().map_err(|e| e.into_error())?;
    Ok(())
}

/// What [`write_spill`] would write, in host memory: how a value moved out of device memory
/// is kept (a worker over its device memory limit), and written to disk as it is when host
/// memory fills in turn ([`write_blob`]); [`parse_spill`] reads it back, to the device.
pub(super) fn spill_bytes(p: &Payload) -> std::io::Result<Bytes> {
    let parts = parts(p)?;
    let len = 16 + parts.0.len() + parts.2.iter().map(|b| 8 + b.len()).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    emit(&parts, |b| {
        out.extend_from_slice(b);
        Ok(())
    })?;
    Ok(Bytes::from(out))
}

/// Writes a value kept as its spill file's bytes ([`spill_bytes`]).
pub(super) fn write_blob(path: &Path, blob: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, blob)
}

pub(super) fn parse_spill(bytes: Bytes) -> Result<Payload, String> {
    let short = || "the file is shorter than it says".to_string();
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        return Err("not a spill file".into());
    }
    let sum = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let mut at = 16usize;
    let mut take = |n: usize| -> Result<Bytes, String> {
        let end = at
            .checked_add(n)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(short)?;
        let b = bytes.slice(at..end);
        at = end;
        Ok(b)
    };
    let u32_of = |b: &Bytes| u32::from_le_bytes(b[..].try_into().expect("4 bytes")) as usize;
    let header_len_bytes = take(4)?;
    let header = take(u32_of(&header_len_bytes))?;
    let nframes_bytes = take(4)?;
    let nframes = u32_of(&nframes_bytes);
    // The parts the writer summed, in its order: the head, then each length and frame.
    let head_len = 4 + header.len() + 4;
    let mut lens = Vec::new();
    let mut frames = Vec::new();
    let mut device = Vec::new();
    for _ in 0..nframes {
        let len_bytes = take(8)?;
        let word = u64::from_le_bytes(len_bytes[..].try_into().expect("8 bytes"));
        let len = word & !DEVICE_FRAME;
        frames.push(take(usize::try_from(len).map_err(|_| short())?)?);
        device.push(word & DEVICE_FRAME != 0);
        lens.push(len_bytes);
    }
    let mut parts: Vec<&[u8]> = vec![&bytes[16..16 + head_len]];
    for (l, f) in lens.iter().zip(&frames) {
        parts.push(l);
        parts.push(f);
    }
    if checksum(&parts) != sum {
        return Err("its checksum does not match".into());
    }
    let frames = frames
        .into_iter()
        .zip(device)
        .map(|(b, device)| read_back(b, device))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Payload {
        header: header.to_vec(),
        nframes: nframes as u32,
        frames,
    })
}

/// A spilled frame as it was: a device frame goes back to the device (the transport's landing
/// GPU); where no GPU can be used, or in a build without `cuda`, it stays in host memory, for
/// the value's decoder to take or refuse (as a device frame received without a GPU).
fn read_back(b: Bytes, device: bool) -> Result<Frame, String> {
    #[cfg(feature = "cuda")]
    if device {
        if let Some(stream) = transport::cuda::landing_stream() {
            return Frame::device_from_host(&stream, &b).map_err(|e| e.to_string());
        }
    }
    let _ = device;
    Ok(Frame::Host(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spilled device frame (its length word marked) reads back as a device frame where a
    /// GPU can be used (feature `cuda`), else as host memory with the same bytes; host frames
    /// beside it keep their kind and bytes; the mark is under the checksum.
    #[test]
    fn spilled_device_frames_come_back_to_the_device_or_as_their_bytes() {
        let d = std::env::temp_dir().join(format!(
            "dask-comm-spill-file-test-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("v");
        let p = Payload {
            header: b"hdr".to_vec(),
            nframes: 2,
            frames: vec![
                Frame::Host(Bytes::from(vec![1u8; 100])),
                Frame::Host(Bytes::from(vec![2u8; 300])),
            ],
        };
        write_spill(&path, &p).unwrap();
        // The same bytes in memory, for a value staged out of device memory.
        assert_eq!(
            spill_bytes(&p).unwrap(),
            Bytes::from(std::fs::read(&path).unwrap())
        );
        // Mark the second frame as a device frame by hand, as a device frame's spill writes
        // it, and fix the checksum over the parts.
        let mut bytes = std::fs::read(&path).unwrap();
        let second_len_at = 135; // MAGIC and sum, the head (4 + 3 + 4), 8 + 100
        let word = u64::from_le_bytes(bytes[second_len_at..second_len_at + 8].try_into().unwrap());
        assert_eq!(word, 300);
        bytes[second_len_at..second_len_at + 8]
            .copy_from_slice(&(300 | DEVICE_FRAME).to_le_bytes());
        // The parts the writer sums: the head, then each frame's length word and bytes.
        let at = |a: usize, n: usize| a..a + n;
        let (head, len1, f1) = (at(16, 11), at(27, 8), at(35, 100));
        let (len2, f2) = (at(135, 8), at(143, 300));
        let sum = checksum(&[
            &bytes[head],
            &bytes[len1],
            &bytes[f1],
            &bytes[len2],
            &bytes[f2],
        ]);
        let marked_old_sum = bytes.clone();
        bytes[8..16].copy_from_slice(&sum.to_le_bytes());
        let back = parse_spill(Bytes::from(bytes)).unwrap();
        assert_eq!(back.header, b"hdr");
        assert_eq!(back.frames[0], Frame::Host(Bytes::from(vec![1u8; 100])));
        assert_eq!(back.frames[1].len(), 300);
        assert_eq!(
            back.frames[1].to_host().unwrap(),
            Bytes::from(vec![2u8; 300])
        );
        #[cfg(feature = "cuda")]
        assert_eq!(
            back.frames[1].is_device(),
            transport::cuda::landing_stream().is_some()
        );
        #[cfg(not(feature = "cuda"))]
        assert!(!back.frames[1].is_device());
        // The mark is checked: the old checksum no longer matches.
        assert!(parse_spill(Bytes::from(marked_old_sum)).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
