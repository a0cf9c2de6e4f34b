//! The receiving half of a `ucx://` connection: a message's first UCX message, posted before it
//! arrives, then its frames (small ones posted ahead, large ones probed first and budgeted).

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

use super::{closed_or, Conn, FIRST_MAX, TAG};
use crate::frame;
use crate::{
    ucx_charge, CloseReason, Frame, Message, ProtocolError, Result, TransportError, CLOSE_CHANNEL,
};

/// Host frames of at least this many bytes are probed before memory is set aside for them,
/// and counted against the receive budget ([`crate::budget`]).
/// (Probing first costs a wake-up; small frames, the latency-sensitive ones, are not probed.)
const BUDGETED: u64 = 256 << 10;
/// The most bytes of small frames whose receives are posted before their frames arrive.
const POSTED_AHEAD: u64 = 4 << 20;
/// What a message's first UCX message held.
enum First {
    /// The whole message.
    Inline(Vec<Frame>),
    /// The header: the frames follow, one UCX message each.
    Framed(Vec<frame::FrameMeta>),
}

/// A frame's receive buffer.
enum RecvBuf {
    Host(Vec<u8>),
    #[cfg(feature = "cuda")]
    Cuda(ucx::cuda::DeviceBuffer),
}

impl Conn {
    /// Where a frame as `m` describes it is received: device frames into device memory where a
    /// GPU can be used (the crate's `cuda` module), everything else into (pooled) host memory.
    fn recv_buffer(&self, m: &frame::FrameMeta) -> Result<RecvBuf> {
        let size = m.size as usize;
        #[cfg(feature = "cuda")]
        if m.cuda {
            if let Some(d) = crate::cuda::device_buffer(size)? {
                return Ok(RecvBuf::Cuda(d));
            }
        }
        crate::pool::try_take(size)
            .map(RecvBuf::Host)
            .ok_or(TransportError::Protocol(ProtocolError::FrameMemory {
                size: m.size,
            }))
    }

    /// Receives one frame into `buf` (posted on the first poll).
    async fn recv_frame(&self, buf: RecvBuf) -> (ucx::Result<usize>, Frame) {
        match buf {
            RecvBuf::Host(v) => {
                let (r, v) = self.ep().recv(v, TAG).await;
                (r, Frame::Host(crate::pool::into_bytes(v)))
            }
            #[cfg(feature = "cuda")]
            RecvBuf::Cuda(d) => {
                let (r, d) = self.ep().recv(d, TAG).await;
                (r, Frame::from(d))
            }
        }
    }

    pub(crate) async fn recv(&self) -> Result<(u32, Message)> {
        self.with_cut_reason(self.recv_inner()).await
    }

    async fn recv_inner(&self) -> Result<(u32, Message)> {
        self.receiving.store(true, Ordering::Release);
        let _done = Receiving(&self.receiving);
        // One receive at a time: `Connection::recv` holds its slot for the whole message.
        // The first UCX message of every transport message fits FIRST_MAX bytes, so its receive
        // is posted before it arrives, into a buffer kept for the connection (no probe, no
        // allocation).
        let mut buf =
            std::mem::take(&mut *self.first_buf.lock().unwrap_or_else(|e| e.into_inner()));
        if buf.capacity() < FIRST_MAX {
            buf = Vec::with_capacity(FIRST_MAX);
        }
        let (r, buf) = self.ep().recv(buf, TAG).await;
        let got = match r {
            Ok(n) => n,
            Err(ucx::Error::Truncated { message, .. }) => {
                return Err(self.refuse(ProtocolError::FirstMessage {
                    got: message,
                    max: FIRST_MAX,
                }))
            }
            Err(e) => return Err(closed_or(e)),
        };
        let first = &buf[..got];
        let result = self.parse_first(first).await;
        *self.first_buf.lock().unwrap_or_else(|e| e.into_inner()) = buf;
        let (channel, metas) = match result? {
            (CLOSE_CHANNEL, _) => return Err(TransportError::Closed(CloseReason::PeerClosed)),
            (channel, First::Inline(frames)) => {
                let msg = Message { frames };
                self.took(ucx_charge(msg.len())).await;
                return Ok((channel, msg));
            }
            (channel, First::Framed(metas)) => (channel, metas),
        };
        // Kept out of this future (boxed): every receive's state stays small, and large
        // messages pay one allocation.
        Box::pin(self.recv_frames(channel, metas)).await
    }

