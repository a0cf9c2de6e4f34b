//! The scheduler's dashboard: an HTTP server (loopback by default) with the task stream (a
//! row per worker thread, a bar per task coloured by its group, fetches between workers in
//! red), progress per group, the workers (memory, spilled bytes, CPU), the tasks' state
//! counts, and Prometheus metrics at `/metrics`.
//!
//! The scheduler records what its workers report ([`Recorder`]: each finished task with its
//! thread and duration, each fetch a heartbeat lists) in a bounded buffer; a request asks the
//! scheduler's loop for a [`Snapshot`] of it and of the core, which `/api/status` serves as
//! JSON (the page polls it), `/metrics` as Prometheus text, and `dask-comm status` prints.
//!
//! ```no_run
//! # async fn f() -> dask_comm::Result<()> {
//! use dask_comm::{SchedulerServer, Secret};
//! let listen = "tcp://127.0.0.1:0".parse().unwrap();
//! let mut server = SchedulerServer::start(&listen, Secret::generate(), Default::default()).await?;
//! let at = server.serve_dashboard("127.0.0.1:0".parse().unwrap()).await?;
//! println!("dashboard at http://{at}/");
//! # Ok(()) }
//! ```

mod http;
mod metrics;
mod page;

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::core::{Core, Status};
use crate::error::{Error, Result};
use crate::protocol::{FromWorker, WorkerId};
use crate::scheduler::SchedulerServer;

pub(crate) use http::serve;
pub use metrics::render as metrics_text;

/// Bars the recorder keeps at most (the oldest go first).
pub const BARS_KEPT: usize = 100_000;

/// Bars older than this go.
pub const KEEP: Duration = Duration::from_secs(300);

/// Most bars one snapshot carries (the latest).
pub const BARS_SENT: usize = 20_000;

/// The thread number of a worker's fetch row in the task stream.
pub const FETCH_ROW: i32 = -1;

/// One bar of the task stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bar {
    /// The worker's number.
    pub worker: u32,
    /// The worker thread (`FETCH_ROW` for fetches from other workers).
    pub thread: i32,
    /// The task's group (its key's name without tokens), or the peer fetched from.
    pub group: String,
    /// Start and end, in seconds since the scheduler started.
    pub start: f64,
    /// End.
    pub stop: f64,
    /// Bytes fetched (0 for tasks).
    pub bytes: u64,
}

/// A worker, as the dashboard shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRow {
    /// Its number.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Its data address.
    pub address: String,
    /// Its threads.
    pub nthreads: u32,
    /// Its memory limit (0: none).
    pub memory_limit: u64,
    /// Bytes of values in memory.
    pub stored: u64,
    /// Bytes spilled to disk.
    pub spilled: u64,
    /// The process's resident memory.
    pub rss: u64,
    /// Cores busy (1.5: one and a half), over its last heartbeat's interval.
    pub cpu: f64,
    /// Tasks sent to it and not finished.
    pub processing: u64,
    /// Above its pause threshold.
    pub paused: bool,
    /// Being retired.
    pub retiring: bool,
}

/// The tasks of one group, by state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupRow {
    /// The group.
    pub name: String,
    /// Its tasks the scheduler knows.
    pub total: u64,
    /// In memory (done).
    pub memory: u64,
    /// Running or sent to a worker.
    pub processing: u64,
    /// Failed.
    pub erred: u64,
    /// Released, waiting, queued or without a worker.
    pub waiting: u64,
}

/// Counters since the scheduler started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Tasks finished.
    pub tasks_finished: u64,
    /// Seconds the finished tasks ran.
    pub compute_seconds: f64,
    /// Fetches between workers.
    pub fetches: u64,
    /// Bytes they moved.
    pub fetch_bytes: u64,
    /// Seconds they took.
    pub fetch_seconds: f64,
    /// Seconds the scheduler's loop spent handling messages.
    pub scheduler_busy_seconds: f64,
}

/// What the dashboard shows, at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Seconds since the scheduler started.
    pub now: f64,
    /// The task stream's window, in seconds.
    pub window: f64,
    /// The workers.
    pub workers: Vec<WorkerRow>,
    /// Tasks by state (every state, in order).
    pub states: Vec<(String, u64)>,
    /// Tasks by group.
    pub groups: Vec<GroupRow>,
    /// The task stream in the window (the latest [`BARS_SENT`]).
    pub bars: Vec<Bar>,
    /// Counters.
    pub totals: Totals,
}

