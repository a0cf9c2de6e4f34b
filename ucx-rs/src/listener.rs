//! Listeners: accept client-server connections and run the listener side of the handshake.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::ptr;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskCx, Poll};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, Stream, StreamExt};
use futures::task::AtomicWaker;
use ucx_sys as sys;

use crate::endpoint::{EpShared, Target, DEFAULT_TIMEOUT};
use crate::error::{check, Error, HandshakeError, Result};
use crate::worker::{as_void, ProgressMode, Worker};
use crate::Endpoint;

/// Connection requests queued by UCX's callback until the accept stream picks them up.
struct Incoming {
    queue: Mutex<VecDeque<usize>>,
    waker: AtomicWaker,
    /// Connection requests UCX reported, since the listener was bound: [`Arrivals`].
    arrived: std::sync::atomic::AtomicUsize,
}

/// How many connection requests a [`Listener`] has had: each one is yielded by
/// [`Listener::accept`] exactly once, handshaken or as its error, so the requests still coming
/// are [`total`](Self::total) less the yields the caller counted. A server that waits until its
/// clients are served (UCXX's `Listener.active_clients`) counts these too: a client's connect
/// can complete before the listener's side of the handshake does. (Read the caller's count
/// first and this second: the difference then never dips below what is coming.)
#[derive(Clone)]
pub struct Arrivals(Arc<Incoming>);

impl Arrivals {
    /// The connection requests UCX reported since the listener was bound.
    pub fn total(&self) -> usize {
        self.0.arrived.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl fmt::Debug for Arrivals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Arrivals").field(&self.total()).finish()
    }
}

unsafe extern "C" fn conn_cb(req: sys::ucp_conn_request_h, arg: *mut c_void) {
    // SAFETY: arg points to the Incoming the Listener (then its `Parked`) keeps alive until
    // after ucp_listener_destroy, after which UCX calls this no more.
    let incoming = unsafe { &*(arg as *const Incoming) };
    incoming
        .arrived
        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    incoming
        .queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push_back(req as usize);
    if let Some(waker) = incoming.waker.take() {
        crate::request::wake_or_defer(waker);
    }
}

type Handshaking = tokio::task::JoinHandle<Result<Endpoint>>;

/// Accepts connections on a socket address. A [`Stream`] of handshaken [`Endpoint`]s.
///
/// Handshakes run concurrently, each with its own time limit, so a slow or bad client never
/// holds up others; a failed handshake is yielded as an error (and logged) and the listener
/// keeps serving. Dropping the listener leaves accepted endpoints working.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> ucx::Result<()> {
/// let ctx = ucx::Context::new()?;
/// let worker = ucx::Worker::new(&ctx, ucx::ProgressMode::Blocking)?;
/// let listener = ucx::Listener::bind(&worker, "0.0.0.0:0".parse().unwrap())?;
/// assert_ne!(listener.port(), 0);
/// # Ok(()) }
/// ```
pub struct Listener {
    worker: Worker,
    handle: sys::ucp_listener_h,
    incoming: Arc<Incoming>,
    local: SocketAddr,
    handshakes: FuturesUnordered<Handshaking>,
    /// Requests whose endpoint could not be created, each to be yielded as its error.
    failed: VecDeque<Error>,
    handshake_timeout: Duration,
    runtime: tokio::runtime::Handle,
    /// The worker's progress count after this listener's last poll (polling mode).
    seen_progress: u64,
}

// SAFETY: the listener handle is only used under the worker lock; the other fields are Send.
unsafe impl Send for Listener {}
// SAFETY: &Listener only exposes plain getters; everything touching UCX takes &mut self.
unsafe impl Sync for Listener {}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("local", &self.local)
            .finish()
    }
}

