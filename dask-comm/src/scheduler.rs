//! The scheduler process: the core on one task, a reader and a writer per connection.
//!
//! Connections are admitted (security handshake, then a [`Hello`]) by a task of their own, so
//! a slow or hostile peer never holds up the core. Each pass of the core handles every event
//! that is waiting, then sends what it produced to each peer as one batch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use transport::{Address, Connection};

use crate::core::{Comm, Config, Core, NewWorker, Stats, WorkerSummary};
use crate::dashboard::{Recorder, Snapshot};
use crate::error::Result;
use crate::net;
use crate::protocol::{ClientId, FromClient, FromWorker, Hello, ToClient, ToWorker, WorkerId};
use crate::security::Secret;

enum Event {
    Joined(Arc<Connection>, Hello),
    Client(ClientId, Vec<FromClient>),
    Worker(WorkerId, Vec<FromWorker>),
    ClientLeft(ClientId, String),
    WorkerLeft(WorkerId, String),
    /// Someone asks what the core counted, and its workers.
    Stats(oneshot::Sender<(Stats, Vec<WorkerSummary>)>),
    /// Someone asks which tasks are not done, and why.
    Describe(oneshot::Sender<Vec<String>>),
    /// Start recording what the dashboard shows.
    Record,
    /// Stop when the clients have all left (or none came within this long).
    StopWhenClientsLeave(Duration),
    /// The dashboard asks for its view, with the task stream of the last this long.
    Dashboard(Duration, oneshot::Sender<Snapshot>),
}

/// Messages the core produced in one pass, by peer, and the peers it dropped.
#[derive(Default)]
struct Outboxes {
    workers: BTreeMap<WorkerId, Vec<ToWorker>>,
    clients: BTreeMap<ClientId, Vec<ToClient>>,
    dropped_workers: Vec<(WorkerId, String)>,
    dropped_clients: Vec<(ClientId, String)>,
}

impl Comm for Outboxes {
    fn send_worker(&mut self, w: WorkerId, msg: ToWorker) {
        self.workers.entry(w).or_default().push(msg);
    }
    fn send_client(&mut self, c: ClientId, msg: ToClient) {
        self.clients.entry(c).or_default().push(msg);
    }
    fn drop_worker(&mut self, w: WorkerId, reason: String) {
        self.dropped_workers.push((w, reason));
    }
    fn drop_client(&mut self, c: ClientId, reason: String) {
        self.dropped_clients.push((c, reason));
    }
}

/// A connected worker or client: its writer's queue, the connection, the writer task.
struct Peer<M> {
    tx: mpsc::UnboundedSender<Vec<M>>,
    conn: Arc<Connection>,
    writer: JoinHandle<()>,
    /// Messages and payload bytes queued for the writer and not yet taken by it.
    queued: Arc<net::Queued>,
    /// Since when the queue has been past the high-water mark, at the ticks that looked.
    over_since: Option<Instant>,
}