impl Snapshot {
    /// The scheduler's time per finished task, in seconds (its loop's busy time over the
    /// tasks finished), when any finished.
    pub fn overhead_per_task(&self) -> Option<f64> {
        (self.totals.tasks_finished > 0)
            .then(|| self.totals.scheduler_busy_seconds / self.totals.tasks_finished as f64)
    }
}

/// Where the dashboard listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// Loopback port [`DEFAULT_PORT`], or another free loopback port when that one is taken.
    Default,
    /// This address, or an error.
    Exactly(SocketAddr),
}

/// The dashboard's usual port (Dask's).
pub const DEFAULT_PORT: u16 = 8787;

/// Starts `server`'s dashboard where `at` says; returns where it listens.
pub async fn start(server: &mut SchedulerServer, at: At) -> Result<SocketAddr> {
    match at {
        At::Exactly(a) => server.serve_dashboard(a).await,
        At::Default => {
            let usual = SocketAddr::from((Ipv4Addr::LOCALHOST, DEFAULT_PORT));
            match server.serve_dashboard(usual).await {
                Ok(a) => Ok(a),
                Err(e) => {
                    tracing::info!(error = %e, "port {DEFAULT_PORT} is taken: the dashboard takes another");
                    server
                        .serve_dashboard(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
                        .await
                }
            }
        }
    }
}

/// Asks the dashboard at `at` (`host:port`) for its status with the task stream of the last
/// `window` seconds (a plain HTTP/1.0 request, at most 10 s and 64 MiB).
pub fn fetch(at: &str, window: f64) -> Result<Snapshot> {
    use std::io::{Read, Write};
    let fail =
        |what: &str, e: std::io::Error| Error::os(format!("{what} the dashboard at {at}"), e);
    let addr = at
        .to_socket_addrs()
        .map_err(|e| fail("resolving", e))?
        .next()
        .ok_or_else(|| Error::Config(format!("{at}: no address")))?;
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .map_err(|e| fail("connecting to", e))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .and_then(|()| conn.set_write_timeout(Some(Duration::from_secs(10))))
        .map_err(|e| fail("connecting to", e))?;
    write!(
        conn,
        "GET /api/status?window={window} HTTP/1.0\r\nHost: {at}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| fail("asking", e))?;
    let mut raw = Vec::new();
    conn.take(64 << 20)
        .read_to_end(&mut raw)
        .map_err(|e| fail("reading", e))?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| Error::Unexpected(format!("{at}: not an HTTP answer")))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        return Err(Error::Unexpected(format!("{at}: {status}")));
    }
    serde_json::from_slice(&raw[split + 4..])
        .map_err(|e| Error::Unexpected(format!("{at}: the status does not decode: {e}")))
}

/// The snapshot as text for a terminal: the workers, progress per group, the tasks by state,
/// and the counters.
pub fn summary(s: &Snapshot) -> String {
    use std::fmt::Write;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut out = String::new();
    let t = &s.totals;
    let _ = writeln!(
        out,
        "{} workers, up {:.0} s; {} tasks finished ({:.2} s of compute); {} fetches ({:.1} MiB in {:.2} s); scheduler time per task {}",
        s.workers.len(),
        s.now,
        t.tasks_finished,
        t.compute_seconds,
        t.fetches,
        mib(t.fetch_bytes),
        t.fetch_seconds,
        s.overhead_per_task()
            .map_or("-".to_string(), |o| format!("{:.1} us", o * 1e6)),
    );
    let _ = writeln!(
        out,
        "\n{:<24} {:<28} {:>7} {:>6} {:>11} {:>11} {:>11} {:>10}",
        "worker", "address", "threads", "cpu", "memory MiB", "spilled MiB", "rss MiB", "processing"
    );
    for w in &s.workers {
        let _ = writeln!(
            out,
            "{:<24} {:<28} {:>7} {:>5.0}% {:>11.1} {:>11.1} {:>11.1} {:>10}{}",
            w.name,
            w.address,
            w.nthreads,
            w.cpu * 100.0,
            mib(w.stored),
            mib(w.spilled),
            mib(w.rss),
            w.processing,
            if w.paused { " paused" } else { "" }
        );
    }
    if !s.groups.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<32} {:>9} {:>9} {:>10} {:>7}",
            "group", "done", "total", "processing", "erred"
        );
        for g in &s.groups {
            let _ = writeln!(
                out,
                "{:<32} {:>9} {:>9} {:>10} {:>7}",
                g.name, g.memory, g.total, g.processing, g.erred
            );
        }
    }
    let states: Vec<String> = s.states.iter().map(|(n, c)| format!("{n} {c}")).collect();
    let _ = writeln!(out, "\ntasks: {}", states.join(", "));
    let recent = s.bars.iter().filter(|b| b.thread >= 0).count();
    let _ = writeln!(
        out,
        "last {:.0} s: {recent} tasks, {} fetches",
        s.window,
        s.bars.len() - recent
    );
    out
}

