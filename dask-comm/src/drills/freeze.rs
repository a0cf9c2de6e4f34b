//! Freeze drills: processes alive but silent (`SIGSTOP`), the failure that hangs real clusters
//! where a killed process (its sockets closed by the kernel) is loud.
//!
//! - [`freeze_worker`]: a worker stopped mid-computation is removed after the heartbeat
//!   timeout, the answer arrives (recomputed), and when the worker thaws it learns it was
//!   removed, exits with [`EXIT_REMOVED`](crate::EXIT_REMOVED) and is started afresh.
//! - [`freeze_scheduler`]: a scheduler process stopped mid-computation; its worker processes
//!   and a client notice within the scheduler timeout, the workers exit, the client's call
//!   fails, and nothing is left running.
//!
//! Each reports its detection times; the callers assert the answers and bounds that leave room
//! for a loaded machine.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dask_graph::Key;
use rand::{Rng, SeedableRng};

use super::{chaos_graph, compute_within, gather_within, int, registered_pids};
use crate::client::{Client, ClientOptions};
use crate::cluster::{ClusterOptions, LocalCluster, Protocol};
use crate::core::Config;
use crate::error::{Error, Result};

/// Durations, summarised as a drill reports them.
#[derive(Debug, Clone, Default)]
pub struct Times(pub Vec<Duration>);

impl Times {
    /// The `q` quantile (0.5: median; nearest rank).
    pub fn quantile(&self, q: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort_unstable();
        if v.is_empty() {
            return Duration::ZERO;
        }
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    }

    /// The longest.
    pub fn max(&self) -> Duration {
        self.0.iter().copied().max().unwrap_or_default()
    }
}

impl std::fmt::Display for Times {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:.2} s, p99 {:.2} s, max {:.2} s ({} trials)",
            self.quantile(0.5).as_secs_f64(),
            self.quantile(0.99).as_secs_f64(),
            self.max().as_secs_f64(),
            self.0.len()
        )
    }
}

/// What [`freeze_worker`] saw.
#[derive(Debug, Clone)]
pub struct FreezeWorkerReport {
    /// Trials run; each answer was `Inline`'s.
    pub trials: usize,
    /// Freezes that landed while the trial's graph was still running.
    pub mid_run: usize,
    /// From the stop to the scheduler's removal of the worker.
    pub detected: Times,
    /// From the stop to the answer.
    pub answered: Times,
    /// From the thaw to the thawed process's exit (it read that it was removed).
    pub exited: Times,
    /// Workers the supervisor started again (one per trial: the thawed ones).
    pub restarts: u64,
    /// The heartbeat timeout the scheduler ran with.
    pub heartbeat_timeout: Duration,
}