impl<M: serde::Serialize + crate::protocol::Payloads + Send + 'static> Peer<M> {
    fn start(conn: Arc<Connection>) -> Peer<M> {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(net::Queued::default());
        let writer = tokio::spawn(net::writer_counted(
            Arc::clone(&conn),
            rx,
            Some(Arc::clone(&queued)),
        ));
        Peer {
            tx,
            conn,
            writer,
            queued,
            over_since: None,
        }
    }

    /// Queues `msgs`.
    fn send(&self, mut msgs: Vec<M>) {
        self.queued.add(&mut msgs);
        let _ = self.tx.send(msgs);
    }

    /// At a tick: why the peer is to be dropped, when its queue has been past the high-water
    /// mark for [`QUEUE_GRACE`] (it does not read: stopped, partitioned, or far slower than
    /// the scheduler). A burst past the mark that the writer drains is no reason.
    fn stuck(&mut self, now: Instant) -> Option<String> {
        let (n, bytes) = self.queued.now();
        if n <= PEER_QUEUE_MESSAGES && bytes <= PEER_QUEUE_BYTES {
            self.over_since = None;
            return None;
        }
        let since = *self.over_since.get_or_insert(now);
        (now.saturating_duration_since(since) >= QUEUE_GRACE).then(|| {
            format!(
                "{n} messages ({bytes} bytes) queued and not taken for {QUEUE_GRACE:?}: past \
                 the high-water mark ({PEER_QUEUE_MESSAGES} messages or {PEER_QUEUE_BYTES} bytes)"
            )
        })
    }

    /// Ends the peer: what is queued (and `last`, if any) is delivered if the peer reads
    /// within [`CLOSE_WAIT`], then, after `linger`, the connection closes (itself bounded).
    /// A removed peer gets a linger: one that is stopped reads why it was removed when it
    /// continues (a closed `ucx://` endpoint drops what its peer had not yet received).
    fn end(
        self,
        last: Option<M>,
        linger: Duration,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        if let Some(m) = last {
            let _ = self.tx.send(vec![m]);
        }
        drop(self.tx);
        let (mut writer, conn) = (self.writer, self.conn);
        async move {
            if tokio::time::timeout(CLOSE_WAIT, &mut writer).await.is_err() {
                tracing::warn!(peer = %conn.peer_addr(), "a peer did not take its last messages in time");
                writer.abort();
            }
            // Or until the peer closes it (a removed worker that read the news and left).
            tokio::select! {
                _ = tokio::time::sleep(linger) => {}
                _ = conn.closed() => {}
            }
            if tokio::time::timeout(CLOSE_WAIT, conn.close())
                .await
                .is_err()
            {
                tracing::warn!(peer = %conn.peer_addr(), "closing a connection timed out");
            }
        }
    }
}

/// How long a peer that is dropped (or the scheduler shutting down) waits for its writer to
/// deliver the last messages, and then for the close.
const CLOSE_WAIT: Duration = Duration::from_secs(3);
/// How long the connection of a peer the core removed stays open after the news went out.
const REMOVED_LINGER: Duration = Duration::from_secs(30);
/// A peer with more messages than this queued for it, not taken by its writer, is
/// disconnected: it does not read.
const PEER_QUEUE_MESSAGES: usize = 1_000_000;
/// A peer with more payload bytes than this queued for it is disconnected.
const PEER_QUEUE_BYTES: u64 = 1 << 30;
/// How long a peer's queue may stay past the high-water mark before the peer is dropped.
const QUEUE_GRACE: Duration = Duration::from_secs(5);

/// A running scheduler.
#[derive(Debug)]
pub struct SchedulerServer {
    address: Address,
    events: mpsc::UnboundedSender<Event>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// `task` has been awaited to its end.
    finished: bool,
    /// The dashboard's server, when one was started.
    dashboard: Option<JoinHandle<()>>,
}

impl SchedulerServer {
    /// Starts a scheduler listening on `listen` (port 0 picks one; see [`Self::address`]) on the
    /// current tokio runtime.
    pub async fn start(listen: &Address, secret: Secret, cfg: Config) -> Result<SchedulerServer> {
        let mut listener = net::listen(listen).await?;
        let address = listener.local_addr().clone();
        tracing::info!(%address, "scheduler listening");
        let (events, rx) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel();
        let accept_events = events.clone();
        let accept_secret = secret.clone();
        let acceptor = tokio::spawn(async move {
            while let Ok(conn) = net::accept(&mut listener, "the scheduler", &mut || false).await {
                let (events, secret) = (accept_events.clone(), accept_secret.clone());
                tokio::spawn(async move {
                    let peer = conn.peer_addr().clone();
                    match net::admit(&conn, &secret).await {
                        Ok(hello) => {
                            let _ = events.send(Event::Joined(Arc::new(conn), hello));
                        }
                        Err(e) => {
                            tracing::warn!(%peer, error = %e, "refused a connection");
                            let _ = conn.close().await;
                        }
                    }
                });
            }
        });
        let task = tokio::spawn(run(Core::new(cfg), rx, events.clone(), stopped, acceptor));
        Ok(SchedulerServer {
            address,
            events,
            stop: Some(stop),
            task,
            finished: false,
            dashboard: None,
        })
    }