impl Listener {
    /// Listens on `addr` (IPv4 or IPv6; port 0 picks a free port). IPv6 needs
    /// `UCX_TCP_AF_PRIO=inet6` in the environment: without it UCX's TCP transport corrupts
    /// memory on IPv6 connections, so `bind` refuses with an explanation.
    ///
    /// Needs a tokio runtime: connection requests are picked up whenever the listener is
    /// polled, and from then on each handshake runs as its own task with a timer, so it
    /// progresses even while nobody is awaiting [`accept`](Self::accept).
    pub fn bind(worker: &Worker, addr: SocketAddr) -> Result<Listener> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::NoRuntime("Listener::bind"))?;
        worker.context().check_address_family(&addr)?;
        let incoming = Arc::new(Incoming {
            queue: Mutex::new(VecDeque::new()),
            waker: AtomicWaker::new(),
            arrived: std::sync::atomic::AtomicUsize::new(0),
        });
        let sa = socket2::SockAddr::from(addr);
        let params = sys::ucp_listener_params_t {
            field_mask: (sys::UCP_LISTENER_PARAM_FIELD_SOCK_ADDR
                | sys::UCP_LISTENER_PARAM_FIELD_CONN_HANDLER) as u64,
            sockaddr: sys::ucs_sock_addr_t {
                addr: sa.as_ptr() as *const sys::sockaddr,
                addrlen: sa.len(),
            },
            conn_handler: sys::ucp_listener_conn_handler_t {
                cb: Some(conn_cb),
                arg: as_void(Arc::as_ptr(&incoming)),
            },
            ..Default::default()
        };
        let mut locked = worker.shared.lock();
        // A listener dropped less than LINGER ago may hold the port: binding it again is asked
        // for, so that one goes now.
        if addr.port() != 0 {
            locked.reap_listeners(Reap::Port(addr.port()));
        }
        let mut handle: sys::ucp_listener_h = ptr::null_mut();
        // SAFETY: worker locked; params and the sockaddr live across the call; the callback
        // argument outlives the listener (see Drop).
        let created =
            check(unsafe { sys::ucp_listener_create(locked.handle(), &params, &mut handle) });
        created.inspect_err(|e| tracing::warn!(%addr, error = %e, "listen failed"))?;
        let mut attr = sys::ucp_listener_attr_t {
            field_mask: sys::UCP_LISTENER_ATTR_FIELD_SOCKADDR as u64,
            ..Default::default()
        };
        // SAFETY: handle is a live listener; attr is a valid out-struct.
        let queried = check(unsafe { sys::ucp_listener_query(handle, &mut attr) });
        drop(locked);
        let local = queried
            .ok()
            .and_then(|_| sockaddr_from_storage(&attr.sockaddr))
            .unwrap_or(addr);
        tracing::info!(%local, "UCX listener bound");
        Ok(Listener {
            worker: worker.clone(),
            handle,
            incoming,
            local,
            handshakes: FuturesUnordered::new(),
            failed: VecDeque::new(),
            handshake_timeout: DEFAULT_TIMEOUT,
            runtime,
            seen_progress: u64::MAX,
        })
    }

    /// Listens on all IPv4 interfaces.
    pub fn bind_port(worker: &Worker, port: u16) -> Result<Listener> {
        Self::bind(
            worker,
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        )
    }

    /// The bound address (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.local.port()
    }

    /// The bound IP address.
    pub fn ip(&self) -> IpAddr {
        self.local.ip()
    }

    /// Time limit for each accepted connection's handshake (default 5 s).
    pub fn set_handshake_timeout(&mut self, t: Duration) {
        self.handshake_timeout = t;
    }

    /// How many connection requests it has had ([`Arrivals`]): a handle that stays valid
    /// while the listener is moved into a task.
    pub fn arrivals(&self) -> Arrivals {
        Arrivals(Arc::clone(&self.incoming))
    }

    /// The next connection, handshaken. Errors are per connection: keep calling.
    pub async fn accept(&mut self) -> Result<Endpoint> {
        match self.next().await {
            Some(r) => r,
            None => Err(Error::Closed),
        }
    }

    /// Starts a handshake for each request UCX reported since the last poll; a request whose
    /// endpoint cannot be created is queued in `failed`, to be yielded as its error.
    fn start_handshakes(&mut self) {
        let requests: Vec<usize> = self
            .incoming
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for req in requests {
            let req = req as sys::ucp_conn_request_h;
            let peer = {
                let _locked = self.worker.shared.lock();
                conn_request_peer(req)
            };
            tracing::debug!(?peer, "connection request");
            match EpShared::create(&self.worker.shared, Target::ConnRequest(req, peer)) {
                Ok(shared) => {
                    let limit = self.handshake_timeout;
                    // Owned by the task from here: dropped (and closed) if the handshake fails
                    // or the task is aborted.
                    let ep = Endpoint::unhandshaken(shared);
                    self.handshakes.push(self.runtime.spawn(async move {
                        match tokio::time::timeout(limit, Endpoint::handshake(ep, true)).await {
                            Ok(Ok(ep)) => {
                                tracing::debug!(?peer, "accepted");
                                Ok(ep)
                            }
                            Ok(Err(e)) => Err(e),
                            Err(_) => Err(HandshakeError::TimedOut(limit).into()),
                        }
                        .inspect_err(|e| tracing::warn!(?peer, error = %e, "rejected connection"))
                    }));
                }
                Err(e) => {
                    tracing::warn!(?peer, error = %e, "creating the endpoint for a connection failed");
                    self.failed.push_back(e);
                }
            }
        }
    }
}