/// A key name's group: the name without its tokens (parts of 8 or more hex digits), as the
/// operation that made it: `sort-9f3ac2e1d4b5a607-transfer` → `sort-transfer`.
///
/// ```
/// assert_eq!(dask_comm::dashboard::group("sort-9f3ac2e1d4b5a607-transfer"), "sort-transfer");
/// assert_eq!(dask_comm::dashboard::group("inc"), "inc");
/// assert_eq!(dask_comm::dashboard::group("deadbeef12"), "deadbeef12");
/// ```
pub fn group(name: &str) -> String {
    let token = |p: &str| p.len() >= 8 && p.bytes().all(|b| b.is_ascii_hexdigit());
    let kept: Vec<&str> = name.split('-').filter(|p| !token(p)).collect();
    if kept.is_empty() {
        name.to_string()
    } else {
        kept.join("-")
    }
}

struct RawBar {
    worker: WorkerId,
    thread: i32,
    group: Arc<str>,
    start: Instant,
    stop: Instant,
    bytes: u64,
}

/// What the scheduler records for the dashboard from its workers' messages.
pub(crate) struct Recorder {
    started: Instant,
    bars: VecDeque<RawBar>,
    groups: FxHashMap<&'static str, Arc<str>>,
    cpu: FxHashMap<WorkerId, u32>,
    totals: Totals,
    /// Time spent on snapshots in the current pass (not the scheduler's work).
    snapshots: Duration,
}

/// Key names whose groups the recorder remembers at most (then it forgets them all).
const GROUPS_KEPT: usize = 10_000;

impl Recorder {
    pub(crate) fn new(started: Instant) -> Recorder {
        Recorder {
            started,
            bars: VecDeque::new(),
            groups: FxHashMap::default(),
            cpu: FxHashMap::default(),
            totals: Totals::default(),
            snapshots: Duration::ZERO,
        }
    }

    fn push(&mut self, bar: RawBar) {
        if self.bars.len() == BARS_KEPT {
            self.bars.pop_front();
        }
        self.bars.push_back(bar);
    }

    /// Takes in a worker's message (before the core does).
    pub(crate) fn on_worker_message(&mut self, w: WorkerId, msg: &FromWorker, now: Instant) {
        match msg {
            FromWorker::Finished {
                key,
                micros,
                thread,
                ..
            } => {
                let name = key.name().as_str();
                if self.groups.len() >= GROUPS_KEPT && !self.groups.contains_key(name) {
                    self.groups.clear();
                }
                let group = Arc::clone(
                    self.groups
                        .entry(name)
                        .or_insert_with(|| Arc::from(group(name))),
                );
                let ran = Duration::from_micros(*micros);
                self.totals.tasks_finished += 1;
                self.totals.compute_seconds += ran.as_secs_f64();
                self.push(RawBar {
                    worker: w,
                    thread: *thread as i32,
                    group,
                    start: now.checked_sub(ran).unwrap_or(now),
                    stop: now,
                    bytes: 0,
                });
            }
            FromWorker::Heartbeat {
                cpu_milli, fetches, ..
            } => {
                self.cpu.insert(w, *cpu_milli);
                for f in fetches {
                    let stop = now
                        .checked_sub(Duration::from_micros(f.ago_micros))
                        .unwrap_or(now);
                    let took = Duration::from_micros(f.micros);
                    self.totals.fetches += 1;
                    self.totals.fetch_bytes += f.bytes;
                    self.totals.fetch_seconds += took.as_secs_f64();
                    self.push(RawBar {
                        worker: w,
                        thread: FETCH_ROW,
                        group: Arc::from(format!("fetch from {}", f.peer)),
                        start: stop.checked_sub(took).unwrap_or(stop),
                        stop,
                        bytes: f.bytes,
                    });
                }
            }
            _ => {}
        }
    }