    /// Where clients and workers connect.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// Serves the dashboard ([`crate::dashboard`]) on `at` (port 0 picks one) and starts
    /// recording what it shows; returns where it listens. It needs no secret: keep it on
    /// loopback (or a trusted network).
    pub async fn serve_dashboard(
        &mut self,
        at: std::net::SocketAddr,
    ) -> Result<std::net::SocketAddr> {
        let listener = tokio::net::TcpListener::bind(at)
            .await
            .map_err(|e| crate::Error::os(format!("the dashboard listening on {at}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| crate::Error::os("the dashboard's address", e))?;
        let _ = self.events.send(Event::Record);
        let events = self.events.clone();
        let snapshot = move |window: Duration| {
            let events = events.clone();
            async move {
                let (tx, rx) = oneshot::channel();
                events.send(Event::Dashboard(window, tx)).ok()?;
                rx.await.ok()
            }
        };
        if let Some(old) = self
            .dashboard
            .replace(tokio::spawn(crate::dashboard::serve(listener, snapshot)))
        {
            old.abort();
        }
        tracing::info!(address = %local, "dashboard listening");
        Ok(local)
    }

    /// What the core counted since it started (workers lost and retired, tasks rescheduled
    /// and recomputed, steals, retries), and its workers now.
    pub fn stats(
        &self,
    ) -> impl std::future::Future<Output = Result<(Stats, Vec<WorkerSummary>)>> + Send + 'static
    {
        let events = self.events.clone();
        async move {
            let (tx, rx) = oneshot::channel();
            let gone = || crate::Error::Disconnected("the scheduler stopped".into());
            events.send(Event::Stats(tx)).map_err(|_| gone())?;
            rx.await.map_err(|_| gone())
        }
    }

    /// Up to 50 tasks that are not done, one line each, with their dependencies' states and
    /// holders (see [`Core::describe_pending`]).
    pub fn describe_pending(
        &self,
    ) -> impl std::future::Future<Output = Result<Vec<String>>> + Send + 'static {
        let events = self.events.clone();
        async move {
            let (tx, rx) = oneshot::channel();
            let gone = || crate::Error::Disconnected("the scheduler stopped".into());
            events.send(Event::Describe(tx)).map_err(|_| gone())?;
            rx.await.map_err(|_| gone())
        }
    }

    /// Waits until the scheduler stops (a client shut the cluster down with
    /// [`Client::shutdown`](crate::Client::shutdown)).
    pub async fn stopped(&mut self) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        let r = (&mut self.task).await;
        self.finished = true;
        r.map_err(|e| {
            tracing::error!(error = %e, "the scheduler's loop ended abnormally");
            crate::Error::Unexpected(format!("the scheduler's loop ended abnormally: {e}"))
        })
    }

    /// Runs until a client shuts the cluster down (the scheduler's own result, as
    /// [`stopped`](Self::stopped)), or SIGINT or SIGTERM comes: then shuts the cluster down
    /// ([`shutdown`](Self::shutdown)) and returns `Ok`. What a scheduler process's `main` waits
    /// on.
    pub async fn serve_until_signalled(mut self) -> Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())
            .map_err(|e| crate::Error::os("listening for SIGTERM", e))?;
        let ended = tokio::select! {
            r = self.stopped() => Some(r),
            _ = tokio::signal::ctrl_c() => None,
            _ = term.recv() => None,
        };
        match ended {
            Some(r) => r,
            None => {
                tracing::info!("signalled: shutting the cluster down");
                self.shutdown().await;
                Ok(())
            }
        }
    }

    /// Stops the scheduler (as a shutdown) once every client has left after one came, or when
    /// none came within `grace`: a launched job's scheduler outlives neither its client rank
    /// nor a client rank that never came.
    pub fn stop_when_clients_leave(&self, grace: Duration) {
        let _ = self.events.send(Event::StopWhenClientsLeave(grace));
    }

    /// Tells the workers to close, closes every connection and stops.
    pub async fn shutdown(mut self) {
        if let Some(d) = self.dashboard.take() {
            d.abort();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if !self.finished {
            let _ = (&mut self.task).await;
        }
    }
}

