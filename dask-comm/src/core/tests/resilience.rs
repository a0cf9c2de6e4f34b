//! Faults, retries, stealing, retirement and memory pauses, including the races Dask got
//! wrong: a task finishing on a worker already removed, a steal answered after the victim
//! (or the thief) died, a key released while a peer fetches it.

use super::*;

fn erred(t: &mut T, w: WorkerId, key: &str) {
    t.core.on_worker_message(
        w,
        FromWorker::Erred {
            key: k(key),
            failure: TaskFailure::new(k(key), "boom", FailureKind::Error, "it failed"),
            attempt: t.attempt(w, key),
        },
        t.now,
        &mut t.rec,
    );
}

fn steal_response(t: &mut T, w: WorkerId, key: &str, id: u64, stolen: bool) {
    t.core.on_worker_message(
        w,
        FromWorker::StealResponse {
            key: k(key),
            id,
            stolen,
        },
        t.now,
        &mut t.rec,
    );
}

/// A heartbeat from `w`; the scheduler's answer ([`ToWorker::Alive`], first) is checked and
/// taken off the record.
pub(super) fn heartbeat(t: &mut T, w: WorkerId, paused: bool) {
    let before = t.rec.sent.len();
    t.core.on_worker_message(
        w,
        FromWorker::Heartbeat {
            stored: 0,
            spilled: 0,
            rss: 0,
            executing: 0,
            paused,
            cpu_milli: 0,
            fetches: Vec::new(),
        },
        t.now,
        &mut t.rec,
    );
    assert_eq!(
        t.rec.sent.get(before),
        Some(&Sent::W(w, ToWorker::Alive)),
        "a heartbeat is answered"
    );
    t.rec.sent.remove(before);
}

/// The steals sent: victim, key, number; and nothing else.
fn steals(t: &mut T) -> Vec<(WorkerId, Key, u64)> {
    t.take()
        .into_iter()
        .map(|s| match s {
            Sent::W(w, ToWorker::Steal { key, id }) => (w, key, id),
            other => panic!("expected only steals, got {other:?}"),
        })
        .collect()
}

/// Messages other than the workers' list clients get when workers come and go.
fn take_but_workers(t: &mut T) -> Vec<Sent> {
    t.take()
        .into_iter()
        .filter(|s| !matches!(s, Sent::C(_, ToClient::Workers { .. })))
        .collect()
}

/// `r` on worker `a`, then `n` tasks needing it, all placed on `a` (the only worker).
fn fan_on_one(t: &mut T, c: ClientId, a: WorkerId, n: u32) -> Vec<String> {
    t.graph(c, vec![def("r", &[], 0)], &["r"]);
    assert_eq!(t.computes(), vec![(a, k("r"))]);
    t.finish(a, "r", 8, 10);
    let _ = t.take();
    let names: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
    let defs = names
        .iter()
        .enumerate()
        .map(|(i, f)| def(f, &["r"], i as u32 + 1))
        .collect();
    let wanted: Vec<&str> = names.iter().map(String::as_str).collect();
    t.graph(c, defs, &wanted);
    assert_eq!(t.computes().len(), n as usize);
    names
}

#[test]
fn retries_run_a_failing_task_again_then_it_errs() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    let mut x = def("x", &[], 0);
    x.retries = 1;
    t.graph(c, vec![x], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    erred(&mut t, a, "x");
    assert_eq!(t.computes(), vec![(a, k("x"))], "run again");
    erred(&mut t, a, "x");
    let sent = t.take();
    assert!(
        matches!(&sent[..], [Sent::C(_, ToClient::Erred { key, failure })] if *key == k("x") && failure.function == "boom"),
        "{sent:?}"
    );
    assert_eq!(t.core.stats().retried, 1);
}

#[test]
fn a_task_that_kills_allowed_failures_workers_errs_killed_worker() {
    let mut t = T::new();
    let c = t.client();
    let ws: Vec<WorkerId> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| t.worker(n, 1))
        .collect();
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    let mut on = t.computes()[0].0;
    for round in 0..3 {
        t.core.on_worker_removed(on, &mut t.rec);
        let sent = take_but_workers(&mut t);
        if round < 2 {
            let [Sent::W(next, ToWorker::Compute { key, .. })] = &sent[..] else {
                panic!("{sent:?}")
            };
            assert_eq!(*key, k("x"));
            on = *next;
        } else {
            let [Sent::C(_, ToClient::Erred { key, failure })] = &sent[..] else {
                panic!("{sent:?}")
            };
            assert_eq!((*key, failure.kind), (k("x"), FailureKind::KilledWorker));
            assert!(failure.message.contains("3 workers"), "{}", failure.message);
        }
    }
    assert!(t.core.workers().len() == 1 && ws.len() == 4);
    assert_eq!(t.core.stats().killed_worker, 1);
}

