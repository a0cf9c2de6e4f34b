//! TCP connections (tokio + socket2): `TCP_NODELAY`, keepalive, a header then the frames
//! (device frames staged through host memory on both sides). `tls://` is the same inside TLS
//! (the connection's halves are boxed streams; see [`crate::tls`]).
//!
//! A garbage header closes the connection; nothing is allocated from unchecked sizes. A close
//! writes the close marker and shuts the socket's sending side, so the peer tells it from a
//! crash (an end of stream without the marker). A `send` dropped part-way through a message
//! shuts the socket down: the peer would otherwise read the next message's bytes as this
//! one's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::os::fd::{AsRawFd, RawFd};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

use crate::frame;
use crate::{
    check_outgoing, close_marker, encode_header, encode_whole, Address, CloseReason, CloseState,
    Error, Failure, Frame, Message, Options, ProtocolError, Result, CLOSE_CHANNEL,
};

/// Messages up to this size (header and frames) are copied into one buffer and written at
/// once; larger ones are written frame by frame, without a copy.
const COALESCE: usize = 16 << 10;
/// The most bytes [`Conn::send_batch`] gathers for one write.
const BATCH_WRITE: usize = 64 << 10;
/// The receive side reads through a buffer this large, so a small message's header, entries
/// and frames take one system call; a frame at least this large bypasses it.
const READ_BUFFER: usize = 64 << 10;
/// A frame's receive buffer starts this large and grows with what arrives (see [`read_frame`]).
const GROW_FROM: usize = 64 << 10;

#[derive(Debug)]
pub(crate) struct Listener {
    inner: TcpListener,
}

/// A connection's receiving half: the socket's, or TLS's over it.
type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// A connection's sending half.
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// The sending side: the connection's write half, and a buffer small messages are gathered in.
struct Writer {
    half: WriteHalf,
    scratch: Vec<u8>,
}

pub(crate) struct Conn {
    reader: Mutex<BufReader<ReadHalf>>,
    writer: Mutex<Writer>,
    /// The socket's descriptor, open as long as the halves are (they own the socket).
    fd: RawFd,
    pub(crate) limits: crate::SharedLimits,
    /// Received host frames as plain `Vec`-backed `Bytes` ([`crate::Options::reclaimable_frames`]).
    reclaim: bool,
    state: Arc<CloseState>,
    /// Poll the socket this long before parking a receive ([`Options::tcp_spin`]).
    spin: std::time::Duration,
    /// Whether the next receive spins: it does while messages come within `spin` of a receive
    /// (and after a parked receive waited less than twice `spin`: a round trip through two
    /// parked peers pays two wake-ups), so a connection that waits long between messages
    /// parks at once and costs no CPU. A new connection starts spinning.
    hot: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("tcp::Conn").field("fd", &self.fd).finish()
    }
}

fn tune(s: &TcpStream) -> Result<()> {
    s.set_nodelay(true)?;
    let sock = socket2::SockRef::from(s);
    sock.set_keepalive(true)?;
    sock.set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(Duration::from_secs(10)))?;
    Ok(())
}

fn to_address(a: SocketAddr) -> Address {
    Address::Tcp {
        host: a.ip().to_string(),
        port: a.port(),
    }
}

pub(crate) async fn listen(host: &str, port: u16) -> Result<Listener> {
    Ok(Listener {
        inner: TcpListener::bind((host, port)).await?,
    })
}

pub(crate) async fn connect(
    host: &str,
    port: u16,
    opts: &Options,
    state: Arc<CloseState>,
) -> Result<Conn> {
    let s = TcpStream::connect((host, port)).await?;
    tune(&s)?;
    Ok(Conn::plain(s, opts, state))
}

/// Connects over TLS: TCP, then the handshake (both within the caller's time limit).
#[cfg(feature = "tls")]
pub(crate) async fn connect_tls(
    host: &str,
    port: u16,
    opts: &Options,
    tls: &crate::tls::TlsConfig,
    state: Arc<CloseState>,
) -> Result<Conn> {
    let name = tls.server_name_for(host)?;
    let s = TcpStream::connect((host, port)).await?;
    tune(&s)?;
    let fd = s.as_raw_fd();
    let stream = tokio_rustls::TlsConnector::from(Arc::clone(&tls.client))
        .connect(name, s)
        .await
        .map_err(crate::tls::handshake_error)?;
    Ok(Conn::tls(stream.into(), fd, opts, state))
}

