//! Prometheus' text format (version 0.0.4) of a [`Snapshot`].

use std::fmt::Write;

use super::Snapshot;

/// A label value with `\`, `"` and newlines escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The snapshot as Prometheus metrics: tasks by state and by group, the workers' memory,
/// spilled bytes and CPU, tasks finished and their compute time, fetches between workers
/// with their bytes and time, and the scheduler's time per task.
///
/// ```
/// use dask_comm::dashboard::{metrics_text, Snapshot, Totals};
/// let s = Snapshot { now: 1.0, window: 10.0, workers: vec![], groups: vec![], bars: vec![],
///     states: vec![("memory".into(), 3)], totals: Totals::default() };
/// let text = metrics_text(&s);
/// assert!(text.contains("dask_comm_tasks{state=\"memory\"} 3\n"));
/// ```
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in rows {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {value}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        }
    };
    let one = |v: String| vec![(String::new(), v)];
    family(
        "dask_comm_tasks",
        "gauge",
        "Tasks the scheduler knows, by state.",
        s.states
            .iter()
            .map(|(st, n)| (format!("state=\"{}\"", label(st)), n.to_string()))
            .collect(),
    );
    let mut by_group = Vec::new();
    for g in &s.groups {
        for (state, n) in [
            ("memory", g.memory),
            ("processing", g.processing),
            ("erred", g.erred),
            ("waiting", g.waiting),
        ] {
            by_group.push((
                format!("group=\"{}\",state=\"{state}\"", label(&g.name)),
                n.to_string(),
            ));
        }
    }
    family(
        "dask_comm_group_tasks",
        "gauge",
        "Tasks by group (key name without tokens) and state.",
        by_group,
    );
    family(
        "dask_comm_workers",
        "gauge",
        "Workers connected.",
        one(s.workers.len().to_string()),
    );
    let per_worker = |f: &dyn Fn(&super::WorkerRow) -> String| {
        s.workers
            .iter()
            .map(|w| (format!("worker=\"{}\"", label(&w.name)), f(w)))
            .collect::<Vec<_>>()
    };
    family(
        "dask_comm_worker_memory_bytes",
        "gauge",
        "Bytes of values a worker holds in memory.",
        per_worker(&|w| w.stored.to_string()),
    );
    family(
        "dask_comm_worker_spilled_bytes",
        "gauge",
        "Bytes of values a worker spilled to disk.",
        per_worker(&|w| w.spilled.to_string()),
    );
    family(
        "dask_comm_worker_rss_bytes",
        "gauge",
        "A worker process's resident memory.",
        per_worker(&|w| w.rss.to_string()),
    );
    family(
        "dask_comm_worker_cpu",
        "gauge",
        "Cores a worker process kept busy over its last heartbeat's interval.",
        per_worker(&|w| format!("{:.3}", w.cpu)),
    );
    family(
        "dask_comm_worker_processing",
        "gauge",
        "Tasks sent to a worker and not finished.",
        per_worker(&|w| w.processing.to_string()),
    );
    let t = &s.totals;
    family(
        "dask_comm_tasks_finished_total",
        "counter",
        "Tasks finished.",
        one(t.tasks_finished.to_string()),
    );
    family(
        "dask_comm_task_compute_seconds_total",
        "counter",
        "Seconds the finished tasks ran.",
        one(format!("{:.6}", t.compute_seconds)),
    );
    family(
        "dask_comm_transfers_total",
        "counter",
        "Fetches of values between workers.",
        one(t.fetches.to_string()),
    );
    family(
        "dask_comm_transfer_bytes_total",
        "counter",
        "Bytes fetched between workers.",
        one(t.fetch_bytes.to_string()),
    );
    family(
        "dask_comm_transfer_seconds_total",
        "counter",
        "Seconds the fetches between workers took.",
        one(format!("{:.6}", t.fetch_seconds)),
    );
    family(
        "dask_comm_scheduler_busy_seconds_total",
        "counter",
        "Seconds the scheduler's loop spent handling messages.",
        one(format!("{:.6}", t.scheduler_busy_seconds)),
    );
    family(
        "dask_comm_scheduler_seconds_per_task",
        "gauge",
        "The scheduler's busy time per finished task (its per-task overhead).",
        one(format!("{:.9}", s.overhead_per_task().unwrap_or(0.0))),
    );
    out
}