    /// Receives the frames of a message whose header announced `metas`.
    ///
    /// Memory follows what arrives, not what was announced. Small frames (under
    /// [`BUDGETED`]) and device frames are received into buffers posted ahead, at most
    /// [`POSTED_AHEAD`] bytes of them at a time. A large host frame is first probed: its buffer
    /// is allocated once UCX reports the frame has arrived (for a rendezvous frame, that the
    /// sender has started it), with its size checked against the header and taken from the
    /// process's receive budget ([`crate::budget`]) until it has landed. Frames match their
    /// receives in order, so the posted ones before a probed frame land first.
    async fn recv_frames(
        &self,
        channel: u32,
        metas: Vec<frame::FrameMeta>,
    ) -> Result<(u32, Message)> {
        let mut frames = Vec::with_capacity(metas.len());
        let mut ahead = Vec::new();
        let mut ahead_bytes = 0u64;
        for m in &metas {
            if m.cuda || m.size < BUDGETED {
                if ahead_bytes + m.size > POSTED_AHEAD {
                    self.land(std::mem::take(&mut ahead), &metas, &mut frames)
                        .await?;
                    ahead_bytes = 0;
                }
                match self.recv_buffer(m) {
                    Ok(b) => ahead.push(self.recv_frame(b)),
                    // No memory for this frame: the rest of the message cannot be received
                    // in order any more, so the connection ends here.
                    Err(e) if m.cuda => {
                        return Err(self.refuse(ProtocolError::DeviceFrame(e.to_string())))
                    }
                    Err(_) => return Err(self.refuse(ProtocolError::FrameMemory { size: m.size })),
                }
                ahead_bytes += m.size;
                continue;
            }
            self.land(std::mem::take(&mut ahead), &metas, &mut frames)
                .await?;
            ahead_bytes = 0;
            let probed = self.ep().probe_message(TAG).await.map_err(closed_or)?;
            let got = probed.info().length as u64;
            if got != m.size {
                // Dropping the probed message discards it.
                return Err(self.refuse(ProtocolError::FrameSize {
                    got,
                    announced: m.size,
                }));
            }
            let _reserved = crate::budget::reserve(got).await;
            let Some(buf) = crate::pool::try_take(m.size as usize) else {
                return Err(self.refuse(ProtocolError::FrameMemory { size: m.size }));
            };
            let (r, buf) = probed.recv(buf).await;
            self.check_frame(r, m)?;
            frames.push(Frame::Host(crate::pool::into_bytes(buf)));
        }
        self.land(ahead, &metas, &mut frames).await?;
        let msg = Message { frames };
        self.took(ucx_charge(msg.len())).await;
        Ok((channel, msg))
    }

    /// Waits for receives posted ahead, the frames after those in `frames`, and appends them.
    async fn land<F>(
        &self,
        posted: Vec<F>,
        metas: &[frame::FrameMeta],
        frames: &mut Vec<Frame>,
    ) -> Result<()>
    where
        F: std::future::Future<Output = (ucx::Result<usize>, Frame)>,
    {
        if posted.is_empty() {
            return Ok(());
        }
        let first = frames.len();
        for ((r, f), m) in futures::future::join_all(posted)
            .await
            .into_iter()
            .zip(&metas[first..])
        {
            self.check_frame(r, m)?;
            frames.push(f);
        }
        Ok(())
    }

    /// A frame's receive ended with `r`: it must hold exactly the announced bytes.
    fn check_frame(&self, r: ucx::Result<usize>, m: &frame::FrameMeta) -> Result<()> {
        let n = match r {
            Ok(n) => n,
            Err(ucx::Error::Truncated { message, .. }) => {
                return Err(self.refuse(ProtocolError::FrameSize {
                    got: message as u64,
                    announced: m.size,
                }))
            }
            Err(e) => return Err(closed_or(e)),
        };
        if n as u64 != m.size {
            return Err(self.refuse(ProtocolError::FrameSize {
                got: n as u64,
                announced: m.size,
            }));
        }
        Ok(())
    }

    /// Reads a message's first UCX message (see [`frame::parse_first`]), receiving the rest
    /// of a header longer than [`FIRST_MAX`]; an inlined message's frames are copied out.
    async fn parse_first(&self, first: &[u8]) -> Result<(u32, First)> {
        let limits = self.limits.get();
        let mut parsed = frame::parse_first(first, None, &limits);
        if let Ok(frame::First::Split { rest: want }) = parsed {
            // `want` is bounded by the limits' frame count.
            let (r, buf) = Box::pin(self.ep().recv(vec![0u8; want].into_boxed_slice(), TAG)).await;
            let got = match r {
                Ok(k) => k,
                Err(ucx::Error::Truncated { message, .. }) => message,
                Err(e) => return Err(closed_or(e)),
            };
            let mut rest = buf.into_vec();
            rest.truncate(got);
            parsed = frame::parse_first(first, Some(&rest), &limits);
        }
        let (channel, metas, bytes) = match parsed {
            Ok(frame::First::Close) => return Ok((CLOSE_CHANNEL, First::Inline(Vec::new()))),
            Ok(frame::First::Framed { channel, frames }) => {
                return Ok((channel, First::Framed(frames)))
            }
            Ok(frame::First::Inline {
                channel,
                frames,
                bytes,
            }) => (channel, frames, bytes),
            Ok(frame::First::Split { rest }) => {
                return Err(self.refuse(ProtocolError::HeaderParts {
                    frames: 0,
                    got: FIRST_MAX + rest,
                }))
            }
            Err(e) => return Err(self.refuse(e)),
        };
        let all = Bytes::copy_from_slice(bytes);
        let mut at = 0;
        let mut frames = Vec::with_capacity(metas.len());
        for m in metas {
            let f = all.slice(at..at + m.size as usize);
            at += m.size as usize;
            // A peer may inline a device frame too: it lands where device frames land.
            #[cfg(feature = "cuda")]
            if m.cuda {
                match crate::cuda::from_host(f) {
                    Ok(d) => frames.push(d),
                    Err(e) => return Err(self.refuse(ProtocolError::DeviceFrame(e.to_string()))),
                }
                continue;
            }
            frames.push(Frame::Host(f));
        }
        Ok((channel, First::Inline(frames)))
    }
}

/// Clears a connection's "receiving" flag when its receive ends (or is dropped).
struct Receiving<'a>(&'a AtomicBool);

impl Drop for Receiving<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}
