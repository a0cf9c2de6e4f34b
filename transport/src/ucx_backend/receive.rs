//! The receiving half of a `ucx://` connection: a message's first UCX message, posted before it
//! arrives, then its frames (small ones posted ahead, large ones probed first and budgeted).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::Bytes;

use super::{closed_or, ring, Conn, COPY_MAX, FIRST_MAX, TAG};
use crate::frame;
use crate::{ucx_charge, CloseReason, Error, Frame, Message, ProtocolError, Result};

/// Host frames of at least this many bytes are probed before memory is set aside for them,
/// and counted against the receive budget ([`crate::budget`]).
/// (Probing first costs a wake-up; small frames, the latency-sensitive ones, are not probed.)
const BUDGETED: u64 = 256 << 10;
/// The most UCX messages a receive takes ahead in one pass when none is waiting in its queue.
const READ_AHEAD: usize = 64;
/// The most bytes of small frames whose receives are posted before their frames arrive.
const POSTED_AHEAD: u64 = 4 << 20;
/// UCX messages on [`TAG`] a receive took ahead, in order, with their count beside the queue:
/// a receive finds it empty (a ping-pong always does) without taking the lock.
#[derive(Debug, Default)]
pub(super) struct Ahead {
    queue: std::sync::Mutex<std::collections::VecDeque<Bytes>>,
    /// The queue's length, written under its lock.
    len: AtomicUsize,
}

impl Ahead {
    pub(super) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// Runs `f` on the queue, under its lock (the count follows what `f` did).
    pub(super) fn with<R>(&self, f: impl FnOnce(&mut std::collections::VecDeque<Bytes>) -> R) -> R {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut queue);
        self.len.store(queue.len(), Ordering::Release);
        r
    }

    /// The message at the head of the queue, if any.
    pub(super) fn pop(&self) -> Option<Bytes> {
        if self.is_empty() {
            return None;
        }
        self.with(|q| q.pop_front())
    }
}

