//! UCX connections over `ucx-rs`. Each process shares one UCX context and worker, set up from
//! [`crate::UcxIntent`] (see [`crate::configure_ucx`]).
//!
//! **On the wire** (all on [`TAG`], whose per-tag order UCX keeps): a message's first UCX
//! message is at most [`FIRST_MAX`] bytes, so the receiver can post that receive before the
//! message arrives.
//! - If the header ([`crate::frame`]) and all frame bytes fit, and no frame is in device memory,
//!   that one UCX message is the whole message (inlined).
//! - Otherwise it is the header, or the header's first `FIRST_MAX` bytes followed by a second
//!   UCX message with the rest; then one UCX message per frame. A message with no bytes at all
//!   has no frame messages.
//!
//! **Flow control.** UCX completes small (eager) sends whether or not the peer's application
//! receives, and the peer's UCX buffers what arrives unexpected. So a sender holds credits: it
//! may have at most [`Options::credit_bytes`] of messages that the receiving application has
//! not taken, each counted as [`ucx_charge`] (its bytes plus 64, at most
//! [`crate::UCX_CHARGE_CAP`]), and the receiver grants them back, a little-endian `u64` of bytes on
//! [`CREDIT_TAG`], whenever it has taken [`UCX_GRANT_EVERY`]. Both sides compute the charge, so
//! neither needs the other's window; a window of at least twice the cap cannot deadlock (a
//! blocked sender has more than half its window in flight, more than the receiver holds back).
//! Rendezvous frames wait for the receive anyway.
//!
//! **Close.** A close sends the close marker (a header on [`CLOSE_CHANNEL`], outside the
//! credits) before closing the endpoint. UCX reports a peer's graceful close and its crash
//! alike (a reset), so the marker is what tells them apart. UCX's error callback records a
//! failure only when nothing is left to receive; otherwise the receive finds the marker, or
//! fails itself.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use tokio::sync::Mutex;

use crate::frame;
use crate::{
    check_outgoing, close_marker, encode_header, header_metas, ucx_charge, Address, CloseReason,
    CloseState, Failure, Frame, Message, Options, ProtocolError, Result, TransportError,
    CLOSE_CHANNEL, UCX_GRANT_EVERY,
};

/// The tag every message and frame of a connection travels on (a UCXX user tag, so it is
/// hashed with the endpoint's tags like any other).
pub const TAG: ucx::Tag = ucx::Tag::User(0x5455);
/// The most bytes in the first UCX message of a transport message. Messages whose header and
/// frames fit (host frames only) go as that one message: one transfer instead of one per frame
/// plus the header. Larger messages send the header (in two parts if it is longer than this),
/// then each frame. The receiver posts a receive of this size before the message arrives.
pub const FIRST_MAX: usize = crate::UCX_FIRST_MAX;
/// Host frames of at least this many bytes are probed before memory is set aside for them,
/// and counted against the receive budget ([`crate::budget`]).
/// (Probing first costs a wake-up; small frames, the latency-sensitive ones, are not probed.)
const BUDGETED: u64 = 256 << 10;
/// The most bytes of small frames whose receives are posted before their frames arrive.
const POSTED_AHEAD: u64 = 4 << 20;
/// The tag credit grants travel on (little-endian `u64`: bytes granted back).
pub const CREDIT_TAG: ucx::Tag = ucx::Tag::User(0x5456);

/// The process's UCX worker, made on first use. A `blocking` worker is progressed by a task
/// on the runtime it was made in; when that runtime has shut down (a program that makes one
/// runtime per phase, or a test after a test), the next connection makes a new worker in the
/// current runtime. Connections of the old worker died with its runtime.
fn worker() -> Result<ucx::Worker> {
    static CONTEXT: OnceLock<std::result::Result<ucx::Context, ucx::Error>> = OnceLock::new();
    static WORKER: std::sync::Mutex<Option<ucx::Worker>> = std::sync::Mutex::new(None);
    let intent = crate::ucx_config::chosen();
    let ctx = CONTEXT
        .get_or_init(|| {
            let opts = intent.options().unwrap_or_default();
            tracing::debug!(ucx = %intent, "starting the UCX backend");
            ucx::Context::builder().options(opts).build()
        })
        .clone()?;
    let mut current = WORKER.lock().unwrap_or_else(|e| e.into_inner());
    match &*current {
        Some(w) if w.is_progressing() => Ok(w.clone()),
        stale => {
            if stale.is_some() {
                tracing::info!("the UCX worker's runtime shut down: making a new worker");
            }
            let w = ucx::Worker::new(&ctx, intent.progress)?;
            *current = Some(w.clone());
            Ok(w)
        }
    }
}

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

#[derive(Debug)]
pub(crate) struct Listener {
    inner: ucx::Listener,
}