/// The server side of a TLS handshake on an accepted socket.
#[cfg(feature = "tls")]
pub(crate) async fn accept_tls(
    s: TcpStream,
    opts: &Options,
    tls: &crate::tls::TlsConfig,
    state: Arc<CloseState>,
) -> Result<Conn> {
    let fd = s.as_raw_fd();
    let stream = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls.server))
        .accept(s)
        .await
        .map_err(crate::tls::handshake_error)?;
    Ok(Conn::tls(stream.into(), fd, opts, state))
}

impl Listener {
    pub(crate) fn local(&self) -> Address {
        self.inner
            .local_addr()
            .map(to_address)
            .unwrap_or(Address::Tcp {
                host: "?".into(),
                port: 0,
            })
    }

    pub(crate) async fn accept(
        &mut self,
        opts: &Options,
        state: Arc<CloseState>,
    ) -> Result<(Conn, Address)> {
        let (s, peer) = self.accept_socket().await?;
        Ok((Conn::plain(s, opts, state), peer))
    }

    /// The next socket, tuned, unwrapped (for `tls://`, whose handshake comes next).
    pub(crate) async fn accept_socket(&mut self) -> Result<(TcpStream, Address)> {
        let (s, peer) = self.inner.accept().await?;
        tune(&s)?;
        Ok((s, to_address(peer)))
    }
}

/// TLS's reading half, with an end of stream that lacks TLS's `close_notify` read as an end
/// of stream: the framing tells a peer that vanished between messages from one cut off in the
/// middle of one, as on `tcp://` (a close is told by the transport's own close marker).
#[cfg(feature = "tls")]
struct EndOfStream<R>(R);

#[cfg(feature = "tls")]
impl<R: AsyncRead + Unpin> AsyncRead for EndOfStream<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match std::task::ready!(std::pin::Pin::new(&mut self.0).poll_read(cx, buf)) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                std::task::Poll::Ready(Ok(()))
            }
            r => std::task::Poll::Ready(r),
        }
    }
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
async fn read_full(r: &mut (impl AsyncRead + Unpin), buf: &mut [u8]) -> Result<usize> {
    let mut at = 0;
    while at < buf.len() {
        match r.read(&mut buf[at..]).await? {
            0 => break,
            n => at += n,
        }
    }
    Ok(at)
}

/// Reads exactly `buf.len()` bytes of a message already begun: an end of stream here is a
/// message cut short.
async fn read_rest(r: &mut (impl AsyncRead + Unpin), buf: &mut [u8]) -> Result<()> {
    if read_full(r, buf).await? < buf.len() {
        return Err(Error::Closed(CloseReason::PeerFailed(Failure::Truncated)));
    }
    Ok(())
}

/// Reads a frame the header announced as `size` bytes. Memory follows what the peer has sent,
/// never what it announced: the buffer starts at [`GROW_FROM`] bytes (or is a pooled one the
/// process already holds) and at most doubles as bytes arrive, so a peer that announces
/// gigabytes and sends little costs little.
async fn read_frame(r: &mut (impl AsyncRead + Unpin), size: usize) -> Result<Vec<u8>> {
    let mut b = crate::pool::take_pooled(size).unwrap_or_default();
    b.clear();
    while b.len() < size {
        let left = size - b.len();
        if b.len() == b.capacity() {
            b.reserve_exact(b.capacity().max(GROW_FROM).min(left));
            crate::pool::advise_huge_pages(&mut b);
        }
        let room = (b.capacity() - b.len()).min(left);
        if (&mut *r).take(room as u64).read_buf(&mut b).await? == 0 {
            return Err(Error::Closed(CloseReason::PeerFailed(Failure::Truncated)));
        }
    }
    Ok(b)
}

/// Shuts the socket down unless disarmed: a send dropped part-way through a message leaves
/// the peer's stream out of step, so the connection ends (closed by this side). Holds the
/// socket's descriptor, which stays open while the connection holds its halves.
struct ShutdownOnDrop<'a>(Option<RawFd>, &'a CloseState);

