//! One connection API over `ucx://`, `tcp://` and `inproc://`.
//!
//! A connection carries **messages**: lists of frames, sent as one header (channel, frame
//! sizes, memory types; validated against [`frame::Limits`] on receipt) followed by the
//! frames. Messages on one connection arrive in the order they were sent; several logical
//! channels share a connection (the channel number travels in the header), and concurrent
//! senders on one connection are safe (a message's header and frames are never interleaved
//! with another's), and `recv` is cancel-safe. Frames are host memory ([`bytes::Bytes`]) or, with the `cuda` feature,
//! CUDA device buffers (see [`Frame`] and the `cuda` module).
//!
//! Features: `ucx` (default: `ucx://`, links UCX), `topology` (default: GPU/NIC locality, links
//! hwloc), `cuda` (device frames). Without the defaults, `tcp://` and `inproc://` need no system
//! library, and a `ucx://` address fails with [`TransportError::NotBuilt`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), transport::TransportError> {
//! use transport::{connect, listen, Message};
//! let mut listener = listen(&"tcp://127.0.0.1:0".parse()?).await?;
//! let addr = listener.local_addr().clone();
//! let (server, client) = tokio::join!(listener.accept(), connect(&addr));
//! let (server, client) = (server?, client?);
//! client.send(3, Message::from(vec![b"header".to_vec(), vec![7u8; 1000]])).await?;
//! let (channel, msg) = server.recv().await?;
//! assert_eq!((channel, msg.frames.len(), msg.frames[1].len()), (3, 2, 1000));
//! assert_eq!(msg.host(0), Some(&b"header"[..]));
//! # Ok(()) }
//! ```

pub mod address;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod frame;
mod inproc;
mod message;
mod pool;
mod tcp;
#[cfg(feature = "topology")]
pub mod topology;
#[cfg(feature = "ucx")]
mod ucx_backend;
#[cfg(feature = "ucx")]
pub mod ucx_config;

use std::time::Duration;

pub use address::{Address, AddressError};
pub use message::{Frame, Message};
#[cfg(feature = "ucx")]
pub use ucx_config::{configure_ucx, UcxIntent};

/// The UCX tag a `ucx://` connection's headers and frames travel on. For peers that speak the
/// wire format with `ucx-rs` (or UCXX) directly: a message's first UCX message is at most
/// [`UCX_FIRST_MAX`] bytes, either the whole message (the [`frame`] header followed by every
/// frame's bytes, host frames only) or its header (in two UCX messages when longer than
/// `UCX_FIRST_MAX`, split there), then one UCX message per frame; a message of 0 bytes has no
/// frame messages. A sender may have [`UCX_WINDOW`] messages the receiving application has not
/// taken; the receiver grants them back on [`UCX_CREDIT_TAG`].
#[cfg(feature = "ucx")]
pub const UCX_TAG: ucx::Tag = ucx_backend::TAG;
/// The most bytes in the first UCX message of a `ucx://` message (its receive is posted ahead).
pub const UCX_FIRST_MAX: usize = 8 << 10;
/// The tag `ucx://` credit grants travel on: a little-endian `u32`, messages taken.
#[cfg(feature = "ucx")]
pub const UCX_CREDIT_TAG: ucx::Tag = ucx_backend::CREDIT_TAG;
/// Messages a `ucx://` sender may have that the peer's application has not taken.
#[cfg(feature = "ucx")]
pub const UCX_WINDOW: u32 = ucx_backend::WINDOW;

#[cfg(not(feature = "ucx"))]
const UCX_NOT_BUILT: TransportError = TransportError::NotBuilt {
    scheme: "ucx",
    feature: "ucx",
};

