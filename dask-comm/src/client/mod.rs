//! The client: submits graphs, holds futures, and moves data to and from workers directly.
//!
//! A [`Client`] runs its I/O on a runtime of its own, so its async methods can be awaited from
//! any executor; [`Client::blocking`] is a view with the same calls for synchronous code (not
//! to be used from inside an async task). It implements [`dask_graph::Scheduler`], so a graph
//! computes the same on [`dask_graph::Inline`], [`dask_graph::Threaded`] or a cluster.
//!
//! A [`DFuture`] stands for a key on the cluster; its value stays there while a future for it
//! exists (dropping the last one releases it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dask_graph::{Arg, Callable, ComputeError, Graph, Key, Name, Node, Task, TaskFailure, Value};
use futures::Stream;
use rustc_hash::{FxHashMap, FxHashSet};
use tokio::sync::{mpsc, oneshot, Notify};
use transport::{Address, Connection};

use crate::error::{Error, Result};
use crate::net;
use crate::protocol::{FromClient, Hello, TaskDef, ToClient, WorkerInfo};
use crate::runtime::{block_on, Runtime};
use crate::security::Secret;
use crate::worker::scheduler_timeout_from_env;

mod blocking;

pub use blocking::Blocking;
mod data;

#[derive(Debug, Clone)]
enum Status {
    Pending,
    /// Computed; where the scheduler said it is (and the value, when it came along), and its
    /// size (which bounds the wait for a fetch).
    Memory(Vec<String>, Option<Value>, u64),
    Erred(Arc<TaskFailure>),
    Cancelled,
    Refused(String),
}

#[derive(Debug)]
struct KeyState {
    refs: usize,
    status: Status,
}

/// Keys and the data addresses of the workers holding them.
type Holders = Vec<(Key, Vec<String>)>;

#[derive(Debug, Default)]
struct State {
    keys: FxHashMap<Key, KeyState>,
    workers: Vec<WorkerInfo>,
    who_has: std::collections::VecDeque<oneshot::Sender<Holders>>,
    /// Retirement requests in flight, by number.
    retired: FxHashMap<u64, oneshot::Sender<std::result::Result<Vec<String>, String>>>,
    next_retire: u64,
    closed: Option<String>,
    welcomed: bool,
    /// When the scheduler was last heard from.
    heard: Option<Instant>,
    /// How often to send heartbeats (the scheduler's welcome says; zero until then).
    heartbeat: Duration,
}

#[derive(Debug)]
struct Inner {
    name: String,
    secret: Secret,
    to_scheduler: mpsc::UnboundedSender<Vec<FromClient>>,
    state: Mutex<State>,
    changed: Notify,
    data: tokio::sync::Mutex<FxHashMap<String, Arc<Connection>>>,
    control: Arc<Connection>,
    /// Whether `wait` draws a progress bar.
    progress: AtomicBool,
    // Last, so the runtime stops after everything above is dropped.
    rt: Runtime,
}

/// How a client connects.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// A scheduler that answers no heartbeat for this long is taken for lost: the connection
    /// closes and every call fails with [`Error::Disconnected`]. Default:
    /// [`DEFAULT_SCHEDULER_TIMEOUT`](crate::DEFAULT_SCHEDULER_TIMEOUT), or
    /// `DASK_COMM_SCHEDULER_TIMEOUT` (seconds).
    pub scheduler_timeout: Duration,
    /// Draw a progress bar on a terminal (standard error) while [`Client::wait`] takes more
    /// than a second. Default: no (the examples turn it on); see
    /// [`Client::set_progress`].
    pub progress: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            scheduler_timeout: scheduler_timeout_from_env(),
            progress: false,
        }
    }
}

/// How a graph is submitted.
#[derive(Debug, Clone)]
pub struct SubmitOptions {
    /// Fuse linear chains into single tasks (default: yes).
    pub fuse: bool,
    /// Run a failing task again this many times before its key errs (default: 0). A task
    /// whose workers die while it runs is rescheduled regardless, up to the scheduler's
    /// `allowed_failures`.
    pub retries: u32,
}

impl Default for SubmitOptions {
    fn default() -> Self {
        SubmitOptions {
            fuse: true,
            retries: 0,
        }
    }
}

