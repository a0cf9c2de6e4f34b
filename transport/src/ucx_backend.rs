//! UCX connections over `ucx-rs`: the header as one tagged message, then one tagged message
//! per frame, all on the same tag (UCX keeps per-tag order). Each process shares one UCX
//! context and worker, set up from [`crate::UcxIntent`] (see [`crate::configure_ucx`]).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::OnceLock;

use bytes::Bytes;
use tokio::sync::Mutex;

use crate::frame::{self, Limits};
use crate::{check_outgoing, Address, Message, Result, TransportError};

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
        if msg.len() <= INLINE_MAX {
            // Small messages travel as one UCX message: header, then the frames' bytes.
            for f in &msg.frames {
                header.extend_from_slice(f);
            }
            let (r, _) = self.ep.send(header, TAG).await;
            return r.map_err(closed_or);
        }
        let sends = {
            let _order = self.send_order.lock().await;
            // join_all posts in order on its first poll, inside the lock; completions are
            // awaited after it is released.
            let mut all = futures::future::join_all(
                std::iter::once(Bytes::from(header))
                    .chain(msg.frames)
                    .map(|b| self.ep.send(b, TAG)),
            );
            let first = futures::poll!(&mut all);
            (all, first)
        };
        let results = match sends {
            (_, std::task::Poll::Ready(r)) => r,
            (all, std::task::Poll::Pending) => all.await,
        };
        for (r, _) in results {
            r.map_err(closed_or)?;
        }
        Ok(())
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
            let frames = metas
                .iter()
                .map(|m| {
                    let f = all.slice(at..at + m.size as usize);
                    at += m.size as usize;
                    f
                })
                .collect();
            return Ok((channel, Message { frames }));
        }
        let recvs = futures::future::join_all(
            metas
                .iter()
                .map(|m| self.ep.recv(crate::pool::take(m.size as usize), TAG)),
        )
        .await;
        let mut frames = Vec::with_capacity(recvs.len());
        for ((r, b), m) in recvs.into_iter().zip(&metas) {
            let n = r.map_err(closed_or)?;
            if n as u64 != m.size {
                return Err(self
                    .refuse(format!("a {n}-byte frame announced as {}", m.size))
                    .await);
            }
            frames.push(crate::pool::into_bytes(b));
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
