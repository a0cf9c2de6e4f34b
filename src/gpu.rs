//! The GPU echo protocol (feature `cuda`), used by the `ucx-gpu-echo` tool and its tests.
//!
//! The commands are the echo protocol's ([`Command`], 24 bytes on
//! [`CTRL_TAG`](crate::echo::CTRL_TAG)): the server then receives `count` messages of `size`
//! bytes on [`DATA_TAG`](crate::echo::DATA_TAG) into buffers of its memory kind and either
//! sends each back from the same buffer ([`PINGPONG`]) or, after the last one, answers with one
//! byte on `CTRL_TAG` ([`SINK`]: the client streams with many sends in flight). Either side may
//! use device or host memory, so one run covers device→device, host→device and device→host
//! transfers.

use std::sync::Arc;
use std::time::Instant;

use ucx::cuda::cudarc::driver::CudaStream;
use ucx::cuda::DeviceBuffer;
use ucx::{Endpoint, Error, IoBuf, IoBufMut, Result};

use crate::echo::{Command, CTRL_TAG, DATA_TAG, MAX_SIZE, PINGPONG, SINK};
use crate::measure::Summary;

/// Where a side of the echo keeps its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Host memory (`Vec<u8>`).
    Host,
    /// CUDA device memory ([`DeviceBuffer`]).
    Cuda,
}

impl Memory {
    /// Parses `host` or `cuda`.
    pub fn parse(s: &str) -> Option<Memory> {
        match s {
            "host" => Some(Memory::Host),
            "cuda" | "device" => Some(Memory::Cuda),
            _ => None,
        }
    }
}

/// A buffer of either kind.
#[derive(Debug)]
pub enum EchoBuf {
    /// Host bytes.
    Host(Vec<u8>),
    /// Device bytes.
    Cuda(DeviceBuffer),
}

impl EchoBuf {
    /// `cap` bytes of `mem` (device buffers on `stream`, which must be given for device memory).
    pub fn alloc(mem: Memory, stream: Option<&Arc<CudaStream>>, cap: usize) -> Result<EchoBuf> {
        match (mem, stream) {
            (Memory::Host, _) => Ok(EchoBuf::Host(Vec::with_capacity(cap))),
            (Memory::Cuda, Some(s)) => Ok(EchoBuf::Cuda(DeviceBuffer::alloc(s, cap)?)),
            (Memory::Cuda, None) => Err(Error::Cuda("device memory needs a GPU".into())),
        }
    }

    /// Replaces the contents with `data`.
    pub fn fill(&mut self, data: &[u8]) -> Result<()> {
        match self {
            EchoBuf::Host(v) => {
                v.clear();
                v.extend_from_slice(data);
                Ok(())
            }
            EchoBuf::Cuda(d) => d.copy_from_host(data),
        }
    }

    /// A host copy of the contents.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        match self {
            EchoBuf::Host(v) => Ok(v.clone()),
            EchoBuf::Cuda(d) => d.to_host(),
        }
    }

    /// Bytes holding data.
    pub fn len(&self) -> usize {
        match self {
            EchoBuf::Host(v) => v.len(),
            EchoBuf::Cuda(d) => d.len(),
        }
    }

    /// Whether no bytes hold data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: forwards to the wrapped buffer, which upholds the contract itself.