/// A connection to a cluster's scheduler. Cheap to clone (clones share the connection).
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// A key on the cluster: its value stays on the workers while a future for it exists.
#[derive(Debug)]
pub struct DFuture {
    key: Key,
    client: Client,
}

impl Clone for DFuture {
    fn clone(&self) -> Self {
        self.client.hold(self.key);
        DFuture {
            key: self.key,
            client: self.client.clone(),
        }
    }
}

impl Drop for DFuture {
    fn drop(&mut self) {
        self.client.let_go(self.key);
    }
}

impl DFuture {
    /// The key.
    pub fn key(&self) -> Key {
        self.key
    }

    /// Whether it finished (computed, failed or cancelled).
    pub fn done(&self) -> bool {
        !matches!(self.client.status(&self.key), Some(Status::Pending))
    }

    /// Its value, once computed (fetched from the worker holding it).
    pub async fn result(&self) -> Result<Value> {
        let mut v = self.client.gather(std::slice::from_ref(self)).await?;
        Ok(v.remove(0))
    }

    /// [`DFuture::result`], blocking.
    pub fn result_blocking(&self) -> Result<Value> {
        block_on(self.result())
    }
}

/// Times [`Client::gather`] fetches a value that keeps being lost before giving up.
const GATHER_ROUNDS: usize = 5;

fn token() -> String {
    format!("{:016x}", rand::random::<u64>())
}

impl Client {
    /// Connects to the scheduler at `address`, proving the cluster's `secret`.
    pub async fn connect(address: &Address, secret: Secret) -> Result<Client> {
        Client::connect_with(address, secret, ClientOptions::default()).await
    }