impl Drop for SchedulerServer {
    fn drop(&mut self) {
        if let Some(d) = self.dashboard.take() {
            d.abort();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn run(
    mut core: Core,
    mut rx: mpsc::UnboundedReceiver<Event>,
    events: mpsc::UnboundedSender<Event>,
    mut stopped: oneshot::Receiver<()>,
    acceptor: JoinHandle<()>,
) {
    let mut clients: BTreeMap<ClientId, Peer<ToClient>> = BTreeMap::new();
    let mut workers: BTreeMap<WorkerId, Peer<ToWorker>> = BTreeMap::new();
    let mut out = Outboxes::default();
    let mut recorder: Option<Recorder> = None;
    let mut watch: Option<ClientWatch> = None;
    let started = Instant::now();
    // Heartbeat checks, work stealing and retirements move on this clock.
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // The clock before the events: a steady stream of events must not starve the
            // heartbeat checks, steals and retirements.
            biased;
            _ = &mut stopped => break,
            _ = tick.tick() => {
                let now = Instant::now();
                core.on_tick(now, &mut out);
                drop_stuck(now, &mut core, &mut out, &mut clients, &mut workers);
                if let Some(why) = watch.as_ref().and_then(|w| w.ended(clients.len())) {
                    tracing::info!("{why}: shutting the cluster down");
                    break;
                }
            }
            ev = rx.recv() => {
                let Some(ev) = ev else { break };
                let t0 = Instant::now();
                let mut peers = Peers { clients: &mut clients, workers: &mut workers, events: &events, watch: &mut watch };
                let mut stop = handle(&mut core, ev, &mut out, &mut peers, &mut recorder, started);
                // Everything already waiting goes into the same pass.
                while let Ok(ev) = rx.try_recv() {
                    stop |= handle(&mut core, ev, &mut out, &mut peers, &mut recorder, started);
                }
                if let Some(r) = &mut recorder {
                    r.busy(t0.elapsed());
                }
                if stop {
                    flush(&mut out, &mut clients, &mut workers);
                    break;
                }
            }
        }
        flush(&mut out, &mut clients, &mut workers);
    }
    acceptor.abort();
    tracing::info!(
        workers = workers.len(),
        clients = clients.len(),
        "scheduler shutting down"
    );
    // Every peer at once, each bounded: a frozen one holds up nobody.
    let mut ends = tokio::task::JoinSet::new();
    for (_, p) in workers {
        ends.spawn(p.end(Some(ToWorker::Close), Duration::ZERO));
    }
    for (_, p) in clients {
        ends.spawn(p.end(None, Duration::ZERO));
    }
    while ends.join_next().await.is_some() {}
}

/// Hands each peer its messages, and ends the peers the core dropped (told why).
fn flush(
    out: &mut Outboxes,
    clients: &mut BTreeMap<ClientId, Peer<ToClient>>,
    workers: &mut BTreeMap<WorkerId, Peer<ToWorker>>,
) {
    for (w, msgs) in std::mem::take(&mut out.workers) {
        if let Some(p) = workers.get(&w) {
            p.send(msgs);
        }
    }
    for (c, msgs) in std::mem::take(&mut out.clients) {
        if let Some(p) = clients.get(&c) {
            p.send(msgs);
        }
    }
    for (w, reason) in std::mem::take(&mut out.dropped_workers) {
        if let Some(p) = workers.remove(&w) {
            tracing::warn!(worker = w.0, %reason, "removed worker: closing its connection");
            tokio::spawn(p.end(Some(ToWorker::Removed { reason }), REMOVED_LINGER));
        }
    }
    for (c, reason) in std::mem::take(&mut out.dropped_clients) {
        if let Some(p) = clients.remove(&c) {
            tracing::warn!(client = c.0, %reason, "dropped client: closing its connection");
            tokio::spawn(p.end(Some(ToClient::Removed { reason }), REMOVED_LINGER));
        }
    }
}

/// Drops the peers whose queue has stayed past the high-water mark ([`Peer::stuck`]): the core
/// forgets them (a worker's work is rescheduled, a client's futures released), and they are
/// told why, so that a worker exits to be restarted when it reads again.
fn drop_stuck(
    now: Instant,
    core: &mut Core,
    out: &mut Outboxes,
    clients: &mut BTreeMap<ClientId, Peer<ToClient>>,
    workers: &mut BTreeMap<WorkerId, Peer<ToWorker>>,
) {
    let stuck: Vec<(WorkerId, String)> = workers
        .iter_mut()
        .filter_map(|(&w, p)| p.stuck(now).map(|why| (w, why)))
        .collect();
    for (w, reason) in stuck {
        tracing::warn!(worker = w.0, %reason, "dropping a worker that does not read");
        if let Some(p) = workers.remove(&w) {
            tokio::spawn(p.end(Some(ToWorker::Removed { reason }), REMOVED_LINGER));
        }
        core.on_worker_removed(w, out);
    }
    let stuck: Vec<(ClientId, String)> = clients
        .iter_mut()
        .filter_map(|(&c, p)| p.stuck(now).map(|why| (c, why)))
        .collect();
    for (c, reason) in stuck {
        tracing::warn!(client = c.0, %reason, "dropping a client that does not read");
        if let Some(p) = clients.remove(&c) {
            tokio::spawn(p.end(Some(ToClient::Removed { reason }), REMOVED_LINGER));
        }
        core.on_client_removed(c, out);
    }
}

/// The scheduler's connections, its own event queue, and whether it stops when its clients
/// leave.
struct Peers<'a> {
    clients: &'a mut BTreeMap<ClientId, Peer<ToClient>>,
    workers: &'a mut BTreeMap<WorkerId, Peer<ToWorker>>,
    events: &'a mpsc::UnboundedSender<Event>,
    watch: &'a mut Option<ClientWatch>,
}

