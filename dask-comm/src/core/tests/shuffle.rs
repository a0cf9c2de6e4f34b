//! Peer-to-peer shuffles in the core: runs and owners, pinned unpack tasks, pieces dropped
//! when no output is pending, restarts when an owner is lost or data goes missing, and the
//! bound on restarts.

use dask_graph::{ShuffleId, ShuffleRole};

use super::*;
use crate::protocol::ShuffleRun;

fn sid() -> ShuffleId {
    ShuffleId::new("core-test-shuffle")
}

/// A shuffle of `inputs` transfer tasks (roots: their inputs fused in), a barrier and
/// `outputs` unpack tasks `out-j`, all wanted.
fn shuffle_graph(inputs: u32, outputs: u32) -> (Vec<TaskDef>, Vec<String>) {
    let id = sid();
    let mut defs = Vec::new();
    let tr: Vec<String> = (0..inputs).map(|i| format!("tr-{i}")).collect();
    for (i, name) in tr.iter().enumerate() {
        let mut d = def(name, &[], i as u32);
        d.shuffle = Some(ShuffleRole::Transfer {
            id,
            input: i as u32,
        });
        defs.push(d);
    }
    let deps: Vec<&str> = tr.iter().map(String::as_str).collect();
    let mut b = def("bar", &deps, inputs);
    b.shuffle = Some(ShuffleRole::Barrier { id });
    defs.push(b);
    let outs: Vec<String> = (0..outputs).map(|j| format!("out-{j}")).collect();
    for (j, name) in outs.iter().enumerate() {
        let mut d = def(name, &["bar"], inputs + 1 + j as u32);
        d.shuffle = Some(ShuffleRole::Unpack { id, part: j as u32 });
        defs.push(d);
    }
    (defs, outs)
}

/// A compute sent: where, what, and the shuffle's run.
type Placed = (WorkerId, Key, Option<ShuffleRun>);

/// Computes sent, with their shuffle runs; other messages are returned apart.
fn split(sent: Vec<Sent>) -> (Vec<Placed>, Vec<Sent>) {
    let mut computes = Vec::new();
    let mut rest = Vec::new();
    for s in sent {
        match s {
            Sent::W(w, ToWorker::Compute { key, shuffle, .. }) => computes.push((w, key, shuffle)),
            other => rest.push(other),
        }
    }
    (computes, rest)
}

fn err_shuffle(t: &mut T, w: WorkerId, key: &str) {
    t.core.on_worker_message(
        w,
        FromWorker::Erred {
            key: k(key),
            failure: TaskFailure::new(k(key), "unpack", FailureKind::Shuffle, "a piece is missing"),
            attempt: t.attempt(w, key),
        },
        t.now,
        &mut t.rec,
    );
}

fn want_outs(outs: &[String]) -> Vec<&str> {
    outs.iter().map(String::as_str).collect()
}