    /// [`Client::connect`] with options (the scheduler timeout).
    pub async fn connect_with(
        address: &Address,
        secret: Secret,
        opts: ClientOptions,
    ) -> Result<Client> {
        let rt = Runtime::new("dask-client")?;
        let name = format!("client-{}", std::process::id());
        let hello = Hello::Client { name: name.clone() };
        let (addr, s) = (address.clone(), secret.clone());
        let control = Arc::new(
            rt.run(async move { net::dial(&addr, &s, hello).await })
                .await??,
        );
        let (to_scheduler, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            name,
            secret,
            to_scheduler,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            data: Default::default(),
            control: Arc::clone(&control),
            progress: AtomicBool::new(opts.progress),
            rt,
        });
        inner
            .rt
            .handle()
            .spawn(net::writer(Arc::clone(&control), rx));
        let weak = Arc::downgrade(&inner);
        inner.rt.handle().spawn(async move {
            let reason = loop {
                let msgs = match net::recv_batch::<ToClient>(&control).await {
                    Ok(m) => m,
                    Err(e) => break e.to_string(),
                };
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                inner.receive(msgs);
            };
            if let Some(inner) = weak.upgrade() {
                tracing::debug!(%reason, "the client's scheduler connection ended");
                let mut s = inner.lock();
                // A reason given before the connection was closed (removed, silent) stands.
                s.closed.get_or_insert(reason);
                // Replies that will never come: dropping their senders fails the calls that
                // wait for them (`Error::Disconnected`) instead of leaving them waiting.
                s.who_has.clear();
                s.retired.clear();
                drop(s);
                inner.changed.notify_waiters();
            }
        });
        inner
            .rt
            .handle()
            .spawn(heartbeats(Arc::downgrade(&inner), opts.scheduler_timeout));
        let client = Client { inner };
        client.welcomed().await?;
        Ok(client)
    }

    async fn welcomed(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let changed = self.inner.changed.notified();
            {
                let s = self.inner.lock();
                if let Some(r) = &s.closed {
                    return Err(Error::Disconnected(r.clone()));
                }
                if s.welcomed {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout("no welcome from the scheduler".into()));
            }
            self.sleep_or(changed, Duration::from_millis(100)).await;
        }
    }

    /// Waits for `changed` or `d`, whichever comes first (runtime-agnostic).
    async fn sleep_or(&self, changed: tokio::sync::futures::Notified<'_>, d: Duration) {
        let sleep = self
            .inner
            .rt
            .handle()
            .spawn(async move { tokio::time::sleep(d).await });
        tokio::select! {
            _ = changed => {}
            _ = sleep => {}
        }
    }

    fn send(&self, msg: FromClient) -> Result<()> {
        self.inner
            .to_scheduler
            .send(vec![msg])
            .map_err(|_| Error::Disconnected("the client's writer ended".into()))
    }

    fn status(&self, key: &Key) -> Option<Status> {
        self.inner.lock().keys.get(key).map(|k| k.status.clone())
    }

    fn hold(&self, key: Key) {
        let mut s = self.inner.lock();
        s.keys
            .entry(key)
            .or_insert(KeyState {
                refs: 0,
                status: Status::Pending,
            })
            .refs += 1;
    }

    fn let_go(&self, key: Key) {
        let mut s = self.inner.lock();
        let Some(k) = s.keys.get_mut(&key) else {
            return;
        };
        k.refs -= 1;
        if k.refs == 0 {
            s.keys.remove(&key);
            drop(s);
            let _ = self.send(FromClient::Release { keys: vec![key] });
        }
    }

    fn future(&self, key: Key) -> DFuture {
        self.hold(key);
        DFuture {
            key,
            client: self.clone(),
        }
    }

    /// The workers, as the scheduler last told.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        self.inner.lock().workers.clone()
    }

    /// Waits until at least `n` workers are connected (at most `limit`).
    pub async fn wait_for_workers(&self, n: usize, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let changed = self.inner.changed.notified();
            {
                let s = self.inner.lock();
                if s.workers.len() >= n {
                    return Ok(());
                }
                if let Some(r) = &s.closed {
                    return Err(Error::Disconnected(r.clone()));
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "{} of {n} workers after {limit:?}",
                    self.workers().len()
                )));
            }
            self.sleep_or(changed, Duration::from_millis(100)).await;
        }
    }

    /// Submits a graph and returns futures for `keys` (their computation goes on while the
    /// futures exist). The graph is checked first, here: unknown functions and wrong argument
    /// types are refused before anything is sent. Keys of this client's futures may be used
    /// as dependencies. The graph is culled to `keys` and its linear chains fused.
    pub async fn persist(&self, graph: Graph, keys: &[Key]) -> Result<Vec<DFuture>> {
        self.persist_with(graph, keys, &SubmitOptions::default())
            .await
    }

    /// [`Client::persist`] with options.
    pub async fn persist_with(
        &self,
        graph: Graph,
        keys: &[Key],
        opts: &SubmitOptions,
    ) -> Result<Vec<DFuture>> {
        let held: FxHashSet<Key> = self.inner.lock().keys.keys().copied().collect();
        let external = |k: &Key| held.contains(k).then_some(None);
        let structure = graph
            .validate(keys, &external)
            .map_err(ComputeError::from)?;
        let n = graph.len();
        let graph = dask_graph::optimize::cull_with(graph, &structure, keys);
        let structure = if graph.len() == n {
            structure
        } else {
            graph.structure()
        };
        let (graph, structure) = if opts.fuse {
            let graph = dask_graph::optimize::fuse_with(
                graph,
                &structure,
                keys,
                dask_graph::local::FUSE_DEPTH,
            );
            let structure = graph.structure();
            (graph, structure)
        } else {
            (graph, structure)
        };
        let order = dask_graph::order::order(&graph, &structure);
        let mut tasks = Vec::with_capacity(graph.len());
        for (i, (key, node)) in graph.iter().enumerate() {
            tasks.push(TaskDef {
                key: *key,
                deps: node.dependencies(),
                order: order[i],
                spec: crate::spec::encode(node)?,
                retries: opts.retries,
                shuffle: match node {
                    Node::Task(t) => t.shuffle,
                    Node::Value(_) => None,
                },
            });
        }
        let futures: Vec<DFuture> = keys.iter().map(|&k| self.future(k)).collect();
        self.send(FromClient::UpdateGraph {
            tasks,
            wanted: keys.to_vec(),
        })?;
        Ok(futures)
    }

    /// Computes `keys` of `graph` and returns their values.
    pub async fn compute(&self, graph: Graph, keys: &[Key]) -> Result<Vec<Value>> {
        self.compute_with(graph, keys, &SubmitOptions::default())
            .await
    }

    /// [`Client::compute`] with options (`retries`, fusion).
    pub async fn compute_with(
        &self,
        graph: Graph,
        keys: &[Key],
        opts: &SubmitOptions,
    ) -> Result<Vec<Value>> {
        let futures = self.persist_with(graph, keys, opts).await?;
        self.gather(&futures).await
    }

    /// Runs `func(args)` on the cluster (`func` a [`Func`](dask_graph::Func) handle, or a
    /// function's name).
    pub async fn submit(&self, func: impl Into<Name>, args: Vec<Arg>) -> Result<DFuture> {
        self.submit_with(func, args, &SubmitOptions::default())
            .await
    }

    /// [`Client::submit`] with options (`retries`).
    pub async fn submit_with(
        &self,
        func: impl Into<Name>,
        args: Vec<Arg>,
        opts: &SubmitOptions,
    ) -> Result<DFuture> {
        let func: Name = func.into();
        let key = Key::name_only(&format!("{func}-{}", token()));
        let mut g = Graph::new();
        g.insert(key, Task::new(func, args));
        Ok(self.persist_with(g, &[key], opts).await?.remove(0))
    }

    /// Retires the workers at these data addresses gracefully: they take no new task, finish
    /// or hand back what they hold, copy the values others need to the workers that stay, and
    /// close. Returns the addresses retired once they are all gone. Refused (nothing touched)
    /// for an unknown address, or when no worker would stay.
    pub async fn retire_workers(&self, addresses: &[String]) -> Result<Vec<String>> {
        let (tx, rx) = oneshot::channel();
        {
            let mut s = self.inner.lock();
            s.connected()?;
            s.next_retire += 1;
            let id = s.next_retire;
            s.retired.insert(id, tx);
            self.inner
                .to_scheduler
                .send(vec![FromClient::Retire {
                    id,
                    workers: addresses.to_vec(),
                }])
                .map_err(|_| Error::Disconnected("the client's writer ended".into()))?;
        }
        rx.await
            .map_err(|_| self.inner.gone())?
            .map_err(Error::Refused)
    }

    /// Runs `func(item)` for every item, as independent tasks. With a
    /// [`Func`](dask_graph::Func) handle the item type is checked when this compiles; with a
    /// name, when the graph is validated.
    ///
    /// ```no_run
    /// # async fn doc(client: dask_comm::Client) -> dask_comm::Result<()> {
    /// let is_even = dask_graph::registry().register("is-even-doc", |x: u64| x % 2 == 0);
    /// let futures = client.map(is_even, 0..10u64).await?;
    /// # Ok(()) }
    /// ```
    pub async fn map<T: dask_graph::Data>(
        &self,
        func: impl Callable<(T,)>,
        items: impl IntoIterator<Item = T>,
    ) -> Result<Vec<DFuture>> {
        let func = func.func_name();
        let name = dask_graph::Name::new(&format!("{func}-{}", token()));
        let mut g = Graph::new();
        let mut keys = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            let key = Key::at(name, &[i as u32]);
            g.insert(key, Task::new(func, [Arg::lit(item)]));
            keys.push(key);
        }
        self.persist(g, &keys).await
    }

    /// Draw a progress bar while [`Client::wait`] takes more than a second, or not (see
    /// [`ClientOptions::progress`]).
    pub fn set_progress(&self, on: bool) {
        self.inner.progress.store(on, Ordering::Relaxed);
    }

    /// Waits until every future is done (computed, failed or cancelled). Draws a progress bar
    /// on a terminal when it takes more than a second, if asked ([`Client::set_progress`]).
    pub async fn wait(&self, futures: &[DFuture]) -> Result<()> {
        let t0 = Instant::now();
        let mut bar: Option<indicatif::ProgressBar> = None;
        loop {
            let changed = self.inner.changed.notified();
            let (done, closed) = {
                let s = self.inner.lock();
                let done = futures
                    .iter()
                    .filter(|f| {
                        !matches!(s.keys.get(&f.key).map(|k| &k.status), Some(Status::Pending))
                    })
                    .count();
                (done, s.closed.clone())
            };
            if let Some(b) = &bar {
                b.set_position(done as u64);
            }
            if done == futures.len() {
                if let Some(b) = bar {
                    b.finish_and_clear();
                }
                return Ok(());
            }
            if let Some(r) = closed {
                return Err(Error::Disconnected(r));
            }
            if bar.is_none()
                && t0.elapsed() > Duration::from_secs(1)
                && self.inner.progress.load(Ordering::Relaxed)
            {
                let b = indicatif::ProgressBar::new(futures.len() as u64);
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "[{elapsed_precise}] {bar:40} {pos}/{len} keys",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                bar = Some(b);
            }
            self.sleep_or(changed, Duration::from_millis(250)).await;
        }
    }

    /// The futures as they finish, in the order they do.
    pub fn as_completed(&self, futures: Vec<DFuture>) -> impl Stream<Item = DFuture> + '_ {
        futures::stream::unfold(futures, move |mut left| async move {
            if left.is_empty() {
                return None;
            }
            loop {
                let changed = self.inner.changed.notified();
                if let Some(i) = left.iter().position(DFuture::done) {
                    let f = left.swap_remove(i);
                    return Some((f, left));
                }
                if self.inner.lock().closed.is_some() {
                    let f = left.remove(0);
                    return Some((f, left));
                }
                self.sleep_or(changed, Duration::from_millis(250)).await;
            }
        })
    }

    /// Cancels the futures' computations (they end as cancelled).
    pub async fn cancel(&self, futures: &[DFuture]) -> Result<()> {
        self.send(FromClient::Cancel {
            keys: futures.iter().map(DFuture::key).collect(),
        })
    }

    // ---- blocking wrappers ----------------------------------------------------------------

    /// Shuts the whole cluster down: the scheduler tells every worker to close and stops.
    /// Waits (at most `limit`) until the scheduler has closed this client's connection.
    /// A cluster already gone is not an error.
    pub async fn shutdown(&self, limit: Duration) -> Result<()> {
        if self.send(FromClient::Shutdown).is_err() {
            return Ok(());
        }
        let deadline = Instant::now() + limit;
        loop {
            let changed = self.inner.changed.notified();
            if self.inner.lock().closed.is_some() {
                tracing::info!("the cluster is shut down");
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "the scheduler did not stop within {limit:?} of a shutdown"
                )));
            }
            self.sleep_or(changed, Duration::from_millis(100)).await;
        }
    }

    /// Closes the connection to the scheduler (the scheduler releases this client's keys).
    pub async fn close(&self) -> Result<()> {
        let control = Arc::clone(&self.inner.control);
        self.inner
            .rt
            .run(async move { control.close().await })
            .await??;
        Ok(())
    }
}