/// Stop once the clients have left, or when none came within `grace` of `since`.
struct ClientWatch {
    grace: Duration,
    since: Instant,
    seen: bool,
}

impl ClientWatch {
    /// Why the scheduler stops now, with `clients` connected: none left after one came, or
    /// none came within the grace.
    fn ended(&self, clients: usize) -> Option<&'static str> {
        match (clients, self.seen) {
            (0, true) => Some("every client has left"),
            (0, false) if self.since.elapsed() > self.grace => Some("no client came in time"),
            _ => None,
        }
    }
}

/// Handles one event; true when a client asked the cluster to shut down.
fn handle(
    core: &mut Core,
    ev: Event,
    out: &mut Outboxes,
    peers: &mut Peers<'_>,
    recorder: &mut Option<Recorder>,
    started: Instant,
) -> bool {
    let (clients, workers, events) = (&mut *peers.clients, &mut *peers.workers, peers.events);
    match ev {
        Event::Joined(conn, Hello::Client { name }) => {
            if let Some(w) = peers.watch.as_mut() {
                w.seen = true;
            }
            let id = core.on_client_added(name, out);
            let peer = Peer::start(Arc::clone(&conn));
            tokio::spawn(read(
                Arc::clone(&conn),
                events.clone(),
                move |m| Event::Client(id, m),
                move |why| Event::ClientLeft(id, why),
            ));
            clients.insert(id, peer);
        }
        Event::Joined(
            conn,
            Hello::Worker {
                name,
                data_address,
                nthreads,
                memory_limit,
                pid,
            },
        ) => {
            let peer = Peer::start(Arc::clone(&conn));
            // Registered first, so the welcome and first tasks have somewhere to go.
            let id = core.on_worker_added(
                NewWorker {
                    name,
                    address: data_address,
                    nthreads,
                    memory_limit,
                    pid,
                },
                Instant::now(),
                out,
            );
            tokio::spawn(read(
                Arc::clone(&conn),
                events.clone(),
                move |m| Event::Worker(id, m),
                move |why| Event::WorkerLeft(id, why),
            ));
            workers.insert(id, peer);
        }
        Event::Joined(conn, Hello::Data { .. }) => {
            // A worker checking that its scheduler lives (or a misdirected peer).
            tracing::info!(peer = %conn.peer_addr(), "a data connection to the scheduler: closed");
            tokio::spawn(async move { conn.close().await });
        }
        Event::Client(c, msgs) => {
            core.on_client_heard(c, Instant::now());
            for m in msgs {
                if m == FromClient::Shutdown {
                    tracing::info!(client = c.0, "a client shuts the cluster down");
                    return true;
                }
                core.on_client_message(c, m, out);
            }
        }
        Event::Worker(w, msgs) => {
            let now = Instant::now();
            if let Some(r) = recorder {
                for m in &msgs {
                    r.on_worker_message(w, m, now);
                }
            }
            for m in msgs {
                core.on_worker_message(w, m, now, out);
            }
        }
        Event::ClientLeft(c, why) => {
            tracing::debug!(client = c.0, %why, "client left");
            if let Some(p) = clients.remove(&c) {
                tokio::spawn(p.end(None, Duration::ZERO));
            }
            core.on_client_removed(c, out);
        }
        Event::Stats(tx) => {
            let _ = tx.send((core.stats().clone(), core.worker_summaries()));
        }
        Event::Describe(tx) => {
            let _ = tx.send(core.describe_pending(50));
        }
        Event::Record => {
            recorder.get_or_insert_with(|| Recorder::new(started));
        }
        Event::StopWhenClientsLeave(grace) => {
            *peers.watch = Some(ClientWatch {
                grace,
                since: Instant::now(),
                seen: !peers.clients.is_empty(),
            });
        }
        Event::Dashboard(window, tx) => {
            let r = recorder.get_or_insert_with(|| Recorder::new(started));
            let _ = tx.send(r.snapshot(core, window, Instant::now()));
        }
        Event::WorkerLeft(w, why) => {
            tracing::info!(worker = w.0, %why, "worker left");
            if let Some(r) = recorder {
                r.worker_left(w);
            }
            if let Some(p) = workers.remove(&w) {
                tokio::spawn(p.end(None, Duration::ZERO));
            }
            core.on_worker_removed(w, out);
        }
    }
    false
}

