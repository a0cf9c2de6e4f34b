//! `dask-comm bench`: runs workloads on a local cluster of processes and prints time per task.
//!
//! Each workload runs once untimed (warm-up), then `--rounds` times, each round with keys of
//! its own; the median is reported, with the answer checked (except with `--zero-work`, where
//! workers run nothing). `roundtrip` times one `submit` + `gather` of a one-task graph.
//! `--scheduler-process` runs the scheduler as a process of its own (`dask-comm scheduler`)
//! instead of in this one, and reports its peak memory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dask_graph::Arg;
use serde::Serialize;

use crate::bench::{register, workload};
use crate::cli::{cluster_options, wait_for_file};
use crate::client::{Client, SubmitOptions};
use crate::cluster::{LocalCluster, Protocol};
use crate::error::{Error, Result};
use crate::security::Secret;

#[derive(Debug, Serialize)]
struct Row {
    workload: String,
    protocol: String,
    zero_work: bool,
    tasks: usize,
    seconds: f64,
    per_task_us: f64,
    rounds: Vec<f64>,
    answer_ok: bool,
    /// The value the last round computed (none with `--zero-work`).
    answer: Option<i64>,
    scheduler_peak_rss_mib: Option<f64>,
}

enum Cluster {
    Local(Box<LocalCluster>),
    Processes {
        scheduler: Child,
        workers: Vec<Child>,
        file: PathBuf,
    },
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Cluster::Processes {
            scheduler,
            workers,
            file,
        } = self
        {
            let _ = scheduler.kill();
            let _ = scheduler.wait();
            let deadline = Instant::now() + Duration::from_secs(5);
            for w in workers.iter_mut() {
                while Instant::now() < deadline && matches!(w.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = w.kill();
                let _ = w.wait();
            }
            let _ = std::fs::remove_file(file);
        }
    }
}