/// A worker runs its tasks by priority on its threads: only the first `nthreads` it held can
/// have killed it. The others are rescheduled without blame.
#[test]
fn only_tasks_that_may_have_been_running_are_blamed() {
    let mut t = T::with(Config {
        allowed_failures: 1,
        ..Config::default()
    });
    let c = t.client();
    let a = t.worker("a", 1);
    fan_on_one(&mut t, c, a, 3);
    let b = t.worker("b", 1);
    t.nothing();
    t.core.on_worker_removed(a, &mut t.rec);
    let sent = take_but_workers(&mut t);
    // r (held only on a) is lost: its client hears, it is recomputed on b; f0 (first by
    // priority) errs; f1 and f2 wait for r again.
    assert!(
        sent.contains(&Sent::C(c, ToClient::Lost { key: k("r") })),
        "{sent:?}"
    );
    assert_eq!(computes_of(&sent), vec![(b, k("r"))]);
    let failed: Vec<Key> = sent
        .iter()
        .filter_map(|s| match s {
            Sent::C(_, ToClient::Erred { key, failure }) => {
                assert_eq!(failure.kind, FailureKind::KilledWorker);
                Some(*key)
            }
            _ => None,
        })
        .collect();
    assert_eq!(failed, vec![k("f0")]);
    t.finish(b, "r", 8, 10);
    let mut got = computes_of(&t.take());
    got.sort();
    assert_eq!(got, vec![(b, k("f1")), (b, k("f2"))]);
}

fn computes_of(sent: &[Sent]) -> Vec<(WorkerId, Key)> {
    sent.iter()
        .filter_map(|s| match s {
            Sent::W(w, ToWorker::Compute { key, .. }) => Some((*w, *key)),
            _ => None,
        })
        .collect()
}

#[test]
fn an_idle_worker_steals_and_only_a_confirmed_steal_moves_a_task() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    fan_on_one(&mut t, c, a, 4);
    let b = t.worker("b", 1);
    t.nothing();
    t.core.on_tick(t.now, &mut t.rec);
    // b takes up to two tasks per thread: the two a would run last.
    let asked = steals(&mut t);
    assert_eq!(
        asked
            .iter()
            .map(|(w, key, _)| (*w, *key))
            .collect::<Vec<_>>(),
        vec![(a, k("f3")), (a, k("f2"))]
    );
    let (id3, id2) = (asked[0].2, asked[1].2);
    // Nothing more is asked while they are in flight (b's slots are promised).
    t.core.on_tick(t.now, &mut t.rec);
    t.nothing();
    // An answer with another steal's number is not this steal's.
    steal_response(&mut t, a, "f3", id2, true);
    t.nothing();
    steal_response(&mut t, a, "f3", id3, true);
    assert_eq!(t.computes(), vec![(b, k("f3"))]);
    // A refused steal (the task started) leaves it where it is, and it is not asked again.
    steal_response(&mut t, a, "f2", id2, false);
    t.nothing();
    assert_eq!((t.core.processing(a), t.core.processing(b)), (3, 1));
    t.finish(b, "f3", 8, 10);
    let _ = t.take();
    t.core.on_tick(t.now, &mut t.rec);
    let again = steals(&mut t);
    assert!(again.iter().all(|(_, key, _)| *key != k("f2")), "{again:?}");
    assert_eq!(t.core.stats().steals_done, 1);
}

#[test]
fn stealing_can_be_switched_off() {
    let mut t = T::with(Config {
        work_stealing: false,
        ..Config::default()
    });
    let c = t.client();
    let a = t.worker("a", 1);
    fan_on_one(&mut t, c, a, 4);
    let _b = t.worker("b", 1);
    t.core.on_tick(t.now, &mut t.rec);
    t.nothing();
}

#[test]
fn a_steal_answered_after_the_victim_died_is_ignored() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    fan_on_one(&mut t, c, a, 2);
    let b = t.worker("b", 1);
    t.core.on_tick(t.now, &mut t.rec);
    let [(_, key, id)] = steals(&mut t)[..] else {
        panic!()
    };
    assert_eq!(key, k("f1"));
    t.core.on_worker_removed(a, &mut t.rec);
    let sent = take_but_workers(&mut t);
    // r was only on a: recomputed on b, then f0 and f1 run there.
    assert_eq!(computes_of(&sent), vec![(b, k("r"))], "{sent:?}");
    let _ = sent;
    steal_response(&mut t, a, "f1", id, true); // from a worker that is gone: nothing
    t.nothing();
    t.finish(b, "r", 8, 10);
    let mut got = computes_of(&t.take());
    got.sort();
    assert_eq!(got, vec![(b, k("f0")), (b, k("f1"))]);
}

