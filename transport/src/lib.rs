//! One connection API over `ucx://`, `tcp://` and `inproc://`.
//!
//! A connection carries **messages**: lists of frames, sent as one header (channel, frame
//! sizes, memory types; validated against [`frame::Limits`] on receipt) followed by the
//! frames. Frames are host memory ([`bytes::Bytes`]) or, with the `cuda` feature, CUDA device
//! buffers (see [`Frame`] and the `cuda` module).
//!
//! How to use a connection:
//! 1. [`listen`] / [`connect`] (or [`listen_with`] / [`connect_with`] and [`Options`]: limits,
//!    connect timeout, the `ucx://` credit window);
//! 2. [`Connection::send`] and [`Connection::recv`]. Messages arrive in the order they were
//!    sent, whatever their channel: a connection is one ordered stream, so a large message
//!    delays what is sent after it (keep bulk data on a connection of its own). Concurrent
//!    senders are safe (a message's header and frames are never interleaved with another's),
//!    and `recv` is cancel-safe. A `send` dropped part-way through a message closes a `tcp://`
//!    connection (what is on the wire cannot be taken back); on `ucx://` and `inproc://` a
//!    posted message is delivered whole. For bursts of small messages,
//!    [`Connection::send_batch`] and [`Connection::recv_many`];
//! 3. [`Connection::close`]: the peer's `recv` then fails with
//!    [`CloseReason::PeerClosed`], after everything sent before. A peer that goes away without
//!    closing is [`CloseReason::PeerFailed`], one that breaks the wire format
//!    [`CloseReason::Refused`]. [`Connection::closed`] waits for either.
//!
//! Features: `ucx` (default: `ucx://`, links UCX), `topology` (default: GPU/NIC locality, links
//! hwloc), `cuda` (device frames). Without the defaults, `tcp://` and `inproc://` need no system
//! library, and a `ucx://` address fails with [`Error::NotBuilt`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), transport::Error> {
//! use transport::{connect, listen, CloseReason, Message, Error};
//! let mut listener = listen(&"tcp://127.0.0.1:0".parse()?).await?;
//! let addr = listener.local_addr().clone();
//! let (server, client) = tokio::join!(listener.accept(), connect(&addr));
//! let (server, client) = (server?, client?);
//! client.send(3, Message::from(vec![b"header".to_vec(), vec![7u8; 1000]])).await?;
//! let (channel, msg) = server.recv().await?;
//! assert_eq!((channel, msg.frames.len(), msg.frames[1].len()), (3, 2, 1000));
//! assert_eq!(msg.host(0), Some(&b"header"[..]));
//! client.close().await?;
//! assert!(matches!(server.recv().await, Err(Error::Closed(CloseReason::PeerClosed))));
//! # Ok(()) }
//! ```

pub mod address;
pub mod auth;
#[cfg(feature = "ucx")]
mod budget;
mod connection;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
pub mod frame;
mod handle;
mod inproc;
mod message;
mod pool;
mod tcp;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "topology")]
pub mod topology;
#[cfg(feature = "ucx")]
mod ucx_backend;
#[cfg(feature = "ucx")]
pub mod ucx_config;
#[cfg(feature = "ucx")]
pub mod ucx_lanes;

use std::sync::Arc;
use std::time::Duration;

pub use address::{Address, AddressError};
#[cfg(feature = "ucx")]
pub use budget::{receive_budget, set_receive_budget, BudgetInUse, DEFAULT_RECEIVE_BUDGET};
use bytes::{Bytes, BytesMut};
pub use connection::Connection;
#[cfg(feature = "ucx")]
pub(crate) use connection::Received;
pub(crate) use connection::{CloseState, ConnInner};
pub use error::{CloseReason, Error, Failure, InprocError, ProtocolError, Refusal};
pub use handle::{Transport, TransportConfig};

/// The name [`Error`] had before every crate's error became its `Error` (`ucx::Error`,
/// `transport::Error`, `dask_comm::Error`).
#[deprecated(note = "renamed transport::Error")]
pub type TransportError = Error;
pub use message::{Frame, Message};
#[cfg(feature = "ucx")]
pub use ucx_config::{configure_ucx, UcxIntent, DEFAULT_SAME_HOST_RING};