/// Every heartbeat (as the scheduler's welcome asks; [`CLIENT_HEARTBEAT`] until then): tells
/// the scheduler the client lives, and takes the scheduler for lost when it has answered
/// nothing for `timeout` (the connection is closed, and every call waiting on it fails with
/// [`Error::Disconnected`]). Ends with the client.
async fn heartbeats(inner: std::sync::Weak<Inner>, timeout: Duration) {
    let started = Instant::now();
    let floor = Duration::from_millis(10);
    let mut every = CLIENT_HEARTBEAT.min(timeout / 4).max(floor);
    loop {
        let slept = Instant::now();
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        // Woken far later than asked: this process was stopped, and the scheduler's silence
        // meanwhile proves nothing.
        if slept.elapsed() > (every * 4).max(crate::worker::STALLED) {
            tracing::warn!(stalled = ?slept.elapsed(), "this client did not run for a while: the scheduler's silence restarts");
            inner.lock().heard = Some(Instant::now());
        }
        let silent = {
            let mut s = inner.lock();
            if s.closed.is_some() {
                return;
            }
            if !s.heartbeat.is_zero() {
                // Answers must come often enough for this client's own timeout too.
                every = s.heartbeat.min(timeout / 4).max(floor);
            }
            let silent = s.heard.unwrap_or(started).elapsed();
            if silent > timeout {
                tracing::error!(
                    ?silent,
                    "the scheduler answered no heartbeat: taking it for lost"
                );
                s.closed = Some(format!(
                    "the scheduler answered no heartbeat for {silent:?} (the scheduler timeout is {timeout:?})"
                ));
            }
            silent
        };
        if silent > timeout {
            inner.changed.notify_waiters();
            let control = Arc::clone(&inner.control);
            drop(inner);
            let _ = tokio::time::timeout(Duration::from_secs(5), control.close()).await;
            return;
        }
        let _ = inner.to_scheduler.send(vec![FromClient::Heartbeat]);
    }
}