impl Drop for ShutdownOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(fd) = self.0 {
            self.1.close(CloseReason::Local);
            tracing::warn!(
                "a TCP send was dropped part-way through a message: closing the connection"
            );
            // SAFETY: the descriptor is the socket the connection's halves own, and the send
            // dropping this guard borrows the connection, so it is open during this call.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let _ = socket2::SockRef::from(&fd).shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Conn {
    /// The socket's local address.
    pub(crate) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        // SAFETY: `fd` stays open as long as the halves, which `self` owns.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) };
        socket2::SockRef::from(&fd).local_addr().ok()?.as_socket()
    }

    fn plain(s: TcpStream, opts: &Options, state: Arc<CloseState>) -> Conn {
        let fd = s.as_raw_fd();
        let (r, w) = s.into_split();
        Conn::new(Box::new(r), Box::new(w), fd, opts, state)
    }

    #[cfg(feature = "tls")]
    fn tls(
        s: tokio_rustls::TlsStream<TcpStream>,
        fd: RawFd,
        opts: &Options,
        state: Arc<CloseState>,
    ) -> Conn {
        let (r, w) = tokio::io::split(s);
        Conn::new(Box::new(EndOfStream(r)), Box::new(w), fd, opts, state)
    }

    fn new(r: ReadHalf, w: WriteHalf, fd: RawFd, opts: &Options, state: Arc<CloseState>) -> Conn {
        Conn {
            reader: Mutex::new(BufReader::with_capacity(READ_BUFFER, r)),
            writer: Mutex::new(Writer {
                half: w,
                scratch: Vec::new(),
            }),
            fd,
            limits: crate::SharedLimits::new(opts.limits),
            reclaim: opts.reclaimable_frames,
            state,
            spin: opts.tcp_spin,
            hot: std::sync::atomic::AtomicBool::new(!opts.tcp_spin.is_zero()),
        }
    }

    /// Awaits `read`, first polling it for at most `spin`, yielding to the runtime between
    /// polls (the runtime checks its sockets then, and other tasks on this thread run): a
    /// reply that comes within the spin is read without the thread sleeping in the kernel.
    /// Also says whether it came within the spin.
    async fn spin_on<F: std::future::Future>(&self, read: F) -> (F::Output, bool) {
        let mut read = std::pin::pin!(read);
        let start = std::time::Instant::now();
        loop {
            let polled =
                std::future::poll_fn(|cx| std::task::Poll::Ready(read.as_mut().poll(cx))).await;
            if let std::task::Poll::Ready(v) = polled {
                return (v, true);
            }
            if start.elapsed() >= self.spin {
                return (read.await, false);
            }
            tokio::task::yield_now().await;
        }
    }

    pub(crate) async fn send(&self, channel: u32, msg: Message) -> Result<()> {
        check_outgoing(channel, &msg, &self.limits.get())?;
        let header = encode_header(channel, &msg);
        // Device frames are staged through host memory, before anything is written: a copy
        // that fails must not leave half a message on the wire.
        let staged = if msg.has_cuda() {
            msg.to_host()?
        } else {
            Vec::new()
        };
        // One writer at a time: a message's header and frames are never interleaved.
        let mut locked = self.writer.lock().await;
        let Writer { half: w, scratch } = &mut *locked;
        let mut guard = ShutdownOnDrop(Some(self.fd), &self.state);
        let written = async {
            let total = header.len() + msg.frames.iter().map(Frame::len).sum::<usize>();
            let host: Option<Vec<&bytes::Bytes>> = msg.frames.iter().map(Frame::as_host).collect();
            if let Some(host) = host.filter(|_| total <= COALESCE) {
                // A small message goes out in one write (one segment, one wake-up for the
                // peer) rather than one per frame, copied into the connection's scratch buffer
                // (kept, so no allocation per message).
                scratch.clear();
                scratch.extend_from_slice(&header);
                for b in host {
                    scratch.extend_from_slice(b);
                }
                w.write_all(scratch).await?;
                // TLS holds records until flushed; for a socket this is nothing.
                return w.flush().await;
            }
            w.write_all(&header).await?;
            for (i, f) in msg.frames.iter().enumerate() {
                match f.as_host() {
                    Some(b) => w.write_all(b).await?,
                    None => w.write_all(&staged[i]).await?,
                }
            }
            w.flush().await
        };
        let r = written.await;
        guard.0 = None;
        Ok(r?)
    }

    /// Small host-memory messages are written together, up to [`BATCH_WRITE`] bytes a write,
    /// under one hold of the writer; a batch with any other message sends each as
    /// [`Self::send`] does. The caller checked every message against the limits.
    pub(crate) async fn send_batch(&self, channel: u32, msgs: Vec<Message>) -> Result<()> {
        let small =
            |m: &Message| !m.has_cuda() && frame::header_len(m.frames.len()) + m.len() <= COALESCE;
        if !msgs.iter().all(small) {
            for m in msgs {
                self.send(channel, m).await?;
            }
            return Ok(());
        }
        let mut locked = self.writer.lock().await;
        let Writer { half: w, scratch } = &mut *locked;
        let mut guard = ShutdownOnDrop(Some(self.fd), &self.state);
        let written = async {
            let mut msgs = msgs.iter().peekable();
            while msgs.peek().is_some() {
                scratch.clear();
                while let Some(m) = msgs.next_if(|_| scratch.len() < BATCH_WRITE) {
                    encode_whole(scratch, channel, m);
                }
                w.write_all(scratch).await?;
            }
            w.flush().await
        };
        let r = written.await;
        guard.0 = None;
        Ok(r?)
    }

    pub(crate) async fn recv(&self) -> Result<(u32, Message)> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut r = self.reader.lock().await;
        let mut fixed = [0u8; frame::FIXED_LEN];
        let got = if self.spin.is_zero() || !r.buffer().is_empty() {
            read_full(&mut *r, &mut fixed).await?
        } else if self.hot.load(Relaxed) {
            // Spinning: stay hot while messages come within the spin.
            let (got, came) = self.spin_on(read_full(&mut *r, &mut fixed)).await;
            self.hot.store(came, Relaxed);
            got?
        } else {
            // Parked: warm up if the message came soon even so (wake-ups included).
            let start = std::time::Instant::now();
            let got = read_full(&mut *r, &mut fixed).await?;
            self.hot.store(start.elapsed() < 2 * self.spin, Relaxed);
            got
        };
        match got {
            0 => return Err(Error::Closed(CloseReason::PeerFailed(Failure::Vanished))),
            n if n < fixed.len() => {
                return Err(Error::Closed(CloseReason::PeerFailed(Failure::Truncated)))
            }
            _ => {}
        }
        let (channel, n) = match frame::decode_fixed(&fixed, &self.limits.get()) {
            Ok(v) => v,
            Err(e) => return Err(self.refuse(e.into()).await),
        };
        if channel == CLOSE_CHANNEL {
            return Err(Error::Closed(CloseReason::PeerClosed));
        }
        let mut entries = vec![0u8; n as usize * frame::ENTRY_LEN];
        read_rest(&mut *r, &mut entries).await?;
        let metas = match frame::decode_entries(&entries, &self.limits.get()) {
            Ok(m) => m,
            Err(e) => return Err(self.refuse(e.into()).await),
        };
        let mut frames = Vec::with_capacity(metas.len());
        for m in metas {
            let b = read_frame(&mut *r, m.size as usize).await?;
            let bytes = crate::pool::into_bytes(b, self.reclaim);
            #[cfg(feature = "cuda")]
            if m.cuda {
                match crate::cuda::from_host(bytes) {
                    Ok(d) => frames.push(d),
                    // The message is lost: the connection ends rather than skip it.
                    Err(e) => {
                        return Err(self.refuse(ProtocolError::DeviceFrame(e.to_string())).await)
                    }
                }
                continue;
            }
            frames.push(Frame::Host(bytes));
        }
        Ok((channel, Message { frames }))
    }

    async fn refuse(&self, e: ProtocolError) -> Error {
        tracing::warn!(error = %e, "closing a TCP connection after a malformed message");
        let _ = self.writer.lock().await.half.shutdown().await;
        Error::Protocol(e)
    }

    pub(crate) async fn close(&self) -> Result<()> {
        let graceful = async {
            let w = &mut self.writer.lock().await.half;
            // The marker first, so the peer knows this is a close and not a crash; a peer that
            // is already gone does not make the close fail.
            if let Err(e) = w.write_all(&close_marker()).await {
                tracing::debug!(error = %e, "the close marker was not delivered");
            }
            if let Err(e) = w.shutdown().await {
                tracing::debug!(error = %e, "shutting the socket down");
            }
        };
        // A send blocked on a peer that does not read (stopped, partitioned) holds the writer:
        // the close does not wait behind it. Shutting the socket down under it ends that send
        // with an error, and any receive with the end of the stream.
        if tokio::time::timeout(CLOSE_GRACE, graceful).await.is_err() {
            tracing::warn!(
                fd = self.fd,
                "closing a TCP connection behind a stuck send: shutting the socket down"
            );
            self.state.close(CloseReason::Local);
            // SAFETY: the descriptor is the socket the connection's halves own, and `self`
            // borrows the connection (and so the halves) for this call, so it is open.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) };
            let _ = socket2::SockRef::from(&fd).shutdown(std::net::Shutdown::Both);
        }
        Ok(())
    }
}

