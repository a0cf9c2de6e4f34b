//! The core driven by a recording `Comm`: no network, no sleeps. Every step is followed by
//! the core's invariant check, every message is asserted, and a test that leaves one unread
//! fails. Messages are also round-tripped through the wire codec.

use std::time::{Duration, Instant};

use dask_graph::{FailureKind, Key, TaskFailure};

use super::*;
use crate::protocol::{decode_batch, encode_batch, Payload};

mod resilience;
mod shuffle;

/// Everything the core sent, in order.
#[derive(Default)]
struct Rec {
    sent: Vec<Sent>,
    /// The latest assignment of each key to each worker (what its news must name).
    attempts: std::collections::HashMap<(WorkerId, Key), u64>,
}

#[derive(Debug, Clone, PartialEq)]
enum Sent {
    W(WorkerId, ToWorker),
    C(ClientId, ToClient),
    /// The core dropped the worker (told why, connection closed).
    DropW(WorkerId, String),
    /// The core dropped the client.
    DropC(ClientId, String),
}

impl Comm for Rec {
    fn send_worker(&mut self, w: WorkerId, msg: ToWorker) {
        // Every message survives the wire.
        let back: Vec<ToWorker> = decode_batch(encode_batch(vec![msg.clone()])).unwrap();
        assert_eq!(back, vec![msg.clone()]);
        if let ToWorker::Compute { key, attempt, .. } = &msg {
            self.attempts.insert((w, *key), *attempt);
        }
        self.sent.push(Sent::W(w, msg));
    }
    fn send_client(&mut self, c: ClientId, msg: ToClient) {
        let back: Vec<ToClient> = decode_batch(encode_batch(vec![msg.clone()])).unwrap();
        assert_eq!(back, vec![msg.clone()]);
        self.sent.push(Sent::C(c, msg));
    }
    fn drop_worker(&mut self, w: WorkerId, reason: String) {
        self.sent.push(Sent::DropW(w, reason));
    }
    fn drop_client(&mut self, c: ClientId, reason: String) {
        self.sent.push(Sent::DropC(c, reason));
    }
}

impl Drop for Rec {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert!(self.sent.is_empty(), "unread messages: {:#?}", self.sent);
        }
    }
}

/// A core under test, its recorder and a clock.
struct T {
    core: Core,
    rec: Rec,
    now: Instant,
}

fn k(name: &str) -> Key {
    Key::name_only(name)
}

fn def(key: &str, deps: &[&str], order: u32) -> TaskDef {
    TaskDef {
        key: k(key),
        deps: deps.iter().map(|d| k(d)).collect(),
        order,
        spec: Payload::default(),
        retries: 0,
        shuffle: None,
    }
}

impl T {
    fn new() -> T {
        T::with(Config::default())
    }

    fn with(cfg: Config) -> T {
        T {
            core: Core::new(cfg),
            rec: Rec::default(),
            now: Instant::now(),
        }
    }

    fn take(&mut self) -> Vec<Sent> {
        self.core.check();
        std::mem::take(&mut self.rec.sent)
    }

    fn nothing(&mut self) {
        assert_eq!(self.take(), vec![]);
    }

    fn client(&mut self) -> ClientId {
        let c = self.core.on_client_added("c".into(), &mut self.rec);
        let sent = self.take();
        assert!(
            matches!(&sent[..], [Sent::C(x, ToClient::Welcome { id, .. })] if *x == c && *id == c)
        );
        c
    }

    fn worker(&mut self, name: &str, nthreads: u32) -> WorkerId {
        let w = self.core.on_worker_added(
            NewWorker {
                name: name.into(),
                address: format!("tcp://{name}"),
                nthreads,
                memory_limit: 0,
                pid: 1,
            },
            self.now,
            &mut self.rec,
        );
        let sent = self.take();
        assert!(
            sent.iter().any(
                |s| matches!(s, Sent::W(x, ToWorker::Welcome { id, .. }) if *x == w && *id == w)
            ),
            "{sent:?}"
        );
        // Clients hear about it; other messages (tasks it got) stay for the test.
        self.rec.sent = sent
            .into_iter()
            .filter(|s| {
                !matches!(
                    s,
                    Sent::W(_, ToWorker::Welcome { .. }) | Sent::C(_, ToClient::Workers { .. })
                )
            })
            .collect();
        w
    }

