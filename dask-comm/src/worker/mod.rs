//! The worker process: runs tasks on `nthreads` threads, keeps their values, and moves data
//! directly to and from other workers (never through the scheduler).
//!
//! One task owns the worker's state and handles, in passes: the scheduler's messages, tasks
//! that finished, and data that arrived. What a pass produces for the scheduler goes as one
//! batch. Dependencies are fetched in batches per peer, one request per peer at a time, on
//! data connections of their own (control messages never wait behind data). A data server
//! answers other workers' and clients' requests from the store.
//!
//! With a memory limit, the store spills to the local directory and the worker pauses and
//! exits at its thresholds (see [`memory`]). The scheduler may take back tasks that have not
//! started (work stealing) and ask for copies of values (a retiring worker's).
//!
//! A task whose inputs are all here waits in a queue of its own, by priority, until the
//! threads can take it. A task handed to the threads reads its spilled inputs back when it
//! starts (on its thread, see [`exec`]) and holds them while it runs: the scheduler may send
//! hundreds of tasks at once, and reading all their inputs back would take the worker past
//! its limit. So a task whose inputs must be
//! read back goes to the threads only while the tasks there hold less than
//! 1/[`READ_BACK_SHARE`] of the memory limit in values read back (or fewer tasks are there
//! than threads); a task whose inputs are all in memory goes at once.

mod exec;
pub(crate) mod fetch;
mod liveness;
pub mod memory;
mod options;
mod pressure;
mod serve;
pub mod shuffle;
mod spill_file;
mod spiller;
pub(crate) mod store;

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, VecDeque};

use std::sync::Arc;
use std::time::{Duration, Instant};

use dask_graph::{Key, Value};
use rustc_hash::{FxHashMap, FxHashSet};
use tokio::sync::mpsc;
use transport::Connection;

use crate::error::{Error, Result};
use crate::net;
use crate::protocol::{Dep, Fetch, FromWorker, Hello, Payload, Priority, ToWorker, FETCHES_KEPT};

use exec::{Done, Executor, Outcome};
use fetch::{Fetched, Fetcher};
pub(crate) use liveness::STALLED;
pub use liveness::{
    exit_code, scheduler_timeout_from_env, DEFAULT_SCHEDULER_TIMEOUT, EXIT_REMOVED,
    EXIT_SCHEDULER_LOST,
};
use liveness::{last_word, recv, LAST_WORD, PARENT_CHECK};
use memory::Limits;
pub(crate) use options::raise_descriptor_limit;
pub use options::{MemoryLimit, WorkerOptions};

/// Tasks handed to the threads (queued there or running) hold at most this fraction of the
/// memory limit in values read back from disk, beyond one task per thread.
pub const READ_BACK_SHARE: u64 = 10;

use pressure::MemoryWatch;
pub(crate) use spiller::{lock, Store};

/// A task the scheduler sent, not yet finished.
struct Pending {
    /// The scheduler's number for this assignment (what the worker says of the task names).
    attempt: u64,
    /// Running (queued on the executor or on a thread): the assignment number its job was
    /// submitted with (the scheduler may have sent the task again since, under a newer one).
    job: Option<u64>,
    spec: Payload,
    deps: Vec<Key>,
    priority: Priority,
    /// Dependencies not here yet.
    missing: usize,
    /// A client wants the result (a small one goes with the completion notice).
    wanted: bool,
}