/// The UCX tag a `ucx://` connection's headers and frames travel on. For peers that speak the
/// wire format with `ucx-rs` (or UCXX) directly: a message's first UCX message is at most
/// [`UCX_FIRST_MAX`] bytes, either the whole message (the [`frame`] header followed by every
/// frame's bytes, host frames only) or its header (in two UCX messages when longer than
/// `UCX_FIRST_MAX`, split there), then one UCX message per frame; a message of 0 bytes has no
/// frame messages. A sender may have [`Options::credit_bytes`] of messages the receiving
/// application has not taken (each counted as [`ucx_charge`]); the receiver grants them back
/// on [`UCX_CREDIT_TAG`] every [`UCX_GRANT_EVERY`] bytes. Before anything else (and before
/// the secret's challenge) each side sends a ring offer on [`UCX_RING_OFFER_TAG`] and a
/// verdict on [`UCX_RING_VERDICT_TAG`] for the peer's offer; a peer that has no ring and
/// takes none sends `[0]` on each (docs/transport.md, "Which lane carries what on one host").
#[cfg(feature = "ucx")]
pub const UCX_TAG: ucx::Tag = ucx_backend::TAG;
/// The tag of a `ucx://` connection's ring offer (see [`UCX_TAG`]).
#[cfg(feature = "ucx")]
pub const UCX_RING_OFFER_TAG: ucx::Tag = ucx_backend::ring_exchange::RING_OFFER_TAG;
/// The tag of a `ucx://` connection's verdict on the peer's ring offer (see [`UCX_TAG`]).
#[cfg(feature = "ucx")]
pub const UCX_RING_VERDICT_TAG: ucx::Tag = ucx_backend::ring_exchange::RING_VERDICT_TAG;
/// The most bytes in the first UCX message of a `ucx://` message (its receive is posted ahead):
/// 64 KiB of frames and 1 KiB of header, so a message of up to 64 KiB crosses as one UCX
/// message (one transfer, one wake-up; across hosts, a second UCX message cost 1.2-1.4× at
/// 64 KiB).
pub const UCX_FIRST_MAX: usize = 65 << 10;
/// The tag `ucx://` credit grants travel on: a little-endian `u64`, bytes granted back.
#[cfg(feature = "ucx")]
pub const UCX_CREDIT_TAG: ucx::Tag = ucx_backend::CREDIT_TAG;
/// A `ucx://` receiver grants credits back once the application took this many bytes' worth.
pub const UCX_GRANT_EVERY: u64 = 256 << 10;
/// The most one message counts against a `ucx://` credit window.
pub const UCX_CHARGE_CAP: u64 = 512 << 10;
/// The smallest [`UcxIntent::same_host_ring`] (other than 0) and the largest.
pub const UCX_RING_MIN: u64 = 1 << 20;
/// See [`UCX_RING_MIN`].
pub const UCX_RING_MAX: u64 = 1 << 36;

/// What one message of `len` bytes counts against a `ucx://` credit window: its bytes plus 64
/// (so empty messages count too), at most [`UCX_CHARGE_CAP`] (rendezvous frames wait for the
/// receiver anyway).
///
/// ```
/// assert_eq!(transport::ucx_charge(0), 64);
/// assert_eq!(transport::ucx_charge(1 << 30), transport::UCX_CHARGE_CAP);
/// ```
pub fn ucx_charge(len: usize) -> u64 {
    (len as u64).saturating_add(64).min(UCX_CHARGE_CAP)
}

