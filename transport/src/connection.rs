//! [`Connection`]: one ordered stream of messages over any backend, its cancel-safe receive,
//! and how it records why it closed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use futures::task::AtomicWaker;

#[cfg(feature = "ucx")]
use crate::ucx_backend;
use crate::{check_outgoing, frame, inproc, tcp, Address, CloseReason, Error, Message, Result};

/// A connection carrying messages; see the crate docs.
#[derive(Debug)]
pub struct Connection {
    pub(crate) inner: Arc<ConnInner>,
    peer: Address,
    /// This end's socket address (`tcp://`, `tls://`, `ucx://`), read when it was made.
    local: Option<std::net::SocketAddr>,
    state: Arc<CloseState>,
    /// One receiver at a time. A `recv` dropped mid-way (`select!`, a timeout) leaves its
    /// receive here and the next `recv` goes on with it: no message, or part of one, is lost.
    /// `futures`' lock rather than tokio's: uncontended, it is one atomic operation each way,
    /// where tokio's semaphore also locks its waiter list to release (measured with
    /// callgrind: 176 instructions fewer per receive).
    recv_slot: futures::lock::Mutex<Box<dyn RecvSlot>>,
}

/// Why and whether a connection closed: set once (the first reason wins), by the connection's
/// own operations or, on `ucx://`, by UCX's error handling.
#[derive(Debug, Default)]
pub(crate) struct CloseState {
    reason: Mutex<Option<CloseReason>>,
    /// Whether `reason` is set: read on every send and receive, without the lock.
    set: AtomicBool,
    changed: tokio::sync::Notify,
    /// The task of the receive in progress (one at a time), woken by a close. Cheaper to poll
    /// than a `Notify`, whose waiter list is locked on every poll of a pending receive.
    receiver: AtomicWaker,
    /// Set by [`give_up_receive`](Self::give_up_receive): a receive in progress that is still
    /// pending when polled ends with `given_up`'s reason.
    stalled: AtomicBool,
    given_up: Mutex<Option<CloseReason>>,
}

impl CloseState {
    /// Records `reason` unless one is recorded; returns the one that holds.
    pub(crate) fn close(&self, reason: CloseReason) -> CloseReason {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        let held = r.get_or_insert(reason).clone();
        self.set.store(true, Ordering::Release);
        drop(r);
        self.changed.notify_waiters();
        self.receiver.wake();
        held
    }

    /// Ends the receive in progress with `reason` once a poll finds it still pending (what
    /// it completed is delivered first). For a receive the backend cannot end: on `ucx://`,
    /// one that UCX matched to a message from a peer that died before sending all of it
    /// (docs/notes/2026-11-27-eager-up-to-64k.md). What it holds stays with it, unread.
    #[cfg(feature = "ucx")]
    pub(crate) fn give_up_receive(&self, reason: CloseReason) {
        self.given_up
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(reason);
        self.stalled.store(true, Ordering::Release);
        self.receiver.wake();
    }

    /// The reason a pending receive was given up with, if it was.
    fn given_up(&self) -> Option<CloseReason> {
        read_flagged(&self.stalled, &self.given_up)
    }