/// `trials` trials on 3 worker processes over `protocol`, the scheduler's heartbeat timeout
/// `heartbeat_timeout`: each persists the chaos graph (`leaves` leaves), stops a random
/// worker with `SIGSTOP` at a random moment within an undisturbed run's length, gathers the
/// answer (checked against `Inline`'s) within `limit`, then continues the worker with `SIGCONT`
/// and waits for it to exit and be replaced.
pub fn freeze_worker(
    protocol: Protocol,
    trials: usize,
    leaves: u32,
    heartbeat_timeout: Duration,
    seed: u64,
    limit: Duration,
) -> Result<FreezeWorkerReport> {
    let (g, _) = chaos_graph("sync", leaves, 8);
    let answer = int(&dask_graph::Scheduler::get(
        &dask_graph::Inline,
        g,
        &[Key::name_only("total-sync")],
    )?[0])?;
    let cluster = LocalCluster::with(ClusterOptions {
        workers: 3,
        threads_per_worker: 1,
        protocol,
        scheduler: Config {
            heartbeat_timeout,
            ..Config::default()
        },
        ..Default::default()
    })?;
    let client = cluster.client()?;
    let t0 = Instant::now();
    let (g, key) = chaos_graph("warm", leaves, 8);
    let got = compute_within(&client, g, key, limit)?;
    let window = t0.elapsed().as_micros().max(1000) as u64;
    if got != answer {
        return Err(Error::Unexpected(format!(
            "undisturbed: {got}, Inline says {answer}"
        )));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut r = FreezeWorkerReport {
        trials: 0,
        mid_run: 0,
        detected: Times::default(),
        answered: Times::default(),
        exited: Times::default(),
        restarts: 0,
        heartbeat_timeout,
    };
    let mut frozen: Vec<u32> = Vec::new();
    for trial in 0..trials {
        let running = cluster.worker_pids();
        frozen.retain(|p| running.contains(p));
        let pids = registered_pids(&cluster, &client, 3, &frozen, Duration::from_secs(30))?;
        let lost_before = cluster.scheduler_stats()?.0.workers_lost;
        let restarts_before = cluster.restarts();
        let (graph, key) = chaos_graph(&format!("f{trial}"), leaves, 8);
        let fs = client.blocking().persist(graph, &[key])?;
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..window)));
        r.mid_run += !fs[0].done() as usize;
        let victim = pids[rng.gen_range(0..pids.len())];
        signal(victim, libc::SIGSTOP)?;
        frozen.push(victim);
        let stopped = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let c = client.clone();
            std::thread::spawn(move || {
                let got = gather_within(&c, fs, limit);
                let _ = tx.send((got, stopped.elapsed()));
            });
        }
        // The removal: the scheduler counts the worker lost.
        let detected = wait_for(limit, || {
            Ok(cluster.scheduler_stats()?.0.workers_lost > lost_before)
        })
        .map_err(|e| {
            let _ = signal(victim, libc::SIGCONT);
            Error::Unexpected(format!(
                "trial {trial}: the frozen worker was not removed: {e}"
            ))
        })?;
        r.detected.0.push(detected.duration_since(stopped));
        let (got, took) = rx
            .recv_timeout(limit + Duration::from_secs(5))
            .map_err(|_| Error::Timeout(format!("trial {trial}: no answer")))?;
        let got = got.map_err(|e| {
            let _ = signal(victim, libc::SIGCONT);
            Error::Unexpected(format!(
                "trial {trial}: {e}\npending:\n{}",
                cluster.describe_pending().unwrap_or_default().join("\n")
            ))
        })?;
        if got != answer {
            return Err(Error::Unexpected(format!(
                "trial {trial}: {got}, Inline says {answer}"
            )));
        }
        r.answered.0.push(took);
        // The thaw: it reads that it was removed, exits, and the supervisor replaces it.
        signal(victim, libc::SIGCONT)?;
        let thawed = Instant::now();
        let exited = wait_for(Duration::from_secs(30), || {
            Ok(!cluster.worker_pids().contains(&victim))
        })
        .map_err(|e| Error::Unexpected(format!("trial {trial}: the thawed worker stayed: {e}")))?;
        r.exited.0.push(exited.duration_since(thawed));
        let code = wait_for(Duration::from_secs(30), || {
            Ok(cluster.worker_exits().iter().any(|&(p, _)| p == victim))
        })
        .ok()
        .and_then(|_| {
            cluster
                .worker_exits()
                .iter()
                .find(|&&(p, _)| p == victim)
                .map(|&(_, c)| c)
        })
        .flatten();
        if code != Some(crate::worker::EXIT_REMOVED) {
            return Err(Error::Unexpected(format!(
                "trial {trial}: the thawed worker exited with {code:?}, not EXIT_REMOVED"
            )));
        }
        wait_for(Duration::from_secs(30), || {
            Ok(cluster.restarts() > restarts_before)
        })
        .map_err(|e| Error::Unexpected(format!("trial {trial}: the thawed worker was not restarted (it did not exit with EXIT_REMOVED?): {e}")))?;
        r.trials += 1;
    }
    r.restarts = cluster.restarts();
    Ok(r)
}

/// What [`freeze_scheduler`] saw.
#[derive(Debug, Clone)]
pub struct FreezeSchedulerReport {
    /// Trials run.
    pub trials: usize,
    /// From the stop to each worker process's exit.
    pub workers_exited: Times,
    /// From the stop to the client's gather failing.
    pub client_failed: Times,
    /// The exit codes the workers ended with (each is [`EXIT_SCHEDULER_LOST`](crate::EXIT_SCHEDULER_LOST)).
    pub exit_codes: Vec<i32>,
    /// The scheduler timeout the workers and the client ran with.
    pub scheduler_timeout: Duration,
}

