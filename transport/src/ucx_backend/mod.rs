//! UCX connections over `ucx-rs`. The connections of a [`crate::Transport`] share its UCX
//! context and worker, set up from its [`crate::UcxIntent`] (for the process-wide one, see
//! [`crate::configure_ucx`]).
//!
//! **On the wire** (all on [`TAG`], whose per-tag order UCX keeps): a message's first UCX
//! message is at most [`FIRST_MAX`] bytes, so the receiver can post that receive before the
//! message arrives.
//! - If the header ([`crate::frame`]) and all frame bytes fit, and no frame is in device memory,
//!   that one UCX message is the whole message (inlined): the sender copies the frames behind
//!   the header; the receiver copies out up to [`COPY_MAX`] bytes and hands out the buffer
//!   larger ones landed in.
//! - Otherwise it is the header, or the header's first `FIRST_MAX` bytes followed by a second
//!   UCX message with the rest; then one UCX message per frame. A message with no bytes at all
//!   has no frame messages.
//!
//! **Flow control.** UCX completes small (eager) sends whether or not the peer's application
//! receives, and the peer's UCX buffers what arrives unexpected. So a sender holds credits: it
//! may have at most [`Options::credit_bytes`] of messages that the receiving application has
//! not taken, each counted as [`ucx_charge`](crate::ucx_charge) (its bytes plus 64, at most
//! [`crate::UCX_CHARGE_CAP`]), and the receiver grants them back, a little-endian `u64` of
//! bytes on [`CREDIT_TAG`], whenever it has taken [`UCX_GRANT_EVERY`](crate::UCX_GRANT_EVERY).
//! Both sides compute the charge, so neither needs the other's window; a window of at least twice the cap cannot deadlock (a
//! blocked sender has more than half its window in flight, more than the receiver holds back).
//! Every first UCX message (at most [`FIRST_MAX`]) goes eager ([`RNDV_THRESH`]); frames of
//! larger messages go by rendezvous, which waits for the receive anyway.
//!
//! **Close.** A close sends the close marker (a header on [`CLOSE_CHANNEL`], outside the
//! credits) before closing the endpoint. UCX reports a peer's graceful close and its crash
//! alike (a reset), so the marker is what tells them apart. UCX's error callback records a
//! failure only when nothing is left to receive; otherwise the receive finds the marker, or
//! fails itself.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use receive::Ahead;
use tokio::sync::Mutex;

mod receive;
pub(crate) mod ring;
pub mod ring_exchange;
mod send;
use crate::handle::Shared;
use crate::{
    close_marker, Address, CloseReason, CloseState, Error, Failure, Options, ProtocolError, Result,
};

/// The tag every message and frame of a connection travels on (a UCXX user tag, so it is
/// hashed with the endpoint's tags like any other).
pub const TAG: ucx::Tag = ucx::Tag::User(0x5455);
/// The most bytes in the first UCX message of a transport message. Messages whose header and
/// frames fit (host frames only) go as that one message: one transfer instead of one per frame
/// plus the header. Larger messages send the header (in two parts if it is longer than this),
/// then each frame. The receiver posts a receive of this size before the message arrives.
pub const FIRST_MAX: usize = crate::UCX_FIRST_MAX;
/// A receiver copies UCX messages of at most this many bytes out of its posted buffer (cheaper
/// than an allocation, and than handing a 65 KiB buffer out for a few bytes); larger ones
/// keep the buffer they landed in. Batched sends bundle small messages up to this size, and
/// a receive takes messages up to this size ahead.
pub(crate) const COPY_MAX: usize = 8 << 10;
/// UCX's rendezvous threshold in this backend's context: messages up to [`FIRST_MAX`] bytes
/// go eager, larger ones (frames of large messages) by rendezvous, which waits for the
/// receive. Eager messages the application has not taken are buffered by the peer's UCX,
/// within the connection's credit window.
const RNDV_THRESH: usize = FIRST_MAX + 1;
/// How long a close waits for sends in flight (the peer taking rendezvous frames) before it
/// forces the endpoint closed.
const CLOSE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);
/// The most UCX messages (bundles) in one UCX batch of [`Conn::send_batch`].
const MAX_RUN: usize = 64;
/// The tag credit grants travel on (little-endian `u64`: bytes granted back).
pub const CREDIT_TAG: ucx::Tag = ucx::Tag::User(0x5456);

