//! The messages between clients, the scheduler and workers, and how they travel.
//!
//! Every transport message is a **batch**: frame 0 is the postcard encoding of a `Vec` of
//! messages (everything one side produced in one pass) and of the batch's layout, and the
//! frames after it carry the messages' payloads (task specs, values), in the order their
//! [`Payload`]s appear. A payload frame of [`PACK_BELOW`] bytes or more travels as a frame of
//! its own, never copied, so a value's bulk bytes move as they are; smaller ones are copied
//! into shared pack frames (each up to [`PACK_FRAME`] bytes), so a batch of many small values
//! (a graph's byte literals, a gather of small results) stays far below the transport's
//! limit of 65,536 frames per message.
//!
//! Connections and what they carry (each opened by the first party, after the security
//! handshake of [`crate::security`], with a [`Hello`]):
//! - client → scheduler: [`FromClient`] / [`ToClient`];
//! - worker → scheduler: [`FromWorker`] / [`ToWorker`];
//! - worker → worker and client → worker, for data only: [`DataMsg`].
//!
//! Control never waits behind bulk data: data moves on data connections, never on a control
//! connection (see `docs/transport.md`, "One ordered stream per connection").

mod codec;

use dask_graph::{Frame, Key, ShuffleId, ShuffleRole, TaskFailure, Value, ValueMeta, WireValue};
use serde::{Deserialize, Serialize};

#[cfg(test)]
use codec::Layout;
pub use codec::{decode_batch, encode_batch, DecodeError, PACK_BELOW, PACK_FRAME};

/// A worker, as the scheduler numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerId(pub u32);

/// A client, as the scheduler numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClientId(pub u32);

/// When a task runs relative to others: lower first. The graph's generation (graphs submitted
/// earlier run first), then the task's static order within its graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Priority(pub u32, pub u32);

/// Bytes that travel as frames beside a control message: a header in the message, the frames
/// after the batch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    /// A small header.
    pub header: Vec<u8>,
    /// How many frames belong to this payload.
    pub nframes: u32,
    /// The frames (carried outside the control frame).
    #[serde(skip)]
    pub frames: Vec<Frame>,
}

impl Payload {
    /// Bytes in header and frames.
    pub fn len(&self) -> usize {
        self.header.len() + self.frames.iter().map(Frame::len).sum::<usize>()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A value's encoding.
    pub fn from_value(v: &Value) -> Result<Payload, dask_graph::DataError> {
        let (meta, frames) = v.encode()?.split();
        let header = postcard::to_stdvec(&meta).map_err(|e| dask_graph::DataError::Encode {
            type_name: "ValueMeta",
            reason: e.to_string(),
        })?;
        Ok(Payload {
            header,
            nframes: frames.len() as u32,
            frames,
        })
    }

    /// The value this payload encodes.
    pub fn to_value(&self) -> Result<Value, dask_graph::DataError> {
        let meta: ValueMeta =
            postcard::from_bytes(&self.header).map_err(|e| dask_graph::DataError::Decode {
                type_name: "ValueMeta".into(),
                reason: e.to_string(),
            })?;
        if meta.frames as usize != self.frames.len() {
            return Err(dask_graph::DataError::Decode {
                type_name: meta.type_name,
                reason: format!(
                    "{} frames where {} were announced",
                    self.frames.len(),
                    meta.frames
                ),
            });
        }
        Value::decode(WireValue::join(meta, self.frames.clone()))
    }
}

/// Messages that carry payloads say where they are, so a batch can move their frames out and
/// back in.
pub trait Payloads {
    /// Calls `f` on each payload of the message, in a fixed order.
    fn payloads(&mut self, f: &mut dyn FnMut(&mut Payload));
}

/// The first message on every connection, after the security handshake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hello {
    /// A client, on its control connection to the scheduler.
    Client {
        /// A name for logs.
        name: String,
    },
    /// A worker, on its control connection to the scheduler.
    Worker {
        /// A name for logs.
        name: String,
        /// Where peers fetch data from it.
        data_address: String,
        /// Threads that run tasks.
        nthreads: u32,
        /// Its memory limit in bytes (0: none).
        memory_limit: u64,
        /// Its process id (on its host).
        pid: u32,
    },
    /// A data connection (to a worker, from a worker or a client).
    Data {
        /// A name for logs.
        name: String,
    },
}

