//! Endpoints: connecting, the UCXX handshake, closing. The operations an endpoint carries
//! live with their concept: tagged messages and the stream in [`tagged`], batches of them in
//! [`batch`], active messages in
//! [`crate::am`], multi-buffer messages in [`crate::multi`], RMA in [`crate::rma`].

mod batch;
mod shared;
mod tagged;

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ucx_sys as sys;

pub(crate) use shared::{EpShared, Target};

use crate::error::{completed, Error, HandshakeError, Result};
#[cfg(doc)]
use crate::wire::Tag;
use crate::wire::{Handshake, HANDSHAKE_LEN};
use crate::worker::{ProgressMode, Worker};

/// Default time limit for connecting and for each side of the handshake (UCXX uses 5 s too).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest message [`Endpoint::recv_vec`] and [`Endpoint::recv_obj`] allocate by default.
pub const DEFAULT_MAX_MESSAGE: usize = 2 << 30;

/// Options for [`Endpoint::connect_with`].
#[derive(Debug, Clone, Copy)]
pub struct ConnectOptions {
    /// Limit for resolving, connecting and the handshake together.
    pub timeout: Duration,
    /// Run the UCXX handshake (default). Without it the endpoint has no default tags: use
    /// [`Tag::Forced`] or the stream API (for speaking other protocols, or testing peers).
    pub handshake: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            timeout: DEFAULT_TIMEOUT,
            handshake: true,
        }
    }
}

/// A connection to one peer, speaking UCXX's wire format.
///
/// Operations take owned buffers and return them with the result. All methods take `&self`,
/// so sends and receives can run concurrently (`tokio::join!`, or share it in an `Arc`).
/// Dropping an operation's future mid-flight is safe: receives are cancelled and the buffer is
/// freed only after UCX lets go of it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> ucx::Result<()> {
/// use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};
/// let ctx = Context::new()?;
/// let worker = Worker::new(&ctx, ProgressMode::Blocking)?;
/// let mut listener = Listener::bind(&worker, "127.0.0.1:0".parse().unwrap())?;
/// let addr = listener.local_addr();
/// let (server, client) = tokio::join!(listener.accept(), Endpoint::connect(&worker, addr));
/// let (server, client) = (server?, client?);
/// let (sent, recvd) = tokio::join!(client.send(b"hello".to_vec(), 7), server.recv(vec![0u8; 64], 7));
/// sent.0?;
/// let (n, buf) = recvd;
/// assert_eq!(&buf[..n?], b"hello");
/// client.close().await?;
/// # Ok(()) }
/// ```
pub struct Endpoint {
    pub(crate) shared: Arc<EpShared>,
    /// Base of send tags: the peer's handshake tag.
    send_base: u64,
    /// Base of receive tags: our handshake tag.
    recv_base: u64,
    tag_cache: Mutex<Vec<(i128, u64, u64)>>,
    pub(crate) max_message: usize,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("peer", &self.shared.peer)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Endpoint {
    /// Connects to a UCXX-compatible listener (ours or UCXX's) and runs the handshake.
    pub async fn connect(
        worker: &Worker,
        addr: impl tokio::net::ToSocketAddrs,
    ) -> Result<Endpoint> {
        Self::connect_with(worker, addr, ConnectOptions::default()).await
    }

    /// [`connect`](Self::connect) with a time limit and handshake choice.
    pub async fn connect_with(
        worker: &Worker,
        addr: impl tokio::net::ToSocketAddrs,
        opts: ConnectOptions,
    ) -> Result<Endpoint> {
        // Timers and name resolution are tokio's: fail cleanly instead of panicking without it.
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime("Endpoint::connect"))?;
        let attempt = async {
            let addr = tokio::net::lookup_host(addr)
                .await
                .map_err(|e| Error::os("resolving the address", e))?
                .next()
                .ok_or_else(|| Error::InvalidArgument("address resolved to nothing".into()))?;
            let span = tracing::debug_span!("ucx_connect", %addr);
            let _g = span.enter();
            tracing::debug!("connecting");
            drop(_g);
            worker.context().check_address_family(&addr)?;
            let ep =
                Endpoint::unhandshaken(EpShared::create(&worker.shared, Target::Sockaddr(addr))?);
            let ep = if opts.handshake {
                Endpoint::handshake(ep, false).await?
            } else {
                ep
            };
            tracing::debug!(%addr, "connected");
            Ok(ep)
        };
        match tokio::time::timeout(opts.timeout, attempt).await {
            Ok(r) => r.inspect_err(|e| tracing::warn!(error = %e, "connect failed")),
            Err(_) => {
                tracing::warn!(timeout = ?opts.timeout, "connect timed out");
                Err(Error::Timeout(opts.timeout))
            }
        }
    }