/// A transport's UCX state: its context and worker, made on first use from its
/// [`crate::UcxIntent`].
#[derive(Debug, Default)]
pub(crate) struct UcxState {
    context: OnceLock<std::result::Result<ucx::Context, ucx::Error>>,
    worker: std::sync::Mutex<Option<ucx::Worker>>,
    /// Workers made for connects that UCX wedged ([`fresh_worker`]).
    fresh_made: AtomicU64,
}

/// The transport's UCX worker, made on first use. A `blocking` worker is progressed by a task
/// on the runtime it was made in; when that runtime has shut down (a program that makes one
/// runtime per phase, or a test after a test), the next connection makes a new worker in the
/// current runtime. Connections of the old worker died with its runtime. A connect that UCX
/// wedged gets a fresh worker too ([`fresh_worker`]).
pub(crate) fn worker(t: &Shared) -> Result<ucx::Worker> {
    let mut current = t.ucx.worker.lock().unwrap_or_else(|e| e.into_inner());
    match &*current {
        Some(w) if w.is_progressing() => Ok(w.clone()),
        stale => {
            if stale.is_some() {
                tracing::info!("the UCX worker's runtime shut down: making a new worker");
            }
            let w = ucx::Worker::new(&context(t)?, t.intent().progress)?;
            *current = Some(w.clone());
            Ok(w)
        }
    }
}

/// The transport's UCX context, from its [`crate::UcxIntent`].
fn context(t: &Shared) -> Result<ucx::Context> {
    Ok(t.ucx
        .context
        .get_or_init(|| {
            let mut opts = t.intent().options().unwrap_or_default();
            // Every first UCX message fits FIRST_MAX and has its receive posted before it
            // arrives, so eager lands it in place; UCX's own threshold (auto) chose
            // rendezvous from 20,553 B over TCP and 8,256 B on shared memory, a round trip
            // more (docs/notes/2026-11-27-eager-up-to-64k.md). The user's UCX_RNDV_THRESH wins.
            if std::env::var_os("UCX_RNDV_THRESH").is_none() {
                opts.push(("RNDV_THRESH", RNDV_THRESH.to_string()));
            }
            tracing::debug!(ucx = %t.intent(), rndv_thresh = RNDV_THRESH, "starting the UCX backend");
            ucx::Context::builder().options(opts).build()
        })
        .clone()?)
}

/// The most workers a transport makes for connects that UCX wedged ([`fresh_worker`]).
const MAX_FRESH_WORKERS: usize = 4;

/// After a connect timed out on `stale`, makes the transport's later connects use a new worker
/// (unless another connect did already, or [`MAX_FRESH_WORKERS`] were made); returns whether
/// the next connect gets a different worker (if not, it tries the same one again). UCX 1.13's TCP layer can reuse a closed
/// connection of a dead peer for a new peer on the same address and port, after which that
/// worker's connects hang (docs/notes/2026-11-23-ucx-direct-same-host-lanes.md, "A UCX 1.13 wedge"); a new worker has TCP
/// interfaces of its own. The old one lives on for its connections and listeners.
fn fresh_worker(t: &Shared, stale: &ucx::Worker) -> bool {
    // An External worker is progressed by its user, who watches this worker's event fd and
    // would not know of a new one (`crate::ucx_worker`): keep trying the same worker.
    if t.intent().progress == ucx::ProgressMode::External {
        return false;
    }
    let mut current = t.ucx.worker.lock().unwrap_or_else(|e| e.into_inner());
    match &*current {
        Some(w) if w.same_as(stale) => {}
        _ => return true,
    }
    if t.ucx.fresh_made.fetch_add(1, Ordering::Relaxed) >= MAX_FRESH_WORKERS as u64 {
        return false;
    }
    tracing::warn!("a UCX connect timed out: later connects use a new worker");
    *current = None;
    true
}