/// Runs a worker until the scheduler tells it to close or goes away.
pub async fn run_worker(mut opts: WorkerOptions) -> Result<()> {
    // A limit of 0 bytes is none.
    opts.memory_limit = opts.memory_limit.filter(|&m| m > 0);
    if opts.nthreads == 0 {
        return Err(Error::Config("a worker needs at least one thread".into()));
    }
    let listen = opts
        .listen
        .clone()
        .unwrap_or_else(|| options::default_listen(&opts.scheduler));
    let limits = Limits {
        limit: opts.memory_limit.unwrap_or(0),
        at: opts.thresholds,
    };
    let store = if opts.memory_limit.is_some() {
        memory::tune_allocator();
        let base = opts
            .local_directory
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "dask-comm-spill-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        store::Store::new(Some(dir.clone()), limits.target())
            .map_err(|e| Error::os(format!("creating the spill directory {}", dir.display()), e))?
    } else {
        store::Store::in_memory_only()
    };
    let store = store.with_device_target(opts.device_memory_limit.unwrap_or(0));
    let listener = net::listen(&listen).await?;
    let address = listener.local_addr().to_string();
    let store: Store = spiller::start(store);
    let (lost_tx, lost_rx) = mpsc::unbounded_channel();
    let shuffles = Arc::new(shuffle::Shuffles::new(
        address.clone(),
        Arc::clone(&store),
        opts.secret.clone(),
        tokio::runtime::Handle::current(),
    ));
    let (serve_failed, mut serve_ended) = tokio::sync::oneshot::channel::<String>();
    let serve = {
        let (store, secret) = (Arc::clone(&store), opts.secret.clone());
        let shuffles = Arc::clone(&shuffles);
        tokio::spawn(async move {
            let why = serve::serve(listener, store, secret, lost_tx, shuffles).await;
            // A worker whose peers cannot reach it is no worker: it ends.
            let _ = serve_failed.send(why);
        })
    };
    let control = net::dial(
        &opts.scheduler,
        &opts.secret,
        Hello::Worker {
            name: opts.name.clone(),
            data_address: address.clone(),
            nthreads: opts.nthreads as u32,
            memory_limit: opts.memory_limit.unwrap_or(0),
            pid: std::process::id(),
        },
    )
    .await?;
    let control = Arc::new(control);
    tracing::info!(name = %opts.name, %address, scheduler = %opts.scheduler, nthreads = opts.nthreads, "worker started");
    let spill = Arc::clone(&store);
    let r = Worker::new(
        &opts,
        address,
        store,
        Arc::clone(&control),
        lost_rx,
        shuffles,
    )
    .run(&mut serve_ended)
    .await;
    serve.abort();
    // The spill folder goes now: the task threads may hold the store past the process's
    // exit, which runs no destructors.
    lock(&spill).clear_disk();
    // Bounded: a stopped scheduler does not hold a worker that is leaving.
    if tokio::time::timeout(LAST_WORD * 3, control.close())
        .await
        .is_err()
    {
        tracing::warn!("closing the scheduler connection timed out");
    }
    tracing::info!(name = %opts.name, "worker stopped");
    r
}

struct Worker {
    address: String,
    zero_work: bool,
    store: Store,
    control: Arc<Connection>,
    pending: FxHashMap<Key, Pending>,
    /// Tasks waiting for each dependency that is being fetched.
    waiting_for: FxHashMap<Key, Vec<Key>>,
    /// Assignments freed while running: their result is dropped.
    freed_running: FxHashSet<u64>,
    executor: Executor,
    done_rx: mpsc::UnboundedReceiver<Done>,
    fetcher: Fetcher,
    fetched_rx: mpsc::UnboundedReceiver<Fetched>,
    out: Vec<FromWorker>,
    /// Tasks handed to the threads (queued there or running).
    executing: u32,
    /// Threads that run tasks.
    nthreads: u32,
    /// Bytes of values read back from disk for the tasks handed to the threads, by
    /// assignment, and in all.
    read_back: FxHashMap<u64, u64>,
    read_back_bytes: u64,
    /// At most this many bytes are, beyond one task per thread (see [`READ_BACK_SHARE`]).
    read_back_budget: u64,
    /// Tasks whose inputs are all here, lowest priority first, then oldest: they go to the
    /// threads as room opens. An entry whose task left, or was handed over meanwhile, is
    /// skipped.
    ready: BinaryHeap<Reverse<(Priority, u64, Key)>>,
    /// Numbers the entries of `ready` in arrival order.
    ready_seq: u64,
    limits: Limits,
    process_memory: bool,
    paused: bool,
    /// Values a data server found corrupt on disk.
    lost_rx: mpsc::UnboundedReceiver<Key>,
    /// Keys the scheduler asked this worker to copy here.
    acquiring: FxHashSet<Key>,
    /// Copies fetched for tasks here (the scheduler does not count this worker among their
    /// holders), with how many tasks here have yet to start with each: the copy goes when
    /// the last one starts or leaves.
    borrowed: FxHashMap<Key, usize>,
    acquired: Vec<(Key, u64)>,
    acquire_failed: Vec<Key>,
    /// Send a heartbeat with this pass (the pause state changed).
    report: bool,
    /// Peer-to-peer shuffles: the service the task threads use.
    shuffles: Arc<shuffle::Shuffles>,
    /// Fetches ended since the last heartbeat, with when (at most [`FETCHES_KEPT`]).
    fetches: VecDeque<(Fetch, Instant)>,
    /// The process's CPU seconds at the last heartbeat, and when that was.
    cpu_at: (f64, Instant),
    /// See [`WorkerOptions::scheduler_timeout`].
    scheduler_timeout: Duration,
    /// The scheduler's address (to tell a lost scheduler from a lost connection,
    /// [`liveness::scheduler_may_live`]).
    scheduler: transport::Address,
    /// See [`WorkerOptions::parent`].
    parent: Option<u32>,
    /// See [`WorkerOptions::handle_signals`].
    handle_signals: bool,
    /// When heartbeats go (at the pace the scheduler's welcome asks).
    beat: Option<tokio::time::Interval>,
}