#[test]
fn a_task_given_back_after_its_thief_died_goes_elsewhere() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    fan_on_one(&mut t, c, a, 2);
    let b = t.worker("b", 1);
    t.core.on_tick(t.now, &mut t.rec);
    let [(_, key, id)] = steals(&mut t)[..] else {
        panic!()
    };
    assert_eq!(key, k("f1"));
    t.core.on_worker_removed(b, &mut t.rec);
    t.nothing_but_workers();
    steal_response(&mut t, a, "f1", id, true);
    assert_eq!(
        t.computes(),
        vec![(a, k("f1"))],
        "given back, and a is the only worker"
    );
}

#[test]
fn a_task_finishing_on_a_worker_already_removed_changes_nothing() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    let b = t.worker("b", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    let on = t.computes()[0].0;
    let other = if on == a { b } else { a };
    t.core.on_worker_removed(on, &mut t.rec);
    assert_eq!(
        computes_of(&take_but_workers(&mut t)),
        vec![(other, k("x"))]
    );
    t.finish(on, "x", 8, 10);
    t.nothing();
    assert_eq!(t.core.status(&k("x")), Some(Status::Processing));
    t.finish(other, "x", 8, 10);
    assert_eq!(t.take().len(), 1, "the client hears once");
}

#[test]
fn a_key_released_while_a_peer_fetches_it() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    t.finish(a, "x", 8, 10);
    let _ = t.take();
    let b = t.worker("b", 1);
    // y needs x; it goes to b, which fetches x from a.
    heartbeat(&mut t, a, true);
    t.graph(c, vec![def("y", &["x"], 1)], &["y"]);
    assert_eq!(t.computes(), vec![(b, k("y"))]);
    // The client lets go of both while b fetches.
    t.core.on_client_message(
        c,
        FromClient::Release {
            keys: vec![k("x"), k("y")],
        },
        &mut t.rec,
    );
    let mut sent = t.take();
    sent.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(
        sent,
        vec![
            Sent::W(a, ToWorker::Free { keys: vec![k("x")] }),
            Sent::W(b, ToWorker::Free { keys: vec![k("y")] }),
        ]
    );
    // b's fetch fails (a freed x): its report comes after the fact and changes nothing.
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
    t.nothing();
    assert_eq!(t.core.task_count(), 0);
}

#[test]
fn retiring_a_worker_copies_what_others_need_then_closes_it() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    t.finish(a, "x", 8, 10);
    let _ = t.take();
    let b = t.worker("b", 1);
    let retire = |t: &mut T, who: Vec<String>| {
        t.core.on_client_message(
            c,
            FromClient::Retire {
                id: 7,
                workers: who,
            },
            &mut t.rec,
        )
    };
    // Refused whole: an unknown address, or every worker.
    let (addr_a, addr_b) = (t.addr(a), t.addr(b));
    retire(&mut t, vec![addr_a.clone(), "tcp://nobody".into()]);
    let sent = t.take();
    assert!(
        matches!(&sent[..], [Sent::C(_, ToClient::Retired { id: 7, workers, refused: Some(r) })] if workers.is_empty() && r.contains("nobody")),
        "{sent:?}"
    );
    retire(&mut t, vec![addr_a.clone(), addr_b]);
    let sent = t.take();
    assert!(
        matches!(&sent[..], [Sent::C(_, ToClient::Retired { refused: Some(r), .. })] if r.contains("every worker")),
        "{sent:?}"
    );
    // Retiring a: x (wanted) is copied to b first.
    retire(&mut t, vec![addr_a]);
    let sent = t.take();
    let [Sent::W(to, ToWorker::Acquire { keys })] = &sent[..] else {
        panic!("{sent:?}")
    };
    assert_eq!(
        (*to, keys[0].key, keys[0].holders.clone()),
        (b, k("x"), vec![t.addr(a)])
    );
    // New work goes to b only, meanwhile.
    t.graph(c, vec![def("z", &[], 5)], &["z"]);
    assert_eq!(t.computes(), vec![(b, k("z"))]);
    t.core.on_worker_message(
        b,
        FromWorker::Acquired {
            keys: vec![(k("x"), 8)],
            failed: vec![],
        },
        t.now,
        &mut t.rec,
    );
    let sent = t.take();
    assert!(sent.contains(&Sent::W(a, ToWorker::Close)), "{sent:?}");
    assert!(sent.contains(&Sent::C(
        c,
        ToClient::Retired {
            id: 7,
            workers: vec![t.addr_of("a")],
            refused: None
        }
    )));
    assert_eq!(t.core.who_has(&k("x")), vec![b]);
    assert_eq!(t.core.workers(), vec![b]);
    assert_eq!(t.core.stats().recomputed, 0);
    // The connection closing afterwards changes nothing.
    t.core.on_worker_removed(a, &mut t.rec);
    t.nothing();
}

