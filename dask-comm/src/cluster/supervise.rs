//! Supervising worker processes: starting them (each with its slot, its GPU), replacing one
//! that died, giving up on one that cannot start; and the nanny of a `dask-comm worker`.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::worker_process::*;
use crate::error::{Error, Result};
use crate::worker::WorkerOptions;

/// How to start one more worker process.
#[derive(Debug, Clone)]
pub(super) struct Spawner {
    pub(super) exe: PathBuf,
    pub(super) args: Vec<std::ffi::OsString>,
    pub(super) env: Vec<(String, std::ffi::OsString)>,
    pub(super) local_dir: PathBuf,
    /// GPUs to pin workers to ([`ClusterOptions::gpus`]; empty: none).
    pub(super) gpus: Vec<usize>,
}

/// `CUDA_VISIBLE_DEVICES` for the worker in `slot`: `gpus` rotated to start at its
/// `slot % len`-th entry (its device 0), the others after it, as dask-cuda's does.
pub(crate) fn cuda_visible_devices(slot: usize, gpus: &[usize]) -> String {
    let n = gpus.len().max(1);
    (0..gpus.len())
        .map(|i| gpus[(slot + i) % n].to_string())
        .collect::<Vec<_>>()
        .join(",")
}

impl Spawner {
    /// Starts the worker process `name` in `slot` (its place among the workers: its GPU).
    pub(super) fn spawn(&self, name: &str, slot: usize) -> Result<Child> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.args).env(ENV_ROLE, "1").env(ENV_NAME, name);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if !self.gpus.is_empty() {
            let visible = cuda_visible_devices(slot, &self.gpus);
            tracing::debug!(%name, %visible, "pinning a worker to its GPU");
            cmd.env("CUDA_VISIBLE_DEVICES", visible);
        }
        cmd.spawn()
            .map_err(|e| Error::os("starting a worker process", e))
    }

    /// Removes what a dead worker process left in the local directory.
    pub(super) fn clean_after(&self, pid: u32) {
        let Ok(entries) = std::fs::read_dir(&self.local_dir) else {
            return;
        };
        let prefix = format!("dask-comm-spill-{pid}-");
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// Worker processes and their supervisor's books.
#[derive(Debug, Default)]
pub(super) struct Supervised {
    /// Each live process, with its name, start time and slot (its GPU).
    pub(super) children: Vec<(Child, String, Instant, usize)>,
    pub(super) stopping: bool,
    pub(super) restarts: u64,
    /// Worker processes that ended while supervised: process id and exit code (`None`: a
    /// signal), the latest [`EXITS_KEPT`].
    pub(super) exits: std::collections::VecDeque<(u32, Option<i32>)>,
    /// Deaths in a row within a second of starting (a worker that cannot start).
    pub(super) quick_deaths: u32,
    pub(super) next_name: usize,
}

/// Worker processes that exit with an error within a second of starting, this many times in
/// a row, stop the supervisor from restarting them (a worker that cannot start would
/// otherwise loop forever). Deaths by signal do not count.
pub(super) const QUICK_DEATHS: u32 = 5;

/// Whether a worker process that ended with `status` failed to start: it exited with an
/// error within a second. One killed by a signal, however young, is always replaced.
fn failed_at_start(status: &std::process::ExitStatus, started: Instant) -> bool {
    status.code().is_some_and(|c| c != 0) && started.elapsed() < Duration::from_secs(1)
}

/// Worker exits [`LocalCluster::worker_exits`] remembers.
pub(super) const EXITS_KEPT: usize = 1024;

/// Watches worker processes every 50 ms: one that died abnormally is replaced.
pub(super) fn supervise(sup: Arc<Mutex<Supervised>>, spawner: Spawner, restart: bool) {
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let mut s = sup.lock().unwrap_or_else(|e| e.into_inner());
        if s.stopping {
            return;
        }
        let mut i = 0;
        while i < s.children.len() {
            let status = match s.children[i].0.try_wait() {
                Ok(Some(status)) => status,
                _ => {
                    i += 1;
                    continue;
                }
            };
            let (child, name, started, slot) = s.children.remove(i);
            spawner.clean_after(child.id());
            if s.exits.len() == EXITS_KEPT {
                s.exits.pop_front();
            }
            s.exits.push_back((child.id(), status.code()));
            if status.success() {
                tracing::info!(%name, pid = child.id(), "a worker process exited");
                continue;
            }
            if status.code() == Some(crate::worker::EXIT_SCHEDULER_LOST) {
                tracing::error!(%name, pid = child.id(), "a worker process lost the scheduler: not restarting it");
                continue;
            }
            let quick = failed_at_start(&status, started);
            s.quick_deaths = if quick { s.quick_deaths + 1 } else { 0 };
            if !restart || s.quick_deaths >= QUICK_DEATHS {
                tracing::error!(%name, %status, "a worker process died; not restarting it");
                continue;
            }
            tracing::warn!(%name, pid = child.id(), %status, "a worker process died: restarting it");
            s.next_name += 1;
            let fresh = format!("local-{}", s.next_name - 1);
            match spawner.spawn(&fresh, slot) {
                Ok(c) => {
                    s.restarts += 1;
                    s.children.push((c, fresh, Instant::now(), slot));
                }
                Err(e) => tracing::error!(error = %e, "restarting a worker process failed"),
            }
        }
    }
}