/// A zeroed buffer of `len` bytes to build a large message in. From 2 MiB up the kernel is
/// asked to back it with transparent huge pages (`MADV_HUGEPAGE`), as the transport's own
/// receive buffers are and as UCX's allocations (`ucx_perftest`'s buffers among them) are:
/// every copy through memory of 4 KiB pages (the kernel's socket copies, UCX's) takes a TLB
/// miss per page (`ucx::host_buffer`; in builds without the `ucx` feature a plain vector).
///
/// ```
/// let b = transport::host_buffer(4 << 20);
/// assert_eq!(b.len(), 4 << 20);
/// assert!(b.iter().all(|&x| x == 0));
/// let msg = transport::Message::from(vec![b]);
/// assert_eq!(msg.len(), 4 << 20);
/// ```
pub fn host_buffer(len: usize) -> Vec<u8> {
    #[cfg(feature = "ucx")]
    return ucx::host_buffer(len);
    #[cfg(not(feature = "ucx"))]
    vec![0; len]
}

/// The process's `ucx://` worker (made on first use, with [`UcxIntent::progress`]'s mode). With
/// `ucx::ProgressMode::External` nothing progresses it but its user: an event loop that
/// watches its event fd ([`ucx::Worker::event_fd`]) and calls
/// [`ucx::Worker::progress_and_arm`] when it is readable, so that a message wakes the thread
/// that waits for it and no other (the Python package's Dask comm does this). The backend
/// never replaces an External worker (in other modes a connect that UCX wedged makes it use a
/// fresh one), so its user may keep the one it got.
#[cfg(feature = "ucx")]
pub fn ucx_worker() -> Result<ucx::Worker> {
    Transport::global().ucx_worker()
}

/// A received frame as memory of the caller's own, to write to: without a copy when the
/// frame is the only handle to a plain buffer (a connection with
/// [`Options::reclaimable_frames`] receives such frames), else copied into a buffer from the
/// receive pool (mapped already, huge pages asked for). `None` when the memory for a copy
/// cannot be had. Give the buffer back with [`recycle_buffer`] once done.
///
/// ```
/// let shared = bytes::Bytes::from(vec![7u8; 100 << 10]);
/// let at = shared.as_ptr();
/// let mut mine = transport::writable(shared).unwrap();
/// assert_eq!((mine.len(), mine.as_ptr()), (100 << 10, at)); // the same memory
/// mine[0] = 1;
/// transport::recycle_buffer(mine.into());
/// let pooled = bytes::Bytes::from_static(&[3u8; 10]);
/// assert_eq!(&transport::writable(pooled).unwrap()[..], &[3u8; 10]); // a copy
/// ```
pub fn writable(frame: Bytes) -> Option<BytesMut> {
    match frame.try_into_mut() {
        Ok(mine) => Some(mine),
        Err(shared) => pool::owned_copy(&shared).map(|v| BytesMut::from(Bytes::from(v))),
    }
}

/// Gives a buffer back to the receive pool, which keeps it for a later receive of a similar
/// size while it holds less than 512 MiB (small buffers are freed).
pub fn recycle_buffer(v: Vec<u8>) {
    pool::recycle(v)
}

/// The channel a connection's close travels on; applications use the channels below it.
pub const CLOSE_CHANNEL: u32 = u32::MAX;

