//! A comm's receive made ahead of its next read, once the comm has idled: what makes a write
//! complete whether or not the peer is reading, as over TCP.
//!
//! `transport` receives when the application asks (a receive posted when `recv` is awaited), so
//! a message's large frames, which go by rendezvous on `ucx://`, wait for the peer's read: a
//! Dask comm that writes 8 MiB or more before the other side reads (distributed's
//! `check_deserialize_roundtrip` does) would wait forever. Dask's contract is TCP's: the
//! write completes, and the bytes wait at the receiver.
//!
//! So a [`ReadAhead`] is armed whenever its comm has no read in progress (from its creation,
//! and after each read). A comm still armed after [`IDLE`] gets a receive of its own, on the
//! runtime: the next message lands (large frames within the process's receive budget,
//! `transport::receive_budget`), and is kept for the next read. One message ahead at most; the
//! writer of a second waits, as a TCP writer waits once the socket buffers are full. A read
//! that comes before [`IDLE`] receives directly, as before, with nothing between it and the
//! transport (small messages keep their latency): one scanner task for every comm checks what
//! is due, so arming costs a lock and a push, not a timer or a task per message.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tracing::debug;
use transport::{Connection, Message};

/// How long a comm idles (no read in progress) before it receives ahead.
pub(crate) const IDLE: Duration = Duration::from_millis(2);

/// What a receive gives.
pub(crate) type Got = Result<(u32, Message), transport::Error>;

#[derive(Default)]
enum State {
    /// A read is in progress (or the comm is closed for reading ahead).
    #[default]
    Reading,
    /// No read in progress: the scanner starts a receive once [`IDLE`] is past.
    Armed { epoch: u64 },
    /// A receive ahead is in progress; readers wait for it.
    Receiving,
    /// What the receive ahead got, for the next read.
    Ready(Got),
}

#[derive(Default)]
struct Inner {
    state: State,
    /// Tells an arming from the next (the scanner starts only the one it saw).
    epoch: u64,
    task: Option<tokio::task::AbortHandle>,
}

/// A comm's receive ahead; see the module.
#[derive(Default)]
pub(crate) struct ReadAhead {
    inner: Mutex<Inner>,
    done: tokio::sync::Notify,
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.lock().state {
            State::Reading => "reading",
            State::Armed { .. } => "armed",
            State::Receiving => "receiving",
            State::Ready(_) => "ready",
        };
        f.debug_struct("ReadAhead").field("state", &state).finish()
    }
}

impl ReadAhead {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the comm idle: unless a read comes first, it receives ahead after [`IDLE`].
    pub(crate) fn arm(self: &Arc<Self>, conn: &Arc<Connection>) {
        let (epoch, at) = {
            let mut g = self.lock();
            if !matches!(g.state, State::Reading) {
                return; // a message is ready or coming already
            }
            g.epoch += 1;
            let at = Instant::now();
            g.state = State::Armed { epoch: g.epoch };
            (g.epoch, at)
        };
        scanner().push(Entry {
            ahead: Arc::downgrade(self),
            conn: Arc::downgrade(conn),
            epoch,
            at,
        });
    }

    /// The next message: the one received ahead, the one being received ahead, or a receive
    /// of its own. Cancel-safe: a message received ahead stays for the next read.
    pub(crate) async fn recv(&self, conn: &Connection) -> Got {
        loop {
            let notified = self.done.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let direct = {
                let mut g = self.lock();
                match std::mem::take(&mut g.state) {
                    State::Ready(got) => {
                        g.task = None;
                        return got;
                    }
                    State::Receiving => {
                        g.state = State::Receiving;
                        false
                    }
                    State::Reading | State::Armed { .. } => true, // now Reading
                }
            };
            if direct {
                return conn.recv().await;
            }
            notified.await;
        }
    }

    /// Starts the receive ahead armed as `epoch`, if the comm is still armed so.
    fn start(self: Arc<Self>, conn: Arc<Connection>, epoch: u64) {
        let mut g = self.lock();
        if !matches!(g.state, State::Armed { epoch: e, .. } if e == epoch) {
            return;
        }
        g.state = State::Receiving;
        debug!(peer = %conn.peer_addr(), "comm idle: receiving its next message ahead of a read");
        let ahead = Arc::clone(&self);
        let task = pyo3_async_runtimes::tokio::get_runtime().spawn(async move {
            let got = conn.recv().await;
            drop(conn);
            ahead.lock().state = State::Ready(got);
            ahead.done.notify_waiters();
        });
        g.task = Some(task.abort_handle());
    }

    /// Ends a receive ahead in progress (the comm is gone: the message, if one was coming,
    /// stays in the transport, which the connection's drop closes).
    pub(crate) fn stop(&self) {
        let mut g = self.lock();
        if let Some(task) = g.task.take() {
            task.abort();
        }
        g.state = State::Reading;
    }
}

/// A comm armed at `at`, for the scanner.
struct Entry {
    ahead: Weak<ReadAhead>,
    conn: Weak<Connection>,
    epoch: u64,
    at: Instant,
}

/// The comms armed, in the order they were, and the task that starts what is due.
struct Scanner {
    armed: Mutex<Vec<Entry>>,
    wake: tokio::sync::Notify,
}

impl Scanner {
    fn push(&self, e: Entry) {
        let was_empty = {
            let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
            armed.push(e);
            armed.len() == 1
        };
        if was_empty {
            self.wake.notify_one();
        }
    }

    async fn run(&'static self) {
        loop {
            let first = {
                let armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
                armed.first().map(|e| e.at)
            };
            let Some(first) = first else {
                self.wake.notified().await; // a permit from a push after the check is kept
                continue;
            };
            tokio::time::sleep_until((first + IDLE).into()).await;
            let now = Instant::now();
            let due: Vec<Entry> = {
                let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
                let split = armed.partition_point(|e| e.at + IDLE <= now);
                armed.drain(..split).collect()
            };
            for e in due {
                if let (Some(ahead), Some(conn)) = (e.ahead.upgrade(), e.conn.upgrade()) {
                    ahead.start(conn, e.epoch);
                }
            }
        }
    }
}

/// The process's scanner, started on the runtime at first use.
fn scanner() -> &'static Scanner {
    static SCANNER: std::sync::OnceLock<&'static Scanner> = std::sync::OnceLock::new();
    SCANNER.get_or_init(|| {
        let s: &'static Scanner = Box::leak(Box::new(Scanner {
            armed: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
        }));
        pyo3_async_runtimes::tokio::get_runtime().spawn(s.run());
        s
    })
}