    /// Connects to a worker by its UCP address (from [`Worker::address`], exchanged out of
    /// band). There is no handshake: both tag bases are 0, so [`Tag::Default`] and user tags
    /// match between two address-connected endpoints, and [`Tag::Forced`] works with anyone.
    ///
    /// Address-connected endpoints pick transports like `ucx_perftest` does (shared memory
    /// alone on one host), while client-server endpoints also carry TCP lanes.
    ///
    /// # Safety
    /// `address` must be the unmodified bytes of [`Worker::address`] of some worker (in this
    /// process or another). UCX parses addresses without validating them: corrupted bytes
    /// make it abort the process (seen with UCX 1.13), so bytes from an untrusted peer must
    /// not reach this call.
    pub unsafe fn connect_address(worker: &Worker, address: &[u8]) -> Result<Endpoint> {
        if address.len() < 8 {
            return Err(Error::InvalidArgument(format!(
                "a UCP worker address of {} bytes is too short",
                address.len()
            )));
        }
        let shared = EpShared::create(&worker.shared, Target::Address(address.to_vec()))?;
        tracing::debug!(len = address.len(), "connected by worker address");
        Ok(Endpoint::from_parts(shared, 0, 0))
    }

    /// A second endpoint to this endpoint's peer, connected by the peer's worker address and
    /// speaking this endpoint's tags: a message sent on either matches receives posted on
    /// either (tags are matched per worker). A client-server endpoint carries the listener's
    /// TCP lanes too; one connected by address uses what the two workers share (shared memory
    /// on one host), so after a handshake two peers may exchange addresses and move their
    /// traffic here. Each endpoint fails and closes on its own.
    ///
    /// # Safety
    /// As for [`connect_address`](Self::connect_address): `address` must be the unmodified
    /// bytes of some worker's [`Worker::address`]. (UCX's listeners unpack the address a
    /// client sends in its connection request just as trustingly.)
    pub unsafe fn connect_address_alike(&self, address: &[u8]) -> Result<Endpoint> {
        // SAFETY: the caller vouches for the address.
        let mut ep = unsafe { Endpoint::connect_address(&self.worker(), address) }?;
        ep.send_base = self.send_base;
        ep.recv_base = self.recv_base;
        ep.max_message = self.max_message;
        Ok(ep)
    }

    fn from_parts(shared: Arc<EpShared>, send_base: u64, recv_base: u64) -> Endpoint {
        Endpoint {
            shared,
            send_base,
            recv_base,
            tag_cache: Mutex::new(Vec::new()),
            max_message: DEFAULT_MAX_MESSAGE,
        }
    }

    /// Runs the UCXX handshake: the listener side sends first, the client receives first.
    /// An endpoint before its handshake: dropping it closes the UCP endpoint, so a handshake
    /// that fails or is abandoned never leaks one.
    pub(crate) fn unhandshaken(shared: Arc<EpShared>) -> Endpoint {
        Endpoint::from_parts(shared, 0, 0)
    }

    /// Runs the UCXX handshake: the listener side sends first, the client receives first.
    pub(crate) async fn handshake(mut ep: Endpoint, listener_side: bool) -> Result<Endpoint> {
        let ours = Handshake::new(rand::random::<u64>());
        ep.recv_base = ours.msg_tag;
        if listener_side {
            ep.send_handshake(&ours).await?;
        }
        let (r, buf) = ep
            .shared
            .stream_recv_exact(Vec::with_capacity(HANDSHAKE_LEN))
            .await;
        r.map_err(handshake_receive_error)?;
        let theirs = Handshake::decode(&buf)?;
        if !listener_side {
            ep.send_handshake(&ours).await?;
        }
        ep.send_base = theirs.msg_tag;
        Ok(ep)
    }

    async fn send_handshake(&self, ours: &Handshake) -> Result<()> {
        let (r, _) = self.shared.stream_send(ours.encode().to_vec()).await;
        r.map_err(|e| HandshakeError::Sending(Box::new(e)).into())
    }
}

/// Lifecycle and introspection.
impl Endpoint {
    /// Closes the endpoint (flushing) once `n` receives have completed on it, counted from its
    /// creation or, with `count_from_now`, from this call (UCX-Py's `close_after_n_recv`).
    /// `recv_obj` counts as two receives, as in UCX-Py.
    pub fn close_after_n_recv(&self, n: u64, count_from_now: bool) -> Result<()> {
        let now = self.shared.recv_count.load(Ordering::Acquire);
        let target = if count_from_now {
            now.saturating_add(n)
        } else {
            n
        };
        if target < now {
            return Err(Error::InvalidArgument(format!(
                "close_after_n_recv({n}): {now} receives already completed"
            )));
        }
        self.shared.close_after.store(target, Ordering::Release);
        if target == now {
            self.shared
                .start_close(&mut self.shared.worker.lock(), false);
        }
        Ok(())
    }

