//! In-process connections: bounded channels, frames moved (reference-counted `Bytes`), never
//! copied. A full channel makes `send` wait, so a slow receiver bounds what is buffered.
//!
//! Each side enforces its [`Limits`](crate::frame::Limits) on what it sends and what it takes,
//! as the other backends do. A side that closes says so through a flag its peer reads when the
//! channel ends, so the peer tells a close from a dropped connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::mpsc;

use crate::frame::Limits;
use crate::{
    check_limits, check_outgoing, Address, CloseReason, Error, Failure, InprocError, Message,
    Options, ProtocolError, Result,
};

/// Messages buffered per direction before `send` waits.
const DEPTH: usize = 64;

type Item = (u32, Message);

/// A connection request: the accepting side's half, and the connecting side's number.
type Request = (Conn, u64);

fn registry() -> &'static Mutex<HashMap<String, mpsc::Sender<Request>>> {
    static REG: OnceLock<Mutex<HashMap<String, mpsc::Sender<Request>>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

#[derive(Debug)]
pub(crate) struct Listener {
    name: String,
    incoming: mpsc::Receiver<Request>,
    /// Our own registration, to remove exactly it when dropped.
    me: mpsc::Sender<Request>,
}

#[derive(Debug)]
pub(crate) struct Conn {
    tx: Mutex<Option<mpsc::Sender<Item>>>,
    rx: tokio::sync::Mutex<mpsc::Receiver<Item>>,
    /// Set by this side's close (the peer reads it).
    closed_here: Arc<AtomicBool>,
    /// The peer's `closed_here`.
    closed_there: Arc<AtomicBool>,
    pub(crate) limits: crate::SharedLimits,
}

pub(crate) fn listen(name: &str) -> Result<Listener> {
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    if reg.get(name).is_some_and(|tx| !tx.is_closed()) {
        return Err(Error::Inproc(InprocError::Taken(name.to_string())));
    }
    let (tx, incoming) = mpsc::channel(DEPTH);
    reg.insert(name.to_string(), tx.clone());
    Ok(Listener {
        name: name.to_string(),
        incoming,
        me: tx,
    })
}

pub(crate) async fn connect(name: &str, opts: &Options) -> Result<Conn> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let not_listening = || Error::Inproc(InprocError::NotListening(name.to_string()));
    let tx = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
        .cloned()
        .ok_or_else(not_listening)?;
    let (a_tx, b_rx) = mpsc::channel(DEPTH);
    let (b_tx, a_rx) = mpsc::channel(DEPTH);
    let (a_closed, b_closed) = (Arc::default(), Arc::default());
    let ours = Conn::new(a_tx, a_rx, &a_closed, &b_closed, opts.limits);
    // The accepting side's limits replace these when it accepts.
    let theirs = Conn::new(b_tx, b_rx, &b_closed, &a_closed, opts.limits);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    tx.send((theirs, id)).await.map_err(|_| not_listening())?;
    Ok(ours)
}

impl Listener {
    /// The next connection, with the peer's address: `inproc://<name>/<number>`, the number
    /// unique among this process's connections.
    pub(crate) async fn accept(&mut self, opts: &Options) -> Result<(Conn, Address)> {
        let (conn, id) = self
            .incoming
            .recv()
            .await
            .ok_or(Error::Closed(CloseReason::Local))?;
        conn.limits.set(opts.limits);
        Ok((conn, Address::Inproc(format!("{}/{id}", self.name))))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        if reg
            .get(&self.name)
            .is_some_and(|tx| tx.same_channel(&self.me))
        {
            reg.remove(&self.name);
        }
    }
}

impl Conn {
    fn new(
        tx: mpsc::Sender<Item>,
        rx: mpsc::Receiver<Item>,
        closed_here: &Arc<AtomicBool>,
        closed_there: &Arc<AtomicBool>,
        limits: Limits,
    ) -> Conn {
        Conn {
            tx: Mutex::new(Some(tx)),
            rx: tokio::sync::Mutex::new(rx),
            closed_here: Arc::clone(closed_here),
            closed_there: Arc::clone(closed_there),
            limits: crate::SharedLimits::new(limits),
        }
    }

    /// Why the peer's side of the channel ended.
    fn peer_end(&self) -> Error {
        Error::Closed(if self.closed_there.load(Ordering::Acquire) {
            CloseReason::PeerClosed
        } else {
            CloseReason::PeerFailed(Failure::Vanished)
        })
    }

    pub(crate) async fn send(&self, channel: u32, msg: Message) -> Result<()> {
        check_outgoing(channel, &msg, &self.limits.get())?;
        let tx = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(Error::Closed(CloseReason::Local))?;
        tx.send((channel, msg)).await.map_err(|_| self.peer_end())
    }

    pub(crate) async fn recv(&self) -> Result<Item> {
        let (channel, msg) = self
            .rx
            .lock()
            .await
            .recv()
            .await
            .ok_or_else(|| self.peer_end())?;
        if let Err(e) = check_limits(&msg, &self.limits.get()) {
            self.close()?;
            return Err(Error::Protocol(ProtocolError::Header(e)));
        }
        Ok((channel, msg))
    }

    pub(crate) fn close(&self) -> Result<()> {
        self.closed_here.store(true, Ordering::Release);
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Dropping the sender ends the peer's channel; `closed_here` stays false unless this
        // side closed, so the peer sees a connection that vanished.
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}
