//! In-process connections: bounded channels, frames moved (reference-counted `Bytes`), never
//! copied. A full channel makes `send` wait, so a slow receiver bounds what is buffered.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use tokio::sync::mpsc;

use crate::{Message, Result, TransportError};

/// Messages buffered per direction before `send` waits.
const DEPTH: usize = 64;

type Item = (u32, Message);

fn registry() -> &'static Mutex<HashMap<String, mpsc::Sender<Conn>>> {
    static REG: OnceLock<Mutex<HashMap<String, mpsc::Sender<Conn>>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

#[derive(Debug)]
pub(crate) struct Listener {
    name: String,
    incoming: mpsc::Receiver<Conn>,
    /// Our own registration, to remove exactly it when dropped.
    me: mpsc::Sender<Conn>,
}

#[derive(Debug)]
pub(crate) struct Conn {
    tx: Mutex<Option<mpsc::Sender<Item>>>,
    rx: tokio::sync::Mutex<mpsc::Receiver<Item>>,
}

pub(crate) fn listen(name: &str) -> Result<Listener> {
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    if reg.get(name).is_some_and(|tx| !tx.is_closed()) {
        return Err(TransportError::Inproc(format!(
            "inproc://{name} is already listening"
        )));
    }
    let (tx, incoming) = mpsc::channel(DEPTH);
    reg.insert(name.to_string(), tx.clone());
    Ok(Listener {
        name: name.to_string(),
        incoming,
        me: tx,
    })
}

pub(crate) async fn connect(name: &str) -> Result<Conn> {
    let tx = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
        .cloned()
        .ok_or_else(|| TransportError::Inproc(format!("nothing listens on inproc://{name}")))?;
    let (a_tx, b_rx) = mpsc::channel(DEPTH);
    let (b_tx, a_rx) = mpsc::channel(DEPTH);
    let ours = Conn::new(a_tx, a_rx);
    tx.send(Conn::new(b_tx, b_rx))
        .await
        .map_err(|_| TransportError::Inproc(format!("inproc://{name} stopped listening")))?;
    Ok(ours)
}

impl Listener {
    pub(crate) async fn accept(&mut self) -> Result<Conn> {
        self.incoming
            .recv()
            .await
            .ok_or_else(|| TransportError::Closed("listener closed".into()))
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
    fn new(tx: mpsc::Sender<Item>, rx: mpsc::Receiver<Item>) -> Conn {
        Conn {
            tx: Mutex::new(Some(tx)),
            rx: tokio::sync::Mutex::new(rx),
        }
    }

    pub(crate) async fn send(&self, channel: u32, msg: Message) -> Result<()> {
        let tx = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| TransportError::Closed("closed locally".into()))?;
        tx.send((channel, msg))
            .await
            .map_err(|_| TransportError::Closed("the peer went away".into()))
    }

    pub(crate) async fn recv(&self) -> Result<Item> {
        self.rx
            .lock()
            .await
            .recv()
            .await
            .ok_or_else(|| TransportError::Closed("the peer closed".into()))
    }

    pub(crate) fn close(&self) -> Result<()> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        Ok(())
    }
}