#[test]
fn unpack_tasks_run_on_their_owners_and_pieces_go_when_no_output_is_pending() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 2);
    let b = t.worker("b", 2);
    let (defs, outs) = shuffle_graph(4, 4);
    t.graph(c, defs, &want_outs(&outs));
    let (computes, rest) = split(t.take());
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(computes.len(), 4, "every transfer placed: {computes:?}");
    for (_, key, run) in &computes {
        let run = run.as_ref().expect("transfers carry the run");
        assert_eq!(run.id, sid(), "{key}");
        assert_eq!(run.run, 1);
        assert_eq!(
            run.owners,
            vec!["tcp://a".to_string(), "tcp://b".to_string()]
        );
    }
    for (w, key, _) in computes {
        t.finish(w, &key.to_string(), 0, 1000);
    }
    let (computes, _) = split(t.take());
    let [(bw, bar, None)] = &computes[..] else {
        panic!("the barrier, without a run: {computes:?}")
    };
    assert_eq!(*bar, k("bar"));
    t.finish(*bw, "bar", 0, 10);
    let (mut computes, rest) = split(t.take());
    assert!(
        rest.iter()
            .all(|s| matches!(s, Sent::W(_, ToWorker::Free { .. }))),
        "transfers freed: {rest:?}"
    );
    computes.sort_by_key(|c| c.1);
    let placed: Vec<(WorkerId, Key)> = computes.iter().map(|(w, key, _)| (*w, *key)).collect();
    assert_eq!(
        placed,
        vec![
            (a, k("out-0")),
            (b, k("out-1")),
            (a, k("out-2")),
            (b, k("out-3"))
        ],
        "output j on owner j % 2"
    );
    assert!(computes
        .iter()
        .all(|c| c.2.as_ref().is_some_and(|r| r.run == 1)));
    // Stealing never moves an unpack task: b is idle, a has two outputs.
    for (w, key) in [(b, "out-1"), (b, "out-3")] {
        t.finish(w, key, 8, 1000);
    }
    t.take();
    t.core.on_tick(t.now, &mut t.rec);
    t.nothing();
    t.finish(a, "out-0", 8, 1000);
    let rest = t.take();
    assert!(
        !rest
            .iter()
            .any(|s| matches!(s, Sent::W(_, ToWorker::ShuffleDone { .. }))),
        "an output is still pending: {rest:?}"
    );
    t.finish(a, "out-2", 8, 1000);
    let sent = t.take();
    let done: Vec<&Sent> = sent
        .iter()
        .filter(|s| matches!(s, Sent::W(_, ToWorker::ShuffleDone { .. })))
        .collect();
    assert_eq!(
        done,
        vec![
            &Sent::W(a, ToWorker::ShuffleDone { id: sid(), run: 1 }),
            &Sent::W(b, ToWorker::ShuffleDone { id: sid(), run: 1 }),
        ]
    );
    // Releasing the outputs forgets the shuffle.
    let keys = outs.iter().map(|o| k(o)).collect();
    t.core
        .on_client_message(c, FromClient::Release { keys }, &mut t.rec);
    let sent = t.take();
    assert!(
        sent.iter()
            .all(|s| matches!(s, Sent::W(_, ToWorker::Free { .. }))),
        "{sent:?}"
    );
    assert_eq!(t.core.task_count(), 0);
    assert!(t.core.shuffle_summaries().is_empty());
    // The same shuffle submitted again runs under a number its workers never dropped.
    let (defs, outs) = shuffle_graph(2, 4);
    t.graph(c, defs, &want_outs(&outs));
    let (computes, _) = split(t.take());
    assert!(
        computes
            .iter()
            .all(|c| c.2.as_ref().is_some_and(|r| r.run == 2)),
        "{computes:?}"
    );
}