/// `trials` trials, each a scheduler process and 2 worker processes (`--no-nanny`) of this
/// program's command line over `protocol` (this program re-executed: its `main` must call
/// [`run_cli_if_asked`] after [`register`](super::register)), and a client here, all with the scheduler timeout
/// `scheduler_timeout`: a graph of slow tasks is submitted, the scheduler stopped with
/// `SIGSTOP`; the workers must exit (with [`EXIT_SCHEDULER_LOST`](crate::EXIT_SCHEDULER_LOST))
/// and the client's gather fail, each within `limit`. The scheduler is then killed.
pub fn freeze_scheduler(
    protocol: Protocol,
    trials: usize,
    scheduler_timeout: Duration,
    limit: Duration,
) -> Result<FreezeSchedulerReport> {
    let scheme = match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Ucx => "ucx",
        other => return Err(Error::Config(format!("freeze_scheduler over {other:?}"))),
    };
    let mut r = FreezeSchedulerReport {
        trials: 0,
        workers_exited: Times::default(),
        client_failed: Times::default(),
        exit_codes: Vec::new(),
        scheduler_timeout,
    };
    let dir = std::env::temp_dir().join(format!(
        "dask-comm-freeze-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| Error::os("creating the drill's folder", e))?;
    let bin = std::env::current_exe().map_err(|e| Error::os("finding this program", e))?;
    let result = (|| {
        for trial in 0..trials {
            let file = dir.join(format!("scheduler-{trial}.json"));
            let timeout = scheduler_timeout.as_secs_f64().to_string();
            let spawn = |args: &[&str]| -> Result<Reaped> {
                Command::new(&bin)
                    .args(args)
                    .env(ENV_CLI, "1")
                    .env("DASK_COMM_SCHEDULER_TIMEOUT", &timeout)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
                    .map(Reaped)
                    .map_err(|e| Error::os(format!("starting {}", bin.display()), e))
            };
            let file_arg = file.to_string_lossy().into_owned();
            let listen = format!("{scheme}://127.0.0.1:0");
            let mut scheduler = spawn(&[
                "scheduler",
                "--listen",
                &listen,
                "--scheduler-file",
                &file_arg,
                "--no-dashboard",
            ])?;
            wait_for(Duration::from_secs(30), || Ok(file.exists()))?;
            let mut workers = (0..2)
                .map(|i| {
                    spawn(&[
                        "worker",
                        "--scheduler-file",
                        &file_arg,
                        "--nthreads",
                        "1",
                        "--no-nanny",
                        "--name",
                        &format!("frozen-{i}"),
                    ])
                })
                .collect::<Result<Vec<_>>>()?;
            let sf = crate::cli::SchedulerFile::read(&file)?;
            let address: transport::Address = sf.address.parse().map_err(transport::Error::from)?;
            let secret = crate::security::Secret::from_hex(&sf.secret)?;
            let client = crate::runtime::block_on(Client::connect_with(
                &address,
                secret,
                ClientOptions {
                    scheduler_timeout,
                    ..ClientOptions::default()
                },
            ))?;
            wait_for(Duration::from_secs(30), || Ok(client.workers().len() == 2))?;
            // Work that outlasts the timeout: the freeze lands mid-run.
            let mut g = dask_graph::Graph::new();
            let keys: Vec<Key> = (0..8)
                .map(|i| {
                    let k = Key::from(("freeze-slow", i));
                    g.insert(
                        k,
                        dask_graph::Task::new(
                            "drill-slow",
                            [dask_graph::Arg::lit(i as i64), dask_graph::Arg::lit(200i64)],
                        ),
                    );
                    k
                })
                .collect();
            let fs = client.blocking().persist(g, &keys)?;
            std::thread::sleep(Duration::from_millis(100));
            signal(scheduler.0.id(), libc::SIGSTOP)?;
            let stopped = Instant::now();
            let (tx, rx) = std::sync::mpsc::channel();
            {
                let c = client.clone();
                std::thread::spawn(move || {
                    let got = c.blocking().gather(&fs);
                    let _ = tx.send((got.err(), stopped.elapsed()));
                });
            }
            let mut left = workers.iter_mut().map(Some).collect::<Vec<_>>();
            let deadline = stopped + limit;
            while left.iter().any(Option::is_some) {
                for slot in left.iter_mut() {
                    if let Some(w) = slot {
                        if let Ok(Some(status)) = w.0.try_wait() {
                            r.workers_exited.0.push(stopped.elapsed());
                            r.exit_codes.push(status.code().unwrap_or(-1));
                            *slot = None;
                        }
                    }
                }
                if Instant::now() > deadline {
                    let _ = signal(scheduler.0.id(), libc::SIGCONT);
                    return Err(Error::Timeout(format!(
                        "trial {trial}: workers still running {limit:?} after the scheduler froze"
                    )));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let (failed, took) = rx.recv_timeout(limit).map_err(|_| {
                Error::Timeout(format!("trial {trial}: the client's gather still waits"))
            })?;
            match failed {
                Some(Error::Disconnected(_)) => {}
                Some(e) => {
                    return Err(Error::Unexpected(format!(
                        "trial {trial}: the gather failed, but not for the lost scheduler: {e}"
                    )))
                }
                None => {
                    return Err(Error::Unexpected(format!(
                        "trial {trial}: the gather succeeded with the scheduler stopped"
                    )))
                }
            }
            r.client_failed.0.push(took);
            let _ = scheduler.0.kill();
            let _ = scheduler.0.wait();
            let _ = std::fs::remove_file(&file);
            r.trials += 1;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result.map(|()| r)
}

/// What [`freeze_client`] saw.
#[derive(Debug, Clone)]
pub struct FreezeClientReport {
    /// Trials run.
    pub trials: usize,
    /// From the stop to the scheduler dropping the client.
    pub dropped: Times,
    /// Graphs another client computed while one was stopped (each answer checked).
    pub served: usize,
    /// The client timeout the scheduler ran with.
    pub client_timeout: Duration,
}

/// `trials` trials on 2 worker processes over `protocol`, the scheduler's client timeout
/// `client_timeout`: a client in another process (this program re-executed: its `main` must
/// call [`run_client_if_asked`]) gathers results in a loop and is stopped with `SIGSTOP`
/// mid-gather; the scheduler must drop it within `limit` while a client here computes graphs
/// (answers checked); continued with `SIGCONT`, the stopped client's calls fail, saying it was
/// dropped, and it exits with 0.
pub fn freeze_client(
    protocol: Protocol,
    trials: usize,
    client_timeout: Duration,
    limit: Duration,
) -> Result<FreezeClientReport> {
    use std::io::BufRead;
    let cluster = LocalCluster::with(ClusterOptions {
        workers: 2,
        threads_per_worker: 1,
        protocol,
        scheduler: Config {
            client_timeout,
            ..Config::default()
        },
        ..Default::default()
    })?;
    let client = cluster.client()?;
    client.blocking().wait_for_workers(2, limit)?;
    let bin = std::env::current_exe().map_err(|e| Error::os("finding this program", e))?;
    let mut r = FreezeClientReport {
        trials: 0,
        dropped: Times::default(),
        served: 0,
        client_timeout,
    };
    let (g, key) = chaos_graph("client-sync", 200, 4);
    let answer = int(&dask_graph::Scheduler::get(&dask_graph::Inline, g, &[key])?[0])?;
    for trial in 0..trials {
        let mut child = Reaped(
            Command::new(&bin)
                .env(ENV_CLIENT, "1")
                .env(ENV_CLIENT_ADDRESS, cluster.address().to_string())
                .env(ENV_CLIENT_SECRET, cluster.secret().to_hex())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| Error::os("starting the client process", e))?,
        );
        let mut line = String::new();
        let out = child.0.stdout.take().expect("piped");
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| Error::os("reading the client's first line", e))?;
        if line.trim() != "GATHERING" {
            return Err(Error::Unexpected(format!(
                "trial {trial}: the client process said {line:?}"
            )));
        }
        let before = cluster.scheduler_stats()?.0.clients_dropped;
        std::thread::sleep(Duration::from_millis(50));
        signal(child.0.id(), libc::SIGSTOP)?;
        let stopped = Instant::now();
        // The cluster serves this client meanwhile.
        let mut dropped = None;
        while dropped.is_none() {
            let (g, key) = chaos_graph(&format!("client-{trial}-{}", r.served), 200, 4);
            let got = compute_within(&client, g, key, limit)?;
            if got != answer {
                return Err(Error::Unexpected(format!(
                    "trial {trial}: {got}, Inline says {answer}"
                )));
            }
            r.served += 1;
            if cluster.scheduler_stats()?.0.clients_dropped > before {
                dropped = Some(stopped.elapsed());
            } else if stopped.elapsed() > limit {
                return Err(Error::Timeout(format!(
                    "trial {trial}: the stopped client was not dropped within {limit:?}"
                )));
            }
        }
        r.dropped.0.extend(dropped);
        signal(child.0.id(), libc::SIGCONT)?;
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = child
                .0
                .try_wait()
                .map_err(|e| Error::os("waiting for the client", e))?
            {
                break s;
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "trial {trial}: the continued client did not end"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if !status.success() {
            return Err(Error::Unexpected(format!(
                "trial {trial}: the continued client ended with {status} (not told it was dropped?)"
            )));
        }
        r.trials += 1;
    }
    Ok(r)
}

/// Set for the client processes [`freeze_client`] starts, with the scheduler's address and
/// the secret.
const ENV_CLIENT: &str = "DASK_COMM_DRILL_CLIENT";
const ENV_CLIENT_ADDRESS: &str = "DASK_COMM_DRILL_CLIENT_ADDRESS";
const ENV_CLIENT_SECRET: &str = "DASK_COMM_DRILL_CLIENT_SECRET";

/// If this process was started by [`freeze_client`], runs its client and exits: it connects,
/// prints `GATHERING`, and persists and gathers graphs until a call fails; it exits with 0
/// when the failure says the scheduler dropped it, 1 otherwise.
pub fn run_client_if_asked() {
    if std::env::var_os(ENV_CLIENT).is_none() {
        return;
    }
    let run = || -> Result<String> {
        let var = |k: &str| {
            std::env::var(k).map_err(|_| Error::Config(format!("a drill client without {k}")))
        };
        let address: transport::Address = var(ENV_CLIENT_ADDRESS)?
            .parse()
            .map_err(transport::Error::from)?;
        let secret = crate::security::Secret::from_hex(&var(ENV_CLIENT_SECRET)?)?;
        let client = Client::connect_blocking(&address, secret)?;
        println!("GATHERING");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        for round in 0.. {
            let (g, key) = chaos_graph(&format!("frozen-{round}"), 400, 4);
            let fs = client.blocking().persist(g, &[key])?;
            if let Err(e) = client.blocking().gather(&fs) {
                return Ok(e.to_string());
            }
        }
        unreachable!("the loop ends with an error")
    };
    let code = match run() {
        Ok(why) if why.contains("dropped by the scheduler") => 0,
        Ok(why) => {
            eprintln!("drill client: the gather failed, but not because it was dropped: {why}");
            1
        }
        Err(e) => {
            eprintln!("drill client: {e}");
            1
        }
    };
    std::process::exit(code);
}

/// Set for the processes [`freeze_scheduler`] starts: they run the command line.
const ENV_CLI: &str = "DASK_COMM_DRILL_CLI";

/// If this process was started by [`freeze_scheduler`] as a scheduler or worker, runs the
/// `dask-comm` command line ([`crate::cli::main`]) and exits; otherwise returns at once.
pub fn run_cli_if_asked() {
    if std::env::var_os(ENV_CLI).is_some() {
        std::process::exit(crate::cli::main());
    }
}

/// A child process killed and reaped when dropped (a failed drill leaves nothing running).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = signal(self.0.id(), libc::SIGCONT);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `done` every 10 ms until it holds (returns when) or `limit` passes (an error).
pub(super) fn wait_for(limit: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        if done()? {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout(format!("not within {limit:?}")));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(super) fn signal(pid: u32, sig: libc::c_int) -> Result<()> {
    // SAFETY: kill only sends a signal to another process; no memory is shared.
    if unsafe { libc::kill(pid as libc::pid_t, sig) } == 0 {
        Ok(())
    } else {
        Err(Error::os(
            format!("kill -{sig} {pid}"),
            std::io::Error::last_os_error(),
        ))
    }
}
