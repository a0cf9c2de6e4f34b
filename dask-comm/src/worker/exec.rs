//! The worker's threads that run tasks: a queue by priority, and `nthreads` threads taking
//! from it. A task's spec is decoded on the thread that runs it, and its spilled inputs are
//! read back there too, without the store's lock (off the worker's runtime).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use dask_graph::{FailureKind, Key, Node, TaskFailure, Value};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;

use crate::protocol::{Payload, Priority};

use super::store::{self, Located, SpillError};
use super::{lock, Store};

/// A task ready to run: its spec and where its inputs' values are (in memory, or spilled:
/// never [`Located::Absent`]).
pub(super) struct Job {
    pub key: Key,
    /// The assignment it runs for.
    pub attempt: u64,
    pub spec: Payload,
    pub inputs: FxHashMap<Key, Located>,
    pub priority: Priority,
    pub seq: u64,
}

impl PartialEq for Job {
    fn eq(&self, o: &Self) -> bool {
        (self.priority, self.seq) == (o.priority, o.seq)
    }
}
impl Eq for Job {}
impl PartialOrd for Job {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Job {
    /// Reversed: the heap pops the lowest priority, then the oldest.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.priority, o.seq).cmp(&(self.priority, self.seq))
    }
}

/// What a thread reports when a task ends.
pub(super) struct Done {
    pub key: Key,
    /// The assignment it ran for.
    pub attempt: u64,
    pub result: Outcome,
    pub micros: u64,
    /// The thread that ran it.
    pub thread: u32,
}

/// How a task ended.
pub(super) enum Outcome {
    /// It ran: its value, or its failure.
    Ran(Result<Value, Box<TaskFailure>>),
    /// It did not run: an input's spill file was lost (the store no longer has the input).
    InputLost(Key, SpillError),
}

struct Queue {
    jobs: BinaryHeap<Job>,
    closed: bool,
    /// No job starts while paused (the worker's memory is above its pause threshold).
    paused: bool,
}

/// The threads and their queue.
pub(super) struct Executor {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    /// Jobs taken by a thread and not finished.
    running: Arc<AtomicUsize>,
    /// Detached when the executor is dropped.
    threads: Vec<std::thread::JoinHandle<()>>,
    seq: u64,
}

impl Executor {
    /// Starts `n` threads, with `shuffles` installed on each, reading spilled inputs from
    /// `store`; each finished task is reported on `done`.
    pub fn start(
        n: usize,
        done: mpsc::UnboundedSender<Done>,
        shuffles: Arc<dyn dask_graph::shuffle::ShuffleService>,
        store: Store,
    ) -> Executor {
        let queue = Arc::new((
            Mutex::new(Queue {
                jobs: BinaryHeap::new(),
                closed: false,
                paused: false,
            }),
            Condvar::new(),
        ));
        let running = Arc::new(AtomicUsize::new(0));
        let threads = (0..n.max(1))
            .map(|i| {
                let (q, done, r) = (Arc::clone(&queue), done.clone(), Arc::clone(&running));
                let (shuffles, store) = (Arc::clone(&shuffles), Arc::clone(&store));
                std::thread::Builder::new()
                    .name(format!("dask-worker-{i}"))
                    .spawn(move || {
                        dask_graph::shuffle::install(Some(shuffles));
                        run(i as u32, &q, &r, &done, &store)
                    })
                    .expect("spawning a worker thread")
            })
            .collect();
        Executor {
            queue,
            running,
            threads,
            seq: 0,
        }
    }

    /// Queues a task.
    pub fn submit(
        &mut self,
        key: Key,
        attempt: u64,
        spec: Payload,
        inputs: FxHashMap<Key, Located>,
        priority: Priority,
    ) {
        self.seq += 1;
        let (lock, cv) = &*self.queue;
        lock.lock()
            .unwrap_or_else(|e| e.into_inner())
            .jobs
            .push(Job {
                key,
                attempt,
                spec,
                inputs,
                priority,
                seq: self.seq,
            });
        cv.notify_one();
    }