    fn graph(&mut self, c: ClientId, tasks: Vec<TaskDef>, wanted: &[&str]) {
        self.core.on_client_message(
            c,
            FromClient::UpdateGraph {
                tasks,
                wanted: wanted.iter().map(|w| k(w)).collect(),
            },
            &mut self.rec,
        );
    }

    /// The number of the latest assignment of `key` to `w` (0: none).
    fn attempt(&self, w: WorkerId, key: &str) -> u64 {
        self.rec.attempts.get(&(w, k(key))).copied().unwrap_or(0)
    }

    fn finish(&mut self, w: WorkerId, key: &str, nbytes: u64, micros: u64) {
        let attempt = self.attempt(w, key);
        self.finish_as(w, key, attempt, nbytes, micros);
    }

    /// `w` says `key` finished, for assignment `attempt` (a stale one, say).
    fn finish_as(&mut self, w: WorkerId, key: &str, attempt: u64, nbytes: u64, micros: u64) {
        self.core.on_worker_message(
            w,
            FromWorker::Finished {
                key: k(key),
                nbytes,
                micros,
                small: None,
                thread: 0,
                attempt,
            },
            self.now,
            &mut self.rec,
        );
    }

    /// A worker's data address.
    fn addr(&self, w: WorkerId) -> String {
        self.core
            .worker_summaries()
            .into_iter()
            .find(|s| s.id == w)
            .map(|s| s.address)
            .unwrap_or_default()
    }

    /// The keys the recorder says were sent to compute, by worker, and nothing else.
    fn computes(&mut self) -> Vec<(WorkerId, Key)> {
        self.take()
            .into_iter()
            .map(|s| match s {
                Sent::W(w, ToWorker::Compute { key, .. }) => (w, key),
                other => panic!("expected only computes, got {other:?}"),
            })
            .collect()
    }
}

#[test]
fn one_task_from_graph_to_memory_to_forgotten() {
    let mut t = T::new();
    let c = t.client();
    let w = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(w, k("x"))]);
    t.finish(w, "x", 8, 100);
    assert_eq!(
        t.take(),
        vec![Sent::C(
            c,
            ToClient::InMemory {
                key: k("x"),
                nbytes: 8,
                holders: vec!["tcp://a".into()],
                value: None
            }
        )]
    );
    assert_eq!(t.core.status(&k("x")), Some(Status::Memory));
    t.core
        .on_client_message(c, FromClient::Release { keys: vec![k("x")] }, &mut t.rec);
    assert_eq!(
        t.take(),
        vec![Sent::W(w, ToWorker::Free { keys: vec![k("x")] })]
    );
    assert_eq!(t.core.task_count(), 0, "forgotten");
}

#[test]
fn tasks_wait_for_a_worker_and_get_one_when_it_comes() {
    let mut t = T::new();
    let c = t.client();
    t.graph(c, vec![def("x", &[], 0), def("y", &["x"], 1)], &["y"]);
    t.nothing();
    assert_eq!(t.core.status(&k("x")), Some(Status::NoWorker));
    assert_eq!(t.core.status(&k("y")), Some(Status::Waiting));
    let w = t.worker("a", 2);
    assert_eq!(t.computes(), vec![(w, k("x"))]);
    t.finish(w, "x", 8, 10);
    assert_eq!(t.computes(), vec![(w, k("y"))]);
    t.finish(w, "y", 8, 10);
    // y wanted: the client hears; x no longer needed: freed, kept as y's lineage.
    assert_eq!(
        t.take(),
        vec![
            Sent::C(
                c,
                ToClient::InMemory {
                    key: k("y"),
                    nbytes: 8,
                    holders: vec!["tcp://a".into()],
                    value: None
                }
            ),
            Sent::W(w, ToWorker::Free { keys: vec![k("x")] }),
        ]
    );
    assert_eq!(t.core.status(&k("x")), Some(Status::Released));
    t.core
        .on_client_message(c, FromClient::Release { keys: vec![k("y")] }, &mut t.rec);
    assert_eq!(
        t.take(),
        vec![Sent::W(w, ToWorker::Free { keys: vec![k("y")] })]
    );
    assert_eq!(t.core.task_count(), 0, "both forgotten");
}