impl Worker {
    fn new(
        opts: &WorkerOptions,
        address: String,
        store: Store,
        control: Arc<Connection>,
        lost_rx: mpsc::UnboundedReceiver<Key>,
        shuffles: Arc<shuffle::Shuffles>,
    ) -> Worker {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (fetched_tx, fetched_rx) = mpsc::unbounded_channel();
        let executor = Executor::start(
            opts.nthreads,
            done_tx,
            Arc::clone(&shuffles) as Arc<dyn dask_graph::shuffle::ShuffleService>,
            Arc::clone(&store),
        );
        Worker {
            fetcher: Fetcher::new(address.clone(), opts.secret.clone(), fetched_tx),
            address,
            zero_work: opts.zero_work,
            store,
            control,
            pending: FxHashMap::default(),
            waiting_for: FxHashMap::default(),
            freed_running: FxHashSet::default(),
            executor,
            done_rx,
            fetched_rx,
            out: Vec::new(),
            executing: 0,
            nthreads: (opts.nthreads as u32).max(1),
            read_back: FxHashMap::default(),
            read_back_bytes: 0,
            read_back_budget: opts
                .memory_limit
                .map_or(u64::MAX, |limit| limit / READ_BACK_SHARE),
            ready: BinaryHeap::new(),
            ready_seq: 0,
            limits: Limits {
                limit: opts.memory_limit.unwrap_or(0),
                at: opts.thresholds,
            },
            process_memory: opts.process_memory,
            paused: false,
            lost_rx,
            acquiring: FxHashSet::default(),
            borrowed: FxHashMap::default(),
            acquired: Vec::new(),
            acquire_failed: Vec::new(),
            report: false,
            shuffles,
            fetches: VecDeque::new(),
            cpu_at: (memory::cpu_seconds(), Instant::now()),
            scheduler_timeout: opts.scheduler_timeout,
            scheduler: opts.scheduler.clone(),
            parent: opts.parent,
            handle_signals: opts.handle_signals,
            beat: None,
        }
    }