/// Time limit for [`connect`] (see [`Options::connect_timeout`]).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of a listener's or a connection's side.
///
/// ```
/// let opts = transport::Options {
///     limits: transport::frame::Limits { max_frames: 16, max_message: 1 << 20 },
///     ..Default::default()
/// };
/// assert!(opts.validate().is_ok());
/// let bad = transport::Options { credit_bytes: 1000, ..Default::default() };
/// assert!(bad.validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// What the peer may announce in one message (refused before anything is allocated), and
    /// what this side may send.
    pub limits: frame::Limits,
    /// Limit for connecting (name resolution, connection, handshake).
    pub connect_timeout: Duration,
    /// `ucx://`: bytes of messages this side may have sent that the peer's application has not
    /// taken (each counted as [`ucx_charge`]); sends wait beyond it. At least
    /// 2 × [`UCX_CHARGE_CAP`] (1 MiB). `tcp://` is bounded by its socket buffers and
    /// `inproc://` by a channel of 64 messages instead.
    pub credit_bytes: u64,
    /// A shared secret both sides must prove before anything else ([`auth`]): a listener
    /// with one hands out only connections that proved it (strangers are dropped and
    /// logged), and a connect with one fails with [`Error::Auth`] unless the
    /// listener knows it too. `None` (the default): no challenge.
    pub secret: Option<auth::Secret>,
    /// `tls://`: the certificates this side presents and trusts (required there; see
    /// [`tls`]). Other schemes ignore it.
    #[cfg(feature = "tls")]
    pub tls: Option<tls::TlsConfig>,
    /// `tcp://`, `tls://`: before a receive parks on the event loop, poll it for this long,
    /// yielding to the runtime between polls (a kernel wake-up costs tens of µs on a VM).
    /// Only while the connection is in a conversation: a receive spins when the one before it
    /// found its message within the spin (or, parked, within twice the spin), so a connection
    /// that waits long between messages parks at once and costs no CPU. [`DEFAULT_TCP_SPIN`]
    /// by default; zero: never spin.
    pub tcp_spin: Duration,
    /// `ucx://`: after connecting, move to endpoints connected by the peers' worker addresses
    /// (shared memory on one host, the fabric's own lanes across hosts; see [`ucx_lanes`]). A
    /// client-server endpoint also carries the listener's TCP lanes, which cost latency and
    /// bandwidth. Like [`Options::secret`], both sides must set it: a connector that sets it
    /// against a listener that does not times out, and such a listener drops a connector that
    /// does not within its time limit. Off by default: with UCX 1.13, a process whose moved
    /// peers died may find later connects hang inside UCX (docs/transport.md).
    pub ucx_direct: bool,
    /// `ucx://`, `tcp://`: hand received host frames out as plain `Vec`-backed [`Bytes`], so
    /// that [`writable`] turns each back into its buffer without a copy (for consumers that
    /// pass frames on as writable memory: the Python package's Dask comm), each shrunk to its
    /// length first when the pooled buffer had more than 1/8 to spare. Their memory then goes
    /// back to the receive pool only through [`recycle_buffer`]. Off by default: a dropped
    /// frame returns to the pool by itself. On `ucx://` the frames of a message of at most
    /// 64 KiB in all arrive as slices of one buffer, which [`writable`] copies.
    pub reclaimable_frames: bool,
}

/// [`Options::tcp_spin`]'s default: longer than a round trip between two processes on one
/// host or across a LAN (5–50 µs), shorter than the kernel's wake-up on a loaded VM is long.
pub const DEFAULT_TCP_SPIN: Duration = Duration::from_micros(50);

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: frame::Limits::default(),
            connect_timeout: CONNECT_TIMEOUT,
            credit_bytes: 8 << 20,
            secret: None,
            #[cfg(feature = "tls")]
            tls: None,
            tcp_spin: DEFAULT_TCP_SPIN,
            ucx_direct: false,
            reclaimable_frames: false,
        }
    }
}

impl Options {
    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<()> {
        if self.credit_bytes < 2 * UCX_CHARGE_CAP {
            return Err(Error::Config(format!(
                "credit_bytes {} is below the least window, {} bytes",
                self.credit_bytes,
                2 * UCX_CHARGE_CAP
            )));
        }
        if self.limits.max_frames == 0 {
            return Err(Error::Config("max_frames is 0".into()));
        }
        Ok(())
    }
}

/// A connection's limits, changeable while it runs ([`Connection::set_limits`]).
#[derive(Debug)]
pub(crate) struct SharedLimits {
    max_frames: std::sync::atomic::AtomicU32,
    max_message: std::sync::atomic::AtomicU64,
}

impl SharedLimits {
    pub(crate) fn new(l: frame::Limits) -> SharedLimits {
        SharedLimits {
            max_frames: l.max_frames.into(),
            max_message: l.max_message.into(),
        }
    }

    pub(crate) fn get(&self) -> frame::Limits {
        use std::sync::atomic::Ordering::Relaxed;
        frame::Limits {
            max_frames: self.max_frames.load(Relaxed),
            max_message: self.max_message.load(Relaxed),
        }
    }