impl Payloads for Hello {
    fn payloads(&mut self, _: &mut dyn FnMut(&mut Payload)) {}
}

/// A task as a client submits it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDef {
    /// Its key.
    pub key: Key,
    /// The keys it needs.
    pub deps: Vec<Key>,
    /// Its place in the graph's static order.
    pub order: u32,
    /// What the worker runs (opaque to the scheduler; see [`crate::spec`]).
    pub spec: Payload,
    /// How many times to run it again when it fails (Dask's `retries`).
    pub retries: u32,
    /// Its part in a peer-to-peer shuffle, if any (see [`dask_graph::shuffle`]).
    pub shuffle: Option<ShuffleRole>,
}

/// Where a shuffle's outputs go in its current run: sent with each of its tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShuffleRun {
    /// The shuffle.
    pub id: ShuffleId,
    /// The run's number: it grows each time the shuffle starts again (a worker holding
    /// pieces was lost); pieces of earlier runs are not read.
    pub run: u32,
    /// Data addresses of the workers that own the outputs: output `i` goes to
    /// `owners[i % owners.len()]`.
    pub owners: Vec<String>,
}

impl ShuffleRun {
    /// The data address of output `part`'s owner.
    pub fn owner(&self, part: u32) -> Option<&str> {
        (!self.owners.is_empty()).then(|| self.owners[part as usize % self.owners.len()].as_str())
    }
}

/// A value a client placed on a worker itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scattered {
    /// Its key.
    pub key: Key,
    /// The worker holding it.
    pub worker: WorkerId,
    /// Its size.
    pub nbytes: u64,
}

/// Client → scheduler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromClient {
    /// New tasks, and the keys the client holds futures for.
    UpdateGraph {
        /// The tasks (keys the scheduler already has are not replaced).
        tasks: Vec<TaskDef>,
        /// Keys the client wants (futures).
        wanted: Vec<Key>,
    },
    /// Values the client put on workers itself (scatter); the client wants them.
    Scattered {
        /// What and where.
        keys: Vec<Scattered>,
    },
    /// The client's futures for these keys are gone.
    Release {
        /// The keys.
        keys: Vec<Key>,
    },
    /// Cancel these keys' computations (the client's futures end as cancelled).
    Cancel {
        /// The keys.
        keys: Vec<Key>,
    },
    /// Where are these keys' values? (Answered with [`ToClient::WhoHas`].)
    WhoHas {
        /// The keys.
        keys: Vec<Key>,
    },
    /// Retire these workers (by data address) gracefully: they take no new tasks, finish what
    /// they run, hand the values others need to other workers, and close. Answered with
    /// [`ToClient::Retired`].
    Retire {
        /// The request's number (echoed in the answer).
        id: u64,
        /// Their data addresses.
        workers: Vec<String>,
    },
    /// Shut the cluster down: the scheduler tells every worker to close, closes every
    /// connection and stops (handled by the scheduler process, not the core).
    Shutdown,
    /// The client is alive (sent every few seconds); answered with [`ToClient::Alive`].
    Heartbeat,
}

impl Payloads for FromClient {
    fn payloads(&mut self, f: &mut dyn FnMut(&mut Payload)) {
        if let FromClient::UpdateGraph { tasks, .. } = self {
            tasks.iter_mut().for_each(|t| f(&mut t.spec));
        }
    }
}

/// A worker as clients see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Its number.
    pub id: WorkerId,
    /// Its data address.
    pub address: String,
    /// Its threads.
    pub nthreads: u32,
    /// Its process id (on its host).
    pub pid: u32,
}