#[test]
fn losing_an_owner_restarts_the_shuffle_and_keeps_the_finished_outputs() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 2);
    let b = t.worker("b", 2);
    let (defs, outs) = shuffle_graph(2, 4);
    t.graph(c, defs, &want_outs(&outs));
    let (computes, _) = split(t.take());
    for (w, key, _) in computes {
        t.finish(w, &key.to_string(), 0, 1000);
    }
    let (computes, _) = split(t.take());
    // The barrier finishes on a (a copy on b too would not change what follows).
    let bw = computes[0].0;
    t.finish(bw, "bar", 0, 10);
    let (computes, _) = split(t.take());
    assert_eq!(computes.len(), 4);
    t.finish(a, "out-0", 8, 10);
    t.finish(a, "out-2", 8, 10);
    t.take();
    // b dies running out-1 and out-3.
    t.core.on_worker_removed(b, &mut t.rec);
    let sent = t.take();
    let (computes, rest) = split(sent);
    assert!(
        rest.contains(&Sent::W(a, ToWorker::ShuffleDone { id: sid(), run: 1 })),
        "the first run's pieces dropped: {rest:?}"
    );
    // The transfers run again (last word per key), in run 1, owned by a alone.
    let mut last: std::collections::BTreeMap<Key, (WorkerId, Option<ShuffleRun>)> =
        Default::default();
    for (w, key, run) in computes {
        last.insert(key, (w, run));
    }
    let keys: Vec<Key> = last.keys().copied().collect();
    assert!(
        keys.contains(&k("tr-0")) && keys.contains(&k("tr-1")),
        "{keys:?}"
    );
    for key in [k("tr-0"), k("tr-1")] {
        let (w, run) = &last[&key];
        assert_eq!(*w, a);
        let run = run.as_ref().unwrap();
        assert_eq!(
            (run.run, run.owners.clone()),
            (2, vec!["tcp://a".to_string()])
        );
    }
    assert_eq!(t.core.status(&k("out-0")), Some(Status::Memory), "kept");
    assert_eq!(t.core.status(&k("out-1")), Some(Status::Waiting));
    assert_eq!(t.core.stats().shuffle_restarts, 1);
    t.finish(a, "tr-0", 0, 10);
    t.finish(a, "tr-1", 0, 10);
    let (computes, _) = split(t.take());
    assert_eq!(
        computes.iter().map(|c| c.1).collect::<Vec<_>>(),
        vec![k("bar")]
    );
    t.finish(a, "bar", 0, 10);
    let (mut computes, _) = split(t.take());
    computes.sort_by_key(|c| c.1);
    assert_eq!(
        computes.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(),
        vec![(a, k("out-1")), (a, k("out-3"))]
    );
    t.finish(a, "out-1", 8, 10);
    t.finish(a, "out-3", 8, 10);
    let sent = t.take();
    assert!(
        sent.contains(&Sent::W(a, ToWorker::ShuffleDone { id: sid(), run: 2 })),
        "{sent:?}"
    );
}

#[test]
fn missing_shuffle_data_restarts_a_bounded_number_of_times_then_fails() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    let (defs, outs) = shuffle_graph(1, 1);
    t.graph(c, defs, &want_outs(&outs));
    for attempt in 0..=SHUFFLE_RESTARTS {
        let (computes, _) = split(t.take());
        assert_eq!(computes.len(), 1, "attempt {attempt}: {computes:?}");
        assert_eq!(computes[0].2.as_ref().unwrap().run, attempt + 1);
        t.finish(a, "tr-0", 0, 10);
        let (computes, _) = split(t.take());
        assert_eq!(computes[0].1, k("bar"));
        t.finish(a, "bar", 0, 10);
        let (computes, _) = split(t.take());
        assert_eq!(computes[0].1, k("out-0"));
        err_shuffle(&mut t, a, "out-0");
    }
    let sent = t.take();
    let failed = sent.iter().find_map(|s| match s {
        Sent::C(x, ToClient::Erred { key, failure }) if *x == c => Some((*key, failure.clone())),
        _ => None,
    });
    let (key, failure) = failed.expect("the output fails");
    assert_eq!(key, k("out-0"));
    assert_eq!(failure.kind, FailureKind::Shuffle);
    assert!(failure.message.contains("restarted"), "{}", failure.message);
    assert_eq!(t.core.stats().shuffle_restarts, SHUFFLE_RESTARTS as u64);
}

#[test]
fn a_transfer_that_cannot_reach_a_peer_restarts_the_shuffle_not_the_computation() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 1);
    let (defs, outs) = shuffle_graph(1, 2);
    t.graph(c, defs, &want_outs(&outs));
    let (computes, _) = split(t.take());
    assert_eq!(computes[0].1, k("tr-0"));
    err_shuffle(&mut t, a, "tr-0");
    let (computes, rest) = split(t.take());
    assert_eq!(
        rest,
        vec![Sent::W(a, ToWorker::ShuffleDone { id: sid(), run: 1 })]
    );
    assert_eq!(computes.len(), 1);
    assert_eq!(
        (computes[0].1, computes[0].2.as_ref().unwrap().run),
        (k("tr-0"), 2)
    );
    // An ordinary error still fails at once.
    t.core.on_worker_message(
        a,
        FromWorker::Erred {
            key: k("tr-0"),
            failure: TaskFailure::new(k("tr-0"), "split", FailureKind::Error, "bad column"),
            attempt: t.attempt(a, "tr-0"),
        },
        t.now,
        &mut t.rec,
    );
    let sent = t.take();
    let erred = sent
        .iter()
        .filter(|s| matches!(s, Sent::C(_, ToClient::Erred { .. })))
        .count();
    assert_eq!(erred, 2, "both outputs fail: {sent:?}");
}

