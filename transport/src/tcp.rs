//! TCP connections (tokio + socket2): `TCP_NODELAY`, keepalive, a header then the frames
//! (device frames staged through host memory on both sides).
//! A garbage header closes the connection; nothing is allocated from unchecked sizes.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

use crate::frame::{self, Limits};
use crate::{check_outgoing, encode_header, Address, Frame, Message, Result, TransportError};

#[derive(Debug)]
pub(crate) struct Listener {
    inner: TcpListener,
}

#[derive(Debug)]
pub(crate) struct Conn {
    reader: Mutex<OwnedReadHalf>,
    writer: Mutex<OwnedWriteHalf>,
    limits: Limits,
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

pub(crate) async fn connect(host: &str, port: u16) -> Result<Conn> {
    let s = TcpStream::connect((host, port)).await?;
    tune(&s)?;
    Ok(Conn::new(s))
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

    pub(crate) async fn accept(&mut self) -> Result<(Conn, Address)> {
        let (s, peer) = self.inner.accept().await?;
        tune(&s)?;
        Ok((Conn::new(s), to_address(peer)))
    }
}

impl Conn {
    fn new(s: TcpStream) -> Conn {
        let (r, w) = s.into_split();
        Conn {
            reader: Mutex::new(r),
            writer: Mutex::new(w),
            limits: Limits::default(),
        }
    }

    pub(crate) async fn send(&self, channel: u32, msg: Message) -> Result<()> {
        check_outgoing(&msg, &self.limits)?;
        let header = encode_header(channel, &msg);
        // Device frames are staged through host memory, before anything is written: a copy
        // that fails must not leave half a message on the wire.
        let staged = if msg.has_cuda() {
            msg.to_host()?
        } else {
            Vec::new()
        };
        // One writer at a time: a message's header and frames are never interleaved.
        let mut w = self.writer.lock().await;
        w.write_all(&header).await?;
        for (i, f) in msg.frames.iter().enumerate() {
            match f.as_host() {
                Some(b) => w.write_all(b).await?,
                None => w.write_all(&staged[i]).await?,
            }
        }
        Ok(())
    }

    pub(crate) async fn recv(&self) -> Result<(u32, Message)> {
        let mut r = self.reader.lock().await;
        let mut fixed = [0u8; frame::FIXED_LEN];
        r.read_exact(&mut fixed).await?;
        let (channel, n) = match frame::decode_fixed(&fixed, &self.limits) {
            Ok(v) => v,
            Err(e) => return Err(self.refuse(e).await),
        };
        let mut entries = vec![0u8; n as usize * frame::ENTRY_LEN];
        r.read_exact(&mut entries).await?;
        let metas = match frame::decode_entries(&entries, &self.limits) {
            Ok(m) => m,
            Err(e) => return Err(self.refuse(e).await),
        };
        let mut frames = Vec::with_capacity(metas.len());
        for m in metas {
            let size = m.size as usize;
            let mut b = crate::pool::take(size);
            // Pooled buffers are already initialised up to their old length: only grow.
            if b.len() < size {
                b.resize(size, 0);
            }
            b.truncate(size);
            r.read_exact(&mut b).await?;
            let bytes = crate::pool::into_bytes(b);
            #[cfg(feature = "cuda")]
            if m.cuda {
                match crate::cuda::from_host(bytes) {
                    Ok(d) => frames.push(d),
                    Err(e) => {
                        // The message is lost: the connection ends rather than skip it.
                        tracing::warn!(error = %e, "closing a TCP connection: a device frame could not land");
                        let _ = self.writer.lock().await.shutdown().await;
                        return Err(e);
                    }
                }
                continue;
            }
            frames.push(Frame::Host(bytes));
        }
        Ok((channel, Message { frames }))
    }

    async fn refuse(&self, e: frame::HeaderError) -> TransportError {
        tracing::warn!(error = %e, "closing a TCP connection after a bad header");
        let _ = self.writer.lock().await.shutdown().await;
        TransportError::BadHeader(e)
    }

    pub(crate) async fn close(&self) -> Result<()> {
        self.writer.lock().await.shutdown().await?;
        Ok(())
    }
}
