//! UCX connections over `ucx-rs`: the header as one tagged message, then one tagged message
//! per frame, all on the same tag (UCX keeps per-tag order). Each process shares one UCX
//! context and worker, set up from [`crate::UcxIntent`] (see [`crate::configure_ucx`]).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::OnceLock;

use bytes::Bytes;
use tokio::sync::Mutex;

use crate::frame::{self, Limits};
use crate::{check_outgoing, Address, Frame, Message, Result, TransportError};

/// The tag every message and frame of a connection travels on (a UCXX user tag, so it is
/// hashed with the endpoint's tags like any other).
pub const TAG: ucx::Tag = ucx::Tag::User(0x5455);
/// Messages of at most this many bytes (all frames) go as one UCX message with their header:
/// one transfer instead of one per frame plus the header.
const INLINE_MAX: usize = 8 << 10;

fn worker() -> Result<ucx::Worker> {
    static WORKER: OnceLock<std::result::Result<ucx::Worker, ucx::Error>> = OnceLock::new();
    WORKER
        .get_or_init(|| {
            let intent = crate::ucx_config::chosen();
            let opts = intent.options().unwrap_or_default();
            tracing::debug!(ucx = %intent, "starting the UCX backend");
            let ctx = ucx::Context::builder().options(opts).build()?;
            ucx::Worker::new(&ctx, intent.progress)
        })
        .clone()
        .map_err(TransportError::from)
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

#[derive(Debug)]
pub(crate) struct Conn {
    ep: ucx::Endpoint,
    /// Held while posting a message's sends, so concurrent messages never interleave.
    send_order: Mutex<()>,
    /// One receiver at a time reads a header and its frames.
    recv_order: Mutex<()>,
    limits: Limits,
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| TransportError::Io(format!("resolving {host}: {e}")))?
        .next()
        .ok_or_else(|| TransportError::Io(format!("{host} resolved to nothing")))
}

pub(crate) async fn listen(host: &str, port: u16) -> Result<Listener> {
    Ok(Listener {
        inner: ucx::Listener::bind(&worker()?, resolve(host, port)?)?,
    })
}