#[derive(Debug)]
pub(crate) struct Listener {
    inner: ucx::Listener,
    /// The transport its connections belong to.
    transport: Arc<Shared>,
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
    /// The endpoint the connection was made on (client-server: it carries the listener's TCP
    /// lanes). Its traffic moves to `direct` when the peers agree ([`crate::ucx_lanes`]).
    cs: Arc<ucx::Endpoint>,
    /// The endpoint connected by the peer's worker address, once the peers moved to it.
    direct: OnceLock<Arc<ucx::Endpoint>>,
    /// Where a failure of the endpoint in use is recorded.
    state: Arc<CloseState>,
    /// Set when the client-server endpoint fails after the move without the peer's goodbye
    /// (the peer died or cut the connection, which an endpoint on shared memory learns only
    /// from UCX's keepalive, 20 s by default), or when this side cuts it off: the endpoint in
    /// use is then aborted, and the errors of what was pending say why.
    cut: Arc<OnceLock<CloseReason>>,
    /// Held while posting a message's sends, so concurrent messages never interleave. It
    /// holds the buffer small messages are copied into, reused (one lock per small message).
    send_order: std::sync::Mutex<Option<Vec<u8>>>,
    /// The buffer first messages are received into, kept between receives.
    first_buf: std::sync::Mutex<Vec<u8>>,
    /// UCX messages on [`TAG`] taken ahead, in order, that the receive has not read yet
    /// (see `receive.rs`): they come before anything still in UCX.
    ahead: Arc<Ahead>,
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
    /// Received host frames as plain `Vec`-backed `Bytes` ([`crate::Options::reclaimable_frames`]).
    reclaim: bool,
    /// A receive is in progress (perhaps parked by `Connection`, still posted in UCX).
    receiving: Arc<AtomicBool>,
    /// Something was sent since the last receive started (the receive then does not read
    /// ahead: see `receive.rs`).
    sent: AtomicBool,
    /// This side's ring, once the peer took it: large host frames go through it
    /// ([`ring`], [`ring_exchange`]).
    ring_out: OnceLock<ring::RingOut>,
    /// The peer's ring, once taken: large host frames come through it.
    ring_in: OnceLock<ring::RingIn>,
    /// The transport it belongs to (its receive budget).
    transport: Arc<Shared>,
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port).to_socket_addrs()?.next().ok_or_else(|| {
        Error::Io(Arc::new(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{host} resolved to no address"),
        )))
    })
}

pub(crate) async fn listen(t: &Arc<Shared>, host: &str, port: u16) -> Result<Listener> {
    Ok(Listener {
        inner: ucx::Listener::bind(&worker(t)?, resolve(host, port)?)?,
        transport: Arc::clone(t),
    })
}