/// How often a client tells the scheduler it lives.
const CLIENT_HEARTBEAT: Duration = Duration::from_secs(2);

impl Inner {
    /// Why a reply will never come: the connection's end, as recorded.
    fn gone(&self) -> Error {
        match &self.lock().closed {
            Some(why) => Error::Disconnected(why.clone()),
            None => Error::Disconnected("the scheduler did not answer".into()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn receive(&self, msgs: Vec<ToClient>) {
        let mut s = self.lock();
        s.heard = Some(Instant::now());
        for m in msgs {
            match m {
                ToClient::Welcome {
                    id,
                    workers,
                    heartbeat_ms,
                } => {
                    tracing::debug!(client = id.0, name = %self.name, heartbeat_ms, "welcomed");
                    s.heartbeat = Duration::from_millis(heartbeat_ms.clamp(10, 60_000));
                    s.workers = workers;
                    s.welcomed = true;
                }
                ToClient::Workers { workers } => s.workers = workers,
                ToClient::InMemory {
                    key,
                    holders,
                    value,
                    nbytes,
                } => {
                    let value = value.and_then(|p| match p.to_value() {
                        Ok(v) => Some(v),
                        Err(e) => {
                            tracing::warn!(%key, error = %e, "a small result does not decode; fetching it");
                            None
                        }
                    });
                    s.set(key, Status::Memory(holders, value, nbytes));
                }
                ToClient::Erred { key, failure } => s.set(key, Status::Erred(Arc::new(failure))),
                ToClient::Cancelled { key } => s.set(key, Status::Cancelled),
                ToClient::Refused { keys, reason } => {
                    for k in keys {
                        s.set(k, Status::Refused(reason.clone()));
                    }
                }
                ToClient::Lost { key } => {
                    if let Some(k) = s.keys.get_mut(&key) {
                        if matches!(k.status, Status::Memory(..)) {
                            k.status = Status::Pending;
                        }
                    }
                }
                ToClient::Retired {
                    id,
                    workers,
                    refused,
                } => {
                    if let Some(tx) = s.retired.remove(&id) {
                        let _ = tx.send(match refused {
                            Some(r) => Err(r),
                            None => Ok(workers),
                        });
                    }
                }
                ToClient::WhoHas { holders } => {
                    if let Some(tx) = s.who_has.pop_front() {
                        let _ = tx.send(holders);
                    }
                }
                ToClient::Alive => {}
                ToClient::Removed { reason } => {
                    tracing::error!(%reason, "the scheduler dropped this client");
                    s.closed
                        .get_or_insert_with(|| format!("dropped by the scheduler: {reason}"));
                }
            }
        }
        drop(s);
        self.changed.notify_waiters();
    }
}

impl State {
    /// An error once the scheduler connection has ended (a reply would never come).
    fn connected(&self) -> Result<()> {
        match &self.closed {
            Some(why) => Err(Error::Disconnected(why.clone())),
            None => Ok(()),
        }
    }

    fn set(&mut self, key: Key, status: Status) {
        if let Some(k) = self.keys.get_mut(&key) {
            k.status = status;
        }
    }
}

/// The collections' `compute_async` on a cluster: `x.compute_async(&client).await`, the
/// caller's thread free while the workers compute.
impl dask_graph::AsyncScheduler for Client {
    fn get_async<'a>(
        &'a self,
        graph: Graph,
        keys: &'a [Key],
    ) -> dask_graph::BoxFuture<'a, Result<Vec<Value>, ComputeError>> {
        Box::pin(async move { self.compute(graph, keys).await.map_err(ComputeError::from) })
    }
}

impl dask_graph::Scheduler for Client {
    fn get(&self, graph: Graph, keys: &[Key]) -> Result<Vec<Value>, ComputeError> {
        self.blocking()
            .compute(graph, keys)
            .map_err(ComputeError::from)
    }

    /// Submits the graph and returns at once: the values stay on the workers while the guard
    /// (the futures) lives, and later graphs of this client may name their keys.
    fn persist(&self, graph: Graph, keys: &[Key]) -> Result<dask_graph::Persisted, ComputeError> {
        let futures = self.blocking().persist(graph, keys)?;
        Ok(dask_graph::Persisted::Held(std::sync::Arc::new(futures)))
    }
}