/// Reads batches from a peer until its connection ends, then says why.
async fn read<M: serde::de::DeserializeOwned + crate::protocol::Payloads>(
    conn: Arc<Connection>,
    events: mpsc::UnboundedSender<Event>,
    wrap: impl Fn(Vec<M>) -> Event,
    left: impl FnOnce(String) -> Event,
) {
    loop {
        match net::recv_batch::<M>(&conn).await {
            Ok(msgs) => {
                if events.send(wrap(msgs)).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = events.send(left(e.to_string()));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::encode_batch;

    /// Peers that registered and then send garbage (an undecodable control frame, payloads
    /// announcing frames that are not there, a message on an unknown channel) or vanish
    /// mid-computation are removed with a logged reason; the scheduler serves the others.
    #[test]
    fn peers_sending_garbage_or_vanishing_are_removed_and_the_rest_goes_on() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let secret = Secret::generate();
            let listen: Address = format!("inproc://garbage-{:x}", rand::random::<u64>())
                .parse()
                .unwrap();
            let server = SchedulerServer::start(&listen, secret.clone(), Config::default())
                .await
                .unwrap();
            let addr = server.address().clone();
            let worker_hello = |name: &str| Hello::Worker {
                name: name.into(),
                data_address: format!("inproc://nowhere-{name}"),
                nthreads: 1,
                memory_limit: 0,
                pid: 1,
            };
            let garbage = [transport::Message::from(vec![vec![0xffu8; 9]]), {
                let mut m = encode_batch(vec![FromWorker::Finished {
                    key: dask_graph::Key::name_only("x"),
                    nbytes: 1,
                    micros: 1,
                    thread: 0,
                    attempt: 1,
                    small: Some(crate::protocol::Payload {
                        header: vec![],
                        nframes: 1,
                        frames: vec![dask_graph::Frame::Host(bytes::Bytes::from_static(b"v"))],
                    }),
                }]);
                m.frames.pop(); // the announced frame is missing
                m
            }];
            let n = garbage.len();
            for (i, g) in garbage.into_iter().enumerate() {
                let conn = net::dial(&addr, &secret, worker_hello(&format!("bad-{i}")))
                    .await
                    .unwrap();
                conn.send(crate::net::CONTROL, g).await.unwrap();
                let _ = conn.recv().await; // closed by the scheduler
            }
            // A client that vanishes with a graph pending, and a worker that vanishes.
            let vanishing = net::dial(&addr, &secret, worker_hello("vanishing"))
                .await
                .unwrap();
            drop(vanishing);
            let client = net::dial(
                &addr,
                &secret,
                Hello::Client {
                    name: "vanishing".into(),
                },
            )
            .await
            .unwrap();
            drop(client);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (stats, workers) = server.stats().await.unwrap();
                if stats.workers_lost as usize == n + 1 && workers.is_empty() {
                    break;
                }
                assert!(Instant::now() < deadline, "{stats:?} {workers:?}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // Still serving: a real client connects and is welcomed.
            let c = crate::Client::connect(&addr, secret.clone()).await.unwrap();
            assert!(c.workers().is_empty());
            server.shutdown().await;
        });
    }
}