#[test]
fn workers_lost_together_restart_the_shuffle_once_without_them() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 2);
    let _b = t.worker("b", 2);
    let _c = t.worker("c", 2);
    let (defs, outs) = shuffle_graph(3, 3);
    t.graph(c, defs, &want_outs(&outs));
    let (computes, _) = split(t.take());
    assert_eq!(computes.len(), 3);
    assert_eq!(computes[0].2.as_ref().unwrap().owners.len(), 3);
    // b and c fall silent; a keeps beating.
    t.now += Duration::from_secs(61);
    super::resilience::heartbeat(&mut t, a, false);
    t.core.on_tick(t.now, &mut t.rec);
    let (computes, _) = split(t.take());
    let mut last: std::collections::BTreeMap<Key, (WorkerId, Option<ShuffleRun>)> =
        Default::default();
    for (w, key, run) in computes {
        last.insert(key, (w, run));
    }
    for i in 0..3 {
        let (w, run) = &last[&k(&format!("tr-{i}"))];
        let run = run.as_ref().unwrap();
        assert_eq!(*w, a);
        assert_eq!(
            (run.run, run.owners.clone()),
            (2, vec!["tcp://a".to_string()]),
            "one new run, owned by the worker left"
        );
    }
    assert_eq!(t.core.stats().shuffle_restarts, 1);
    assert_eq!(
        t.core.shuffle_summaries()[0].3,
        0,
        "losses are not failures"
    );
}

/// The CI hang: a transfer finished on `a` just as its shuffle restarted. The scheduler's
/// `Free` of it and `a`'s `Finished` crossed on the wire, and the transfer was sent to `a`
/// again. The late `Finished` named the first assignment: counted, it would have made `a` a
/// holder of a value `a` then dropped (the `Free`), and the barrier on `a` would have asked
/// for it forever.
#[test]
fn news_of_a_transfer_taken_back_by_a_restart_is_ignored() {
    let mut t = T::new();
    let c = t.client();
    let a = t.worker("a", 2);
    let b = t.worker("b", 2);
    let (defs, outs) = shuffle_graph(2, 2);
    t.graph(c, defs, &want_outs(&outs));
    let (computes, _) = split(t.take());
    let on_a: Vec<Key> = computes.iter().filter(|c| c.0 == a).map(|c| c.1).collect();
    assert!(!on_a.is_empty(), "a transfer on a: {computes:?}");
    let first = t.attempt(a, &on_a[0].to_string());
    // b (an owner) dies; a finished its transfer meanwhile, unbeknown to the scheduler.
    t.core.on_worker_removed(b, &mut t.rec);
    let (computes, rest) = split(t.take());
    assert!(
        rest.contains(&Sent::W(
            a,
            ToWorker::Free {
                keys: vec![on_a[0]]
            }
        )),
        "the restart frees the transfer on a: {rest:?}"
    );
    assert!(computes.iter().any(|c| c.0 == a && c.1 == on_a[0]));
    let second = t.attempt(a, &on_a[0].to_string());
    assert!(second > first, "a new assignment: {first} then {second}");
    // The first assignment's news: stale.
    t.finish_as(a, &on_a[0].to_string(), first, 0, 10);
    t.nothing();
    assert_eq!(t.core.status(&on_a[0]), Some(Status::Processing));
    // The second assignment's counts; the barrier waits for every transfer of this run.
    for (w, key, _) in &computes {
        if *key != on_a[0] {
            t.finish(*w, &key.to_string(), 0, 10);
        }
    }
    let (computes, _) = split(t.take());
    assert!(computes.iter().all(|c| c.1 != k("bar")), "{computes:?}");
    t.finish(a, &on_a[0].to_string(), 0, 10);
    let (computes, _) = split(t.take());
    assert_eq!(
        computes.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(),
        vec![(a, k("bar"))]
    );
}