pub(crate) async fn connect(
    t: &Arc<Shared>,
    host: &str,
    port: u16,
    opts: &Options,
    state: Arc<CloseState>,
) -> Result<Conn> {
    let at = resolve(host, port)?;
    let deadline = std::time::Instant::now() + opts.connect_timeout;
    // A connect that UCX resets during the UCXX handshake is made again, twice at most (within
    // the caller's time limit): seen about once in 600 connects to a freshly started peer in
    // `tests/peer_death.rs` (thread progress), before any application byte moved. The first
    // try has half the time: one that times out is tried again on a fresh worker
    // ([`fresh_worker`]).
    for attempt in 0.. {
        let w = worker(t)?;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let connected = ucx::Endpoint::connect_with(
            &w,
            at,
            ucx::ConnectOptions {
                timeout: if attempt == 0 { left / 2 } else { left },
                ..Default::default()
            },
        )
        .await;
        match connected {
            Ok(ep) => return Ok(Conn::new(ep, opts, state, Arc::clone(t))),
            Err(ucx::Error::Timeout(_)) if attempt == 0 => {
                if fresh_worker(t, &w) {
                    tracing::warn!(peer = %at, "connecting again on a new UCX worker");
                }
            }
            Err(ucx::Error::Handshake(
                ucx::HandshakeError::Sending(e) | ucx::HandshakeError::Receiving(e),
            )) if attempt < 2 && matches!(*e, ucx::Error::Ucx(s) if s.is_peer_failure()) => {
                tracing::warn!(peer = %at, error = %e, attempt, "UCX reset the connection during its handshake: connecting again");
            }
            Err(ucx::Error::Timeout(_)) => return Err(Error::Timeout(opts.connect_timeout)),
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
                    return Ok((
                        Conn::new(ep, opts, state, Arc::clone(&self.transport)),
                        peer,
                    ));
                }
                // A failed handshake concerns that client only: keep accepting.
                Err(ucx::Error::Handshake(e)) => tracing::warn!(error = %e, "rejected a client"),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Conn {
    /// The local address of the client-server endpoint the connection was made on.
    pub(crate) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.cs.local_addr()
    }

    fn new(
        ep: ucx::Endpoint,
        opts: &Options,
        state: Arc<CloseState>,
        transport: Arc<Shared>,
    ) -> Conn {
        let ep = Arc::new(ep);
        let receiving = Arc::new(AtomicBool::new(false));
        let ahead = Arc::default();
        watch(&ep, &receiving, &ahead, &state);
        Conn {
            cs: ep,
            direct: OnceLock::new(),
            state,
            cut: Arc::default(),
            send_order: std::sync::Mutex::new(None),
            first_buf: std::sync::Mutex::new(Vec::new()),
            ahead,
            credits: AtomicU64::new(opts.credit_bytes),
            window: opts.credit_bytes,
            refill: Mutex::new(ParkedGrant(None)),
            taken: AtomicU64::new(0),
            limits: crate::SharedLimits::new(opts.limits),
            reclaim: opts.reclaimable_frames,
            receiving,
            sent: AtomicBool::new(false),
            ring_out: OnceLock::new(),
            ring_in: OnceLock::new(),
            transport,
        }
    }

    /// The endpoint in use, shared.
    fn endpoint(&self) -> Arc<ucx::Endpoint> {
        Arc::clone(self.ep())
    }

    /// From now on, large host frames go through `ring` (the peer took it). Before any
    /// message of the application.
    fn send_through(&self, ring: ring::RingOut) {
        if self.ring_out.set(ring).is_err() {
            unreachable!("a connection's rings are settled once");
        }
    }

    /// From now on, large host frames come through `ring` (taken from the peer). Before any
    /// message of the application.
    fn receive_through(&self, ring: ring::RingIn) {
        if self.ring_in.set(ring).is_err() {
            unreachable!("a connection's rings are settled once");
        }
    }

    /// Whether large host frames go through shared-memory rings: (sending, receiving).
    pub(crate) fn rings(&self) -> (bool, bool) {
        (self.ring_out.get().is_some(), self.ring_in.get().is_some())
    }

    /// The endpoint the connection's traffic travels on.
    fn ep(&self) -> &Arc<ucx::Endpoint> {
        self.direct.get().unwrap_or(&self.cs)
    }

    /// The client-server endpoint the connection was made on (where [`crate::ucx_lanes`]
    /// negotiates).
    pub(crate) fn client_server(&self) -> &Arc<ucx::Endpoint> {
        &self.cs
    }

    /// Whether the traffic moved to an endpoint connected by worker address.
    pub(crate) fn is_direct(&self) -> bool {
        self.direct.get().is_some()
    }

    /// UCX's description of the endpoint in use (`ucp_ep_print_info`).
    pub(crate) fn transports(&self) -> Result<String> {
        Ok(self.ep().transports()?)
    }

    /// Moves the connection's traffic to `ep` (an endpoint to the same peer, by its worker
    /// address, with the same tags). Called once, before any message of the application moved:
    /// the peer moves at the same point of the exchange. From here failures of `ep` are the
    /// connection's; the client-server endpoint stays open, watched for the peer's death.
    pub(crate) fn move_to(&self, ep: ucx::Endpoint) {
        let ep = Arc::new(ep);
        watch(&ep, &self.receiving, &self.ahead, &self.state);
        // The client-server endpoint's TCP connection still tells at once when the peer dies
        // or cuts the connection. A graceful close sends a goodbye on it first, but UCX may
        // report the endpoint's reset (on its connection manager's socket) before the goodbye
        // (on a data lane) is taken in: the verdict waits for it a little ([`GOODBYE_GRACE`]).
        let (weak, direct, state, cut) = (
            Arc::downgrade(&self.cs),
            Arc::downgrade(&ep),
            Arc::clone(&self.state),
            Arc::clone(&self.cut),
        );
        let receiving = Arc::clone(&self.receiving);
        let runtime = tokio::runtime::Handle::try_current().ok();
        self.cs.on_close(move |reason| {
            let (Some(ucx::Error::Ucx(status)), Some(runtime)) = (reason, runtime) else {
                return;
            };
            runtime.spawn(async move {
                let step = GOODBYE_GRACE / 20;
                for _ in 0..20 {
                    let Some(cs) = weak.upgrade() else { return };
                    // Taken out of UCX's queue (and dropped: discarded) as it is found.
                    if state.get().is_some() || cs.tag_probe(crate::ucx_lanes::LANES_TAG, true).is_some() {
                        return;
                    }
                    drop(cs);
                    tokio::time::sleep(step).await;
                }
                tracing::debug!(%status, "the client-server endpoint failed without a goodbye: the peer is gone");
                let why = CloseReason::PeerFailed(Failure::Ucx(status));
                state.close(why.clone());
                let _ = cut.set(why.clone());
                // Aborted: that ends every pending operation (their errors then say why),
                // where a flushing close to a dead peer on shared memory would wait for UCX's
                // keepalive.
                if let Some(direct) = direct.upgrade() {
                    direct.abort();
                }
                give_up_if_stalled(receiving, state, why).await;
            });
        });
        if self.direct.set(ep).is_err() {
            unreachable!("a connection moves once");
        }
        tracing::debug!("ucx:// moved to an endpoint connected by worker address");
    }

    /// The error an operation ended with: once the connection is cut (`cut` set, and the
    /// endpoint in use aborted, which ends the operation), why it was cut.
    pub(crate) fn cut_reason(&self, e: Error) -> Error {
        match self.cut.get() {
            Some(CloseReason::Refused(p)) => Error::Protocol(p.clone()),
            Some(why) => Error::Closed(why.clone()),
            None => e,
        }
    }

    /// Ends the connection without a close marker: the peer's operations fail. Before a move,
    /// by aborting the endpoint. After it, by aborting both endpoints: the peer learns it from
    /// the client-server endpoint's TCP connection, as from a death; this side's pending
    /// operations end with `why`.
    fn cut_off(&self, why: CloseReason) {
        if let Some(direct) = self.direct.get() {
            let _ = self.cut.set(why);
            direct.abort();
        }
        self.cs.abort();
    }

    /// Closes the connection after the peer broke the wire format.
    fn refuse(&self, e: ProtocolError) -> Error {
        tracing::warn!(error = %e, "closing a UCX connection after a malformed message");
        self.cut_off(CloseReason::Refused(e.clone()));
        Error::Protocol(e)
    }

    pub(crate) async fn close(&self) -> Result<()> {
        if self.cut.get().is_some() {
            // The peer is gone (or was cut off): nothing more can be delivered, and sends it
            // will never take are cancelled by a forced close.
            self.ep().abort();
            self.cs.abort();
            return Ok(());
        }
        // The marker first (outside the credits: it is the last message), so the peer knows
        // this is a close; a peer already gone does not make the close fail.
        let send = std::pin::pin!(self.ep().send(close_marker(), TAG));
        let (r, _) = self.post_in_order(send).await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "the close marker was not delivered");
        }
        let direct = self.direct.get().map(Arc::clone);
        finish_close(direct, Arc::clone(&self.cs), true).await
    }
}

