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
//! library, and a `ucx://` address fails with [`TransportError::NotBuilt`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), transport::TransportError> {
//! use transport::{connect, listen, CloseReason, Message, TransportError};
//! let mut listener = listen(&"tcp://127.0.0.1:0".parse()?).await?;
//! let addr = listener.local_addr().clone();
//! let (server, client) = tokio::join!(listener.accept(), connect(&addr));
//! let (server, client) = (server?, client?);
//! client.send(3, Message::from(vec![b"header".to_vec(), vec![7u8; 1000]])).await?;
//! let (channel, msg) = server.recv().await?;
//! assert_eq!((channel, msg.frames.len(), msg.frames[1].len()), (3, 2, 1000));
//! assert_eq!(msg.host(0), Some(&b"header"[..]));
//! client.close().await?;
//! assert!(matches!(server.recv().await, Err(TransportError::Closed(CloseReason::PeerClosed))));
//! # Ok(()) }
//! ```

pub mod address;
pub mod auth;
#[cfg(feature = "ucx")]
mod budget;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
pub mod frame;
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

use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use address::{Address, AddressError};
#[cfg(feature = "ucx")]
pub use budget::{receive_budget, set_receive_budget, BudgetInUse, DEFAULT_RECEIVE_BUDGET};
pub use error::{CloseReason, Failure, InprocError, ProtocolError, Refusal, TransportError};
pub use message::{Frame, Message};
#[cfg(feature = "ucx")]
pub use ucx_config::{configure_ucx, UcxIntent};

/// The UCX tag a `ucx://` connection's headers and frames travel on. For peers that speak the
/// wire format with `ucx-rs` (or UCXX) directly: a message's first UCX message is at most
/// [`UCX_FIRST_MAX`] bytes, either the whole message (the [`frame`] header followed by every
/// frame's bytes, host frames only) or its header (in two UCX messages when longer than
/// `UCX_FIRST_MAX`, split there), then one UCX message per frame; a message of 0 bytes has no
/// frame messages. A sender may have [`Options::credit_bytes`] of messages the receiving
/// application has not taken (each counted as [`ucx_charge`]); the receiver grants them back
/// on [`UCX_CREDIT_TAG`] every [`UCX_GRANT_EVERY`] bytes.
#[cfg(feature = "ucx")]
pub const UCX_TAG: ucx::Tag = ucx_backend::TAG;
/// The most bytes in the first UCX message of a `ucx://` message (its receive is posted ahead).
pub const UCX_FIRST_MAX: usize = 8 << 10;
/// The tag `ucx://` credit grants travel on: a little-endian `u64`, bytes granted back.
#[cfg(feature = "ucx")]
pub const UCX_CREDIT_TAG: ucx::Tag = ucx_backend::CREDIT_TAG;
/// A `ucx://` receiver grants credits back once the application took this many bytes' worth.
pub const UCX_GRANT_EVERY: u64 = 256 << 10;
/// The most one message counts against a `ucx://` credit window.
pub const UCX_CHARGE_CAP: u64 = 512 << 10;

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
    /// logged), and a connect with one fails with [`TransportError::Auth`] unless the
    /// listener knows it too. `None` (the default): no challenge.
    pub secret: Option<auth::Secret>,
    /// `tls://`: the certificates this side presents and trusts (required there; see
    /// [`tls`]). Other schemes ignore it.
    #[cfg(feature = "tls")]
    pub tls: Option<tls::TlsConfig>,
    /// `tcp://`, `tls://`: before a receive parks on the event loop, poll the socket for this
    /// long (a kernel wake-up costs tens of µs on a VM; polling costs a core while it spins).
    /// Zero (the default): never spin. Like UCX's polling progress, for latency-bound peers
    /// with cores to spare.
    pub tcp_spin: Duration,
    /// `ucx://`: after connecting, move to endpoints connected by the peers' worker addresses
    /// (shared memory on one host, the fabric's own lanes across hosts; see [`ucx_lanes`]). A
    /// client-server endpoint also carries the listener's TCP lanes, which cost latency and
    /// bandwidth. Like [`Options::secret`], both sides must set it: a connector that sets it
    /// against a listener that does not times out, and such a listener drops a connector that
    /// does not within its time limit. Off by default: with UCX 1.13, a process whose moved
    /// peers died may find later connects hang inside UCX (docs/transport.md).
    pub ucx_direct: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: frame::Limits::default(),
            connect_timeout: CONNECT_TIMEOUT,
            credit_bytes: 8 << 20,
            secret: None,
            #[cfg(feature = "tls")]
            tls: None,
            tcp_spin: Duration::ZERO,
            ucx_direct: false,
        }
    }
}