/// Root tasks are released to free threads only (saturation 1.1 → 2 slots per thread), and
/// once a prefix is known to be very short, more at a time.
#[test]
fn root_tasks_are_queued_then_released_to_free_threads() {
    let mut t = T::new();
    let c = t.client();
    let w = t.worker("a", 1);
    let tasks: Vec<TaskDef> = (0..200).map(|i| def(&format!("r-{i}"), &[], i)).collect();
    let names: Vec<String> = (0..200).map(|i| format!("r-{i}")).collect();
    let wanted: Vec<&str> = names.iter().map(String::as_str).collect();
    t.graph(c, tasks, &wanted);
    assert_eq!(t.computes(), vec![(w, k("r-0")), (w, k("r-1"))]);
    assert_eq!(t.core.status(&k("r-2")), Some(Status::Queued));
    // A slow task (1 s): one more slot frees, one more task goes, in priority order.
    t.finish(w, "r-0", 8, 1_000_000);
    let sent = t.take();
    assert_eq!(
        sent[0],
        Sent::C(
            c,
            ToClient::InMemory {
                key: k("r-0"),
                nbytes: 8,
                holders: vec!["tcp://a".into()],
                value: None
            }
        )
    );
    assert_eq!(
        sent[1..],
        [Sent::W(
            w,
            ToWorker::Compute {
                key: k("r-2"),
                spec: Payload::default(),
                deps: vec![],
                priority: Priority(1, 2),
                wanted: true,
                shuffle: None,
                attempt: t.attempt(w, "r-2"),
            }
        )]
    );
    t.finish(w, "r-1", 8, 1_000_000);
    t.finish(w, "r-2", 8, 1_000_000);
    let sent = t.take();
    assert_eq!(sent.len(), 4, "two answers, two more tasks: {sent:?}");

    t.core.on_client_removed(c, &mut t.rec);
    let frees = t.take();
    assert!(
        frees
            .iter()
            .all(|s| matches!(s, Sent::W(_, ToWorker::Free { .. }))),
        "{frees:?}"
    );
    assert_eq!(t.core.task_count(), 0);
}

/// A task goes where its large dependency is, and dependencies are freed once done with.
/// Tasks of a prefix known to be very short (1 us) are handed out many at a time, so a worker
/// stays busy without waiting for the scheduler: at most 64 per thread.
#[test]
fn very_short_tasks_get_more_slots() {
    let mut t = T::new();
    let c = t.client();
    let w = t.worker("a", 1);
    let names: Vec<String> = (0..300).map(|i| format!("fast-{i}")).collect();
    let tasks: Vec<TaskDef> = (0..300).map(|i| def(&names[i as usize], &[], i)).collect();
    let wanted: Vec<&str> = names.iter().map(String::as_str).collect();
    t.graph(c, tasks, &wanted);
    assert_eq!(t.computes().len(), 2, "unknown duration: saturation 1.1");
    t.finish(w, &names[0], 8, 1);
    let computes = t
        .take()
        .iter()
        .filter(|s| matches!(s, Sent::W(_, ToWorker::Compute { .. })))
        .count();
    assert!(computes > 10, "{computes}");
    assert!(t.core.processing(w) <= 64);
    t.core.on_client_removed(c, &mut t.rec);
    t.take();
    assert_eq!(t.core.task_count(), 0);
}

#[test]
fn placement_follows_the_data() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    let b = t.worker("b", 1);
    t.graph(c, vec![def("big", &[], 0), def("small", &[], 1)], &[]);
    // Not wanted and nothing needs them: forgotten at once.
    t.nothing();
    assert_eq!(t.core.task_count(), 0);
    t.graph(
        c,
        vec![
            def("big", &[], 0),
            def("small", &[], 1),
            def("use", &["big", "small"], 2),
        ],
        &["use"],
    );
    let computes = t.computes();
    assert_eq!(computes.len(), 2);
    let on = |key: &str| computes.iter().find(|(_, x)| *x == k(key)).unwrap().0;
    let (wb, ws) = (on("big"), on("small"));
    assert_ne!(wb, ws, "spread over the two workers");
    t.finish(wb, "big", 100 << 20, 10);
    t.finish(ws, "small", 10, 10);
    assert_eq!(t.computes(), vec![(wb, k("use"))]);
    t.finish(wb, "use", 8, 10);
    let sent = t.take();
    assert!(sent.contains(&Sent::C(
        c,
        ToClient::InMemory {
            key: k("use"),
            nbytes: 8,
            holders: vec![t.addr(wb)],
            value: None
        }
    )));
    assert!(sent.contains(&Sent::W(
        wb,
        ToWorker::Free {
            keys: vec![k("big")]
        }
    )));
    assert!(sent.contains(&Sent::W(
        ws,
        ToWorker::Free {
            keys: vec![k("small")]
        }
    )));
    let _ = (a, b);
}