    pub(crate) fn set(&self, l: frame::Limits) {
        use std::sync::atomic::Ordering::Relaxed;
        self.max_frames.store(l.max_frames, Relaxed);
        self.max_message.store(l.max_message, Relaxed);
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Accepts connections on an address.
#[derive(Debug)]
pub struct Listener {
    inner: ListenerInner,
    local: Address,
    opts: Options,
    /// The transport it belongs to.
    shared: Arc<handle::Shared>,
    /// Accepted connections being set up (TLS handshake, secret challenge), at most
    /// [`MAX_PENDING_ACCEPTS`] at a time.
    pending: futures::stream::FuturesUnordered<SetUp>,
}

/// A connection being set up: the connection, or who failed and why.
type SetUp = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Connection, (Address, Error)>> + Send>,
>;

/// The most accepted connections a listener sets up (TLS handshake, secret challenge) at
/// once; beyond, it accepts no more until some finish (each within
/// [`Options::connect_timeout`] for TLS and [`auth::HANDSHAKE_TIMEOUT`] per challenge step).
pub const MAX_PENDING_ACCEPTS: usize = 256;

/// A connection from a backend's accept.
enum Accepted {
    /// Ready to use (or to challenge).
    Ready(Connection),
    /// A socket whose TLS handshake comes next.
    #[cfg(feature = "tls")]
    Tls(tokio::net::TcpStream, Address, tls::TlsConfig),
}

impl ListenerInner {
    /// `ucx://` connections run the lanes exchange ([`ucx_lanes`]) before they are handed out.
    fn is_ucx(&self) -> bool {
        #[cfg(feature = "ucx")]
        if matches!(self, ListenerInner::Ucx(..)) {
            return true;
        }
        false
    }

    fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        if matches!(self, ListenerInner::Tls(..)) {
            return true;
        }
        false
    }
}

/// Sets an accepted connection up: the TLS handshake (within `opts.connect_timeout`), the
/// `ucx://` lanes exchange with [`Options::ucx_direct`] ([`ucx_lanes`]) and the ring exchange
/// (`ucx_backend::ring_exchange`), then the challenge if `opts` has a secret.
#[cfg_attr(not(feature = "tls"), allow(clippy::infallible_destructuring_match))]
fn set_up(accepted: Accepted, opts: Options, shared: Arc<handle::Shared>) -> SetUp {
    #[cfg(not(feature = "ucx"))]
    let _ = shared;
    Box::pin(async move {
        let conn = match accepted {
            Accepted::Ready(c) => c,
            #[cfg(feature = "tls")]
            Accepted::Tls(socket, peer, config) => {
                let state = Arc::new(CloseState::default());
                let handshake = tcp::accept_tls(socket, &opts, &config, Arc::clone(&state));
                match tokio::time::timeout(opts.connect_timeout, handshake).await {
                    Ok(Ok(c)) => Connection::new(ConnInner::Tcp(c), peer, state),
                    Ok(Err(e)) => return Err((peer, e)),
                    Err(_) => return Err((peer, Error::Timeout(opts.connect_timeout))),
                }
            }
        };
        #[cfg(feature = "ucx")]
        if let (ConnInner::Ucx(c), true) = (&*conn.inner, opts.ucx_direct) {
            let deadline = std::time::Instant::now() + opts.connect_timeout;
            let settled = ucx_lanes::settle(c, ucx_lanes::Role::Acceptor, &opts, deadline).await;
            if let Err(e) = settled {
                let _ = conn.close().await;
                return Err((conn.peer_addr().clone(), e));
            }
        }
        #[cfg(feature = "ucx")]
        if let ConnInner::Ucx(c) = &*conn.inner {
            let deadline = std::time::Instant::now() + opts.connect_timeout;
            let size = shared.intent().ring_bytes();
            if let Err(e) = ucx_backend::ring_exchange::exchange(c, size, deadline).await {
                let _ = conn.close().await;
                return Err((conn.peer_addr().clone(), e));
            }
        }
        if let Some(secret) = &opts.secret {
            if let Err(e) = auth::accept(&conn, secret, opts.limits).await {
                return Err((conn.peer_addr().clone(), e.into()));
            }
        }
        Ok(conn)
    })
}

#[derive(Debug)]
enum ListenerInner {
    Inproc(inproc::Listener),
    Tcp(tcp::Listener),
    #[cfg(feature = "tls")]
    Tls(tcp::Listener, tls::TlsConfig),
    #[cfg(feature = "ucx")]
    Ucx(ucx_backend::Listener),
}

/// The next connection from the backend, not set up.
async fn accept_raw(
    inner: &mut ListenerInner,
    opts: &Options,
    local: &Address,
) -> Result<Accepted> {
    let state = Arc::new(CloseState::default());
    let (inner, peer) = match inner {
        ListenerInner::Inproc(l) => {
            let (c, peer) = l.accept(opts).await?;
            (ConnInner::Inproc(c), peer)
        }
        ListenerInner::Tcp(l) => {
            let (c, peer) = l.accept(opts, Arc::clone(&state)).await?;
            (ConnInner::Tcp(c), peer)
        }
        #[cfg(feature = "ucx")]
        ListenerInner::Ucx(l) => {
            let (c, peer) = l.accept(opts, Arc::clone(&state)).await?;
            (ConnInner::Ucx(c), peer)
        }
        #[cfg(feature = "tls")]
        ListenerInner::Tls(l, config) => {
            let (socket, peer) = l.accept_socket().await?;
            let Address::Tcp { host, port } = peer else {
                unreachable!("a TCP peer's address")
            };
            let peer = Address::Tls { host, port };
            tracing::debug!(%local, %peer, "accepted");
            return Ok(Accepted::Tls(socket, peer, config.clone()));
        }
    };
    tracing::debug!(%local, %peer, "accepted");
    Ok(Accepted::Ready(Connection::new(inner, peer, state)))
}

#[cfg(not(feature = "ucx"))]
const UCX_NOT_BUILT: Error = Error::NotBuilt {
    scheme: "ucx",
    feature: "ucx",
};

#[cfg(not(feature = "tls"))]
const TLS_NOT_BUILT: Error = Error::NotBuilt {
    scheme: "tls",
    feature: "tls",
};

/// `tls://` needs certificates.
#[cfg(feature = "tls")]
fn tls_of(opts: &Options) -> Result<&tls::TlsConfig> {
    opts.tls
        .as_ref()
        .ok_or_else(|| Error::Config("tls:// needs Options::tls (see transport::tls)".into()))
}

/// Listens on `addr` with the default [`Options`] (port 0 picks a free port; see
/// [`Listener::local_addr`]).
pub async fn listen(addr: &Address) -> Result<Listener> {
    listen_with(addr, &Options::default()).await
}

/// Listens on `addr`; accepted connections get `opts` (on [`Transport::global`]).
pub async fn listen_with(addr: &Address, opts: &Options) -> Result<Listener> {
    Transport::global().listen_with(addr, opts).await
}

/// Listens on `addr` for the transport `shared`.
pub(crate) async fn listen_on(
    shared: &Arc<handle::Shared>,
    addr: &Address,
    opts: &Options,
) -> Result<Listener> {
    opts.validate()?;
    let (inner, local) = match addr {
        Address::Inproc(name) => (ListenerInner::Inproc(inproc::listen(name)?), addr.clone()),
        Address::Tcp { host, port } => {
            let l = tcp::listen(host, *port).await?;
            let local = l.local();
            (ListenerInner::Tcp(l), local)
        }
        #[cfg(feature = "ucx")]
        Address::Ucx { host, port } => {
            let l = ucx_backend::listen(shared, host, *port).await?;
            let local = l.local();
            (ListenerInner::Ucx(l), local)
        }
        #[cfg(not(feature = "ucx"))]
        Address::Ucx { .. } => return Err(UCX_NOT_BUILT),
        #[cfg(feature = "tls")]
        Address::Tls { host, port } => {
            let config = tls_of(opts)?.clone();
            let l = tcp::listen(host, *port).await?;
            let Address::Tcp { host, port } = l.local() else {
                unreachable!("a TCP listener's address")
            };
            (ListenerInner::Tls(l, config), Address::Tls { host, port })
        }
        #[cfg(not(feature = "tls"))]
        Address::Tls { .. } => return Err(TLS_NOT_BUILT),
    };
    tracing::debug!(%local, "listening");
    Ok(Listener {
        inner,
        local,
        opts: opts.clone(),
        shared: Arc::clone(shared),
        pending: Default::default(),
    })
}

/// Connects to `addr` with the default [`Options`] (within [`CONNECT_TIMEOUT`]).
pub async fn connect(addr: &Address) -> Result<Connection> {
    connect_with(addr, &Options::default()).await
}

/// Connects to `addr` within `opts.connect_timeout` (on [`Transport::global`]).
pub async fn connect_with(addr: &Address, opts: &Options) -> Result<Connection> {
    Transport::global().connect_with(addr, opts).await
}

/// Connects to `addr` for the transport `shared`.
pub(crate) async fn connect_on(
    shared: &Arc<handle::Shared>,
    addr: &Address,
    opts: &Options,
) -> Result<Connection> {
    #[cfg(not(feature = "ucx"))]
    let _ = shared;
    opts.validate()?;
    let started = std::time::Instant::now();
    let state = Arc::new(CloseState::default());
    let attempt = async {
        Ok::<_, Error>(match addr {
            Address::Inproc(name) => ConnInner::Inproc(inproc::connect(name, opts).await?),
            Address::Tcp { host, port } => {
                ConnInner::Tcp(tcp::connect(host, *port, opts, Arc::clone(&state)).await?)
            }
            #[cfg(feature = "ucx")]
            Address::Ucx { host, port } => ConnInner::Ucx(
                ucx_backend::connect(shared, host, *port, opts, Arc::clone(&state)).await?,
            ),
            #[cfg(not(feature = "ucx"))]
            Address::Ucx { .. } => return Err(UCX_NOT_BUILT),
            #[cfg(feature = "tls")]
            Address::Tls { host, port } => ConnInner::Tcp(
                tcp::connect_tls(host, *port, opts, tls_of(opts)?, Arc::clone(&state)).await?,
            ),
            #[cfg(not(feature = "tls"))]
            Address::Tls { .. } => return Err(TLS_NOT_BUILT),
        })
    };
    let inner = tokio::time::timeout(opts.connect_timeout, attempt)
        .await
        .map_err(|_| Error::Timeout(opts.connect_timeout))?
        .inspect_err(|e| tracing::debug!(peer = %addr, error = %e, "connect failed"))?;
    tracing::debug!(peer = %addr, "connected");
    let conn = Connection::new(inner, addr.clone(), state);
    #[cfg(feature = "ucx")]
    if let (ConnInner::Ucx(c), true) = (&*conn.inner, opts.ucx_direct) {
        let deadline = started + opts.connect_timeout;
        let settled = ucx_lanes::settle(c, ucx_lanes::Role::Connector, opts, deadline).await;
        if let Err(e) = settled {
            tracing::warn!(peer = %addr, error = %e, "the ucx:// lanes exchange failed");
            let _ = conn.close().await;
            return Err(e);
        }
    }
    #[cfg(feature = "ucx")]
    if let ConnInner::Ucx(c) = &*conn.inner {
        let deadline = started + opts.connect_timeout;
        let size = shared.intent().ring_bytes();
        if let Err(e) = ucx_backend::ring_exchange::exchange(c, size, deadline).await {
            tracing::warn!(peer = %addr, error = %e, "the ucx:// ring exchange failed");
            let _ = conn.close().await;
            return Err(e);
        }
    }
    if let Some(secret) = &opts.secret {
        // The challenge counts against the same time limit as connecting.
        let left = opts.connect_timeout.saturating_sub(started.elapsed());
        let proved =
            match tokio::time::timeout(left, auth::connect(&conn, secret, opts.limits)).await {
                Ok(r) => r,
                Err(_) => {
                    let _ = conn.close().await;
                    Err(auth::AuthError::Timeout(opts.connect_timeout))
                }
            };
        proved.inspect_err(|e| tracing::warn!(peer = %addr, error = %e, "the challenge failed"))?;
    }
    Ok(conn)
}

impl Listener {
    /// The next connection. On `tls://`, or with [`Options::secret`], the next one whose TLS
    /// handshake and challenge succeeded: connections are set up concurrently (a slow or
    /// silent stranger holds up no one), at most [`MAX_PENDING_ACCEPTS`] at a time, and
    /// those that fail are dropped and logged.
    pub async fn accept(&mut self) -> Result<Connection> {
        use futures::StreamExt;
        // ucx:// connections always run the ring exchange before they are handed out.
        let direct = self.opts.secret.is_none() && !self.inner.is_tls() && !self.inner.is_ucx();
        if direct {
            return match accept_raw(&mut self.inner, &self.opts, &self.local).await? {
                Accepted::Ready(c) => Ok(c),
                #[cfg(feature = "tls")]
                Accepted::Tls(..) => unreachable!("a tls:// listener sets connections up"),
            };
        }
        loop {
            let room = self.pending.len() < MAX_PENDING_ACCEPTS;
            tokio::select! {
                Some(done) = self.pending.next(), if !self.pending.is_empty() => match done {
                    Ok(conn) => return Ok(conn),
                    Err((peer, e)) => {
                        tracing::warn!(local = %self.local, %peer, error = %e, "dropped a peer whose connection setup failed");
                    }
                },
                raw = accept_raw(&mut self.inner, &self.opts, &self.local), if room => {
                    self.pending.push(set_up(raw?, self.opts.clone(), Arc::clone(&self.shared)));
                }
            }
        }
    }