impl Options {
    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<()> {
        if self.credit_bytes < 2 * UCX_CHARGE_CAP {
            return Err(TransportError::Config(format!(
                "credit_bytes {} is below the least window, {} bytes",
                self.credit_bytes,
                2 * UCX_CHARGE_CAP
            )));
        }
        if self.limits.max_frames == 0 {
            return Err(TransportError::Config("max_frames is 0".into()));
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
pub type Result<T, E = TransportError> = std::result::Result<T, E>;

/// Accepts connections on an address.
#[derive(Debug)]
pub struct Listener {
    inner: ListenerInner,
    local: Address,
    opts: Options,
    /// Accepted connections being set up (TLS handshake, secret challenge), at most
    /// [`MAX_PENDING_ACCEPTS`] at a time.
    pending: futures::stream::FuturesUnordered<SetUp>,
}

/// A connection being set up: the connection, or who failed and why.
type SetUp = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Connection, (Address, TransportError)>> + Send>,
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
/// `ucx://` lanes exchange with [`Options::ucx_direct`] ([`ucx_lanes`]), then the challenge if
/// `opts` has a secret.
#[cfg_attr(not(feature = "tls"), allow(clippy::infallible_destructuring_match))]
fn set_up(accepted: Accepted, opts: Options) -> SetUp {
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
                    Err(_) => return Err((peer, TransportError::Timeout(opts.connect_timeout))),
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

/// A connection carrying messages; see the crate docs.
#[derive(Debug)]
pub struct Connection {
    inner: Arc<ConnInner>,
    peer: Address,
    state: Arc<CloseState>,
    /// One receiver at a time. A `recv` dropped mid-way (`select!`, a timeout) leaves its
    /// receive here and the next `recv` goes on with it: no message, or part of one, is lost.
    recv_slot: tokio::sync::Mutex<Box<dyn RecvSlot>>,
}

/// Why and whether a connection closed: set once (the first reason wins), by the connection's
/// own operations or, on `ucx://`, by UCX's error handling.
#[derive(Debug, Default)]
pub(crate) struct CloseState {
    reason: Mutex<Option<CloseReason>>,
    changed: tokio::sync::Notify,
}

impl CloseState {
    /// Records `reason` unless one is recorded; returns the one that holds.
    pub(crate) fn close(&self, reason: CloseReason) -> CloseReason {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        let held = r.get_or_insert(reason).clone();
        drop(r);
        self.changed.notify_waiters();
        held
    }

    pub(crate) fn get(&self) -> Option<CloseReason> {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn wait(&self) -> CloseReason {
        loop {
            let changed = self.changed.notified();
            if let Some(r) = self.get() {
                return r;
            }
            changed.await;
        }
    }

    /// Records what an operation's error says about the connection.
    fn observe(&self, e: TransportError) -> TransportError {
        match e {
            TransportError::Closed(r) => TransportError::Closed(self.close(r)),
            TransportError::Protocol(p) => {
                self.close(CloseReason::Refused(p.clone()));
                TransportError::Protocol(p)
            }
            e => e,
        }
    }
}

/// What a backend's receive delivers: the next message, and others that were already there
/// (ucx:// takes small messages that arrived in one pass; the other backends, none).
type Received = ((u32, Message), Vec<(u32, Message)>);

/// Where a connection's receive of one whole message lives while it is in progress: allocated
/// once per connection and refilled in place, so a receive costs no allocation.
trait RecvSlot: Send {
    /// The next message the backend already delivered, if any.
    fn take_ready(&mut self) -> Option<(u32, Message)>;
    /// Polls the receive in progress, starting one first if there is none.
    fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(u32, Message)>>;
}

struct Slot<F, M> {
    receiving: std::pin::Pin<Box<Option<F>>>,
    start: M,
    /// Messages the backend delivered after the one it was asked for, in order.
    ready: std::collections::VecDeque<(u32, Message)>,
}

impl<F, M> RecvSlot for Slot<F, M>
where
    F: std::future::Future<Output = Result<Received>> + Send,
    M: Fn() -> F + Send,
{
    fn take_ready(&mut self) -> Option<(u32, Message)> {
        self.ready.pop_front()
    }

    fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(u32, Message)>> {
        if let Some(m) = self.ready.pop_front() {
            return std::task::Poll::Ready(Ok(m));
        }
        if self.receiving.is_none() {
            self.receiving.as_mut().set(Some((self.start)()));
        }
        let Some(receiving) = self.receiving.as_mut().as_pin_mut() else {
            unreachable!("filled just above")
        };
        let r = std::task::ready!(receiving.poll(cx));
        self.receiving.as_mut().set(None);
        std::task::Poll::Ready(r.map(|(first, more)| {
            self.ready.extend(more);
            first
        }))
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
const UCX_NOT_BUILT: TransportError = TransportError::NotBuilt {
    scheme: "ucx",
    feature: "ucx",
};

#[cfg(not(feature = "tls"))]
const TLS_NOT_BUILT: TransportError = TransportError::NotBuilt {
    scheme: "tls",
    feature: "tls",
};

/// `tls://` needs certificates.
#[cfg(feature = "tls")]
fn tls_of(opts: &Options) -> Result<&tls::TlsConfig> {
    opts.tls.as_ref().ok_or_else(|| {
        TransportError::Config("tls:// needs Options::tls (see transport::tls)".into())
    })
}

/// Listens on `addr` with the default [`Options`] (port 0 picks a free port; see
/// [`Listener::local_addr`]).
pub async fn listen(addr: &Address) -> Result<Listener> {
    listen_with(addr, &Options::default()).await
}

/// Listens on `addr`; accepted connections get `opts`.
pub async fn listen_with(addr: &Address, opts: &Options) -> Result<Listener> {
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
            let l = ucx_backend::listen(host, *port).await?;
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
        pending: Default::default(),
    })
}

/// Connects to `addr` with the default [`Options`] (within [`CONNECT_TIMEOUT`]).
pub async fn connect(addr: &Address) -> Result<Connection> {
    connect_with(addr, &Options::default()).await
}

/// Connects to `addr` within `opts.connect_timeout`.
pub async fn connect_with(addr: &Address, opts: &Options) -> Result<Connection> {
    opts.validate()?;
    let started = std::time::Instant::now();
    let state = Arc::new(CloseState::default());
    let attempt = async {
        Ok::<_, TransportError>(match addr {
            Address::Inproc(name) => ConnInner::Inproc(inproc::connect(name, opts).await?),
            Address::Tcp { host, port } => {
                ConnInner::Tcp(tcp::connect(host, *port, opts, Arc::clone(&state)).await?)
            }
            #[cfg(feature = "ucx")]
            Address::Ucx { host, port } => {
                ConnInner::Ucx(ucx_backend::connect(host, *port, opts, Arc::clone(&state)).await?)
            }
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
        .map_err(|_| TransportError::Timeout(opts.connect_timeout))?
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
        let direct = self.opts.secret.is_none()
            && !self.inner.is_tls()
            && !(self.opts.ucx_direct && self.inner.is_ucx());
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
                    self.pending.push(set_up(raw?, self.opts.clone()));
                }
            }
        }
    }

    /// The bound address (port 0 resolved).
    pub fn local_addr(&self) -> &Address {
        &self.local
    }
}

impl Connection {
    fn new(inner: ConnInner, peer: Address, state: Arc<CloseState>) -> Connection {
        let inner = Arc::new(inner);
        let conn = Arc::clone(&inner);
        let start = move || {
            let conn = Arc::clone(&conn);
            async move {
                match &*conn {
                    ConnInner::Inproc(c) => c.recv().await.map(|m| (m, Vec::new())),
                    ConnInner::Tcp(c) => c.recv().await.map(|m| (m, Vec::new())),
                    #[cfg(feature = "ucx")]
                    ConnInner::Ucx(c) => c.recv().await,
                }
            }
        };
        Connection {
            inner,
            peer,
            state,
            recv_slot: tokio::sync::Mutex::new(Box::new(Slot {
                receiving: Box::pin(None),
                start,
                ready: std::collections::VecDeque::new(),
            })),
        }
    }

    /// Sends `msg` on `channel` (below [`CLOSE_CHANNEL`]). Waits while the peer is not keeping
    /// up (bounded buffering).
    pub async fn send(&self, channel: u32, msg: Message) -> Result<()> {
        // Spelled out rather than shared with `send_batch`: a helper taking the backend's
        // future by value moved it once more per message (measured: 25% of the 8 B rate).
        if let Some(r) = self.state.get() {
            return Err(TransportError::Closed(r));
        }
        let r = match &*self.inner {
            ConnInner::Inproc(c) => c.send(channel, msg).await,
            ConnInner::Tcp(c) => c.send(channel, msg).await,
            #[cfg(feature = "ucx")]
            ConnInner::Ucx(c) => c.send(channel, msg).await,
        };
        r.map_err(|e| self.state.observe(e))
    }

    /// Sends `msgs` on `channel`, in order, as one call: what a runtime uses for a burst of
    /// control messages to one peer. On `ucx://` small messages go as one UCX batch (posted in
    /// one pass, one completion, one take of credit); on `tcp://` and `tls://` small messages
    /// are written together. Every message is checked before any is sent; if the connection
    /// fails part-way, the ones before may have been delivered.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> transport::Result<()> {
    /// use transport::{connect, listen, Message};
    /// let mut l = listen(&"inproc://batch-doc".parse()?).await?;
    /// let addr = l.local_addr().clone();
    /// let (a, b) = tokio::join!(connect(&addr), l.accept());
    /// let (a, b) = (a?, b?);
    /// let msgs: Vec<Message> = (0u8..3).map(|i| Message::from(vec![vec![i; 4]])).collect();
    /// a.send_batch(5, msgs).await?;
    /// for i in 0u8..3 {
    ///     let (channel, m) = b.recv().await?;
    ///     assert_eq!((channel, m.to_host()?), (5, vec![bytes::Bytes::from(vec![i; 4])]));
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn send_batch(&self, channel: u32, msgs: Vec<Message>) -> Result<()> {
        if let Some(r) = self.state.get() {
            return Err(TransportError::Closed(r));
        }
        let limits = self.limits();
        for m in &msgs {
            check_outgoing(channel, m, &limits)?;
        }
        let r = match &*self.inner {
            ConnInner::Inproc(c) => {
                async {
                    for m in msgs {
                        c.send(channel, m).await?;
                    }
                    Ok(())
                }
                .await
            }
            ConnInner::Tcp(c) => c.send_batch(channel, msgs).await,
            #[cfg(feature = "ucx")]
            ConnInner::Ucx(c) => c.send_batch(channel, msgs).await,
        };
        r.map_err(|e| self.state.observe(e))
    }

    /// The next message, with its channel.
    ///
    /// Cancel-safe: a `recv` dropped before it returns (in `select!`, under a timeout) loses
    /// nothing; the next `recv` resumes it. Once the connection is closed, fails with the
    /// [`CloseReason`] (messages the peer sent before its close come first).
    pub async fn recv(&self) -> Result<(u32, Message)> {
        let mut slot = self.recv_slot.lock().await;
        self.recv_locked(&mut slot).await
    }

    /// The next message, as [`recv`](Self::recv), and then, without waiting, those that had
    /// already arrived behind it: at most `most` in all (at least one). The call for a reader
    /// of many small messages: on `ucx://` the transport takes what arrived in one pass.
    ///
    /// Cancel-safe as `recv`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> transport::Result<()> {
    /// use transport::{connect, listen, Message};
    /// let mut l = listen(&"inproc://recv-many-doc".parse()?).await?;
    /// let addr = l.local_addr().clone();
    /// let (a, b) = tokio::join!(connect(&addr), l.accept());
    /// let (a, b) = (a?, b?);
    /// a.send_batch(1, (0u8..5).map(|i| Message::from(vec![vec![i]])).collect()).await?;
    /// let mut got = Vec::new();
    /// while got.len() < 5 {
    ///     got.extend(b.recv_many(64).await?);
    /// }
    /// assert!(got.iter().enumerate().all(|(i, (ch, m))| *ch == 1 && m.host(0) == Some(&[i as u8][..])));
    /// # Ok(()) }
    /// ```
    pub async fn recv_many(&self, most: usize) -> Result<Vec<(u32, Message)>> {
        let mut slot = self.recv_slot.lock().await;
        let first = self.recv_locked(&mut slot).await?;
        let mut out = vec![first];
        while out.len() < most {
            match slot.take_ready() {
                Some(m) => out.push(m),
                None => break,
            }
        }
        Ok(out)
    }

    async fn recv_locked(&self, slot: &mut Box<dyn RecvSlot>) -> Result<(u32, Message)> {
        match self.state.get() {
            // What the peer sent before it closed or failed comes first.
            Some(r) if r != CloseReason::Local => {
                if let Some(m) = slot.take_ready() {
                    return Ok(m);
                }
                return Err(TransportError::Closed(r));
            }
            Some(r) => return Err(TransportError::Closed(r)),
            None => {}
        }
        let r = tokio::select! {
            biased;
            r = std::future::poll_fn(|cx| slot.poll_recv(cx)) => r,
            // A local close ends a pending receive (the backend's may wait for the peer).
            _ = self.closed_locally() => Err(TransportError::Closed(CloseReason::Local)),
        };
        r.map_err(|e| self.state.observe(e))
    }

    async fn closed_locally(&self) {
        while self.state.wait().await != CloseReason::Local {
            // Another reason is final too, but the backend's receive reports it itself.
            std::future::pending::<()>().await;
        }
    }

    /// Closes the connection: the peer's `recv` fails with [`CloseReason::PeerClosed`] once it
    /// has received everything sent before. Idempotent; a pending `recv` here fails with
    /// [`CloseReason::Local`].
    pub async fn close(&self) -> Result<()> {
        if self.state.get().is_some() {
            return Ok(());
        }
        self.state.close(CloseReason::Local);
        tracing::debug!(peer = %self.peer, "closing");
        match &*self.inner {
            ConnInner::Inproc(c) => c.close(),
            ConnInner::Tcp(c) => c.close().await,
            #[cfg(feature = "ucx")]
            ConnInner::Ucx(c) => c.close().await,
        }
    }

    /// The limits this side holds messages to (see [`Self::set_limits`]).
    fn limits(&self) -> frame::Limits {
        match &*self.inner {
            ConnInner::Inproc(c) => c.limits.get(),
            ConnInner::Tcp(c) => c.limits.get(),
            #[cfg(feature = "ucx")]
            ConnInner::Ucx(c) => c.limits.get(),
        }
    }

    /// Changes what this side accepts from the peer, and may send, from the next message on.
    /// A runtime that authenticates its peers starts connections with small limits (see
    /// [`Options::limits`]) and raises them once the peer proved who it is, so a stranger
    /// cannot make it allocate more than the handshake needs.
    pub fn set_limits(&self, limits: frame::Limits) {
        match &*self.inner {
            ConnInner::Inproc(c) => c.limits.set(limits),
            ConnInner::Tcp(c) => c.limits.set(limits),
            #[cfg(feature = "ucx")]
            ConnInner::Ucx(c) => c.limits.set(limits),
        }
    }

    /// `ucx://`: whether the connection moved to endpoints connected by worker address
    /// ([`Options::ucx_direct`]); false on other schemes.
    pub fn is_ucx_direct(&self) -> bool {
        #[cfg(feature = "ucx")]
        if let ConnInner::Ucx(c) = &*self.inner {
            return c.is_direct();
        }
        false
    }

    /// `ucx://`: UCX's description of the endpoint the connection uses, its lanes and their
    /// transports (`ucp_ep_print_info`); `None` on other schemes or once it is closed.
    pub fn ucx_lanes(&self) -> Option<String> {
        #[cfg(feature = "ucx")]
        if let ConnInner::Ucx(c) = &*self.inner {
            return c.transports().ok();
        }
        None
    }

    /// Whether the connection is closed, as far as this side knows (see [`Self::closed`]).
    pub fn is_closed(&self) -> bool {
        self.state.get().is_some()
    }

    /// Why the connection closed, if it did.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.state.get()
    }

    /// Waits until the connection is closed and says why. A peer's close or failure is
    /// noticed by a pending [`recv`](Self::recv) (a runtime always keeps one) or a `send`,
    /// and on `ucx://` also by UCX's error handling with no operation pending.
    pub async fn closed(&self) -> CloseReason {
        self.state.wait().await
    }

    /// The address this connection goes to. For accepted connections, where the peer came
    /// from: its socket address on `tcp://` and `ucx://`, and on `inproc://` the listener's
    /// name with `/` and a number unique in the process.
    pub fn peer_addr(&self) -> &Address {
        &self.peer
    }
}

/// Checks an outgoing message's channel and size before anything is sent (the receiver would
/// refuse it).
fn check_outgoing(channel: u32, msg: &Message, limits: &frame::Limits) -> Result<()> {
    if channel == CLOSE_CHANNEL {
        return Err(TransportError::Refused(Refusal::Channel(channel)));
    }
    check_limits(msg, limits).map_err(|e| TransportError::Refused(Refusal::Limits(e)))
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