#[test]
fn a_paused_worker_gets_no_new_task_until_it_resumes() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    let b = t.worker("b", 1);
    heartbeat(&mut t, a, true);
    t.nothing();
    let defs = (0..3).map(|i| def(&format!("q{i}"), &[], i)).collect();
    t.graph(c, defs, &["q0", "q1", "q2"]);
    // b has 2 slots (saturation 1.1); a none while paused.
    assert_eq!(t.computes(), vec![(b, k("q0")), (b, k("q1"))]);
    heartbeat(&mut t, a, false);
    assert_eq!(t.computes(), vec![(a, k("q2"))]);
    let _ = (a, b);
}

#[test]
fn a_value_lost_from_a_spill_file_is_announced_and_recomputed() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    t.finish(a, "x", 8, 10);
    let _ = t.take();
    t.core.on_worker_message(
        a,
        FromWorker::LostKeys { keys: vec![k("x")] },
        t.now,
        &mut t.rec,
    );
    let sent = t.take();
    assert_eq!(
        sent,
        vec![
            Sent::C(c, ToClient::Lost { key: k("x") }),
            Sent::W(a, compute_of(&sent, 1)),
        ]
    );
    assert_eq!(t.core.stats().recomputed, 1);
    t.finish(a, "x", 8, 10);
    assert_eq!(t.take().len(), 1);
}

fn compute_of(sent: &[Sent], i: usize) -> ToWorker {
    match &sent[i] {
        Sent::W(_, m @ ToWorker::Compute { .. }) => m.clone(),
        other => panic!("not a compute: {other:?}"),
    }
}

impl T {
    fn nothing_but_workers(&mut self) {
        assert_eq!(take_but_workers(self), vec![]);
    }

    /// The address worker `name` had (test workers are `tcp://<name>`).
    fn addr_of(&self, name: &str) -> String {
        format!("tcp://{name}")
    }
}

#[test]
fn a_retirement_whose_copy_target_dies_copies_elsewhere() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    t.finish(a, "x", 8, 10);
    let _ = t.take();
    let b = t.worker("b", 1);
    let d = t.worker("d", 1);
    let addr_a = t.addr(a);
    t.core.on_client_message(
        c,
        FromClient::Retire {
            id: 1,
            workers: vec![addr_a],
        },
        &mut t.rec,
    );
    let sent = t.take();
    assert!(
        matches!(&sent[..], [Sent::W(to, ToWorker::Acquire { .. })] if *to == b),
        "{sent:?}"
    );
    // b dies before it has the copy: the copy is asked of d.
    t.core.on_worker_removed(b, &mut t.rec);
    let sent = take_but_workers(&mut t);
    assert!(
        matches!(&sent[..], [Sent::W(to, ToWorker::Acquire { keys })] if *to == d && keys[0].key == k("x")),
        "{sent:?}"
    );
    t.core.on_worker_message(
        d,
        FromWorker::Acquired {
            keys: vec![(k("x"), 8)],
            failed: vec![],
        },
        t.now,
        &mut t.rec,
    );
    let sent = take_but_workers(&mut t);
    assert!(sent.contains(&Sent::W(a, ToWorker::Close)), "{sent:?}");
    assert!(
        sent.iter().any(|s| matches!(
            s,
            Sent::C(
                _,
                ToClient::Retired {
                    id: 1,
                    refused: None,
                    ..
                }
            )
        )),
        "{sent:?}"
    );
    assert_eq!(t.core.who_has(&k("x")), vec![d]);
}