    async fn run(mut self, serve_ended: &mut tokio::sync::oneshot::Receiver<String>) -> Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        // SIGTERM (a supervisor's) ends the worker cleanly: its folders go with it. So does
        // SIGINT for a worker with no parent to follow.
        let listen =
            |kind: SignalKind, name: &str| -> Result<Option<tokio::signal::unix::Signal>> {
                if !self.handle_signals {
                    return Ok(None);
                }
                signal(kind)
                    .map(Some)
                    .map_err(|e| Error::os(format!("listening for {name}"), e))
            };
        let mut term = listen(SignalKind::terminate(), "SIGTERM")?;
        let mut int = listen(SignalKind::interrupt(), "SIGINT")?;
        // When the last heartbeat tick came: a tick far later than its pace means this process
        // itself was stopped, and the scheduler's silence meanwhile proves nothing.
        let mut last_tick = Instant::now();
        let mut heard = Instant::now();
        let mut parent_tick = tokio::time::interval(PARENT_CHECK);
        let (from_scheduler, mut scheduler_rx) = mpsc::unbounded_channel();
        let reader = {
            let control = Arc::clone(&self.control);
            tokio::spawn(async move {
                loop {
                    let r = net::recv_batch::<ToWorker>(&control).await;
                    let end = r.is_err();
                    if from_scheduler.send(r).is_err() || end {
                        return;
                    }
                }
            })
        };
        let (to_scheduler, writer_rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(net::writer(Arc::clone(&self.control), writer_rx));
        self.beat = Some(tokio::time::interval(
            Duration::from_secs(2)
                .min(self.scheduler_timeout / 4)
                .max(Duration::from_millis(10)),
        ));
        let mut memory_tick = tokio::time::interval(Duration::from_millis(100));
        memory_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut memory_watch = MemoryWatch::default();
        let mut connection_failed = false;
        let result = loop {
            tokio::select! {
                msgs = scheduler_rx.recv() => match msgs {
                    Some(Ok(msgs)) => {
                        heard = Instant::now();
                        match self.on_scheduler(msgs) {
                            Ok(true) => break Ok(()),
                            Ok(false) => {}
                            Err(e) => break Err(e),
                        }
                    }
                    Some(Err(e)) => break match e {
                        // Closed by the scheduler without a `Close`: it dropped this worker.
                        Error::Transport(transport::Error::Closed(
                            transport::CloseReason::PeerClosed,
                        )) => Err(Error::Removed(
                            "the scheduler closed this worker's connection".into(),
                        )),
                        // Closed here (the worker is leaving).
                        Error::Transport(transport::Error::Closed(
                            transport::CloseReason::Local,
                        )) => Ok(()),
                        // Failed, reset or refused (the scheduler was killed, the network
                        // broke): lost, not restarted, unless the scheduler may live (below).
                        Error::Transport(t) => {
                            connection_failed = true;
                            Err(Error::Disconnected(format!(
                                "the scheduler connection failed: {t}"
                            )))
                        }
                        e => Err(e),
                    },
                    None => break Ok(()),
                },
                Some(done) = self.done_rx.recv() => self.on_done(done),
                Some(fetched) = self.fetched_rx.recv() => self.on_fetched(fetched),
                Some(key) = self.lost_rx.recv() => {
                    lock(&self.store).remove(&key);
                    self.out.push(FromWorker::LostKeys { keys: vec![key] });
                }
                _ = self.beat.as_mut().expect("set before the loop").tick() => {
                    let pace = self.beat.as_ref().map_or(Duration::ZERO, |b| b.period());
                    if last_tick.elapsed() > (pace * 4).max(STALLED) {
                        tracing::warn!(stalled = ?last_tick.elapsed(), "this worker did not run for a while: the scheduler's silence restarts");
                        heard = Instant::now();
                    }
                    last_tick = Instant::now();
                    let silent = heard.elapsed();
                    if silent > self.scheduler_timeout {
                        tracing::error!(?silent, scheduler = %self.control.peer_addr(), "the scheduler answered no heartbeat: taking it for lost");
                        break Err(Error::Disconnected(format!(
                            "the scheduler answered no heartbeat for {silent:?} (the scheduler timeout is {:?})",
                            self.scheduler_timeout
                        )));
                    }
                    self.report = true;
                }
                why = &mut *serve_ended => {
                    break Err(Error::Unexpected(why.unwrap_or_else(|_| "the data server ended".into())));
                }
                _ = parent_tick.tick(), if self.parent.is_some() => {
                    if self.parent != Some(std::os::unix::process::parent_id()) {
                        tracing::warn!("the worker's parent is gone: the worker stops");
                        break Ok(());
                    }
                }
                Some(()) = recv(&mut term) => {
                    tracing::info!("SIGTERM: the worker stops");
                    break Ok(());
                }
                Some(()) = recv(&mut int) => {
                    // Ctrl-C reaches the whole process group: a supervised worker leaves it to
                    // its parent (which stops it, or dies and is noticed), so that the parent's
                    // clean-up finds its workers and the last one out finds the parent gone.
                    if self.parent.is_none() {
                        tracing::info!("SIGINT: the worker stops");
                        break Ok(());
                    }
                    tracing::info!("SIGINT: left to the worker's parent");
                }
                _ = memory_tick.tick(), if self.limits.limit > 0 && self.process_memory => {
                    if let Err(e) = self.check_memory(&mut memory_watch) {
                        break Err(e);
                    }
                }
            }
            // Everything else already here joins this pass.
            while let Ok(done) = self.done_rx.try_recv() {
                self.on_done(done);
            }
            while let Ok(fetched) = self.fetched_rx.try_recv() {
                self.on_fetched(fetched);
            }
            self.hand_over();
            self.fetcher.start();
            if !self.acquired.is_empty() || !self.acquire_failed.is_empty() {
                self.out.push(FromWorker::Acquired {
                    keys: std::mem::take(&mut self.acquired),
                    failed: std::mem::take(&mut self.acquire_failed),
                });
            }
            if std::mem::take(&mut self.report) {
                let beat = self.heartbeat();
                self.out.push(beat);
            }
            if !self.out.is_empty() && to_scheduler.send(std::mem::take(&mut self.out)).is_err() {
                break Err(Error::Disconnected(
                    "the scheduler connection's writer ended".into(),
                ));
            }
        };
        // A worker that thaws after a stop finds the connection gone and the clock past the
        // timeout; the scheduler's last words, still on their way in, say why.
        let result = match result {
            Err(Error::Disconnected(why)) => last_word(&mut scheduler_rx)
                .await
                .unwrap_or(Err(Error::Disconnected(why))),
            r => r,
        };
        // A connection can fail on this side alone (out of descriptors, its transport
        // broken): if the scheduler may live, this worker was only cut off, and starts
        // afresh rather than leave the cluster for good. (Silence is not probed: a stopped
        // scheduler's kernel still accepts connections.)
        let result = match result {
            Err(Error::Disconnected(why))
                if connection_failed && liveness::scheduler_may_live(&self.scheduler).await =>
            {
                tracing::error!(%why, "the scheduler connection failed but the scheduler may live: the worker exits to be started afresh");
                Err(Error::Removed(format!(
                    "{why}; the scheduler's port still answers: cut off, not lost"
                )))
            }
            r => r,
        };
        reader.abort();
        drop(to_scheduler);
        let mut writer = writer;
        if tokio::time::timeout(LAST_WORD * 2, &mut writer)
            .await
            .is_err()
        {
            tracing::warn!("the last messages to the scheduler were not taken in time");
            writer.abort();
        }
        result
    }