/// Peak resident memory of process `pid` (Linux), in MiB.
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn bench(words: Vec<String>) -> Result<()> {
    register();
    let mut workloads = "merge-10000,tree-12,chain-10000,roundtrip".to_string();
    let (mut workers, mut threads, mut rounds) = (2usize, 1usize, 3usize);
    let mut protocol = Protocol::Tcp;
    let (mut zero_work, mut json, mut separate) = (false, false, false);
    let mut it = words.into_iter();
    while let Some(w) = it.next() {
        let mut val = || {
            it.next()
                .ok_or_else(|| Error::Config(format!("{w} needs a value")))
        };
        match w.as_str() {
            "--workload" => workloads = val()?,
            "--workers" => {
                workers = val()?
                    .parse()
                    .map_err(|_| Error::Config("--workers".into()))?
            }
            "--threads" => {
                threads = val()?
                    .parse()
                    .map_err(|_| Error::Config("--threads".into()))?
            }
            "--rounds" => {
                rounds = val()?
                    .parse()
                    .map_err(|_| Error::Config("--rounds".into()))?
            }
            "--protocol" => protocol = val()?.parse()?,
            "--zero-work" => zero_work = true,
            "--json" => json = true,
            "--scheduler-process" => separate = true,
            other => return Err(Error::Config(format!("unknown bench option {other:?}"))),
        }
    }
    let rounds = rounds.max(1);
    let scheme = match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Ucx => "ucx",
        Protocol::Tls if !separate => "tls",
        Protocol::Tls => {
            return Err(Error::Config(
                "--scheduler-process runs tcp or ucx (tls needs the cluster's certificate)".into(),
            ))
        }
        Protocol::Inproc => return Err(Error::Config("bench runs processes: tcp or ucx".into())),
    };
    let (cluster, client) = if separate {
        start_processes(scheme, workers, threads, zero_work)?
    } else {
        let c = LocalCluster::with(cluster_options(workers, threads, protocol, zero_work))?;
        let client = c.client()?;
        (Cluster::Local(Box::new(c)), client)
    };
    let opts = SubmitOptions {
        fuse: false,
        ..Default::default()
    };
    if !json {
        let at = match &cluster {
            Cluster::Local(c) => format!("scheduler in this process at {}", c.address()),
            Cluster::Processes { .. } => "scheduler in a process of its own".into(),
        };
        println!(
            "{workers} workers x {threads} thread(s), {scheme}://{}, {at}; {rounds} rounds after a warm-up (medians)",
            if zero_work { ", zero-work workers" } else { "" }
        );
    }
    for name in workloads.split(',') {
        let mut times = Vec::with_capacity(rounds);
        let mut ok = true;
        let mut answer = None;
        let tasks;
        if name == "roundtrip" {
            tasks = 1;
            for _ in 0..20 {
                client
                    .blocking()
                    .submit("inc", vec![Arg::lit(1i64)])?
                    .result_blocking()?;
            }
            for _ in 0..rounds {
                let mut per = Vec::with_capacity(200);
                for _ in 0..200 {
                    let t0 = Instant::now();
                    let v = client
                        .blocking()
                        .submit("inc", vec![Arg::lit(1i64)])?
                        .result_blocking()?;
                    per.push(t0.elapsed().as_secs_f64());
                    answer = v.downcast_ref::<i64>().copied().filter(|_| !zero_work);
                    ok &= zero_work || answer == Some(2);
                }
                times.push(median(&mut per));
            }
        } else {
            let run = |tag: &str| -> Result<(f64, bool, usize, Option<i64>)> {
                let w = workload(name, tag)
                    .ok_or_else(|| Error::Config(format!("unknown workload {name:?}")))?;
                let t0 = Instant::now();
                let f = client.blocking().persist_with(w.graph, &[w.key], &opts)?;
                let v = client.blocking().gather(&f)?;
                let secs = t0.elapsed().as_secs_f64();
                let got = v[0].downcast_ref::<i64>().copied().filter(|_| !zero_work);
                let ok = zero_work || got == Some(w.answer);
                Ok((secs, ok, w.tasks, got))
            };
            let (_, warm_ok, n, _) = run("warm")?;
            ok &= warm_ok;
            tasks = n;
            for r in 0..rounds {
                let (secs, round_ok, _, got) = run(&format!("r{r}"))?;
                ok &= round_ok;
                answer = got;
                times.push(secs);
            }
        }
        let mut sorted = times.clone();
        let secs = median(&mut sorted);
        let rss = match &cluster {
            Cluster::Processes { scheduler, .. } => peak_rss_mib(scheduler.id()),
            Cluster::Local(_) => None,
        };
        let row = Row {
            workload: name.to_string(),
            protocol: scheme.into(),
            zero_work,
            tasks,
            seconds: secs,
            per_task_us: secs / tasks as f64 * 1e6,
            rounds: times,
            answer_ok: ok,
            answer,
            scheduler_peak_rss_mib: rss,
        };
        if json {
            println!("{}", serde_json::to_string(&row).expect("serialises"));
        } else {
            println!(
                "{:<16} {:>8} tasks {:>10.3} s {:>10.2} us/task  answer {}{}",
                row.workload,
                row.tasks,
                row.seconds,
                row.per_task_us,
                if zero_work {
                    "not checked"
                } else if ok {
                    "ok"
                } else {
                    "WRONG"
                },
                rss.map(|m| format!("  scheduler peak {m:.0} MiB"))
                    .unwrap_or_default()
            );
        }
        if !ok {
            return Err(Error::Unexpected(format!("{name}: wrong answer")));
        }
    }
    drop(client);
    drop(cluster);
    Ok(())
}

fn start_processes(
    scheme: &str,
    workers: usize,
    threads: usize,
    zero_work: bool,
) -> Result<(Cluster, Client)> {
    let exe = std::env::current_exe().map_err(|e| Error::os("finding this program", e))?;
    let file = std::env::temp_dir().join(format!("dask-comm-bench-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let secret = Secret::generate();
    let secret_file = file.with_extension("secret");
    std::fs::write(&secret_file, secret.to_hex())
        .map_err(|e| Error::os("writing the secret file", e))?;
    let scheduler = Command::new(&exe)
        .args(["scheduler", "--listen", &format!("{scheme}://127.0.0.1:0")])
        .arg("--scheduler-file")
        .arg(&file)
        .arg("--secret-file")
        .arg(&secret_file)
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| Error::os("starting the scheduler", e))?;
    let sf = wait_for_file(&file, Duration::from_secs(30))?;
    let _ = std::fs::remove_file(&secret_file);
    let mut children = Vec::new();
    for i in 0..workers {
        let mut cmd = Command::new(&exe);
        cmd.arg("worker").arg("--scheduler-file").arg(&file).args([
            "--nthreads",
            &threads.to_string(),
            "--name",
            &format!("bench-{i}"),
        ]);
        if zero_work {
            cmd.arg("--zero-work");
        }
        children.push(cmd.spawn().map_err(|e| Error::os("starting a worker", e))?);
    }
    let cluster = Cluster::Processes {
        scheduler,
        workers: children,
        file,
    };
    let address = sf.address.parse().map_err(transport::Error::from)?;
    let client = Client::connect_blocking(&address, Secret::from_hex(&sf.secret)?)?;
    crate::runtime::block_on(client.wait_for_workers(workers, Duration::from_secs(60)))?;
    Ok((cluster, client))
}