/// A copy a worker reports (asked for by a retirement) makes it a holder, freed with the key;
/// a copy of a key already released is freed at once.
#[test]
fn reported_copies_are_holders_and_are_freed_with_their_key() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    t.finish(a, "x", 8, 10);
    let _ = t.take();
    let b = t.worker("b", 1);
    let copied = |t: &mut T, key: &str| {
        t.core.on_worker_message(
            b,
            FromWorker::Acquired {
                keys: vec![(k(key), 8)],
                failed: vec![],
            },
            t.now,
            &mut t.rec,
        )
    };
    copied(&mut t, "x");
    t.nothing();
    assert_eq!(t.core.who_has(&k("x")), vec![a, b]);
    t.core
        .on_client_message(c, FromClient::Release { keys: vec![k("x")] }, &mut t.rec);
    assert_eq!(
        t.take(),
        vec![
            Sent::W(a, ToWorker::Free { keys: vec![k("x")] }),
            Sent::W(b, ToWorker::Free { keys: vec![k("x")] }),
        ]
    );
    copied(&mut t, "x");
    assert_eq!(
        t.take(),
        vec![Sent::W(b, ToWorker::Free { keys: vec![k("x")] })]
    );
}

/// A copy fetched before its holder died, reported while the key is being computed again on
/// the same worker: the scheduler must not answer `Free` (it would cancel that run, and the
/// task would stay processing forever: found by the chaos drill when every fetched copy was
/// reported).
#[test]
fn a_late_copy_does_not_cancel_the_recomputation_on_its_worker() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    t.finish(a, "x", 8, 10);
    let _ = t.take();
    let b = t.worker("b", 1);
    t.core.on_worker_removed(a, &mut t.rec);
    let sent = take_but_workers(&mut t);
    assert!(sent.contains(&Sent::C(c, ToClient::Lost { key: k("x") })));
    assert_eq!(computes_of(&sent), vec![(b, k("x"))]);
    // b had fetched x from a before a died; its report comes now.
    t.core.on_worker_message(
        b,
        FromWorker::Acquired {
            keys: vec![(k("x"), 8)],
            failed: vec![],
        },
        t.now,
        &mut t.rec,
    );
    t.nothing();
    t.finish(b, "x", 8, 10);
    assert_eq!(t.take().len(), 1, "the client hears x is back");
}

/// A key released while it ran and submitted again, to the same worker: the worker's news of
/// the first run (sent before it saw the `Free`) is not the second's.
#[test]
fn a_result_of_an_assignment_taken_back_is_not_the_current_ones() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    let first = t.attempt(a, "x");
    t.core
        .on_client_message(c, FromClient::Release { keys: vec![k("x")] }, &mut t.rec);
    assert_eq!(
        t.take(),
        vec![Sent::W(a, ToWorker::Free { keys: vec![k("x")] })]
    );
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    let second = t.attempt(a, "x");
    for stale in [first, 0, second + 1] {
        t.finish_as(a, "x", stale, 8, 10);
        t.nothing();
        assert_eq!(t.core.status(&k("x")), Some(Status::Processing));
    }
    // A failure or a missing input of the first run is as stale.
    t.core.on_worker_message(
        a,
        FromWorker::Erred {
            key: k("x"),
            failure: TaskFailure::new(k("x"), "boom", FailureKind::Error, "it failed"),
            attempt: first,
        },
        t.now,
        &mut t.rec,
    );
    t.nothing();
    t.core.on_worker_message(
        a,
        FromWorker::MissingDep {
            key: k("x"),
            dep: k("x"),
            tried: vec![t.addr(a)],
            attempt: first,
        },
        t.now,
        &mut t.rec,
    );
    t.nothing();
    assert_eq!(t.core.status(&k("x")), Some(Status::Processing));
    t.finish(a, "x", 8, 10);
    let sent = t.take();
    assert!(
        matches!(&sent[..], [Sent::C(_, ToClient::InMemory { key, .. })] if *key == k("x")),
        "{sent:?}"
    );
}

/// As above, with the second assignment on another worker, finished first: the first
/// worker's late news does not make it a holder (it dropped the value on the `Free`).
#[test]
fn a_late_result_from_a_worker_the_task_was_taken_from_is_no_copy() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(a, k("x"))]);
    let first = t.attempt(a, "x");
    t.core
        .on_client_message(c, FromClient::Release { keys: vec![k("x")] }, &mut t.rec);
    assert_eq!(
        t.take(),
        vec![Sent::W(a, ToWorker::Free { keys: vec![k("x")] })]
    );
    // a pauses; x, submitted again, goes to b.
    heartbeat(&mut t, a, true);
    let b = t.worker("b", 1);
    t.graph(c, vec![def("x", &[], 0)], &["x"]);
    assert_eq!(t.computes(), vec![(b, k("x"))]);
    t.finish(b, "x", 8, 10);
    assert_eq!(t.take().len(), 1, "the client hears");
    t.finish_as(a, "x", first, 8, 10);
    t.nothing();
    assert_eq!(t.core.who_has(&k("x")), vec![b]);
}