/// A connection dropped without [`Conn::close`] (nor a failure) ends in the background: no
/// close marker, so the peer sees it vanish (a failure, as on the other backends), but what
/// it sent before still reaches the peer first (the round trip of [`finish_close`]). Without
/// a runtime its endpoints just close.
impl Drop for Conn {
    fn drop(&mut self) {
        if self.cut.get().is_some() || self.state.get().is_some() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (direct, cs) = (self.direct.get().map(Arc::clone), Arc::clone(&self.cs));
        runtime.spawn(async move {
            if let Err(e) = finish_close(direct, cs, false).await {
                tracing::debug!(error = %e, "closing a dropped connection failed");
            }
        });
    }
}

/// How long a close waits for the peer's worker to answer [`ucx::Endpoint::sync_with_peer`]
/// (a peer that does not progress, or is not ucx-rs, never answers).
const SYNC_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The rest of a close once the marker is posted (`graceful`; a dropped connection posts none
/// and sends no goodbye): the goodbye of a moved connection; a round trip through the peer's
/// worker, so that it has taken in everything sent before (UCX completes a send once it left
/// this process, and on one host the close, on the connection manager's socket, could
/// overtake a rendezvous still in the peer's shared-memory queue: the peer's UCX then fails
/// the receive taking it); then the endpoints' close.
async fn finish_close(
    direct: Option<Arc<ucx::Endpoint>>,
    cs: Arc<ucx::Endpoint>,
    graceful: bool,
) -> Result<()> {
    let ep = direct.as_ref().unwrap_or(&cs);
    if graceful && direct.is_some() {
        // The goodbye, on the client-server endpoint before its close: the peer then takes
        // that close for a graceful one (the marker arrives on the other path).
        let (r, _) = cs.send(vec![2u8], crate::ucx_lanes::LANES_TAG).await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "the goodbye was not delivered");
        }
    }
    match tokio::time::timeout(SYNC_LIMIT, ep.sync_with_peer()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "the peer's worker did not answer before the close")
        }
        Err(_) => {
            tracing::debug!(limit = ?SYNC_LIMIT, "the peer's worker did not answer in time: closing anyway")
        }
    }
    // UCX's close waits for sends still in flight (a rendezvous waits for the peer to take
    // it): bounded, then forced (which cancels them).
    let closed = match tokio::time::timeout(CLOSE_LIMIT, ep.close()).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(limit = ?CLOSE_LIMIT, "the peer took no sends in flight before the close's limit: aborting");
            ep.abort();
            Ok(())
        }
    };
    if direct.is_some() {
        // A goodbye of the peer's that crossed ours stays queued: discard it.
        drop(cs.tag_probe(crate::ucx_lanes::LANES_TAG, true));
        if let Err(e) = cs.close().await {
            tracing::debug!(error = %e, "closing the client-server endpoint failed");
        }
    }
    match closed {
        Err(e) if !e.is_disconnect() => Err(Error::Ucx(e)),
        _ => Ok(()),
    }
}