/// Scheduler → client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToClient {
    /// The client's number, and the workers.
    Welcome {
        /// The client's number.
        id: ClientId,
        /// How often to send heartbeats, in milliseconds (a fraction of the scheduler's
        /// client timeout).
        heartbeat_ms: u64,
        /// The workers at this moment.
        workers: Vec<WorkerInfo>,
    },
    /// The workers changed.
    Workers {
        /// The workers now.
        workers: Vec<WorkerInfo>,
    },
    /// A wanted key's value is on a worker.
    InMemory {
        /// The key.
        key: Key,
        /// Its size.
        nbytes: u64,
        /// Data addresses of the workers holding it (the client fetches from one).
        holders: Vec<String>,
        /// The value itself when it is small ([`SMALL_RESULT`]): it rode with the worker's
        /// completion notice, and saves the client a round trip to the worker.
        value: Option<Payload>,
    },
    /// A wanted key failed (`failure` names the task that failed: this key or a dependency).
    Erred {
        /// The key.
        key: Key,
        /// Why.
        failure: TaskFailure,
    },
    /// A wanted key was cancelled.
    Cancelled {
        /// The key.
        key: Key,
    },
    /// Where the asked keys are (unknown keys have no holders).
    WhoHas {
        /// Keys and the data addresses of workers holding them.
        holders: Vec<(Key, Vec<String>)>,
    },
    /// A wanted key's value was lost with its worker; it is being computed again.
    Lost {
        /// The key.
        key: Key,
    },
    /// The answer to [`FromClient::Retire`]: the workers retired (in the order asked), or
    /// why none was.
    Retired {
        /// The request's number.
        id: u64,
        /// Data addresses of the workers that left.
        workers: Vec<String>,
        /// Why the request was refused (then no worker was touched).
        refused: Option<String>,
    },
    /// Keys of a graph the scheduler refused (the text says why).
    Refused {
        /// The keys.
        keys: Vec<Key>,
        /// Why.
        reason: String,
    },
    /// The answer to [`FromClient::Heartbeat`]: the scheduler reads this client.
    Alive,
    /// The scheduler dropped this client (silent past its timeout, or its queue grew past the
    /// limit); the connection closes after this.
    Removed {
        /// Why.
        reason: String,
    },
}

impl Payloads for ToClient {
    fn payloads(&mut self, f: &mut dyn FnMut(&mut Payload)) {
        if let ToClient::InMemory { value: Some(p), .. } = self {
            f(p);
        }
    }
}

/// The largest result (encoded) a worker sends with its completion notice when a client wants
/// the key: metadata-sized, so it does not count as data through the scheduler.
pub const SMALL_RESULT: usize = 1024;

/// A dependency of a task sent to a worker: where to fetch it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dep {
    /// Its key.
    pub key: Key,
    /// Data addresses of the workers holding it.
    pub holders: Vec<String>,
    /// Its size.
    pub nbytes: u64,
}

/// Scheduler → worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToWorker {
    /// The worker's number.
    Welcome {
        /// The number.
        id: WorkerId,
        /// How often to send heartbeats, in milliseconds (a fraction of the scheduler's
        /// heartbeat timeout).
        heartbeat_ms: u64,
    },
    /// Run a task once its dependencies are here.
    Compute {
        /// The task's key.
        key: Key,
        /// What to run.
        spec: Payload,
        /// Its dependencies and where they are.
        deps: Vec<Dep>,
        /// When it runs relative to others here.
        priority: Priority,
        /// A client wants the key: send a small result with the completion notice.
        wanted: bool,
        /// For a shuffle's task: the shuffle's current run.
        shuffle: Option<ShuffleRun>,
        /// This assignment's number (unique across the scheduler's assignments): what the
        /// worker says of the task names it, so that news of an assignment the scheduler took
        /// back (a `Free` that crossed the news on the wire) is told from the current one.
        attempt: u64,
    },
    /// A shuffle's runs up to `run` are over: drop their pieces.
    ShuffleDone {
        /// The shuffle.
        id: ShuffleId,
        /// The last run to drop.
        run: u32,
    },
    /// Forget these keys (and cancel them if they have not run).
    Free {
        /// The keys.
        keys: Vec<Key>,
    },
    /// Give this task back if it has not started (work stealing); answered with
    /// [`FromWorker::StealResponse`].
    Steal {
        /// The task's key.
        key: Key,
        /// The steal's number (echoed in the answer, so a late answer to an earlier steal of
        /// the same key is not taken for this one's).
        id: u64,
    },
    /// Fetch these values from their holders and keep them (a retiring worker's data moving
    /// here); answered with [`FromWorker::Acquired`].
    Acquire {
        /// The keys and where they are.
        keys: Vec<Dep>,
    },
    /// Shut down.
    Close,
    /// The worker serving data at `address` was removed while silent (stopped, partitioned):
    /// fetches from it end now, rather than when their deadline passes, and go to the next
    /// holder or are reported missing.
    PeerGone {
        /// Its data address.
        address: String,
    },
    /// The answer to a heartbeat: the scheduler reads this worker (see
    /// `docs/resilience.md`, liveness).
    Alive,
    /// The scheduler removed this worker (it was silent past the heartbeat timeout, or its
    /// queue grew past the limit): its tasks and values are gone from the scheduler's books,
    /// the connection closes after this, and the worker exits with
    /// [`EXIT_REMOVED`](crate::EXIT_REMOVED) to be restarted.
    Removed {
        /// Why.
        reason: String,
    },
}