    /// Stops (or resumes) starting jobs; running ones go on.
    pub fn set_paused(&self, paused: bool) {
        let (lock, cv) = &*self.queue;
        lock.lock().unwrap_or_else(|e| e.into_inner()).paused = paused;
        if !paused {
            cv.notify_all();
        }
    }

    /// Jobs running now.
    pub fn running(&self) -> usize {
        self.running.load(AtomicOrdering::Relaxed)
    }

    /// Removes a queued assignment that has not started; whether it was there.
    pub fn cancel(&self, attempt: u64) -> bool {
        let (lock, _) = &*self.queue;
        let mut q = lock.lock().unwrap_or_else(|e| e.into_inner());
        let before = q.jobs.len();
        q.jobs.retain(|j| j.attempt != attempt);
        q.jobs.len() != before
    }
}

impl Drop for Executor {
    /// Stops the threads without waiting: a running task finishes on its own (its result is
    /// dropped), so a worker told to close does not wait for long tasks.
    fn drop(&mut self) {
        let (lock, cv) = &*self.queue;
        let mut q = lock.lock().unwrap_or_else(|e| e.into_inner());
        q.closed = true;
        q.jobs.clear();
        drop(q);
        cv.notify_all();
        self.threads.clear();
    }
}

fn run(
    thread: u32,
    queue: &(Mutex<Queue>, Condvar),
    running: &AtomicUsize,
    done: &mpsc::UnboundedSender<Done>,
    store: &Store,
) {
    let (lock, cv) = queue;
    loop {
        let mut job = {
            let mut q = lock.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if q.closed {
                    return;
                }
                if !q.paused {
                    if let Some(j) = q.jobs.pop() {
                        running.fetch_add(1, AtomicOrdering::Relaxed);
                        break j;
                    }
                }
                q = cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let (key, attempt) = (job.key, job.attempt);
        super::spiller::wait_for_room(store);
        let t0 = Instant::now();
        let result = match read_inputs(store, std::mem::take(&mut job.inputs)) {
            Ok(inputs) => Outcome::Ran(execute(&job, &inputs)),
            Err((dep, e)) => Outcome::InputLost(dep, e),
        };
        let micros = t0.elapsed().as_micros() as u64;
        drop(job);
        running.fetch_sub(1, AtomicOrdering::Relaxed);
        if done
            .send(Done {
                key,
                attempt,
                result,
                micros,
                thread,
            })
            .is_err()
        {
            return;
        }
    }
}

/// The inputs' values, spilled ones read back (and kept in memory again if they fit). An
/// input whose file cannot be read is looked up again (another task may have read it back
/// meanwhile) and, if it is still that file's, is lost: the store forgets it.
fn read_inputs(
    store: &Store,
    inputs: FxHashMap<Key, Located>,
) -> Result<FxHashMap<Key, Value>, (Key, SpillError)> {
    let mut values = FxHashMap::default();
    values.reserve(inputs.len());
    for (k, mut at) in inputs {
        // Bounded: each turn follows a move of the value the store made meanwhile.
        let mut turns = 0;
        let v = loop {
            turns += 1;
            match at {
                Located::Memory(v) => break v,
                Located::Absent => return Err((k, SpillError::Gone { key: k })),
                Located::Disk(path) => match store::read_spill(&k, &path) {
                    Ok(v) => {
                        lock(store).unspilled(k, &path, v.clone());
                        break v;
                    }
                    Err(e) => {
                        let mut s = lock(store);
                        if s.spilled_at(&k, &path) {
                            s.remove(&k);
                            return Err((k, e));
                        }
                        if turns >= 4 {
                            return Err((k, e));
                        }
                        at = s.use_value(&k);
                    }
                },
            }
        };
        values.insert(k, v);
    }
    Ok(values)
}

fn execute(job: &Job, inputs: &FxHashMap<Key, Value>) -> Result<Value, Box<TaskFailure>> {
    let node = crate::spec::decode(&job.spec).map_err(|e| {
        Box::new(TaskFailure::new(
            job.key,
            "",
            FailureKind::Data,
            format!("the task's spec does not decode: {e}"),
        ))
    })?;
    match node {
        Node::Value(v) => Ok(v),
        Node::Task(t) => dask_graph::run(&t, job.key, &|k| inputs.get(k).cloned()),
    }
}