/// What a message's first UCX message held.
enum First {
    /// Whole messages: one inlined, or a bundle of them (a batched send).
    Whole(crate::Received),
    /// The close marker.
    Close,
    /// The header of a message on its channel: the frames follow, one UCX message each.
    Framed(u32, Vec<frame::FrameMeta>),
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
            .ok_or(Error::Protocol(ProtocolError::FrameMemory { size: m.size }))
    }

    /// Receives one frame into `buf` (posted on the first poll).
    async fn recv_frame(&self, buf: RecvBuf) -> (ucx::Result<usize>, Frame) {
        match buf {
            RecvBuf::Host(v) => {
                let (r, v) = self.ep().recv(v, TAG).await;
                (r, Frame::Host(crate::pool::into_bytes(v, self.reclaim)))
            }
            #[cfg(feature = "cuda")]
            RecvBuf::Cuda(d) => {
                let (r, d) = self.ep().recv(d, TAG).await;
                (r, Frame::from(d))
            }
        }
    }

    pub(crate) async fn recv(&self) -> Result<crate::Received> {
        self.recv_inner().await.map_err(|e| self.cut_reason(e))
    }

    /// The next message, and the messages behind it that arrived with it (bundled in the
    /// same UCX message, or taken ahead and whole).
    async fn recv_inner(&self) -> Result<crate::Received> {
        self.receiving.store(true, Ordering::Release);
        let _done = Receiving(&self.receiving);
        let (first, mut more) = self.recv_one().await?;
        while let Some((one, behind)) = self.whole_ahead() {
            self.took(charge(&one, &behind)).await;
            more.push(one);
            more.extend(behind);
        }
        Ok((first, more))
    }

    /// Takes the small messages that have already arrived on [`TAG`] (one pass, nothing
    /// posted ahead) into the queue the receive reads first.
    async fn read_ahead(&self) {
        // Messages of at most COPY_MAX: small ones, always eager (a rendezvous message would
        // hold up the ones before it), as a batched send bundles them.
        match self.ep().recv_arrived(TAG, READ_AHEAD, COPY_MAX).await {
            Ok(taken) if taken.is_empty() => {}
            Ok(taken) => self
                .ahead
                .with(|q| q.extend(taken.into_iter().map(Bytes::from))),
            // The posted receive that follows reports what went wrong.
            Err(e) => tracing::trace!(error = %e, "nothing taken ahead"),
        }
    }

    /// The messages of the UCX message at the head of the queue taken ahead, if they are
    /// whole there: taken off the queue (slices of its buffer, no copy). Anything else (a
    /// header whose frames follow, the close marker, bytes the wire format does not allow)
    /// stays for the next receive, which reports it after the messages before it.
    fn whole_ahead(&self) -> Option<crate::Received> {
        if self.ahead.is_empty() {
            return None;
        }
        self.ahead.with(|ahead| {
            let msgs = self.whole(ahead.front()?).ok()??;
            ahead.pop_front();
            Some(msgs)
        })
    }

    /// The message in `ucx_msg` if it holds one whole message of at most one host frame (a
    /// ping-pong's), its frame copied out on its own: one allocation, where copying the UCX
    /// message and slicing it took two (the slice makes `Bytes` allocate its shared count).
    /// `None` for anything else, including what the wire format does not allow, which
    /// [`Self::whole`] then reports.
    fn lone(&self, ucx_msg: &[u8]) -> Option<(u32, Message)> {
        let one = frame::next_inline(ucx_msg, &self.limits.get()).ok()??;
        if !one.more.is_empty() {
            return None;
        }
        let mut metas = one.frames();
        let frames = match (metas.next(), metas.next()) {
            (None, _) => Vec::new(),
            (Some(m), None) if !m.cuda => vec![Frame::Host(Bytes::copy_from_slice(one.bytes))],
            _ => return None,
        };
        Some((one.channel, Message { frames }))
    }

    /// The messages in a UCX message that holds only whole ones (one inlined message, or a
    /// bundle of them from a batched send), every frame a slice of `ucx_msg`: the first, and
    /// those behind it (no allocation for a lone message); `None` if it is something else
    /// (the close marker, the header of a message whose frames follow).
    fn whole(
        &self,
        ucx_msg: &Bytes,
    ) -> std::result::Result<Option<crate::Received>, ProtocolError> {
        let limits = self.limits.get();
        let mut rest = &ucx_msg[..];
        let mut first = None;
        let mut more = Vec::new();
        while !rest.is_empty() || first.is_none() {
            let at = ucx_msg.len() - rest.len();
            let one = match frame::next_inline(rest, &limits)? {
                Some(one) => one,
                None if first.is_none() => return Ok(None),
                None => return Err(ProtocolError::Bundled { at }),
            };
            let from = ucx_msg.len() - one.bytes.len() - one.more.len();
            let msg = (
                one.channel,
                Message {
                    frames: inline_frames(ucx_msg, from, one.frames())?,
                },
            );
            match first {
                None => first = Some(msg),
                Some(_) => more.push(msg),
            }
            rest = one.more;
        }
        Ok(first.map(|first| (first, more)))
    }

    /// The next message (and any bundled behind it): from what was taken ahead, or from UCX.
    async fn recv_one(&self) -> Result<crate::Received> {
        // Read ahead when receiving twice in a row (a stream); after a send, the answer is
        // usually still on its way (a ping-pong), and the posted receive is the quick path.
        let answering = self.sent.swap(false, Ordering::Relaxed);
        if !answering && self.ahead.is_empty() {
            self.read_ahead().await;
        }
        let first = match self.ahead.pop() {
            Some(first) => Ucx::Ahead(first),
            None => {
                // One receive at a time: `Connection::recv` holds its slot for the whole
                // message. The first UCX message of every transport message fits FIRST_MAX
                // bytes, so its receive is posted before it arrives, into a buffer kept for
                // the connection (no probe; an allocation only after a buffer was handed out,
                // of exactly FIRST_MAX: not from the pool, whose buffers may be twice that).
                let mut buf =
                    std::mem::take(&mut *self.first_buf.lock().unwrap_or_else(|e| e.into_inner()));
                if buf.capacity() < FIRST_MAX {
                    buf = Vec::with_capacity(FIRST_MAX);
                }
                let (r, buf) = self.ep().recv(buf, TAG).await;
                match r {
                    // Vec's capacity may exceed what was asked: what it took beyond
                    // FIRST_MAX is refused as UCX refuses what does not fit.
                    Ok(n) if n > FIRST_MAX => {
                        return Err(self.refuse(ProtocolError::FirstMessage {
                            got: n,
                            max: FIRST_MAX,
                        }))
                    }
                    Ok(_) => Ucx::Posted(buf),
                    Err(ucx::Error::Truncated { message, .. }) => {
                        return Err(self.refuse(ProtocolError::FirstMessage {
                            got: message,
                            max: FIRST_MAX,
                        }))
                    }
                    Err(e) => return Err(closed_or(e)),
                }
            }
        };
        // A small UCX message is copied out and its posted buffer kept; a larger one (or one
        // taken ahead, in a buffer of its own) becomes the messages' memory, and the next
        // receive takes another buffer. Memory follows what arrived: a buffer less than half
        // full is shrunk first (in place where the allocator can: glibc's can).
        let first = match first {
            Ucx::Posted(buf) if buf.len() <= COPY_MAX => {
                let lone = self.lone(&buf);
                let all = match lone {
                    Some(_) => Bytes::new(),
                    None => Bytes::copy_from_slice(&buf),
                };
                *self.first_buf.lock().unwrap_or_else(|e| e.into_inner()) = buf;
                if let Some(msg) = lone {
                    self.took(charge(&msg, &[])).await;
                    return Ok((msg, Vec::new()));
                }
                all
            }
            Ucx::Posted(mut buf) => {
                if buf.len() < buf.capacity() / 2 {
                    buf.shrink_to_fit();
                }
                Bytes::from(buf)
            }
            Ucx::Ahead(taken) => taken,
        };
        let parsed = match self.whole(&first) {
            Ok(Some(msgs)) => Ok(First::Whole(msgs)),
            Ok(None) => self.parse_first(&first).await,
            Err(e) => Err(self.refuse(e)),
        };
        match parsed? {
            First::Close => Err(Error::Closed(CloseReason::PeerClosed)),
            First::Whole((first, more)) => {
                self.took(charge(&first, &more)).await;
                Ok((first, more))
            }
            First::Framed(channel, metas) => {
                // Kept out of this future (boxed): every receive's state stays small, and
                // large messages pay one allocation.
                let msg = Box::pin(self.recv_frames(channel, metas)).await?;
                Ok((msg, Vec::new()))
            }
        }
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
        if let Some(ring) = self.ring_in.get() {
            if let Some(picked) = ring::ring_frames(metas.iter().copied(), ring.size()) {
                return self.recv_ringed(ring, channel, &metas, &picked).await;
            }
        }
        let frames = self.recv_frame_list(&metas).await?;
        let msg = Message { frames };
        self.took(ucx_charge(msg.len())).await;
        Ok((channel, msg))
    }

    /// Receives a message whose large host frames came through the peer's ring
    /// ([`ring`]): after the header, for each ring frame in order, one UCX message per chunk
    /// ([`ring::CHUNK`]), a little-endian `u64`, the chunk's offset in the ring, sent once
    /// the chunk is written: each chunk is copied out as its message arrives (while the
    /// sender writes the next), and the frames counted copied out at the end. The other
    /// frames follow over UCX as usual.
    async fn recv_ringed(
        &self,
        ring: &ring::RingIn,
        channel: u32,
        metas: &[frame::FrameMeta],
        picked: &[usize],
    ) -> Result<(u32, Message)> {
        let mut ringed = Vec::with_capacity(picked.len());
        for &i in picked {
            let len = metas[i].size;
            // Counted against the receive budget while it is copied out, as a rendezvous
            // frame is while it lands.
            let _reserved = self.transport.budget().reserve(len).await;
            let Some(mut buf) = crate::pool::try_take(len as usize) else {
                return Err(self.refuse(ProtocolError::FrameMemory { size: len }));
            };
            buf.clear();
            let mut start = None;
            for (at, bytes) in ring::chunks(len) {
                let offset = self.chunk_offset().await?;
                let first = *start.get_or_insert(offset);
                // Every chunk where the first one says the frame starts: the frame is
                // contiguous, and all of it inside the ring.
                let inside = first.checked_add(len).is_some_and(|end| end <= ring.size());
                if !inside || offset != first + at || ring.read(offset, bytes, &mut buf).is_err() {
                    return Err(self.refuse(ProtocolError::RingPlan {
                        offset,
                        len,
                        size: ring.size(),
                    }));
                }
            }
            ringed.push(crate::pool::into_bytes(buf, self.reclaim));
        }
        ring.copied(picked.len() as u64);
        let others: Vec<frame::FrameMeta> = metas
            .iter()
            .enumerate()
            .filter(|(i, _)| !picked.contains(i))
            .map(|(_, m)| *m)
            .collect();
        let mut others = self.recv_frame_list(&others).await?.into_iter();
        let mut ringed = ringed.into_iter();
        let frames = (0..metas.len())
            .map(|i| match picked.contains(&i) {
                true => ringed.next().map(Frame::Host),
                false => others.next(),
            })
            .collect::<Option<Vec<Frame>>>()
            .unwrap_or_else(|| unreachable!("one frame per meta"));
        let msg = Message { frames };
        self.took(ucx_charge(msg.len())).await;
        Ok((channel, msg))
    }

    /// The next ring chunk's offset: an 8-byte UCX message (taken ahead, or received).
    async fn chunk_offset(&self) -> Result<u64> {
        let got = match self.ahead.pop() {
            Some(taken) => taken,
            None => {
                let (r, buf) = self.ep().recv(vec![0u8; 8].into_boxed_slice(), TAG).await;
                match r {
                    Ok(8) => {
                        let b: [u8; 8] = buf[..].try_into().unwrap_or([0xff; 8]);
                        return Ok(u64::from_le_bytes(b));
                    }
                    Ok(n) | Err(ucx::Error::Truncated { message: n, .. }) => {
                        return Err(self.refuse(ProtocolError::RingPlanSize { got: n, want: 8 }))
                    }
                    Err(e) => return Err(closed_or(e)),
                }
            }
        };
        match <[u8; 8]>::try_from(&got[..]) {
            Ok(b) => Ok(u64::from_le_bytes(b)),
            Err(_) => Err(self.refuse(ProtocolError::RingPlanSize {
                got: got.len(),
                want: 8,
            })),
        }
    }

    /// Receives the frames `metas` describes, one UCX message each, in order.
    async fn recv_frame_list(&self, metas: &[frame::FrameMeta]) -> Result<Vec<Frame>> {
        let mut frames = Vec::with_capacity(metas.len());
        // Frames taken ahead come first, in order.
        for m in metas {
            let Some(taken) = self.ahead.pop() else { break };
            frames.push(self.frame_taken_ahead(taken, m)?);
        }
        let mut ahead = Vec::new();
        let mut ahead_bytes = 0u64;
        for m in &metas[frames.len()..] {
            if m.cuda || m.size < BUDGETED {
                if ahead_bytes + m.size > POSTED_AHEAD {
                    self.land(std::mem::take(&mut ahead), metas, &mut frames)
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
            self.land(std::mem::take(&mut ahead), metas, &mut frames)
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
            let _reserved = self.transport.budget().reserve(got).await;
            let Some(buf) = crate::pool::try_take(m.size as usize) else {
                return Err(self.refuse(ProtocolError::FrameMemory { size: m.size }));
            };
            let (r, buf) = probed.recv(buf).await;
            self.check_frame(r, m)?;
            frames.push(Frame::Host(crate::pool::into_bytes(buf, self.reclaim)));
        }
        self.land(ahead, metas, &mut frames).await?;
        Ok(frames)
    }

    /// A frame that was taken ahead (into host memory): it must hold the announced bytes; a
    /// device frame is copied where device frames land.
    fn frame_taken_ahead(&self, taken: Bytes, m: &frame::FrameMeta) -> Result<Frame> {
        if taken.len() as u64 != m.size {
            return Err(self.refuse(ProtocolError::FrameSize {
                got: taken.len() as u64,
                announced: m.size,
            }));
        }
        #[cfg(feature = "cuda")]
        if m.cuda {
            return crate::cuda::from_host(taken)
                .map_err(|e| self.refuse(ProtocolError::DeviceFrame(e.to_string())));
        }
        Ok(Frame::Host(taken))
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

    /// Reads a message's first UCX message that is not whole messages ([`Self::whole`]): the
    /// close marker, or a header whose frames follow, receiving the rest of a header longer
    /// than [`FIRST_MAX`].
    async fn parse_first(&self, first: &[u8]) -> Result<First> {
        let limits = self.limits.get();
        let mut parsed = frame::parse_first(first, None, &limits);
        if let Ok(frame::First::Split { rest: want }) = parsed {
            let rest = match self.ahead.pop() {
                Some(taken) => taken,
                None => {
                    // `want` is bounded by the limits' frame count.
                    let (r, buf) =
                        Box::pin(self.ep().recv(vec![0u8; want].into_boxed_slice(), TAG)).await;
                    let got = match r {
                        Ok(k) => k,
                        Err(ucx::Error::Truncated { message, .. }) => message,
                        Err(e) => return Err(closed_or(e)),
                    };
                    let mut rest = buf.into_vec();
                    rest.truncate(got);
                    Bytes::from(rest)
                }
            };
            parsed = frame::parse_first(first, Some(&rest), &limits);
        }
        match parsed {
            Ok(frame::First::Close) => Ok(First::Close),
            Ok(frame::First::Framed { channel, frames }) => Ok(First::Framed(channel, frames)),
            // Only after a split header (whole messages were taken above): frames with no
            // bytes, nothing bundled.
            Ok(frame::First::Inline {
                channel,
                frames,
                bytes,
                more,
            }) => {
                debug_assert!(bytes.is_empty() && more.is_empty());
                let frames = inline_frames(&Bytes::copy_from_slice(bytes), 0, frames.into_iter())
                    .map_err(|e| self.refuse(e))?;
                Ok(First::Whole(((channel, Message { frames }), Vec::new())))
            }
            Ok(frame::First::Split { rest }) => Err(self.refuse(ProtocolError::HeaderParts {
                frames: 0,
                got: FIRST_MAX + rest,
            })),
            Err(e) => Err(self.refuse(e)),
        }
    }
}

/// Where a message's first UCX message came from.
enum Ucx {
    /// The receive posted into the connection's buffer.
    Posted(Vec<u8>),
    /// The queue of messages taken ahead.
    Ahead(Bytes),
}

/// The frames `metas` describes, sliced one after the other from `all` at `from`. A peer may
/// inline a device frame too: it lands where device frames land.
fn inline_frames(
    all: &Bytes,
    mut from: usize,
    metas: impl Iterator<Item = frame::FrameMeta>,
) -> std::result::Result<Vec<Frame>, ProtocolError> {
    let mut frames = Vec::with_capacity(metas.size_hint().0);
    for m in metas {
        let f = all.slice(from..from + m.size as usize);
        from += m.size as usize;
        #[cfg(feature = "cuda")]
        if m.cuda {
            frames.push(
                crate::cuda::from_host(f).map_err(|e| ProtocolError::DeviceFrame(e.to_string()))?,
            );
            continue;
        }
        frames.push(Frame::Host(f));
    }
    Ok(frames)
}

/// Clears a connection's "receiving" flag when its receive ends (or is dropped).
struct Receiving<'a>(&'a AtomicBool);

impl Drop for Receiving<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// What the sender charged for `msgs` (see [`ucx_charge`]).
fn charge(first: &(u32, Message), more: &[(u32, Message)]) -> u64 {
    std::iter::once(first)
        .chain(more)
        .map(|(_, m)| ucx_charge(m.len()))
        .sum()
}