    /// UCX's description of this endpoint: its lanes and the transports they use
    /// (`ucp_ep_print_info`).
    pub fn transports(&self) -> Result<String> {
        let locked = self.shared.worker.lock();
        let ep = self.shared.live(&locked)?;
        crate::context::capture_file(|f| {
            // SAFETY: ep is live under the worker lock; f is an open stream.
            unsafe { sys::ucp_ep_print_info(ep, f) }
        })
    }

    /// Waits for sends still in flight, flushes, then closes. Pending receives fail with
    /// [`Error::Closed`]. A send the peer never takes (a rendezvous it discarded) keeps this
    /// waiting: bound it with a timeout; dropping the endpoint, or a close abandoned by its
    /// timeout, then closes it forcibly, cancelling such sends.
    pub async fn close(&self) -> Result<()> {
        for op in self.shared.sends_in_flight() {
            if self.shared.ended_by().is_some() {
                break; // UCX cancels them as the endpoint closes
            }
            crate::request::wait(&op, &self.shared.worker).await;
        }
        let op = self
            .shared
            .start_close(&mut self.shared.worker.lock(), false);
        if let Some(op) = op {
            crate::request::wait(&op, &self.shared.worker).await;
            match completed(op.completion().status, None) {
                Ok(()) | Err(Error::Closed) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "endpoint close completed with error");
                    return Err(e);
                }
            }
        }
        tracing::debug!(peer = ?self.shared.peer, "endpoint closed");
        Ok(())
    }

    /// Closes at once without flushing; outstanding operations fail.
    pub fn abort(&self) {
        let mut locked = self.shared.worker.lock();
        self.shared.start_close(&mut locked, true);
        tracing::debug!(peer = ?self.shared.peer, "endpoint aborted");
    }

    /// Whether the endpoint was closed locally or failed.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire) || self.shared.ended_by().is_some()
    }

    /// The error that closed the endpoint from the peer's side, if any.
    pub fn peer_error(&self) -> Option<Error> {
        self.shared.ended_by().map(Error::Ucx)
    }

    /// Calls `f` once when the endpoint closes: with `None` for a local close, or the error
    /// when the peer failed or closed. Called at once if it is already closed.
    pub fn on_close(&self, f: impl FnOnce(Option<Error>) + Send + 'static) {
        // Under the worker lock, so that a close or failure cannot slip between the check
        // and the store (callbacks and closes run under it too).
        let locked = self.shared.worker.lock();
        if !self.is_closed() {
            *self
                .shared
                .on_close
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(Box::new(f));
            return;
        }
        drop(locked);
        f(self.peer_error());
    }

    /// The peer's socket address, when known.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.shared.peer
    }

    /// The local socket address of a client-server endpoint's connection (the one its peer
    /// sees as [`peer_addr`](Self::peer_addr)); `None` for an endpoint made from a worker
    /// address, and once the endpoint is closed.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.peer?;
        let locked = self.shared.worker.lock();
        let ep = self.shared.live(&locked).ok()?;
        let mut attr = sys::ucp_ep_attr_t {
            field_mask: sys::UCP_EP_ATTR_FIELD_LOCAL_SOCKADDR as u64,
            ..Default::default()
        };
        // SAFETY: ep is live under the worker lock; attr is a valid out-struct.
        crate::error::check(unsafe { sys::ucp_ep_query(ep, &mut attr) }).ok()?;
        crate::listener::sockaddr_from_storage(&attr.local_sockaddr)
    }

    /// The raw UCP tags this endpoint sends to and receives on (UCXX's `msg_send`/`msg_recv`).
    pub fn raw_tags(&self) -> (u64, u64) {
        (self.send_base, self.recv_base)
    }

    /// The worker this endpoint lives on.
    pub fn worker(&self) -> Worker {
        Worker {
            shared: Arc::clone(&self.shared.worker),
        }
    }
}

/// A failed receive of the peer's handshake. A peer that is unreachable or refused is reported
/// as the UCX error it is.
fn handshake_receive_error(e: Error) -> Error {
    match e {
        Error::Ucx(s) if matches!(s.0, sys::UCS_ERR_UNREACHABLE | sys::UCS_ERR_REJECTED) => e,
        e => HandshakeError::Receiving(Box::new(e)).into(),
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let op = self
            .shared
            .start_close(&mut self.shared.worker.lock(), false);
        // A polling worker has no background progress: finish the close here, bounded.
        if let (Some(op), ProgressMode::Polling) = (op, self.shared.worker.mode()) {
            let deadline = Instant::now() + Duration::from_millis(500);
            while !op.is_done() && Instant::now() < deadline {
                self.shared.worker.lock().progress();
            }
        }
    }
}