/// A posted receive of a credit grant.
type Grant =
    std::pin::Pin<Box<dyn std::future::Future<Output = (ucx::Result<usize>, Box<[u8]>)> + Send>>;

struct ParkedGrant(Option<Grant>);

impl std::fmt::Debug for ParkedGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "posted" } else { "idle" })
    }
}

/// A UCX connection. Its `recv` is not cancel-safe by itself: [`crate::Connection`] parks an
/// interrupted receive and resumes it.
#[derive(Debug)]
pub(crate) struct Conn {
    ep: std::sync::Arc<ucx::Endpoint>,
    /// Held while posting a message's sends, so concurrent messages never interleave.
    send_order: std::sync::Mutex<()>,
    /// A small-message send buffer, reused.
    send_buf: std::sync::Mutex<Option<Vec<u8>>>,
    /// The buffer first messages are received into, kept between receives.
    first_buf: std::sync::Mutex<Vec<u8>>,
    /// Bytes (charged) this side may still send before it needs a grant from the peer.
    credits: AtomicU64,
    /// The window: what `credits` starts at and never exceeds.
    window: u64,
    /// One sender at a time waits for a grant; a wait whose sender was dropped stays posted
    /// here for the next one, so no grant is lost to a cancelled send.
    refill: Mutex<ParkedGrant>,
    /// Bytes (charged) taken by the application and not yet granted back to the peer.
    taken: AtomicU64,
    pub(crate) limits: crate::SharedLimits,
    /// A receive is in progress (perhaps parked by `Connection`, still posted in UCX).
    receiving: Arc<AtomicBool>,
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port).to_socket_addrs()?.next().ok_or_else(|| {
        TransportError::Io(Arc::new(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{host} resolved to no address"),
        )))
    })
}

pub(crate) async fn listen(host: &str, port: u16) -> Result<Listener> {
    Ok(Listener {
        inner: ucx::Listener::bind(&worker()?, resolve(host, port)?)?,
    })
}

pub(crate) async fn connect(
    host: &str,
    port: u16,
    opts: &Options,
    state: Arc<CloseState>,
) -> Result<Conn> {
    let at = resolve(host, port)?;
    // A connect that UCX resets during the UCXX handshake is made again, twice at most (within
    // the caller's time limit): seen about once in 600 connects to a freshly started peer in
    // `tests/peer_death.rs` (thread progress), before any application byte moved.
    for attempt in 0.. {
        let connected = ucx::Endpoint::connect_with(
            &worker()?,
            at,
            ucx::ConnectOptions {
                timeout: opts.connect_timeout,
                ..Default::default()
            },
        )
        .await;
        match connected {
            Ok(ep) => return Ok(Conn::new(ep, opts, state)),
            Err(ucx::Error::Handshake(
                ucx::HandshakeError::Sending(e) | ucx::HandshakeError::Receiving(e),
            )) if attempt < 2 && matches!(*e, ucx::Error::Ucx(s) if s.is_peer_failure()) => {
                tracing::warn!(peer = %at, error = %e, attempt, "UCX reset the connection during its handshake: connecting again");
            }
            Err(e) => return Err(e.into()),
        }
    }
    unreachable!("the loop returns")
}

fn to_address(a: SocketAddr) -> Address {
    Address::Ucx {
        host: a.ip().to_string(),
        port: a.port(),
    }
}

impl Listener {
    pub(crate) fn local(&self) -> Address {
        to_address(self.inner.local_addr())
    }