impl Payloads for ToWorker {
    fn payloads(&mut self, f: &mut dyn FnMut(&mut Payload)) {
        if let ToWorker::Compute { spec, .. } = self {
            f(spec);
        }
    }
}

/// Most fetches a heartbeat reports.
pub const FETCHES_KEPT: usize = 256;

/// A fetch of values from another worker, as a heartbeat reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fetch {
    /// The worker fetched from (its data address).
    pub peer: String,
    /// Values asked for.
    pub keys: u32,
    /// Bytes that arrived.
    pub bytes: u64,
    /// How long it took, in microseconds.
    pub micros: u64,
    /// How long before the heartbeat it ended, in microseconds.
    pub ago_micros: u64,
}

/// Worker → scheduler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromWorker {
    /// A task ran; its value is here.
    Finished {
        /// The key.
        key: Key,
        /// The value's size.
        nbytes: u64,
        /// How long it ran, in microseconds.
        micros: u64,
        /// The value, when a client wants it and it is small ([`SMALL_RESULT`]).
        small: Option<Payload>,
        /// The worker thread that ran it (`0..nthreads`), for the task stream.
        thread: u32,
        /// The assignment it ran for ([`ToWorker::Compute`]'s `attempt`).
        attempt: u64,
    },
    /// A task failed.
    Erred {
        /// The key.
        key: Key,
        /// Why.
        failure: TaskFailure,
        /// The assignment it ran for.
        attempt: u64,
    },
    /// A dependency of `key` could not be fetched from any holder the scheduler named.
    MissingDep {
        /// The task that needed it.
        key: Key,
        /// The dependency.
        dep: Key,
        /// The holders that did not have it or could not be reached (this worker's own
        /// address when the scheduler named it and the value is not here).
        tried: Vec<String>,
        /// The assignment of `key` that needed it.
        attempt: u64,
    },
    /// How the worker is doing (every two seconds, and at once when it pauses or resumes).
    Heartbeat {
        /// Bytes of values it holds in memory.
        stored: u64,
        /// Bytes of values it spilled to disk.
        spilled: u64,
        /// Its process's resident memory.
        rss: u64,
        /// Tasks running or queued to run now.
        executing: u32,
        /// It is above its pause threshold: it starts no new task.
        paused: bool,
        /// The process's CPU time since the last heartbeat per second of it, in thousandths
        /// of a core (1500: one and a half cores busy).
        cpu_milli: u32,
        /// The fetches of values from other workers that ended since the last heartbeat
        /// (the last [`FETCHES_KEPT`] of them), for the task stream.
        fetches: Vec<Fetch>,
    },
    /// The answer to [`ToWorker::Steal`]: whether the task was given back (it had not
    /// started; it will not run here).
    StealResponse {
        /// The task's key.
        key: Key,
        /// The steal's number.
        id: u64,
        /// Given back.
        stolen: bool,
    },
    /// Copies of values an [`ToWorker::Acquire`] asked for that are here now (with their
    /// sizes), and the keys no holder had.
    Acquired {
        /// Keys now held here, with their sizes.
        keys: Vec<(Key, u64)>,
        /// Keys that could not be fetched.
        failed: Vec<Key>,
    },
    /// Values this worker had and lost (a spill file that is corrupt or gone): the scheduler
    /// finds them elsewhere or computes them again.
    LostKeys {
        /// The keys.
        keys: Vec<Key>,
    },
}

impl Payloads for FromWorker {
    fn payloads(&mut self, f: &mut dyn FnMut(&mut Payload)) {
        if let FromWorker::Finished { small: Some(p), .. } = self {
            f(p);
        }
    }
}