    /// Handles the scheduler's messages; true when told to close, an error when removed.
    fn on_scheduler(&mut self, msgs: Vec<ToWorker>) -> Result<bool> {
        for m in msgs {
            match m {
                ToWorker::Welcome { id, heartbeat_ms } => {
                    tracing::debug!(worker = id.0, heartbeat_ms, "welcomed");
                    // Answers must come often enough for this worker's own timeout too.
                    let every = Duration::from_millis(heartbeat_ms.clamp(10, 60_000))
                        .min(self.scheduler_timeout / 4)
                        .max(Duration::from_millis(10));
                    self.beat = Some(tokio::time::interval(every));
                }
                ToWorker::Compute {
                    key,
                    spec,
                    deps,
                    priority,
                    wanted,
                    shuffle,
                    attempt,
                } => {
                    if let Some(run) = shuffle {
                        self.shuffles.set_run(run);
                    }
                    self.compute(key, attempt, spec, deps, priority, wanted)
                }
                ToWorker::ShuffleDone { id, run } => self.shuffles.done(id, run),
                ToWorker::Free { keys } => self.free(keys),
                ToWorker::Steal { key, id } => {
                    let stolen = self.give_back(key);
                    self.out.push(FromWorker::StealResponse { key, id, stolen });
                }
                ToWorker::Acquire { keys } => self.acquire(keys),
                ToWorker::Close => return Ok(true),
                ToWorker::Alive => {}
                ToWorker::PeerGone { address } => self.fetcher.peer_gone(&address),
                ToWorker::Removed { reason } => {
                    tracing::error!(%reason, "the scheduler removed this worker: it exits to be started afresh");
                    return Err(Error::Removed(reason));
                }
            }
        }
        Ok(false)
    }