#[test]
fn a_failure_fails_its_dependents_with_the_cause() {
    let mut t = T::new();
    let c = t.client();
    let w = t.worker("a", 1);
    t.graph(
        c,
        vec![def("x", &[], 0), def("y", &["x"], 1), def("z", &["y"], 2)],
        &["z"],
    );
    assert_eq!(t.computes(), vec![(w, k("x"))]);
    let failure = TaskFailure::new(k("x"), "f", FailureKind::Panic, "boom");
    t.core.on_worker_message(
        w,
        FromWorker::Erred {
            key: k("x"),
            failure: failure.clone(),
            attempt: t.attempt(w, "x"),
        },
        t.now,
        &mut t.rec,
    );
    assert_eq!(
        t.take(),
        vec![Sent::C(
            c,
            ToClient::Erred {
                key: k("z"),
                failure
            }
        )]
    );
    assert_eq!(t.core.status(&k("y")), Some(Status::Erred));
    // Asking again for the erred key answers at once.
    t.graph(c, vec![], &["z"]);
    assert!(matches!(
        &t.take()[..],
        [Sent::C(_, ToClient::Erred { .. })]
    ));
    t.core
        .on_client_message(c, FromClient::Release { keys: vec![k("z")] }, &mut t.rec);
    t.nothing();
    assert_eq!(t.core.task_count(), 0);
}

/// A lost worker: what ran there runs elsewhere, what only it held is recomputed, and a
/// dependent running elsewhere is taken back until its input exists again.
#[test]
fn a_lost_worker_loses_nothing() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &[]);
    t.nothing();
    t.graph(
        c,
        vec![def("x", &[], 0), def("y", &[], 1), def("z", &["x", "y"], 2)],
        &["z"],
    );
    assert_eq!(t.computes(), vec![(a, k("x")), (a, k("y"))]);
    t.finish(a, "x", 8, 10);
    t.nothing();
    let b = t.worker("b", 1);
    t.nothing();
    t.core.on_worker_removed(a, &mut t.rec);
    let sent = t.take();
    let computes: Vec<_> = sent
        .iter()
        .filter_map(|s| match s {
            Sent::W(w, ToWorker::Compute { key, .. }) => Some((*w, *key)),
            _ => None,
        })
        .collect();
    assert!(
        computes.contains(&(b, k("x"))) && computes.contains(&(b, k("y"))),
        "{sent:?}"
    );
    assert!(sent
        .iter()
        .any(|s| matches!(s, Sent::C(_, ToClient::Workers { workers }) if workers.len() == 1)));
    t.finish(b, "x", 8, 10);
    t.finish(b, "y", 8, 10);
    assert_eq!(t.computes(), vec![(b, k("z"))]);
    // Now b dies while z runs, and a new worker comes: everything is recomputed there.
    let d = t.worker("d", 1);
    t.nothing();
    t.core.on_worker_removed(b, &mut t.rec);
    let sent = t.take();
    assert!(
        sent.iter().any(
            |s| matches!(s, Sent::W(w, ToWorker::Compute { key, .. }) if *w == d && *key == k("x"))
        ),
        "{sent:?}"
    );
    t.finish(d, "x", 8, 10);
    t.finish(d, "y", 8, 10);
    assert_eq!(t.computes(), vec![(d, k("z"))]);
    t.finish(d, "z", 8, 10);
    let sent = t.take();
    assert!(sent.contains(&Sent::C(
        c,
        ToClient::InMemory {
            key: k("z"),
            nbytes: 8,
            holders: vec!["tcp://d".into()],
            value: None
        }
    )));
}