/// How long a close waits for the writer (a send in progress, then the close marker) before
/// it shuts the socket down under a stuck send.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    async fn pair(opts: &Options) -> (Conn, Conn) {
        let mut l = listen("127.0.0.1", 0).await.unwrap();
        let Address::Tcp { port, .. } = l.local() else {
            unreachable!("a TCP listener has a TCP address")
        };
        let (a, b) = tokio::join!(
            connect("127.0.0.1", port, opts, Arc::default()),
            l.accept(opts, Arc::default())
        );
        (a.unwrap(), b.unwrap().0)
    }

    /// A close does not wait behind a send blocked on a peer that never reads: it shuts the
    /// socket down under it, the send fails, and the peer sees the connection end.
    #[tokio::test(flavor = "current_thread")]
    async fn a_close_behind_a_send_stuck_on_a_peer_that_does_not_read_ends_both() {
        let (a, b) = pair(&Options::default()).await;
        let a = Arc::new(a);
        let big = Message::from(vec![bytes::Bytes::from(vec![7u8; 64 << 20])]);
        let stuck = tokio::spawn({
            let a = Arc::clone(&a);
            async move { a.send(1, big).await }
        });
        // Until the socket buffers fill: the send cannot finish while `b` does not read.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!stuck.is_finished(), "64 MiB fit in the socket buffers");
        // Bounds against a hang, far above the 2 s grace.
        tokio::time::timeout(Duration::from_secs(60), a.close())
            .await
            .expect("the close waited behind the stuck send")
            .unwrap();
        let sent = tokio::time::timeout(Duration::from_secs(60), stuck)
            .await
            .expect("the stuck send never ended")
            .unwrap();
        assert!(sent.is_err(), "the send was cut: it cannot have succeeded");
        // The peer reads what arrived, then the end.
        let end = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                if b.recv().await.is_err() {
                    return;
                }
            }
        })
        .await;
        assert!(end.is_ok(), "the peer never saw the end");
    }

    /// A receive that waits longer than the spin leaves the connection parking at once (no
    /// core burnt on a connection that waits long between messages), whether it spun first
    /// or not, and the message arrives whole either way.
    #[tokio::test(flavor = "current_thread")]
    async fn a_long_wait_stops_the_spinning() {
        let (a, b) = pair(&Options::default()).await;
        for hot in [true, false] {
            b.hot.store(hot, Relaxed);
            let late = async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                a.send(7, Message::from(vec![bytes::Bytes::from_static(b"late")]))
                    .await
            };
            let (sent, got) = tokio::join!(late, b.recv());
            sent.unwrap();
            let (channel, msg) = got.unwrap();
            assert_eq!((channel, msg.frames.len()), (7, 1));
            assert_eq!(msg.frames[0].as_host().unwrap().as_ref(), b"late");
            assert!(
                !b.hot.load(Relaxed),
                "still spinning after a 20 ms wait (was {hot})"
            );
        }
    }

    /// `tcp_spin` zero never spins: the flag is never set.
    #[tokio::test(flavor = "current_thread")]
    async fn no_spin_stays_parked() {
        let opts = Options {
            tcp_spin: Duration::ZERO,
            ..Default::default()
        };
        let (a, b) = pair(&opts).await;
        for i in 0..20u32 {
            let (sent, got) =
                tokio::join!(a.send(i, Message::from(Vec::<Vec<u8>>::new())), b.recv());
            sent.unwrap();
            assert_eq!(got.unwrap().0, i);
            assert!(!b.hot.load(Relaxed));
        }
    }
}