    fn compute(
        &mut self,
        key: Key,
        attempt: u64,
        spec: Payload,
        deps: Vec<Dep>,
        priority: Priority,
        wanted: bool,
    ) {
        if self.zero_work {
            let v = Value::new(());
            let small = small_result(wanted, &v);
            lock(&self.store).insert(key, v);
            self.out.push(FromWorker::Finished {
                key,
                nbytes: 0,
                micros: 0,
                small,
                thread: 0,
                attempt,
            });
            return;
        }
        if let Some(p) = self.pending.get_mut(&key) {
            // Sent again while still here: what it makes answers the new assignment.
            p.attempt = attempt;
            return;
        }
        let mut missing = 0;
        {
            let store = lock(&self.store);
            for d in &deps {
                if let Some(n) = self.borrowed.get_mut(&d.key) {
                    *n += 1;
                } else if !store.contains(&d.key) {
                    missing += 1;
                    let first = match self.waiting_for.entry(d.key) {
                        Entry::Occupied(mut e) => {
                            e.get_mut().push(key);
                            false
                        }
                        Entry::Vacant(e) => {
                            e.insert(vec![key]);
                            true
                        }
                    };
                    if first && !self.acquiring.contains(&d.key) {
                        let (mine, holders): (Vec<String>, Vec<String>) =
                            d.holders.iter().cloned().partition(|h| *h == self.address);
                        // Named as a holder, and not here: if no other holder has it, the
                        // scheduler hears this worker does not either.
                        self.fetcher.want(d.key, holders, mine, d.nbytes);
                    }
                }
            }
        }
        self.pending.insert(
            key,
            Pending {
                attempt,
                job: None,
                spec,
                deps: deps.into_iter().map(|d| d.key).collect(),
                priority,
                missing,
                wanted,
            },
        );
        if missing == 0 {
            self.queue_ready(key);
        }
    }

    /// A task's inputs are all here: it goes to the threads now if nothing waits before it
    /// and there is room, or else waits for room there (see [`Worker::hand_over`]).
    fn queue_ready(&mut self, key: Key) {
        let Some(p) = self.pending.get(&key) else {
            return;
        };
        let priority = p.priority;
        if self.ready.is_empty() && self.has_room(self.read_back_cost(&p.deps)) {
            self.submit(key);
            return;
        }
        self.ready_seq += 1;
        self.ready.push(Reverse((priority, self.ready_seq, key)));
    }

    /// Bytes of these inputs on disk: what reading them back would add to memory.
    fn read_back_cost(&self, deps: &[Key]) -> u64 {
        let store = lock(&self.store);
        deps.iter().map(|d| store.on_disk_bytes(d)).sum()
    }

    /// Whether a task whose inputs cost `read_back` bytes to read back may go to the threads
    /// now (see [`Worker::hand_over`]).
    fn has_room(&self, read_back: u64) -> bool {
        read_back == 0
            || (!self.paused
                && (self.executing < self.nthreads
                    || self.read_back_bytes.saturating_add(read_back) <= self.read_back_budget))
    }

    /// Hands ready tasks to the threads, most urgent first: any task while fewer tasks than
    /// threads are there, a task whose inputs are all in memory at once, and one whose inputs
    /// must be read back from disk while that keeps the tasks there within the read-back
    /// budget. While the worker is paused (no task starts), only tasks whose inputs are in
    /// memory go: reading values back then would only raise its memory. The first task that
    /// must wait holds back those behind it (they go in order).
    fn hand_over(&mut self) {
        while let Some(&Reverse((_, _, key))) = self.ready.peek() {
            let cost = match self.pending.get(&key) {
                // Still here, still ready, not handed over already (a task sent again, or
                // freed and sent again, may have two entries).
                Some(p) if p.job.is_none() && p.missing == 0 => self.read_back_cost(&p.deps),
                _ => {
                    self.ready.pop();
                    continue;
                }
            };
            if !self.has_room(cost) {
                return;
            }
            self.ready.pop();
            self.submit(key);
        }
    }

    /// A job handed to the threads ended (it finished, or left the queue): the values read
    /// back for it no longer count against the budget.
    fn job_ended(&mut self, job: u64) {
        if let Some(bytes) = self.read_back.remove(&job) {
            self.read_back_bytes = self.read_back_bytes.saturating_sub(bytes);
        }
    }