    pub(crate) fn get(&self) -> Option<CloseReason> {
        read_flagged(&self.set, &self.reason)
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
    fn observe(&self, e: Error) -> Error {
        match e {
            Error::Closed(r) => Error::Closed(self.close(r)),
            Error::Protocol(p) => {
                self.close(CloseReason::Refused(p.clone()));
                Error::Protocol(p)
            }
            e => e,
        }
    }
}

/// The reason in `reason` once `flag` says it is set: one atomic load while it is not.
fn read_flagged(flag: &AtomicBool, reason: &Mutex<Option<CloseReason>>) -> Option<CloseReason> {
    if !flag.load(Ordering::Acquire) {
        return None;
    }
    reason.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// What a backend's receive delivers: the next message, and others that were already there
/// (ucx:// takes small messages that arrived in one pass; the other backends, none).
pub(crate) type Received = ((u32, Message), Vec<(u32, Message)>);

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
            // Usually none (a ping-pong's): extending by an empty vector still reserves,
            // copies nothing and frees it.
            if !more.is_empty() {
                self.ready.extend(more);
            }
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
pub(crate) enum ConnInner {
    Inproc(inproc::Conn),
    Tcp(tcp::Conn),
    #[cfg(feature = "ucx")]
    Ucx(ucx_backend::Conn),
}

impl Connection {
    pub(crate) fn new(inner: ConnInner, peer: Address, state: Arc<CloseState>) -> Connection {
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
        let local = match &*inner {
            ConnInner::Inproc(_) => None,
            ConnInner::Tcp(c) => c.local_addr(),
            #[cfg(feature = "ucx")]
            ConnInner::Ucx(c) => c.local_addr(),
        };
        Connection {
            inner,
            peer,
            local,
            state,
            recv_slot: futures::lock::Mutex::new(Box::new(Slot {
                receiving: Box::pin(None),
                start,
                ready: std::collections::VecDeque::new(),
            })),
        }
    }

    /// Sends `msg` on `channel` (below [`CLOSE_CHANNEL`](crate::CLOSE_CHANNEL)). Waits while
    /// the peer is not keeping up (bounded buffering).
    pub async fn send(&self, channel: u32, msg: Message) -> Result<()> {
        // Spelled out rather than shared with `send_batch`: a helper taking the backend's
        // future by value moved it once more per message (measured: 25% of the 8 B rate).
        if let Some(r) = self.state.get() {
            return Err(Error::Closed(r));
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
            return Err(Error::Closed(r));
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
                return Err(Error::Closed(r));
            }
            Some(r) => return Err(Error::Closed(r)),
            None => {}
        }
        // The waker registered for a local close: registered again only if the task's changed
        // (a polling-mode receive is polled many times while it waits).
        let mut registered: Option<std::task::Waker> = None;
        let r = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = slot.poll_recv(cx) {
                return Poll::Ready(r);
            }
            // A local close ends a pending receive (the backend's may wait for the peer). A
            // close records its reason before it wakes, so registering first, then reading
            // the reason, misses none.
            if !registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                self.state.receiver.register(cx.waker());
                registered = Some(cx.waker().clone());
            }
            match self.state.get() {
                Some(CloseReason::Local) => Poll::Ready(Err(Error::Closed(CloseReason::Local))),
                _ => match self.state.given_up() {
                    Some(r) => Poll::Ready(Err(Error::Closed(r))),
                    None => Poll::Pending,
                },
            }
        })
        .await;
        r.map_err(|e| self.state.observe(e))
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
    /// [`Options::limits`](crate::Options::limits)) and raises them once the peer proved who
    /// it is, so a stranger cannot make it allocate more than the handshake needs.
    pub fn set_limits(&self, limits: frame::Limits) {
        match &*self.inner {
            ConnInner::Inproc(c) => c.limits.set(limits),
            ConnInner::Tcp(c) => c.limits.set(limits),
            #[cfg(feature = "ucx")]
            ConnInner::Ucx(c) => c.limits.set(limits),
        }
    }

    /// `ucx://`: whether the connection moved to endpoints connected by worker address
    /// ([`Options::ucx_direct`](crate::Options::ucx_direct)); false on other schemes.
    pub fn is_ucx_direct(&self) -> bool {
        #[cfg(feature = "ucx")]
        if let ConnInner::Ucx(c) = &*self.inner {
            return c.is_direct();
        }
        false
    }

    /// `ucx://`: whether large host frames travel through shared-memory rings, (sending,
    /// receiving) (see [`UcxIntent::same_host_ring`](crate::UcxIntent::same_host_ring));
    /// `(false, false)` on other schemes.
    pub fn ucx_rings(&self) -> (bool, bool) {
        #[cfg(feature = "ucx")]
        if let ConnInner::Ucx(c) = &*self.inner {
            return c.rings();
        }
        (false, false)
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

    /// This end's socket address on `tcp://`, `tls://` and `ucx://` (on `ucx://`, that of
    /// the client-server connection it was made on): what the peer's
    /// [`peer_addr`](Self::peer_addr) of an accepted connection says. `None` on `inproc://`.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.local
    }
}