/// Time limit for [`connect`].
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything that can go wrong on a connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The address did not parse.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// The peer is gone or the connection was closed.
    #[error("connection closed: {0}")]
    Closed(String),
    /// A header from the peer was refused; the connection is closed.
    #[error("bad message header from the peer: {0}")]
    BadHeader(#[from] frame::HeaderError),
    /// Connecting did not finish in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// An operating-system error (TCP).
    #[error("{0}")]
    Io(String),
    /// An error from UCX.
    #[cfg(feature = "ucx")]
    #[error("UCX: {0}")]
    Ucx(#[from] ucx::Error),
    /// The address's scheme needs a feature this build of `transport` does not have.
    #[error("{scheme}:// is not built in: enable transport's `{feature}` feature")]
    NotBuilt {
        /// The scheme asked for.
        scheme: &'static str,
        /// The cargo feature that provides it.
        feature: &'static str,
    },
    /// Nothing listens on that `inproc://` name, or it is taken.
    #[error("{0}")]
    Inproc(String),
    /// The transport configuration is inconsistent or came too late.
    #[error("configuration: {0}")]
    Config(String),
}

impl From<std::io::Error> for TransportError {
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::UnexpectedEof | K::ConnectionReset | K::BrokenPipe | K::ConnectionAborted => {
                TransportError::Closed(e.to_string())
            }
            _ => TransportError::Io(e.to_string()),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = TransportError> = std::result::Result<T, E>;

/// Accepts connections on an address.
#[derive(Debug)]
pub struct Listener {
    inner: ListenerInner,
    local: Address,
}

#[derive(Debug)]
enum ListenerInner {
    Inproc(inproc::Listener),
    Tcp(tcp::Listener),
    #[cfg(feature = "ucx")]
    Ucx(ucx_backend::Listener),
}

/// A connection carrying messages; see the crate docs.
#[derive(Debug)]
pub struct Connection {
    inner: std::sync::Arc<ConnInner>,
    peer: Address,
    /// One receiver at a time. A `recv` dropped mid-way (`select!`, a timeout) leaves its
    /// receive here and the next `recv` goes on with it: no message, or part of one, is lost.
    recv_slot: tokio::sync::Mutex<Box<dyn RecvSlot>>,
}

/// Where a connection's receive of one whole message lives while it is in progress: allocated
/// once per connection and refilled in place, so a receive costs no allocation.
trait RecvSlot: Send {
    /// Polls the receive in progress, starting one first if there is none.
    fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(u32, Message)>>;
}

struct Slot<F, M> {
    receiving: std::pin::Pin<Box<Option<F>>>,
    start: M,
}

impl<F, M> RecvSlot for Slot<F, M>
where
    F: std::future::Future<Output = Result<(u32, Message)>> + Send,
    M: Fn() -> F + Send,
{
    fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(u32, Message)>> {
        if self.receiving.is_none() {
            self.receiving.as_mut().set(Some((self.start)()));
        }
        let Some(receiving) = self.receiving.as_mut().as_pin_mut() else {
            unreachable!("filled just above")
        };
        let r = std::task::ready!(receiving.poll(cx));
        self.receiving.as_mut().set(None);
        std::task::Poll::Ready(r)
    }
}

impl std::fmt::Debug for dyn RecvSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecvSlot")
    }
}

#[derive(Debug)]
enum ConnInner {
    Inproc(inproc::Conn),
    Tcp(tcp::Conn),
    #[cfg(feature = "ucx")]
    Ucx(ucx_backend::Conn),
}

/// Listens on `addr` (port 0 picks a free port; see [`Listener::local_addr`]).
pub async fn listen(addr: &Address) -> Result<Listener> {
    let (inner, local) = match addr {
        Address::Inproc(name) => (ListenerInner::Inproc(inproc::listen(name)?), addr.clone()),
        Address::Tcp { host, port } => {
            let l = tcp::listen(host, *port).await?;
            let local = l.local();
            (ListenerInner::Tcp(l), local)
        }
        #[cfg(feature = "ucx")]
        Address::Ucx { host, port } => {
            let l = ucx_backend::listen(host, *port).await?;
            let local = l.local();
            (ListenerInner::Ucx(l), local)
        }
        #[cfg(not(feature = "ucx"))]
        Address::Ucx { .. } => return Err(UCX_NOT_BUILT),
    };
    tracing::debug!(%local, "listening");
    Ok(Listener { inner, local })
}

/// Connects to `addr` within [`CONNECT_TIMEOUT`].
pub async fn connect(addr: &Address) -> Result<Connection> {
    let attempt = async {
        Ok::<_, TransportError>(match addr {
            Address::Inproc(name) => ConnInner::Inproc(inproc::connect(name).await?),
            Address::Tcp { host, port } => ConnInner::Tcp(tcp::connect(host, *port).await?),
            #[cfg(feature = "ucx")]
            Address::Ucx { host, port } => ConnInner::Ucx(ucx_backend::connect(host, *port).await?),
            #[cfg(not(feature = "ucx"))]
            Address::Ucx { .. } => return Err(UCX_NOT_BUILT),
        })
    };
    let inner = tokio::time::timeout(CONNECT_TIMEOUT, attempt)
        .await
        .map_err(|_| TransportError::Timeout(CONNECT_TIMEOUT))??;
    tracing::debug!(peer = %addr, "connected");
    Ok(Connection::new(inner, addr.clone()))
}