/// Runs worker `opts` as a child process of this one, and starts it again when it dies
/// (not when it exits cleanly: told to close, or retired). The child dies with this process.
/// Returns when the child exited cleanly, or gave up after [`QUICK_DEATHS`] quick deaths.
pub(crate) fn nanny(opts: &WorkerOptions) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::os("finding this program", e))?;
    let mut env: Vec<(String, std::ffi::OsString)> = vec![
        (ENV_SCHEDULER.into(), opts.scheduler.to_string().into()),
        (ENV_SECRET.into(), opts.secret.to_hex().into()),
        (ENV_THREADS.into(), opts.nthreads.to_string().into()),
        (
            ENV_MEMORY.into(),
            opts.memory_limit.unwrap_or(0).to_string().into(),
        ),
        (ENV_PARENT.into(), std::process::id().to_string().into()),
    ];
    if let Some(d) = &opts.local_directory {
        env.push((ENV_LOCAL_DIR.into(), d.clone().into()));
    }
    if let Some(l) = &opts.listen {
        env.push((ENV_LISTEN.into(), l.to_string().into()));
    }
    if opts.zero_work {
        env.push((ENV_ZERO.into(), "1".into()));
    }
    if let Some(d) = opts.device_memory_limit {
        env.push((ENV_DEVICE_MEMORY.into(), d.to_string().into()));
    }
    let spawner = Spawner {
        exe,
        args: Vec::new(),
        env,
        local_dir: opts
            .local_directory
            .clone()
            .unwrap_or_else(std::env::temp_dir),
        gpus: Vec::new(),
    };
    let mut quick = 0;
    loop {
        let started = Instant::now();
        let mut child = spawner.spawn(&opts.name, 0)?;
        let status = child
            .wait()
            .map_err(|e| Error::os("waiting for the worker process", e))?;
        spawner.clean_after(child.id());
        if status.success() {
            return Ok(());
        }
        if status.code() == Some(crate::worker::EXIT_SCHEDULER_LOST) {
            return Err(Error::Disconnected(
                "the worker process lost the scheduler".into(),
            ));
        }
        quick = if failed_at_start(&status, started) {
            quick + 1
        } else {
            0
        };
        if quick >= QUICK_DEATHS {
            return Err(Error::Config(format!(
                "the worker process died {quick} times within a second of starting ({status})"
            )));
        }
        tracing::warn!(name = %opts.name, %status, "the worker process died: restarting it");
    }
}