#[test]
fn scattered_data_lost_with_its_worker_fails_what_needs_it() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    let _b = t.worker("b", 1);
    t.core.on_client_message(
        c,
        FromClient::Scattered {
            keys: vec![Scattered {
                key: k("s"),
                worker: a,
                nbytes: 5,
            }],
        },
        &mut t.rec,
    );
    assert_eq!(
        t.take(),
        vec![Sent::C(
            c,
            ToClient::InMemory {
                key: k("s"),
                nbytes: 5,
                holders: vec!["tcp://a".into()],
                value: None
            }
        )]
    );
    t.graph(c, vec![def("u", &["s"], 0)], &["u"]);
    assert_eq!(t.computes(), vec![(a, k("u"))], "where the data is");
    t.core.on_worker_removed(a, &mut t.rec);
    let sent = t.take();
    let errs: Vec<&Key> = sent
        .iter()
        .filter_map(|s| match s {
            Sent::C(_, ToClient::Erred { key, failure }) if failure.kind == FailureKind::Lost => {
                Some(key)
            }
            _ => None,
        })
        .collect();
    assert!(
        errs.contains(&&k("s")) && errs.contains(&&k("u")),
        "{sent:?}"
    );
}

/// A client scatters a value under the key of a task that is running: the task is taken
/// off its worker (freed there), and that worker's late result is no copy.
#[test]
fn a_value_scattered_over_a_running_task_takes_it_back() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    let b = t.worker("b", 1);
    t.core.on_client_message(
        c,
        FromClient::Scattered {
            keys: vec![Scattered {
                key: k("x"),
                worker: b,
                nbytes: 5,
            }],
        },
        &mut t.rec,
    );
    let sent = t.take();
    assert!(
        sent.contains(&Sent::W(a, ToWorker::Free { keys: vec![k("x")] })),
        "{sent:?}"
    );
    assert_eq!(t.core.who_has(&k("x")), vec![b]);
    t.finish(a, "x", 8, 10);
    t.nothing();
    assert_eq!(t.core.who_has(&k("x")), vec![b]);
}

#[test]
fn cancel_release_and_client_removal_free_everything() {
    let mut t = T::new();
    let c = t.client();
    let w = t.worker("a", 4);
    t.graph(c, vec![def("x", &[], 0), def("y", &["x"], 1)], &["y"]);
    assert_eq!(t.computes(), vec![(w, k("x"))]);
    t.core
        .on_client_message(c, FromClient::Cancel { keys: vec![k("y")] }, &mut t.rec);
    assert_eq!(
        t.take(),
        vec![
            Sent::C(c, ToClient::Cancelled { key: k("y") }),
            Sent::W(w, ToWorker::Free { keys: vec![k("x")] }),
        ]
    );
    assert_eq!(t.core.task_count(), 0);
    // A late answer for a forgotten task is harmless: the worker is told to drop it.
    t.finish(w, "x", 8, 10);
    assert_eq!(
        t.take(),
        vec![Sent::W(w, ToWorker::Free { keys: vec![k("x")] })]
    );
    // A second client's interest keeps a key alive after the first leaves.
    let c2 = t.client();
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    t.graph(c2, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(w, k("x"))]);
    t.core.on_client_removed(c, &mut t.rec);
    t.nothing();
    t.finish(w, "x", 8, 10);
    assert_eq!(
        t.take(),
        vec![Sent::C(
            c2,
            ToClient::InMemory {
                key: k("x"),
                nbytes: 8,
                holders: vec!["tcp://a".into()],
                value: None
            }
        )]
    );
}

#[test]
fn graphs_with_unknown_dependencies_are_refused_whole() {
    let mut t = T::new();
    let c = t.client();
    t.graph(c, vec![def("a", &[], 0), def("b", &["nope"], 1)], &["b"]);
    let sent = t.take();
    assert!(
        matches!(&sent[..], [Sent::C(_, ToClient::Refused { keys, reason })]
        if keys == &vec![k("b")] && reason.contains("nope"))
    );
    assert_eq!(t.core.task_count(), 0);
}

#[test]
fn a_missing_dependency_is_fetched_elsewhere_or_recomputed() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0), def("y", &["x"], 1)], &["y"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    t.finish(a, "x", 8, 10);
    assert_eq!(t.computes(), vec![(a, k("y"))]);
    // The worker says it could not get x (from itself: say it lost it).
    t.core.on_worker_message(
        a,
        FromWorker::MissingDep {
            key: k("y"),
            dep: k("x"),
            tried: vec!["tcp://a".into()],
            attempt: t.attempt(a, "y"),
        },
        t.now,
        &mut t.rec,
    );
    assert_eq!(t.computes(), vec![(a, k("x"))], "recomputed");
    t.finish(a, "x", 8, 10);
    assert_eq!(t.computes(), vec![(a, k("y"))]);
}