/// How long a receive still posted when its endpoint failed may take to end by itself before
/// the connection gives it up ([`give_up_if_stalled`]).
const STALLED_RECEIVE_GRACE: std::time::Duration = std::time::Duration::from_millis(100);
/// How long a moved connection waits for the peer's goodbye after its client-server endpoint
/// failed, before it takes the peer for gone ([`Conn::move_to`]).
const GOODBYE_GRACE: std::time::Duration = std::time::Duration::from_millis(20);

/// Records in `state` a failure of `ep` that no receive will report. UCX's error handling
/// notices a peer that fails while nothing is pending. A peer's close shows up there too (as a
/// reset), after its marker: while a receive is posted (it takes the marker, or fails itself),
/// or a message (perhaps the marker) waits to be received, the receive is left to tell which
/// it was.
fn watch(
    ep: &Arc<ucx::Endpoint>,
    receiving: &Arc<AtomicBool>,
    ahead: &Arc<Ahead>,
    state: &Arc<CloseState>,
) {
    let (weak, posted, state) = (Arc::downgrade(ep), Arc::clone(receiving), Arc::clone(state));
    let ahead = Arc::downgrade(ahead);
    let runtime = tokio::runtime::Handle::try_current().ok();
    ep.on_close(move |reason| {
        let Some(ucx::Error::Ucx(status)) = reason else {
            return;
        };
        if posted.load(Ordering::Acquire) {
            // UCX cannot cancel a receive it matched to an eager message of several
            // fragments, and one from a peer that died before sending them all never ends.
            // Any other receive has ended (or taken what had arrived) well within the
            // grace; one still posted after it is given up.
            if let Some(runtime) = &runtime {
                let why = CloseReason::PeerFailed(Failure::Ucx(status));
                runtime.spawn(give_up_if_stalled(
                    Arc::clone(&posted),
                    Arc::clone(&state),
                    why,
                ));
            }
            return;
        }
        let taken = ahead.upgrade().is_some_and(|a| !a.is_empty());
        let queued = taken
            || weak
                .upgrade()
                .is_some_and(|ep| ep.tag_probe(TAG, false).is_some());
        if !queued {
            state.close(CloseReason::PeerFailed(Failure::Ucx(status)));
        }
    });
}

/// After [`STALLED_RECEIVE_GRACE`], ends the connection's receive with `why` if it is still
/// posted. For a receive on an endpoint that failed or was aborted.
async fn give_up_if_stalled(posted: Arc<AtomicBool>, state: Arc<CloseState>, why: CloseReason) {
    tokio::time::sleep(STALLED_RECEIVE_GRACE).await;
    if posted.load(Ordering::Acquire) {
        tracing::debug!(reason = %why, "a receive on a failed endpoint never ended: given up");
        state.give_up_receive(why);
    }
}

/// A UCX error as the transport reports it: a peer that went away, or a local close, is a
/// closed connection; anything else stays a UCX error.
pub(crate) fn closed_or(e: ucx::Error) -> Error {
    match e {
        ucx::Error::Closed => Error::Closed(CloseReason::Local),
        ucx::Error::Ucx(s) if s.is_peer_failure() => {
            Error::Closed(CloseReason::PeerFailed(Failure::Ucx(s)))
        }
        e => Error::Ucx(e),
    }
}