    /// A worker left.
    pub(crate) fn worker_left(&mut self, w: WorkerId) {
        self.cpu.remove(&w);
    }

    /// Time the scheduler's loop spent on a pass (less what the dashboard's snapshots took).
    pub(crate) fn busy(&mut self, d: Duration) {
        let own = std::mem::take(&mut self.snapshots);
        self.totals.scheduler_busy_seconds += d.saturating_sub(own).as_secs_f64();
    }

    /// The dashboard's view of the recorder and `core` now, with the bars of the last
    /// `window`.
    pub(crate) fn snapshot(&mut self, core: &Core, window: Duration, now: Instant) -> Snapshot {
        let t0 = Instant::now();
        let s = self.view(core, window, now);
        self.snapshots += t0.elapsed();
        s
    }

    fn view(&mut self, core: &Core, window: Duration, now: Instant) -> Snapshot {
        while self
            .bars
            .front()
            .is_some_and(|b| now.saturating_duration_since(b.stop) > KEEP)
        {
            self.bars.pop_front();
        }
        let since = |t: Instant| t.saturating_duration_since(self.started).as_secs_f64();
        let mut bars: Vec<Bar> = self
            .bars
            .iter()
            .rev()
            // Fetches are reported a heartbeat late: bars are not in order of their ends.
            .filter(|b| now.saturating_duration_since(b.stop) <= window)
            .take(BARS_SENT)
            .map(|b| Bar {
                worker: b.worker.0,
                thread: b.thread,
                group: b.group.to_string(),
                start: since(b.start),
                stop: since(b.stop),
                bytes: b.bytes,
            })
            .collect();
        bars.reverse();
        let workers = core
            .worker_summaries()
            .into_iter()
            .map(|s| WorkerRow {
                id: s.id.0,
                name: s.name,
                address: s.address,
                nthreads: s.nthreads,
                memory_limit: s.memory_limit,
                stored: s.stored,
                spilled: s.spilled,
                rss: s.rss,
                cpu: f64::from(self.cpu.get(&s.id).copied().unwrap_or(0)) / 1000.0,
                processing: s.processing as u64,
                paused: s.paused,
                retiring: s.retiring,
            })
            .collect();
        let mut states: FxHashMap<Status, u64> = FxHashMap::default();
        let mut groups: FxHashMap<&'static str, GroupRow> = FxHashMap::default();
        core.for_each_task(|key, status| {
            *states.entry(status).or_default() += 1;
            let name = key.name().as_str();
            let g = groups.entry(name).or_insert_with(|| GroupRow {
                name: group(name),
                total: 0,
                memory: 0,
                processing: 0,
                erred: 0,
                waiting: 0,
            });
            g.total += 1;
            match status {
                Status::Memory => g.memory += 1,
                Status::Processing => g.processing += 1,
                Status::Erred => g.erred += 1,
                _ => g.waiting += 1,
            }
        });
        // Names that differ only by tokens are one group.
        let mut merged: std::collections::BTreeMap<String, GroupRow> = Default::default();
        for g in groups.into_values() {
            let m = merged.entry(g.name.clone()).or_insert_with(|| GroupRow {
                name: g.name.clone(),
                total: 0,
                memory: 0,
                processing: 0,
                erred: 0,
                waiting: 0,
            });
            m.total += g.total;
            m.memory += g.memory;
            m.processing += g.processing;
            m.erred += g.erred;
            m.waiting += g.waiting;
        }
        Snapshot {
            now: since(now),
            window: window.as_secs_f64(),
            workers,
            states: Status::ALL
                .iter()
                .map(|s| (s.name().to_string(), states.get(s).copied().unwrap_or(0)))
                .collect(),
            groups: merged.into_values().collect(),
            bars,
            totals: self.totals.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Config;
    use crate::protocol::Fetch;
    use dask_graph::Key;

    fn finished(name: &str, i: u32, micros: u64, thread: u32) -> FromWorker {
        FromWorker::Finished {
            key: Key::new(name, &[i]),
            nbytes: 8,
            micros,
            small: None,
            thread,
            attempt: 1,
        }
    }

    #[test]
    fn tasks_and_fetches_become_bars_in_their_rows() {
        let t0 = Instant::now();
        let mut r = Recorder::new(t0);
        let w = WorkerId(3);
        let now = t0 + Duration::from_secs(20);
        r.on_worker_message(w, &finished("inc-0123456789abcdef", 0, 500_000, 1), now);
        r.on_worker_message(w, &finished("inc-fedcba9876543210", 1, 1_000, 0), now);
        // Long ago: outside a 10 s window.
        r.on_worker_message(
            w,
            &finished("old", 0, 1_000, 0),
            t0 + Duration::from_secs(2),
        );
        r.on_worker_message(
            w,
            &FromWorker::Heartbeat {
                stored: 0,
                spilled: 0,
                rss: 0,
                executing: 0,
                paused: false,
                cpu_milli: 1500,
                fetches: vec![Fetch {
                    peer: "tcp://b".into(),
                    keys: 2,
                    bytes: 4096,
                    micros: 2_000,
                    ago_micros: 1_000_000,
                }],
            },
            now,
        );
        let core = Core::new(Config::default());
        let s = r.snapshot(&core, Duration::from_secs(10), now);
        assert_eq!(s.now, 20.0);
        let tasks: Vec<&Bar> = s.bars.iter().filter(|b| b.thread >= 0).collect();
        assert_eq!(tasks.len(), 2, "{:?}", s.bars);
        assert!(tasks.iter().all(|b| b.group == "inc" && b.worker == 3));
        assert_eq!(
            (tasks[0].start, tasks[0].stop, tasks[0].thread),
            (19.5, 20.0, 1)
        );
        let fetch: Vec<&Bar> = s.bars.iter().filter(|b| b.thread == FETCH_ROW).collect();
        assert_eq!(fetch.len(), 1);
        assert_eq!((fetch[0].bytes, fetch[0].stop), (4096, 19.0));
        assert!((fetch[0].start - 18.998).abs() < 1e-9, "{}", fetch[0].start);
        assert_eq!(s.totals.tasks_finished, 3);
        assert_eq!((s.totals.fetches, s.totals.fetch_bytes), (1, 4096));
        assert_eq!(s.states.len(), Status::ALL.len());
        // Worker CPU is reported for workers the core knows (none here).
        assert!(s.workers.is_empty());
        assert!(metrics_text(&s).contains("dask_comm_transfer_bytes_total 4096\n"));
        let text = summary(&s);
        assert!(text.contains("3 tasks finished"), "{text}");
    }

    #[test]
    fn the_recorder_keeps_a_bounded_window() {
        let t0 = Instant::now();
        let mut r = Recorder::new(t0);
        for i in 0..(BARS_KEPT as u32 + 10) {
            r.on_worker_message(WorkerId(0), &finished("x", i, 1, 0), t0);
        }
        assert_eq!(r.bars.len(), BARS_KEPT);
        let core = Core::new(Config::default());
        let s = r.snapshot(&core, Duration::from_secs(10), t0);
        assert_eq!(s.bars.len(), BARS_SENT);
        // Past KEEP, everything goes.
        let s = r.snapshot(
            &core,
            Duration::from_secs(10),
            t0 + KEEP + Duration::from_secs(1),
        );
        assert!(s.bars.is_empty());
        assert!(r.bars.is_empty());
    }

    #[test]
    fn label_values_are_escaped() {
        let s = Snapshot {
            now: 0.0,
            window: 10.0,
            workers: vec![],
            states: vec![],
            groups: vec![GroupRow {
                name: "a\"b\\c\nd".into(),
                total: 1,
                memory: 1,
                processing: 0,
                erred: 0,
                waiting: 0,
            }],
            bars: vec![],
            totals: Totals::default(),
        };
        assert!(metrics_text(&s)
            .contains("dask_comm_group_tasks{group=\"a\\\"b\\\\c\\nd\",state=\"memory\"} 1\n"));
    }
}