unsafe impl IoBuf for EchoBuf {
    fn stable_ptr(&self) -> *const u8 {
        match self {
            EchoBuf::Host(v) => v.stable_ptr(),
            EchoBuf::Cuda(d) => d.stable_ptr(),
        }
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn memory_type(&self) -> ucx::MemoryType {
        match self {
            EchoBuf::Host(_) => ucx::MemoryType::Host,
            EchoBuf::Cuda(_) => ucx::MemoryType::Cuda,
        }
    }
    fn cuda_stream(&self) -> Option<&Arc<CudaStream>> {
        match self {
            EchoBuf::Host(_) => None,
            EchoBuf::Cuda(d) => Some(d.stream()),
        }
    }
}

// SAFETY: as above.
unsafe impl IoBufMut for EchoBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        match self {
            EchoBuf::Host(v) => v.stable_mut_ptr(),
            EchoBuf::Cuda(d) => d.stable_mut_ptr(),
        }
    }
    fn bytes_total(&self) -> usize {
        match self {
            EchoBuf::Host(v) => v.bytes_total(),
            EchoBuf::Cuda(d) => d.bytes_total(),
        }
    }
    unsafe fn set_init(&mut self, n: usize) {
        match self {
            // SAFETY: forwarded with the caller's guarantee.
            EchoBuf::Host(v) => unsafe { v.set_init(n) },
            // SAFETY: forwarded with the caller's guarantee.
            EchoBuf::Cuda(d) => unsafe { d.set_init(n) },
        }
    }
}

/// Serves echo commands with buffers of `mem` until the client closes; returns the number of
/// commands served.
pub async fn serve(ep: &Endpoint, mem: Memory, stream: Option<&Arc<CudaStream>>) -> Result<u64> {
    let mut served = 0;
    loop {
        let Some(Command { kind, size, count }) = Command::recv(ep).await? else {
            return if served > 0 {
                Ok(served)
            } else {
                Err(Error::Closed)
            };
        };
        if size > MAX_SIZE {
            return Err(Error::InvalidArgument(format!(
                "a {size}-byte echo is over the {MAX_SIZE}-byte limit"
            )));
        }
        if kind == SINK {
            sink(ep, mem, stream, size as usize, count).await?;
            served += 1;
            continue;
        }
        if kind != PINGPONG {
            return Err(Error::InvalidArgument(format!("unknown command {kind}")));
        }
        let mut buf = EchoBuf::alloc(mem, stream, size as usize)?;
        for _ in 0..count {
            let (r, b) = ep.recv(buf, DATA_TAG).await;
            r?;
            let (r, b) = ep.send(b, DATA_TAG).await;
            r?;
            buf = b;
        }
        served += 1;
    }
}

async fn sink(
    ep: &Endpoint,
    mem: Memory,
    stream: Option<&Arc<CudaStream>>,
    size: usize,
    count: u64,
) -> Result<()> {
    let free = (0..crate::echo::SINK_WINDOW)
        .map(|_| EchoBuf::alloc(mem, stream, size))
        .collect::<Result<Vec<_>>>()?;
    crate::echo::recv_window(ep, free, count as usize).await?;
    let (r, _) = ep.send(vec![1u8], CTRL_TAG).await;
    r
}

/// Streams `count` messages of `size` bytes from `window` client buffers of `mem`, keeping
/// `window` sends in flight, and returns bytes per second until the server acknowledged the
/// last one (as `ucx_perftest -t tag_bw` measures, plus the acknowledgement). A short untimed
/// stream warms up first.
pub async fn stream_bandwidth(
    ep: &Endpoint,
    mem: Memory,
    stream: Option<&Arc<CudaStream>>,
    size: usize,
    count: usize,
    window: usize,
) -> Result<f64> {
    let window = window.max(1);
    let data = pattern(size, 0);
    let mut bufs = (0..window)
        .map(|_| {
            let mut b = EchoBuf::alloc(mem, stream, size)?;
            b.fill(&data)?;
            Ok(b)
        })
        .collect::<Result<Vec<_>>>()?;
    bufs = stream_once(ep, bufs, window.max(4)).await?;
    let t0 = Instant::now();
    stream_once(ep, bufs, count).await?;
    Ok((size * count) as f64 / t0.elapsed().as_secs_f64().max(1e-9))
}

async fn stream_once(ep: &Endpoint, free: Vec<EchoBuf>, count: usize) -> Result<Vec<EchoBuf>> {
    let size = free.first().map_or(0, |b| b.len());
    Command::new(SINK, size, count).send(ep).await?;
    let ack = ep.recv(Vec::with_capacity(1), CTRL_TAG);
    let sends = crate::echo::send_window(ep, free, count);
    let ((a, _), s) = futures::join!(ack, sends);
    let free = s?;
    a?;
    Ok(free)
}