/// A holder another worker could not fetch from in time (slow, not gone) stops being counted
/// and is told to free its copy, so that nothing it holds is left unaccounted; the value is
/// computed again.
#[test]
fn a_holder_that_did_not_answer_in_time_is_told_to_free_its_copy() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    t.finish(a, "x", 8, 10);
    let _ = t.take();
    let b = t.worker("b", 1);
    // a is busy: y goes to b, which fetches x from a.
    resilience::heartbeat(&mut t, a, true);
    t.graph(c, vec![def("y", &["x"], 1)], &["y"]);
    assert_eq!(t.computes(), vec![(b, k("y"))]);
    t.core.on_worker_message(
        b,
        FromWorker::MissingDep {
            key: k("y"),
            dep: k("x"),
            tried: vec![t.addr(a)],
            attempt: t.attempt(b, "y"),
        },
        t.now,
        &mut t.rec,
    );
    let sent = t.take();
    assert_eq!(
        sent.first(),
        Some(&Sent::W(a, ToWorker::Free { keys: vec![k("x")] })),
        "{sent:?}"
    );
    assert!(
        sent.iter().any(
            |m| matches!(m, Sent::W(w, ToWorker::Compute { key, .. }) if *w == b && *key == k("x"))
        ),
        "recomputed where it runs: {sent:?}"
    );
    assert!(!t.core.who_has(&k("x")).contains(&a));
}