impl Listener {
    /// The next connection.
    pub async fn accept(&mut self) -> Result<Connection> {
        let (inner, peer) = match &mut self.inner {
            ListenerInner::Inproc(l) => (ConnInner::Inproc(l.accept().await?), self.local.clone()),
            ListenerInner::Tcp(l) => {
                let (c, peer) = l.accept().await?;
                (ConnInner::Tcp(c), peer)
            }
            #[cfg(feature = "ucx")]
            ListenerInner::Ucx(l) => {
                let (c, peer) = l.accept().await?;
                (ConnInner::Ucx(c), peer)
            }
        };
        Ok(Connection::new(inner, peer))
    }

    /// The bound address (port 0 resolved).
    pub fn local_addr(&self) -> &Address {
        &self.local
    }
}

impl Connection {
    fn new(inner: ConnInner, peer: Address) -> Connection {
        let inner = std::sync::Arc::new(inner);
        let conn = std::sync::Arc::clone(&inner);
        let start = move || {
            let conn = std::sync::Arc::clone(&conn);
            async move {
                match &*conn {
                    ConnInner::Inproc(c) => c.recv().await,
                    ConnInner::Tcp(c) => c.recv().await,
                    #[cfg(feature = "ucx")]
                    ConnInner::Ucx(c) => c.recv().await,
                }
            }
        };
        Connection {
            inner,
            peer,
            recv_slot: tokio::sync::Mutex::new(Box::new(Slot {
                receiving: Box::pin(None),
                start,
            })),
        }
    }

    /// Sends `msg` on `channel`. Waits while the peer is not keeping up (bounded buffering).
    pub async fn send(&self, channel: u32, msg: Message) -> Result<()> {
        match &*self.inner {
            ConnInner::Inproc(c) => c.send(channel, msg).await,
            ConnInner::Tcp(c) => c.send(channel, msg).await,
            #[cfg(feature = "ucx")]
            ConnInner::Ucx(c) => c.send(channel, msg).await,
        }
    }

    /// The next message, with its channel.
    ///
    /// Cancel-safe: a `recv` dropped before it returns (in `select!`, under a timeout) loses
    /// nothing; the next `recv` resumes it.
    pub async fn recv(&self) -> Result<(u32, Message)> {
        let mut slot = self.recv_slot.lock().await;
        std::future::poll_fn(|cx| slot.poll_recv(cx)).await
    }

    /// Closes the connection; the peer's pending `recv` fails with [`TransportError::Closed`].
    pub async fn close(&self) -> Result<()> {
        match &*self.inner {
            ConnInner::Inproc(c) => c.close(),
            ConnInner::Tcp(c) => c.close().await,
            #[cfg(feature = "ucx")]
            ConnInner::Ucx(c) => c.close().await,
        }
    }

    /// The address this connection goes to (for accepted ones: where the peer came from).
    pub fn peer_addr(&self) -> &Address {
        &self.peer
    }
}

/// Checks a message against the limits before sending (the receiver would refuse it).
fn check_outgoing(msg: &Message, limits: &frame::Limits) -> Result<()> {
    let n = u32::try_from(msg.frames.len()).unwrap_or(u32::MAX);
    if n > limits.max_frames {
        return Err(frame::HeaderError::TooManyFrames {
            got: n,
            max: limits.max_frames,
        }
        .into());
    }
    let total = msg.len() as u64;
    if total > limits.max_message {
        return Err(frame::HeaderError::TooLarge {
            got: total,
            max: limits.max_message,
        }
        .into());
    }
    Ok(())
}

/// `msg`'s header on `channel`.
fn encode_header(channel: u32, msg: &Message) -> Vec<u8> {
    let mut h = Vec::with_capacity(frame::header_len(msg.frames.len()));
    frame::encode_into(&mut h, channel, header_metas(msg));
    h
}

/// How the header describes `msg`'s frames.
fn header_metas(msg: &Message) -> impl ExactSizeIterator<Item = frame::FrameMeta> + '_ {
    msg.frames.iter().map(|f| frame::FrameMeta {
        size: f.len() as u64,
        cuda: f.is_cuda(),
    })
}