pub(crate) async fn connect(host: &str, port: u16) -> Result<Conn> {
    let ep = ucx::Endpoint::connect(&worker()?, resolve(host, port)?).await?;
    Ok(Conn::new(ep))
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

    pub(crate) async fn accept(&mut self) -> Result<(Conn, Address)> {
        loop {
            match self.inner.accept().await {
                Ok(ep) => {
                    let peer = ep.peer_addr().map(to_address).unwrap_or(Address::Ucx {
                        host: "?".into(),
                        port: 0,
                    });
                    return Ok((Conn::new(ep), peer));
                }
                // A failed handshake concerns that client only: keep accepting.
                Err(ucx::Error::Handshake(e)) => tracing::warn!(error = %e, "rejected a client"),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Conn {
    fn new(ep: ucx::Endpoint) -> Conn {
        Conn {
            ep,
            send_order: Mutex::new(()),
            recv_order: Mutex::new(()),
            limits: Limits::default(),
        }
    }

    pub(crate) async fn send(&self, channel: u32, msg: Message) -> Result<()> {
        let metas = check_outgoing(&msg, &self.limits)?;
        let mut header = frame::encode(channel, &metas);
        // Post under the lock so another sender's header or frames never land between ours
        // (UCX keeps per-tag order, not per-message order). Sends are posted on their first
        // poll, inside the lock; completions are awaited after it is released.
        if msg.len() <= INLINE_MAX && !msg.has_cuda() {
            // Small messages travel as one UCX message: header, then the frames' bytes.
            for f in msg.frames.iter().filter_map(Frame::as_host) {
                header.extend_from_slice(f);
            }
            let mut one = std::pin::pin!(self.ep.send(header, TAG));
            let first = {
                let _order = self.send_order.lock().await;
                futures::poll!(&mut one)
            };
            let (r, _) = match first {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => one.await,
            };
            return r.map_err(closed_or);
        }
        let sends = {
            let _order = self.send_order.lock().await;
            let mut all = futures::future::join_all(
                std::iter::once(self.send_frame(Frame::Host(Bytes::from(header))))
                    .chain(msg.frames.into_iter().map(|f| self.send_frame(f))),
            );
            let first = futures::poll!(&mut all);
            (all, first)
        };
        let results = match sends {
            (_, std::task::Poll::Ready(r)) => r,
            (all, std::task::Poll::Pending) => all.await,
        };
        for r in results {
            r.map_err(closed_or)?;
        }
        Ok(())
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
    /// GPU can be used ([`crate::cuda`]), everything else into (pooled) host memory.
    fn recv_buffer(&self, m: &frame::FrameMeta) -> Result<RecvBuf> {
        let size = m.size as usize;
        #[cfg(feature = "cuda")]
        if m.cuda {
            if let Some(d) = crate::cuda::device_buffer(size)? {
                return Ok(RecvBuf::Cuda(d));
            }
        }
        Ok(RecvBuf::Host(crate::pool::take(size)))
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
        let _order = self.recv_order.lock().await;
        let header = self.ep.recv_vec(TAG).await.map_err(closed_or)?;
        if header.len() < frame::FIXED_LEN {
            return Err(self.refuse(format!("a {}-byte header", header.len())).await);
        }
        let fixed: &[u8; frame::FIXED_LEN] = header[..frame::FIXED_LEN].try_into().expect("fixed");
        let (channel, n) = match frame::decode_fixed(fixed, &self.limits) {
            Ok(v) => v,
            Err(e) => return Err(self.refuse_header(e).await),
        };
        let entries_end = frame::FIXED_LEN + n as usize * frame::ENTRY_LEN;
        if header.len() < entries_end {
            return Err(self
                .refuse(format!("{n} frames but a {}-byte header", header.len()))
                .await);
        }
        let metas =
            match frame::decode_entries(&header[frame::FIXED_LEN..entries_end], &self.limits) {
                Ok(m) => m,
                Err(e) => return Err(self.refuse_header(e).await),
            };
        if header.len() > entries_end {
            // An inlined message: the frames follow the entries, exactly.
            let total: u64 = metas.iter().map(|m| m.size).sum();
            if (header.len() - entries_end) as u64 != total || total > INLINE_MAX as u64 {
                return Err(self
                    .refuse(format!(
                        "{} bytes after the header for {total} bytes of frames",
                        header.len() - entries_end
                    ))
                    .await);
            }
            let all = Bytes::from(header);
            let mut at = entries_end;
            let mut frames = Vec::with_capacity(metas.len());
            for m in &metas {
                let f = all.slice(at..at + m.size as usize);
                at += m.size as usize;
                // A peer may inline a device frame too: it lands where device frames land.
                #[cfg(feature = "cuda")]
                if m.cuda {
                    frames.push(crate::cuda::from_host(f)?);
                    continue;
                }
                frames.push(Frame::Host(f));
            }
            return Ok((channel, Message { frames }));
        }
        let mut posted = Vec::with_capacity(metas.len());
        for m in &metas {
            match self.recv_buffer(m) {
                Ok(b) => posted.push(self.recv_frame(b)),
                // No device memory for this frame: the rest of the message cannot be received
                // in order any more, so the connection ends here.
                Err(e) => return Err(self.refuse(format!("receiving a device frame: {e}")).await),
            }
        }
        let recvs = futures::future::join_all(posted).await;
        let mut frames = Vec::with_capacity(recvs.len());
        for ((r, f), m) in recvs.into_iter().zip(&metas) {
            let n = r.map_err(closed_or)?;
            if n as u64 != m.size {
                return Err(self
                    .refuse(format!("a {n}-byte frame announced as {}", m.size))
                    .await);
            }
            frames.push(f);
        }
        Ok((channel, Message { frames }))
    }

    async fn refuse_header(&self, e: frame::HeaderError) -> TransportError {
        tracing::warn!(error = %e, "closing a UCX connection after a bad header");
        self.ep.abort();
        TransportError::BadHeader(e)
    }

    async fn refuse(&self, why: String) -> TransportError {
        tracing::warn!(why, "closing a UCX connection after a malformed message");
        self.ep.abort();
        TransportError::Closed(format!("malformed message from the peer: {why}"))
    }

    pub(crate) async fn close(&self) -> Result<()> {
        self.ep.close().await.map_err(closed_or)
    }
}

fn closed_or(e: ucx::Error) -> TransportError {
    if e.is_disconnect() {
        TransportError::Closed(e.to_string())
    } else {
        TransportError::Ucx(e)
    }
}