/// A worker silent past the heartbeat timeout is removed for good: its work goes elsewhere,
/// the clients hear, and the core drops it (it is told why and its connection closes), so a
/// process that thaws later cannot talk to a scheduler that forgot it. Heartbeats are
/// answered, so a worker can tell a silent scheduler too.
#[test]
fn silent_workers_are_removed_for_good_on_tick_and_heartbeats_are_answered() {
    let mut t = T::with(Config {
        heartbeat_timeout: Duration::from_secs(10),
        client_timeout: Duration::from_secs(3600),
        ..Config::default()
    });
    let c = t.client();
    let a = t.worker("a", 1);
    let b = t.worker("b", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    let on = t.computes()[0].0;
    let other = if on == a { b } else { a };
    // The other worker keeps beating; the one with the task goes silent.
    t.core.on_tick(t.now, &mut t.rec);
    ticks(&mut t, 8);
    resilience::heartbeat(&mut t, other, false);
    t.nothing();
    ticks(&mut t, 8);
    let sent = t.take();
    assert!(
        sent.iter()
            .any(|m| matches!(m, Sent::C(_, ToClient::Workers { workers }) if workers.len() == 1)),
        "{sent:?}"
    );
    assert!(
        sent.iter().any(|m| matches!(m, Sent::W(w, ToWorker::Compute { key, .. }) if *w == other && *key == k("x"))),
        "the task moves: {sent:?}"
    );
    assert!(
        sent.iter().any(|m| matches!(m, Sent::W(w, ToWorker::PeerGone { address }) if *w == other && address == &format!("tcp://{}", if on == a { "a" } else { "b" }))),
        "the other worker's fetches from it end now: {sent:?}"
    );
    assert!(
        matches!(sent.last(), Some(Sent::DropW(w, why)) if *w == on && why.contains("no heartbeat")),
        "dropped last, with why: {sent:?}"
    );
    assert_eq!(t.core.workers().len(), 1);
    // Its late news is ignored; its leaving (the connection closing) changes nothing more.
    t.core.on_worker_removed(on, &mut t.rec);
    t.nothing();
}

/// Ticks every 100 ms for `secs` seconds (the scheduler's pace).
fn ticks(t: &mut T, secs: u64) {
    for _ in 0..secs * 10 {
        t.now += Duration::from_millis(100);
        t.core.on_tick(t.now, &mut t.rec);
    }
}

/// A scheduler that did not run for longer than the heartbeat timeout (stopped, swapped out)
/// does not remove its workers and clients on its first tick back: their heartbeats may be
/// waiting unread. Their silence counts from then, and a worker still silent a timeout later
/// is removed.
#[test]
fn a_scheduler_that_did_not_run_counts_silence_afresh() {
    let mut t = T::with(Config {
        heartbeat_timeout: Duration::from_secs(10),
        client_timeout: Duration::from_secs(10),
        ..Config::default()
    });
    let c = t.client();
    let a = t.worker("a", 1);
    t.core.on_tick(t.now, &mut t.rec);
    t.now += Duration::from_secs(30);
    t.core.on_tick(t.now, &mut t.rec);
    t.nothing();
    assert_eq!(t.core.workers().len(), 1);
    // Then the ordinary clock: the client speaks, the worker does not.
    ticks(&mut t, 5);
    t.core.on_client_heard(c, t.now);
    ticks(&mut t, 6);
    let sent = t.take();
    assert!(
        matches!(sent.last(), Some(Sent::DropW(w, _)) if *w == a),
        "{sent:?}"
    );
    assert!(
        !sent.iter().any(|m| matches!(m, Sent::DropC(..))),
        "{sent:?}"
    );
}

/// A client silent past the client timeout is dropped like one that left: its futures are
/// released (the work nobody else wants is freed) and its connection closes. A client's
/// heartbeat is answered, and any message restarts its clock.
#[test]
fn silent_clients_are_dropped_and_their_keys_released() {
    let mut t = T::with(Config {
        client_timeout: Duration::from_secs(10),
        heartbeat_timeout: Duration::from_secs(3600),
        ..Config::default()
    });
    let quiet = t.client();
    let chatty = t.client();
    let a = t.worker("a", 1);
    t.graph(quiet, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    t.finish(a, "x", 8, 10);
    let _ = t.take();
    t.core.on_tick(t.now, &mut t.rec);
    for _ in 0..2 {
        ticks(&mut t, 6);
        let sent = t.take();
        t.core.on_client_heard(chatty, t.now);
        t.core
            .on_client_message(chatty, FromClient::Heartbeat, &mut t.rec);
        assert_eq!(t.take(), vec![Sent::C(chatty, ToClient::Alive)]);
        t.rec.sent = sent;
    }
    let sent = t.take();
    assert!(
        sent.contains(&Sent::W(a, ToWorker::Free { keys: vec![k("x")] })),
        "its key is released: {sent:?}"
    );
    assert!(
        matches!(sent.last(), Some(Sent::DropC(c, why)) if *c == quiet && why.contains("silent")),
        "{sent:?}"
    );
    // The chatty one stays; the quiet one's connection ending later changes nothing.
    t.core.on_client_removed(quiet, &mut t.rec);
    t.nothing();
    t.core.on_tick(t.now, &mut t.rec);
    t.nothing();
}

/// The merge shape at scale: 10,000 roots into one sum, over two workers; everything
/// finishes and nothing is left.
#[test]
fn a_merge_graph_runs_to_the_end() {
    let mut t = T::new();
    let c = t.client();
    let ws = [t.worker("a", 1), t.worker("b", 1)];
    let n = 10_000;
    let mut tasks: Vec<TaskDef> = (0..n).map(|i| def(&format!("x-{i}"), &[], i)).collect();
    let names: Vec<String> = (0..n).map(|i| format!("x-{i}")).collect();
    let deps: Vec<&str> = names.iter().map(String::as_str).collect();
    tasks.push(def("sum", &deps, n));
    t.graph(c, tasks, &["sum"]);
    let mut pending = t.computes();
    let mut done = 0;
    let mut steps = 0;
    while let Some((w, key)) = pending.pop() {
        steps += 1;
        assert!(steps < 100_000, "bounded");
        assert!(ws.contains(&w));
        t.core.on_worker_message(
            w,
            FromWorker::Finished {
                key,
                nbytes: 8,
                micros: 1,
                small: None,
                thread: 0,
                attempt: t.rec.attempts[&(w, key)],
            },
            t.now,
            &mut t.rec,
        );
        if steps % 1000 == 0 {
            t.core.check();
        }
        for s in std::mem::take(&mut t.rec.sent) {
            match s {
                Sent::W(w, ToWorker::Compute { key, .. }) => pending.push((w, key)),
                Sent::W(_, ToWorker::Free { .. }) => {}
                Sent::C(_, ToClient::InMemory { key, .. }) if key == k("sum") => done += 1,
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(done, 1);
    t.core.on_client_message(
        c,
        FromClient::Release {
            keys: vec![k("sum")],
        },
        &mut t.rec,
    );
    assert!(matches!(&t.take()[..], [Sent::W(_, ToWorker::Free { .. })]));
    assert_eq!(t.core.task_count(), 0);
}