    /// The bound address (port 0 resolved).
    pub fn local_addr(&self) -> &Address {
        &self.local
    }
}

/// Checks an outgoing message's channel and size before anything is sent (the receiver would
/// refuse it).
fn check_outgoing(channel: u32, msg: &Message, limits: &frame::Limits) -> Result<()> {
    if channel == CLOSE_CHANNEL {
        return Err(Error::Refused(Refusal::Channel(channel)));
    }
    check_limits(msg, limits).map_err(|e| Error::Refused(Refusal::Limits(e)))
}

/// Checks a message's frame count and bytes against `limits`.
fn check_limits(msg: &Message, limits: &frame::Limits) -> Result<(), frame::HeaderError> {
    let n = u32::try_from(msg.frames.len()).unwrap_or(u32::MAX);
    if n > limits.max_frames {
        return Err(frame::HeaderError::TooManyFrames {
            got: n,
            max: limits.max_frames,
        });
    }
    let total = msg.len() as u64;
    if total > limits.max_message {
        return Err(frame::HeaderError::TooLarge {
            got: total,
            max: limits.max_message,
        });
    }
    Ok(())
}

/// `msg`'s header on `channel`.
fn encode_header(channel: u32, msg: &Message) -> Vec<u8> {
    let mut h = Vec::with_capacity(frame::header_len(msg.frames.len()));
    frame::encode_into(&mut h, channel, header_metas(msg));
    h
}

/// The close marker: a header on [`CLOSE_CHANNEL`] with no frames.
fn close_marker() -> Vec<u8> {
    frame::encode(CLOSE_CHANNEL, &[])
}

/// Appends `msg` on `channel` whole: its header, then its frames' bytes (host frames only:
/// callers inline only messages without device frames).
fn encode_whole(buf: &mut Vec<u8>, channel: u32, msg: &Message) {
    frame::encode_into(buf, channel, header_metas(msg));
    for f in msg.frames.iter().filter_map(Frame::as_host) {
        buf.extend_from_slice(f);
    }
}

/// How the header describes `msg`'s frames.
fn header_metas(msg: &Message) -> impl ExactSizeIterator<Item = frame::FrameMeta> + '_ {
    msg.frames.iter().map(|f| frame::FrameMeta {
        size: f.len() as u64,
        cuda: f.is_cuda(),
    })
}
