//! Listeners: accept client-server connections and run the listener side of the handshake.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::ptr;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskCx, Poll};
use std::time::Duration;

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
}

unsafe extern "C" fn conn_cb(req: sys::ucp_conn_request_h, arg: *mut c_void) {
    // SAFETY: arg points to the Incoming the Listener keeps alive until after
    // ucp_listener_destroy, after which UCX calls this no more.
    let incoming = unsafe { &*(arg as *const Incoming) };
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
        let locked = worker.shared.lock();
        let mut handle: sys::ucp_listener_h = ptr::null_mut();
        // SAFETY: worker locked; params and the sockaddr live across the call; the callback
        // argument outlives the listener (see Drop).
        check(unsafe { sys::ucp_listener_create(locked.handle(), &params, &mut handle) })
            .inspect_err(|e| tracing::warn!(%addr, error = %e, "listen failed"))?;
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

    /// The next connection, handshaken. Errors are per connection: keep calling.
    pub async fn accept(&mut self) -> Result<Endpoint> {
        match self.next().await {
            Some(r) => r,
            None => Err(Error::Closed),
        }
    }

    fn start_handshakes(&mut self) -> Option<Error> {
        let requests: Vec<usize> = self
            .incoming
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        let mut first_err = None;
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
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err
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
        if let Some(e) = self.start_handshakes() {
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
        let locked = self.worker.shared.lock();
        for req in self
            .incoming
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // SAFETY: a queued request was never handed to ucp_ep_create; rejecting it once
            // releases it. The listener is still alive.
            unsafe { sys::ucp_listener_reject(self.handle, req as sys::ucp_conn_request_h) };
        }
        // SAFETY: the listener is alive and the worker locked; after this UCX calls conn_cb no
        // more, so `incoming` may be freed when the fields drop.
        unsafe { sys::ucp_listener_destroy(self.handle) };
        drop(locked);
        tracing::debug!(local = %self.local, "UCX listener closed");
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

fn sockaddr_from_storage(s: &sys::sockaddr_storage) -> Option<SocketAddr> {
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