    /// Hands a task whose inputs are all here to the threads, with its inputs' values (read
    /// back from disk if they were spilled). An input that is not here after all (its spill
    /// file was bad, here or when a peer read it) sends the task back to the scheduler as
    /// missing that input, which also stops counting this worker among the input's holders.
    fn submit(&mut self, key: Key) {
        let Some(p) = self.pending.get_mut(&key) else {
            return;
        };
        let mut inputs = FxHashMap::default();
        let mut bad = None;
        let mut read_back = 0;
        {
            // Where each input is: spilled ones are read back on the task's thread.
            let mut store = lock(&self.store);
            for d in &p.deps {
                read_back += store.on_disk_bytes(d);
                match store.use_value(d) {
                    store::Located::Absent => {
                        tracing::warn!(%key, input = %d, "an input is gone");
                        bad = Some(*d);
                        break;
                    }
                    at => {
                        inputs.insert(*d, at);
                    }
                }
            }
        }
        if let Some(dep) = bad {
            let attempt = p.attempt;
            self.borrowed.remove(&dep);
            self.drop_pending(key);
            self.out.push(FromWorker::MissingDep {
                key,
                dep,
                tried: vec![self.address.clone()],
                attempt,
            });
            return;
        }
        p.job = Some(p.attempt);
        let (spec, priority, attempt) = (std::mem::take(&mut p.spec), p.priority, p.attempt);
        if read_back > 0 {
            self.read_back.insert(attempt, read_back);
            self.read_back_bytes += read_back;
        }
        let deps = (!self.borrowed.is_empty()).then(|| p.deps.clone());
        self.executing += 1;
        self.executor.submit(key, attempt, spec, inputs, priority);
        if let Some(deps) = deps {
            self.return_borrowed(&deps);
        }
    }

    /// A task here no longer needs the borrowed copies among `deps` (it started, or left).
    fn return_borrowed(&mut self, deps: &[Key]) {
        for d in deps {
            if let Some(n) = self.borrowed.get_mut(d) {
                *n -= 1;
                if *n == 0 {
                    self.borrowed.remove(d);
                    lock(&self.store).remove(d);
                }
            }
        }
    }

    /// Forgets a task that has not started: it stops waiting for its inputs, and returns the
    /// copies it borrowed.
    fn drop_pending(&mut self, key: Key) -> Option<Pending> {
        let p = self.pending.remove(&key)?;
        for d in &p.deps {
            if let Some(ws) = self.waiting_for.get_mut(d) {
                ws.retain(|x| *x != key);
            }
        }
        if p.job.is_none() {
            self.return_borrowed(&p.deps);
        }
        Some(p)
    }

    /// Gives a task back to the scheduler if it has not started (work stealing).
    fn give_back(&mut self, key: Key) -> bool {
        let Some(p) = self.pending.get(&key) else {
            return false;
        };
        if let Some(job) = p.job {
            if !self.executor.cancel(job) {
                return false; // a thread has it
            }
            self.executing -= 1;
            self.job_ended(job);
        }
        self.drop_pending(key);
        true
    }

    /// Fetches copies of values the scheduler asks this worker to hold.
    fn acquire(&mut self, keys: Vec<Dep>) {
        let store = lock(&self.store);
        let mut here = Vec::new();
        for d in keys {
            if store.contains(&d.key) {
                // A borrowed copy becomes one the scheduler counts: it stays.
                self.borrowed.remove(&d.key);
                here.push((d.key, d.nbytes));
            } else if self.acquiring.insert(d.key) && !self.waiting_for.contains_key(&d.key) {
                let holders = d
                    .holders
                    .into_iter()
                    .filter(|h| *h != self.address)
                    .collect();
                self.fetcher.want(d.key, holders, Vec::new(), d.nbytes);
            }
        }
        drop(store);
        self.acquired.extend(here);
    }

    /// How the worker is doing.
    fn heartbeat(&mut self) -> FromWorker {
        let now = Instant::now();
        let cpu_milli = memory::cpu_share_since(&mut self.cpu_at, now);
        let fetches = self
            .fetches
            .drain(..)
            .map(|(mut f, ended)| {
                f.ago_micros = now.duration_since(ended).as_micros() as u64;
                f
            })
            .collect();
        let store = lock(&self.store);
        FromWorker::Heartbeat {
            stored: store.memory_bytes(),
            spilled: store.disk_bytes(),
            rss: memory::rss(),
            // Handed to the threads, or ready and waiting for room there.
            executing: self.executing
                + self
                    .pending
                    .values()
                    .filter(|p| p.job.is_none() && p.missing == 0)
                    .count() as u32,
            paused: self.paused,
            cpu_milli,
            fetches,
        }
    }

    fn free(&mut self, keys: Vec<Key>) {
        for k in keys {
            lock(&self.store).remove(&k);
            self.acquiring.remove(&k);
            self.borrowed.remove(&k);
            if let Some(p) = self.drop_pending(k) {
                if let Some(job) = p.job {
                    if self.executor.cancel(job) {
                        self.executing -= 1;
                        self.job_ended(job);
                    } else {
                        self.freed_running.insert(job);
                    }
                }
            }
        }
    }