/// The bytes of round trip `round` for a `size`-byte echo: different for every size and round,
/// so a stale or misplaced byte is caught.
pub fn pattern(size: usize, round: usize) -> Vec<u8> {
    let seed = (size as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (round as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..size as u64)
        .map(|i| {
            let mut x = i.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ seed;
            x ^= x >> 29;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            (x >> 56) as u8
        })
        .collect()
}

/// What one echo run measured.
#[derive(Debug, Clone, Copy)]
pub struct EchoRun {
    /// Latency and bandwidth over the measured round trips.
    pub summary: Summary,
    /// Round trips whose every byte was compared with what was sent.
    pub checked: usize,
}

/// Runs `warmup + iters` round trips of `size` bytes with client buffers of `mem`. With
/// `check_all`, every round trip sends fresh bytes and compares every byte that comes back
/// (the copies are not timed); otherwise the first and last round trips are checked.
pub async fn pingpong(
    ep: &Endpoint,
    mem: Memory,
    stream: Option<&Arc<CudaStream>>,
    size: usize,
    warmup: usize,
    iters: usize,
    check_all: bool,
) -> Result<EchoRun> {
    let total = warmup + iters;
    Command::new(PINGPONG, size, total).send(ep).await?;
    let mut sbuf = EchoBuf::alloc(mem, stream, size)?;
    let mut rbuf = EchoBuf::alloc(mem, stream, size)?;
    let mut expected = pattern(size, 0);
    sbuf.fill(&expected)?;
    let mut rts = Vec::with_capacity(iters.max(1));
    let mut checked = 0;
    for i in 0..total {
        let check = check_all || i == 0 || i + 1 == total;
        if check_all && i > 0 {
            expected = pattern(size, i);
            sbuf.fill(&expected)?;
        }
        let t0 = Instant::now();
        let ((rr, rb), (sr, sb)) = futures::join!(ep.recv(rbuf, DATA_TAG), ep.send(sbuf, DATA_TAG));
        let elapsed = t0.elapsed();
        sr?;
        let n = rr?;
        if n != size {
            return Err(Error::InvalidArgument(format!(
                "echo of {size} bytes came back with {n} bytes"
            )));
        }
        if check {
            let got = rb.to_host()?;
            if let Some(at) = got.iter().zip(&expected).position(|(a, b)| a != b) {
                return Err(Error::InvalidArgument(format!(
                    "echo of {size} bytes differs at byte {at} in round trip {i}"
                )));
            }
            checked += 1;
        }
        if i >= warmup {
            rts.push(elapsed);
        }
        rbuf = rb;
        sbuf = sb;
    }
    Ok(EchoRun {
        summary: Summary::from_round_trips(size, &mut rts),
        checked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_size_and_round() {
        assert_ne!(pattern(64, 0), pattern(64, 1));
        // Rounds differ nearly everywhere, so a stale byte from the last round is caught.
        let (a, b) = (pattern(4096, 0), pattern(4096, 1));
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        assert!(same < 4096 / 32, "{same} of 4096 bytes equal across rounds");
        assert_ne!(pattern(64, 0)[..32], pattern(32, 0)[..]);
        assert_eq!(pattern(0, 3), Vec::<u8>::new());
        // Not a constant fill.
        let p = pattern(256, 0);
        assert!(p.iter().any(|&b| b != p[0]));
    }

    #[test]
    fn host_echo_buffers_fill_and_copy() {
        let mut b = EchoBuf::alloc(Memory::Host, None, 4).unwrap();
        b.fill(b"abcd").unwrap();
        assert_eq!(b.to_host().unwrap(), b"abcd");
        assert!(EchoBuf::alloc(Memory::Cuda, None, 4).is_err());
    }
}