impl Stream for Listener {
    type Item = Result<Endpoint>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<Option<Self::Item>> {
        let polling = self.worker.mode() == ProgressMode::Polling;
        if polling {
            // Only when nothing else progressed the worker since this listener's last poll: a
            // pending accept beside a busy connection would otherwise double the progress
            // calls (connection requests found by others' progress wake `incoming.waker`).
            let mut locked = self.worker.shared.lock();
            if locked.progress_calls() == self.seen_progress {
                locked.progress();
            }
            let seen = locked.progress_calls();
            drop(locked);
            self.seen_progress = seen;
        }
        self.incoming.waker.register(cx.waker());
        self.start_handshakes();
        if let Some(e) = self.failed.pop_front() {
            return Poll::Ready(Some(Err(e)));
        }
        if let Poll::Ready(Some(joined)) = self.handshakes.poll_next_unpin(cx) {
            return Poll::Ready(Some(joined.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "handshake task ended");
                Err(HandshakeError::Aborted.into())
            })));
        }
        if polling {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Abandoned handshakes: their endpoints close as the aborted tasks drop them.
        for h in self.handshakes.iter() {
            h.abort();
        }
        let mut locked = self.worker.shared.lock();
        let mut parked = Parked {
            handle: self.handle,
            incoming: Arc::clone(&self.incoming),
            local: self.local,
            since: Instant::now(),
        };
        // SAFETY: the listener is alive and the worker locked.
        unsafe { parked.reject_queued() };
        locked.park_listener(parked);
        drop(locked);
        // Destroyed once it has refused nothing for the linger, whether or not the worker is
        // progressed then (a client still trying to connect keeps it, refusing, that long).
        let weak = Arc::downgrade(&self.worker.shared);
        let handle = self.handle as usize;
        self.runtime.spawn(async move {
            loop {
                tokio::time::sleep(LINGER).await;
                let Some(shared) = weak.upgrade() else { return };
                let mut locked = shared.lock();
                locked.reap_listeners(Reap::Expired);
                if !locked.is_parked(handle) {
                    return;
                }
            }
        });
        tracing::debug!(local = %self.local, "UCX listener closed: it refuses connections until destroyed");
    }
}