    fn on_done(&mut self, d: Done) {
        self.executing = self.executing.saturating_sub(1);
        self.job_ended(d.attempt);
        if self.freed_running.remove(&d.attempt) {
            return;
        }
        if self
            .pending
            .get(&d.key)
            .is_none_or(|p| p.job != Some(d.attempt))
        {
            tracing::warn!(key = %d.key, attempt = d.attempt, "a result of no assignment here: dropped");
            return;
        }
        // Reported for the assignment here now (sent again while it ran: the newer one).
        let (wanted, attempt) = self
            .pending
            .remove(&d.key)
            .map_or((false, d.attempt), |p| (p.wanted, p.attempt));
        match d.result {
            Outcome::Ran(Ok(v)) => {
                let nbytes = v.nbytes() as u64;
                let small = small_result(wanted, &v);
                lock(&self.store).insert(d.key, v);
                self.out.push(FromWorker::Finished {
                    key: d.key,
                    nbytes,
                    micros: d.micros,
                    small,
                    thread: d.thread,
                    attempt,
                });
            }
            Outcome::Ran(Err(f)) => self.out.push(FromWorker::Erred {
                key: d.key,
                failure: f.on_worker(self.address.clone()),
                attempt,
            }),
            Outcome::InputLost(dep, e) => {
                // Its thread found the input's spill file bad and the store forgot it: the
                // task goes back to the scheduler as missing it (as `submit` does).
                tracing::warn!(key = %d.key, error = %e, "an input is lost");
                self.borrowed.remove(&dep);
                self.out.push(FromWorker::MissingDep {
                    key: d.key,
                    dep,
                    tried: vec![self.address.clone()],
                    attempt,
                });
            }
        }
    }

    fn on_fetched(&mut self, f: Fetched) {
        if let Some(summary) = f.summary() {
            if summary.bytes > 0 {
                // The transfer log: per-pair rates of what moved (`Client::transfer_log`).
                self.shuffles.log().record(crate::Transfer {
                    peer: summary.peer.clone(),
                    bytes: summary.bytes,
                    micros: summary.micros,
                    fetched: true,
                    seq: 0,
                });
            }
            if self.fetches.len() == FETCHES_KEPT {
                self.fetches.pop_front();
            }
            self.fetches.push_back((summary, Instant::now()));
        }
        let fetch::Arrivals {
            values: arrived,
            missing,
        } = self.fetcher.arrived(f);
        {
            // A copy the scheduler asked for is reported (it counts this worker among the
            // key's holders, and frees the copy with the key); one fetched for tasks here is
            // borrowed until they start, and one nothing here waits for any more is dropped.
            let mut store = lock(&self.store);
            for (k, v) in &arrived {
                let users = self.waiting_for.get(k).map_or(0, Vec::len);
                if self.acquiring.remove(k) {
                    self.acquired.push((*k, v.nbytes() as u64));
                } else if users > 0 {
                    self.borrowed.insert(*k, users);
                } else {
                    continue;
                }
                store.insert(*k, v.clone());
            }
        }
        for (k, _) in arrived {
            for t in self.waiting_for.remove(&k).unwrap_or_default() {
                let ready = self.pending.get_mut(&t).is_some_and(|p| {
                    p.missing -= 1;
                    p.missing == 0
                });
                if ready {
                    self.queue_ready(t);
                }
            }
        }
        for (dep, tried) in missing {
            if self.acquiring.remove(&dep) {
                self.acquire_failed.push(dep);
            }
            for key in self.waiting_for.remove(&dep).unwrap_or_default() {
                if let Some(p) = self.drop_pending(key) {
                    self.out.push(FromWorker::MissingDep {
                        key,
                        dep,
                        tried: tried.clone(),
                        attempt: p.attempt,
                    });
                }
            }
        }
    }
}

/// A wanted result small enough to travel with its completion notice, encoded.
fn small_result(wanted: bool, v: &Value) -> Option<Payload> {
    wanted
        .then(|| Payload::from_value(v).ok())
        .flatten()
        .filter(|p| p.len() <= crate::protocol::SMALL_RESULT)
}