/// One transfer in a worker's log: a delivery of shuffle pieces to a peer, as the sender timed
/// it (from the first byte sent to the peer's acknowledgement of the last batch), or a fetch
/// of values a task here needs from a peer, as the receiver timed it (from the request to the
/// last byte of the answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// The peer's data address.
    pub peer: String,
    /// Bytes of pieces or values (their encodings).
    pub bytes: u64,
    /// How long it took, in microseconds.
    pub micros: u64,
    /// A fetch from the peer (`true`) rather than a delivery to it.
    pub fetched: bool,
    /// Its number in the worker's log (from 1, in the order recorded; set by the log): a
    /// later read of the log has what came after by this, however much the log forgot.
    pub seq: u64,
}

/// On data connections (worker ↔ worker, client ↔ worker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataMsg {
    /// Send these keys' values.
    Get {
        /// The keys.
        keys: Vec<Key>,
    },
    /// The answer to [`DataMsg::Get`]: each key's value, or `None` when it is not here.
    Values {
        /// The values.
        values: Vec<(Key, Option<Payload>)>,
    },
    /// Keep these values (a client's scatter).
    Put {
        /// The values.
        values: Vec<(Key, Payload)>,
    },
    /// The values of a [`DataMsg::Put`] or [`DataMsg::Pieces`] are stored.
    Stored,
    /// Keep these shuffle pieces as they are (encoded: the unpack task decodes them).
    Pieces {
        /// The pieces.
        values: Vec<(Key, Payload)>,
    },
    /// Which transfers did you make (shuffle deliveries, fetches)? (Answered with
    /// [`DataMsg::Transfers`].)
    TransferLog,
    /// The worker's latest transfers (at most [`TRANSFER_LOG`]), oldest first.
    Transfers {
        /// The deliveries.
        entries: Vec<Transfer>,
    },
}

/// The most transfers a worker remembers.
pub const TRANSFER_LOG: usize = 10_000;