/// How long a dropped listener's UCX listener lives on after the last connection request it
/// refused (or its drop), refusing every request, before it is destroyed.
///
/// UCX's TCP connection manager accepts a connection before the client's request arrives on
/// it, and that accepted connection keeps a pointer to its listener which
/// `ucp_listener_destroy` leaves dangling (UCX 1.13.1 to the master of 2026): a request arriving
/// after the destroy calls back into freed memory and the process crashes
/// (`ucp_cm_server_conn_request_cb`; seen in CI when a cluster shut down while a worker
/// reconnected). A UCX client sends its request as soon as its connection is accepted, so
/// the listener is kept, refusing, until no such request can still be on its way from a
/// client that is running: `LINGER` after the last one it refused (a client retrying its
/// connect keeps it until it gives up). Binding its port again destroys it at once (see
/// [`Listener::bind`]); so does dropping the worker.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

/// A dropped listener, kept alive by its worker for [`LINGER`].
pub(crate) struct Parked {
    handle: sys::ucp_listener_h,
    incoming: Arc<Incoming>,
    local: SocketAddr,
    since: Instant,
}

// SAFETY: the handle is only used under the worker lock (or in the worker's drop).
unsafe impl Send for Parked {}

/// Which parked listeners [`Locked::reap_listeners`](crate::worker::Locked) destroys.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Reap {
    /// Those that refused nothing for [`LINGER`].
    Expired,
    /// Those bound to this port (it is being bound again).
    Port(u16),
}

impl Parked {
    /// Refuses the connection requests that came since the last call (and, if there were
    /// any, starts its linger again).
    ///
    /// # Safety
    /// The listener is alive and its worker locked.
    pub(crate) unsafe fn reject_queued(&mut self) {
        let queued: Vec<usize> = self
            .incoming
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        if !queued.is_empty() {
            self.since = Instant::now();
        }
        for req in queued {
            // SAFETY: a queued request was never handed to ucp_ep_create; rejecting it once
            // releases it. The listener is alive and the worker locked (the caller's promise).
            unsafe { sys::ucp_listener_reject(self.handle, req as sys::ucp_conn_request_h) };
            tracing::debug!(local = %self.local, "refused a connection to a closed listener");
        }
    }

    /// The listener's handle, as a number (which parked listener this is).
    pub(crate) fn id(&self) -> usize {
        self.handle as usize
    }

    /// Whether `reap` destroys this one now.
    pub(crate) fn due(&self, reap: Reap) -> bool {
        match reap {
            Reap::Expired => self.since.elapsed() >= LINGER,
            Reap::Port(port) => self.local.port() == port,
        }
    }

    /// Refuses what is queued, then destroys the UCX listener.
    ///
    /// # Safety
    /// The listener is alive and its worker locked; it is not used again.
    pub(crate) unsafe fn destroy(mut self) {
        // SAFETY: the caller's promise.
        unsafe { self.reject_queued() };
        // SAFETY: the listener is alive and the worker locked; after this UCX calls conn_cb no
        // more, so `incoming` may be freed when `self` drops.
        unsafe { sys::ucp_listener_destroy(self.handle) };
        tracing::debug!(local = %self.local, "UCX listener destroyed");
    }
}

fn conn_request_peer(req: sys::ucp_conn_request_h) -> Option<SocketAddr> {
    let mut attr = sys::ucp_conn_request_attr_t {
        field_mask: sys::UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR as u64,
        ..Default::default()
    };
    // SAFETY: req is a live connection request (not yet accepted or rejected); attr is valid.
    check(unsafe { sys::ucp_conn_request_query(req, &mut attr) }).ok()?;
    sockaddr_from_storage(&attr.client_address)
}

pub(crate) fn sockaddr_from_storage(s: &sys::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: both types are the C struct sockaddr_storage (same size and layout); we copy the
    // bytes into socket2's storage, and pass the full length, which is always large enough.
    let (_, addr) = unsafe {
        socket2::SockAddr::try_init(|storage, len| {
            ptr::copy_nonoverlapping(
                (s as *const sys::sockaddr_storage).cast::<u8>(),
                storage.cast::<u8>(),
                std::mem::size_of::<libc::sockaddr_storage>(),
            );
            *len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            Ok(())
        })
    }
    .ok()?;
    addr.as_socket()
}