    pub(crate) async fn accept(
        &mut self,
        opts: &Options,
        state: Arc<CloseState>,
    ) -> Result<(Conn, Address)> {
        loop {
            match self.inner.accept().await {
                Ok(ep) => {
                    let peer = ep.peer_addr().map(to_address).unwrap_or(Address::Ucx {
                        host: "?".into(),
                        port: 0,
                    });
                    return Ok((Conn::new(ep, opts, state), peer));
                }
                // A failed handshake concerns that client only: keep accepting.
                Err(ucx::Error::Handshake(e)) => tracing::warn!(error = %e, "rejected a client"),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Conn {
    fn new(ep: ucx::Endpoint, opts: &Options, state: Arc<CloseState>) -> Conn {
        let ep = Arc::new(ep);
        let receiving = Arc::new(AtomicBool::new(false));
        // UCX's error handling notices a peer that fails while nothing is pending. A peer's
        // close shows up there too (as a reset), after its marker: while a receive is posted
        // (it takes the marker, or fails itself), or a message (perhaps the marker) waits to
        // be received, the receive is left to tell which it was.
        let (weak, posted) = (Arc::downgrade(&ep), Arc::clone(&receiving));
        ep.on_close(move |reason| {
            let Some(ucx::Error::Ucx(status)) = reason else {
                return;
            };
            if posted.load(Ordering::Acquire) {
                return;
            }
            let queued = weak
                .upgrade()
                .is_some_and(|ep| ep.tag_probe(TAG, false).is_some());
            if !queued {
                state.close(CloseReason::PeerFailed(Failure::Ucx(status)));
            }
        });
        Conn {
            ep,
            send_order: std::sync::Mutex::new(()),
            send_buf: std::sync::Mutex::new(None),
            first_buf: std::sync::Mutex::new(Vec::new()),
            credits: AtomicU64::new(opts.credit_bytes),
            window: opts.credit_bytes,
            refill: Mutex::new(ParkedGrant(None)),
            taken: AtomicU64::new(0),
            limits: crate::SharedLimits::new(opts.limits),
            receiving,
        }
    }

    pub(crate) async fn send(&self, channel: u32, msg: Message) -> Result<()> {
        check_outgoing(channel, &msg, &self.limits.get())?;
        self.take_credit(ucx_charge(msg.len())).await?;
        // Post under the lock so another sender's header or frames never land between ours
        // (UCX keeps per-tag order, not per-message order). Sends are posted on their first
        // poll, inside the lock; completions are awaited after it is released.
        let total = msg.len();
        if frame::header_len(msg.frames.len()) + total <= FIRST_MAX && !msg.has_cuda() {
            // Small messages travel as one UCX message: header, then the frames' bytes.
            // Into a buffer kept for the connection (given back once UCX is done with it).
            let mut one = self
                .send_buf
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            let mut one = one
                .take_if(|b| b.capacity() >= FIRST_MAX)
                .unwrap_or_default();
            one.clear();
            one.reserve(FIRST_MAX);
            frame::encode_into(&mut one, channel, header_metas(&msg));
            for f in msg.frames.iter().filter_map(Frame::as_host) {
                one.extend_from_slice(f);
            }
            let (r, one) = self.post_in_order(self.ep.send(one, TAG)).await;
            *self.send_buf.lock().unwrap_or_else(|e| e.into_inner()) = Some(one);
            return r.map_err(closed_or);
        }
        // A header longer than FIRST_MAX goes in two parts (the receiver posts FIRST_MAX bytes).
        let header = Bytes::from(encode_header(channel, &msg));
        let parts = if header.len() > FIRST_MAX {
            vec![header.slice(..FIRST_MAX), header.slice(FIRST_MAX..)]
        } else {
            vec![header]
        };
        // With no bytes at all, the header says everything: no frame messages.
        let frames = if total > 0 { msg.frames } else { Vec::new() };
        #[cfg(feature = "cuda")]
        for f in &frames {
            // Wait for the producer's GPU work here, not under the send lock.
            if let Frame::Cuda(d) = f {
                d.stream()
                    .synchronize()
                    .map_err(|e| TransportError::Ucx(ucx::Error::Cuda(e.to_string())))?;
            }
        }
        let sends: Vec<_> = parts
            .into_iter()
            .map(Frame::Host)
            .chain(frames)
            .map(|f| Box::pin(self.send_frame(f)))
            .collect();
        let results = self.post_all_in_order(sends).await;
        if let Some(e) = results.into_iter().find_map(|r| r.err()) {
            // Part of the message may be on the wire: the peer's stream is out of step, so
            // the connection ends here.
            if !e.is_disconnect() {
                tracing::warn!(error = %e, "a send failed part-way: closing the UCX connection");
                self.ep.abort();
            }
            return Err(closed_or(e));
        }
        Ok(())
    }

    /// Polls every send once, in order, under the send lock (each send posts on its first
    /// poll), so what one message posts is never interleaved with another's; then waits for
    /// those that did not complete at once, outside the lock.
    async fn post_all_in_order<F>(
        &self,
        mut sends: Vec<std::pin::Pin<Box<F>>>,
    ) -> Vec<ucx::Result<()>>
    where
        F: std::future::Future<Output = ucx::Result<()>>,
    {
        let mut done: Vec<Option<ucx::Result<()>>> = Vec::with_capacity(sends.len());
        std::future::poll_fn(|cx| {
            let _order = self.send_order.lock().unwrap_or_else(|e| e.into_inner());
            for s in sends.iter_mut() {
                done.push(match s.as_mut().poll(cx) {
                    std::task::Poll::Ready(r) => Some(r),
                    std::task::Poll::Pending => None,
                });
            }
            std::task::Poll::Ready(())
        })
        .await;
        let mut out = Vec::with_capacity(sends.len());
        for (s, d) in sends.into_iter().zip(done) {
            out.push(match d {
                Some(r) => r,
                None => s.await,
            });
        }
        out
    }

    /// Takes `charge` bytes of credit, waiting for the peer's grants while there is too
    /// little left.
    async fn take_credit(&self, charge: u64) -> Result<()> {
        loop {
            let took = self
                .credits
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    c.checked_sub(charge)
                });
            if took.is_ok() {
                return Ok(());
            }
            let mut parked = self.refill.lock().await;
            if self.credits.load(Ordering::Acquire) >= charge {
                continue; // another sender received a grant meanwhile
            }
            tracing::trace!("waiting for the peer to take messages");
            let wait = parked.0.get_or_insert_with(|| {
                let ep = Arc::clone(&self.ep);
                Box::pin(async move { ep.recv(vec![0u8; 8].into_boxed_slice(), CREDIT_TAG).await })
            });
            let (r, grant) = wait.as_mut().await;
            parked.0 = None;
            let n = r.map_err(closed_or)?;
            let granted = grant
                .first_chunk::<8>()
                .map_or(0, |b| u64::from_le_bytes(*b));
            let before = self.credits.fetch_add(granted, Ordering::AcqRel);
            if n != 8 || granted == 0 || before.saturating_add(granted) > self.window {
                return Err(self.refuse(ProtocolError::Grant {
                    got: n,
                    bytes: granted,
                }));
            }
        }
    }

    /// Counts a message the application took, granting credits back every
    /// [`UCX_GRANT_EVERY`] bytes.
    async fn took(&self, charge: u64) {
        let taken = self.taken.fetch_add(charge, Ordering::AcqRel) + charge;
        if taken < UCX_GRANT_EVERY {
            return;
        }
        self.taken.fetch_sub(taken, Ordering::AcqRel);
        let (r, _) = Box::pin(self.ep.send(taken.to_le_bytes().to_vec(), CREDIT_TAG)).await;
        if let Err(e) = r {
            // The peer is gone or going: its next operation says so.
            tracing::debug!(error = %e, "a credit grant was not delivered");
        }
    }

    /// Runs `sends`, whose first poll posts them, with that first poll under the send lock:
    /// what one message posts is never interleaved with another's. Completions are awaited
    /// outside the lock.
    async fn post_in_order<F: std::future::Future>(&self, sends: F) -> F::Output {
        let mut sends = std::pin::pin!(sends);
        let first = std::future::poll_fn(|cx| {
            let _order = self.send_order.lock().unwrap_or_else(|e| e.into_inner());
            std::task::Poll::Ready(sends.as_mut().poll(cx))
        })
        .await;
        match first {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => sends.await,
        }
    }

    /// Sends one frame (posted on the first poll).
    async fn send_frame(&self, f: Frame) -> ucx::Result<()> {
        match f {
            Frame::Host(b) => self.ep.send(b, TAG).await.0,
            #[cfg(feature = "cuda")]
            Frame::Cuda(d) => self.ep.send(d, TAG).await.0,
        }
    }

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
                let (r, v) = self.ep.recv(v, TAG).await;
                (r, Frame::Host(crate::pool::into_bytes(v)))
            }
            #[cfg(feature = "cuda")]
            RecvBuf::Cuda(d) => {
                let (r, d) = self.ep.recv(d, TAG).await;
                (r, Frame::from(d))
            }
        }
    }

    pub(crate) async fn recv(&self) -> Result<(u32, Message)> {
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
        let (r, buf) = self.ep.recv(buf, TAG).await;
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
            let probed = self.ep.probe_message(TAG).await.map_err(closed_or)?;
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
            let (r, buf) = Box::pin(self.ep.recv(vec![0u8; want].into_boxed_slice(), TAG)).await;
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

    /// Closes the connection after the peer broke the wire format.
    fn refuse(&self, e: ProtocolError) -> TransportError {
        tracing::warn!(error = %e, "closing a UCX connection after a malformed message");
        self.ep.abort();
        TransportError::Protocol(e)
    }

    pub(crate) async fn close(&self) -> Result<()> {
        // The marker first (outside the credits: it is the last message), so the peer knows
        // this is a close; a peer already gone does not make the close fail.
        let marker = close_marker();
        let (r, _) = self.post_in_order(self.ep.send(marker, TAG)).await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "the close marker was not delivered");
        }
        match self.ep.close().await {
            Err(e) if !e.is_disconnect() => Err(TransportError::Ucx(e)),
            _ => Ok(()),
        }
    }
}

/// Clears a connection's "receiving" flag when its receive ends (or is dropped).
struct Receiving<'a>(&'a AtomicBool);

impl Drop for Receiving<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A UCX error as the transport reports it: a peer that went away, or a local close, is a
/// closed connection; anything else stays a UCX error.
fn closed_or(e: ucx::Error) -> TransportError {
    match e {
        ucx::Error::Closed => TransportError::Closed(CloseReason::Local),
        ucx::Error::Ucx(s) if s.is_peer_failure() => {
            TransportError::Closed(CloseReason::PeerFailed(Failure::Ucx(s)))
        }
        e => TransportError::Ucx(e),
    }
}