impl Payloads for DataMsg {
    fn payloads(&mut self, f: &mut dyn FnMut(&mut Payload)) {
        match self {
            DataMsg::Values { values } => values
                .iter_mut()
                .filter_map(|(_, p)| p.as_mut())
                .for_each(f),
            DataMsg::Put { values } | DataMsg::Pieces { values } => {
                values.iter_mut().for_each(|(_, p)| f(p))
            }
            DataMsg::Get { .. }
            | DataMsg::Stored
            | DataMsg::TransferLog
            | DataMsg::Transfers { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn batches_round_trip_with_payload_frames() {
        let v = Value::new(Bytes::from(vec![9u8; 100]));
        let msgs = vec![
            DataMsg::Get {
                keys: vec![Key::name_only("a")],
            },
            DataMsg::Values {
                values: vec![
                    (Key::name_only("a"), Some(Payload::from_value(&v).unwrap())),
                    (Key::name_only("b"), None),
                ],
            },
            DataMsg::Stored,
        ];
        let wire = encode_batch(msgs.clone());
        assert_eq!(wire.frames.len(), 2, "control + one value frame");
        let back: Vec<DataMsg> = decode_batch(wire).unwrap();
        let DataMsg::Values { values } = &back[1] else {
            panic!()
        };
        let got = values[0].1.as_ref().unwrap().to_value().unwrap();
        assert_eq!(got.downcast_ref::<Bytes>().unwrap().len(), 100);
        assert_eq!(back[0], msgs[0]);
    }

    #[test]
    fn announced_frame_counts_are_not_loop_bounds() {
        // A thousand payloads announcing 4 billion frames each, with none present: an error
        // at once (the count once drove a loop: 4 trillion steps).
        let huge = Payload {
            header: Vec::new(),
            nframes: u32::MAX,
            frames: Vec::new(),
        };
        let msgs = vec![DataMsg::Put {
            values: (0..1000)
                .map(|i| (Key::name_only(&format!("k{i}")), huge.clone()))
                .collect(),
        }];
        let control = postcard::to_stdvec(&(&msgs, Layout::default())).unwrap();
        let wire = transport::Message::from(vec![control]);
        assert!(matches!(
            decode_batch::<DataMsg>(wire),
            Err(DecodeError::Frames { got: 0, .. })
        ));
    }

    #[test]
    fn bad_batches_are_errors_not_panics() {
        let empty = transport::Message::from(Vec::<Vec<u8>>::new());
        assert_eq!(decode_batch::<DataMsg>(empty), Err(DecodeError::Empty));
        let garbage = transport::Message::from(vec![vec![0xff; 10]]);
        assert!(matches!(
            decode_batch::<DataMsg>(garbage),
            Err(DecodeError::Control(_))
        ));
        // A payload announcing frames that are not there, and frames nobody announced (a
        // value of PACK_BELOW bytes: a frame of its own).
        let mut wire = encode_batch(vec![DataMsg::Put {
            values: vec![(
                Key::name_only("k"),
                Payload::from_value(&Value::new(Bytes::from(vec![1u8; PACK_BELOW]))).unwrap(),
            )],
        }]);
        let extra = wire.frames.pop().unwrap();
        assert!(matches!(
            decode_batch::<DataMsg>(wire.clone()),
            Err(DecodeError::Frames {
                announced: 1,
                got: 0
            })
        ));
        wire.frames.push(extra.clone());
        wire.frames.push(extra);
        assert!(matches!(
            decode_batch::<DataMsg>(wire),
            Err(DecodeError::Frames {
                announced: 1,
                got: 2
            })
        ));
    }

    fn puts(sizes: &[usize]) -> Vec<DataMsg> {
        let values = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let v = Value::new(Bytes::from(vec![(i % 251) as u8; n]));
                (
                    Key::name_only(&format!("k{i}")),
                    Payload::from_value(&v).unwrap(),
                )
            })
            .collect();
        vec![DataMsg::Put { values }]
    }

    fn sizes_back(msgs: &[DataMsg]) -> Vec<(usize, u8)> {
        let DataMsg::Put { values } = &msgs[0] else {
            panic!("not a Put")
        };
        values
            .iter()
            .map(|(_, p)| {
                let v = p.to_value().unwrap();
                let b = v.downcast_ref::<Bytes>().unwrap().clone();
                (b.len(), b.first().copied().unwrap_or(0))
            })
            .collect()
    }

    #[test]
    fn a_hundred_thousand_small_payloads_travel_in_a_few_frames() {
        let sizes = vec![10usize; 100_000];
        let wire = encode_batch(puts(&sizes));
        assert!(
            wire.frames.len() <= 3,
            "{} frames: over the transport's 65,536 without packing",
            wire.frames.len()
        );
        let back: Vec<DataMsg> = decode_batch(wire).unwrap();
        let got = sizes_back(&back);
        assert_eq!(got.len(), 100_000);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, &(n, b))| n == 10 && b == (i % 251) as u8));
    }

    #[test]
    fn small_and_large_frames_mix_and_packs_split_at_their_limit() {
        // Small frames past PACK_FRAME in all (several packs), empty ones, and frames of their own.
        let mut sizes = vec![0, 1, PACK_BELOW - 1, PACK_BELOW, 1 << 20, 0];
        sizes.extend(std::iter::repeat_n(
            PACK_BELOW - 1,
            2 * PACK_FRAME / (PACK_BELOW - 1) + 3,
        ));
        let wire = encode_batch(puts(&sizes));
        let own = sizes.iter().filter(|&&n| n >= PACK_BELOW).count();
        assert!(wire.frames.len() >= 1 + own + 3, "at least three packs");
        let back: Vec<DataMsg> = decode_batch(wire).unwrap();
        let got = sizes_back(&back);
        let want: Vec<(usize, u8)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (n, if n == 0 { 0 } else { (i % 251) as u8 }))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn layouts_that_do_not_match_their_frames_are_errors() {
        let good = encode_batch(puts(&[10, 20, PACK_BELOW]));
        assert_eq!(
            good.frames.len(),
            3,
            "control, one pack, one frame of its own"
        );
        // The pack cut short, grown, dropped, doubled; the own frame dropped.
        let mut short = good.clone();
        short.frames[1] = transport::Frame::Host(Bytes::from(vec![0u8; 25]));
        let mut long = good.clone();
        long.frames[1] = transport::Frame::Host(Bytes::from(vec![0u8; 31]));
        let mut no_pack = good.clone();
        no_pack.frames.remove(1);
        let mut two_packs = good.clone();
        two_packs.frames.insert(1, good.frames[1].clone());
        let mut no_own = good.clone();
        no_own.frames.pop();
        for (what, wire) in [
            ("short pack", short),
            ("long pack", long),
            ("no pack", no_pack),
            ("a pack too many", two_packs),
            ("no own frame", no_own),
        ] {
            assert!(
                decode_batch::<DataMsg>(wire).is_err(),
                "{what} was accepted"
            );
        }
        assert!(decode_batch::<DataMsg>(good).is_ok());
    }
}
