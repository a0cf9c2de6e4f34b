//! Real processes: local clusters of worker processes over `tcp://`, `tls://` and `ucx://`, the
//! `dask-comm` command line with a scheduler file, a worker killed mid-computation, and
//! strangers at the door.
//!
//! Its own `main` (no test harness): worker processes re-execute this binary, and must become
//! workers before anything else runs.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dask_comm::{ClusterOptions, LocalCluster, Protocol, Secret};
use dask_graph::{registry, Arg, Graph, Key, Task, Value};

const BIN: &str = env!("CARGO_BIN_EXE_dask-comm");

fn register() {
    dask_comm::bench::register();
    registry().register("p-slow-inc", |x: i64| {
        std::thread::sleep(Duration::from_millis(20));
        x + 1
    });
    registry().register("p-visible-gpus", |_: i64| {
        std::thread::sleep(Duration::from_millis(20));
        std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
    });
}

fn int(v: &Value) -> i64 {
    *v.downcast_ref::<i64>().expect("an i64")
}

fn merge(n: u32, func: &str, tag: &str) -> (Graph, Key, i64) {
    let mut g = Graph::new();
    let x = format!("x-{tag}");
    for i in 0..n {
        g.insert((x.as_str(), i), Task::new(func, [Arg::lit(i as i64)]));
    }
    let total = format!("total-{tag}");
    g.insert(
        total.as_str(),
        Task::new("sum", (0..n).map(|i| Arg::key((x.as_str(), i)))),
    );
    let n = n as i64;
    (g, Key::name_only(&total), n * (n + 1) / 2)
}

fn process_cluster(protocol: Protocol) {
    let c = LocalCluster::with(ClusterOptions {
        workers: 2,
        threads_per_worker: 1,
        protocol,
        ..Default::default()
    })
    .unwrap();
    let client = c.client().unwrap();
    assert_eq!(client.workers().len(), 2);
    let fs = client.blocking().map("inc", 0..1000i64).unwrap();
    let vs = client.blocking().gather(&fs).unwrap();
    assert_eq!(vs.iter().map(int).sum::<i64>(), (1..=1000).sum::<i64>());
    let (g, key, want) = merge(5000, "inc", "p");
    let v = client.blocking().compute(g, &[key]).unwrap();
    assert_eq!(int(&v[0]), want);
    // Bulk data between worker processes.
    let data = Value::new(bytes::Bytes::from(vec![3u8; 8 << 20]));
    let f = client.blocking().scatter(vec![data]).unwrap();
    let back = client.blocking().gather(&f).unwrap();
    assert_eq!(
        back[0].downcast_ref::<bytes::Bytes>().unwrap().len(),
        8 << 20
    );
}

/// A worker process killed while it runs tasks: its tasks run on the other worker, and the
/// answer is right.
fn killed_worker_loses_nothing() {
    let c = LocalCluster::with(ClusterOptions {
        workers: 2,
        threads_per_worker: 1,
        restart: false,
        ..Default::default()
    })
    .unwrap();
    let client = c.client().unwrap();
    let (g, key, want) = merge(200, "p-slow-inc", "k");
    let f = client.blocking().persist(g, &[key]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let victim = client.workers()[0].pid;
    assert_ne!(victim, std::process::id(), "a worker process, not this one");
    let killed = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -9 {victim}");
    let v = client.blocking().gather(&f).unwrap();
    assert_eq!(int(&v[0]), want);
    assert_eq!(client.workers().len(), 1);
}

struct Kill(Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `dask-comm scheduler` and `dask-comm worker` processes found through a scheduler file.
fn command_line() {
    let dir = std::env::temp_dir().join(format!("dask-comm-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("scheduler.json");
    let mut procs = Kill(Vec::new());
    // Workers first: they wait for the scheduler file.
    for i in 0..2 {
        procs.0.push(
            Command::new(BIN)
                .args(["worker", "--nthreads", "1", "--name", &format!("cli-{i}")])
                .arg("--scheduler-file")
                .arg(&file)
                .arg("--local-directory")
                .arg(dir.join(format!("w{i}")))
                .spawn()
                .unwrap(),
        );
    }
    let mut sched = Command::new(BIN)
        .args([
            "scheduler",
            "--listen",
            "tcp://127.0.0.1:0",
            "--scheduler-file",
        ])
        .arg(&file)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = test_support::listening(&mut sched, test_support::START_LIMIT).unwrap();
    procs.0.push(sched);
    let sf = dask_comm::cli::SchedulerFile::read(&file).unwrap();
    assert_eq!(sf.address, addr);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the scheduler file is private");
    }
    let client = dask_comm::Client::connect_blocking(
        &sf.address.parse().unwrap(),
        Secret::from_hex(&sf.secret).unwrap(),
    )
    .unwrap();
    futures::executor::block_on(client.wait_for_workers(2, Duration::from_secs(60))).unwrap();
    let (g, key, want) = merge(2000, "inc", "cli");
    assert_eq!(int(&client.blocking().compute(g, &[key]).unwrap()[0]), want);
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Strangers: a wrong secret, garbage bytes, a peer that connects and says nothing, a raw UCX
/// endpoint speaking another protocol. Each is refused and logged; the cluster goes on.
fn strangers_are_refused(protocol: Protocol) {
    let c = LocalCluster::with(ClusterOptions {
        workers: 1,
        threads_per_worker: 1,
        protocol,
        ..Default::default()
    })
    .unwrap();
    let addr = c.address().clone();
    let e = dask_comm::Client::connect_blocking(&addr, Secret::generate()).unwrap_err();
    assert!(matches!(e, dask_comm::Error::Auth(_)), "{e:?}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (host, port) = match &addr {
        transport::Address::Tcp { host, port } | transport::Address::Ucx { host, port } => {
            (host.clone(), *port)
        }
        other => panic!("{other}"),
    };
    let mut silent = Vec::new();
    rt.block_on(async {
        let ucx_worker = match protocol {
            Protocol::Ucx => {
                let ctx = ucx::Context::new().unwrap();
                Some(ucx::Worker::new(&ctx, ucx::ProgressMode::Blocking).unwrap())
            }
            _ => None,
        };
        for _ in 0..20 {
            match protocol {
                Protocol::Tcp => {
                    let mut s = std::net::TcpStream::connect((host.as_str(), port)).unwrap();
                    let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n\xff\xff\xff\xff garbage");
                    silent.push(std::net::TcpStream::connect((host.as_str(), port)).unwrap());
                }
                _ => {
                    let w = ucx_worker.as_ref().unwrap();
                    if let Ok(ep) = ucx::Endpoint::connect(w, (host.as_str(), port)).await {
                        let _ = ep.send(vec![0xffu8; 5000], transport::UCX_TAG).await;
                        let _ = ep.send(vec![1u8; 20], 7).await;
                    }
                }
            }
        }
    });
    // The cluster serves a real client at once, strangers or not.
    let t0 = Instant::now();
    let client = c.client().unwrap();
    let f = client
        .blocking()
        .submit("inc", vec![Arg::lit(1i64)])
        .unwrap();
    assert_eq!(int(&f.result_blocking().unwrap()), 2);
    assert!(t0.elapsed() < Duration::from_secs(30));
    drop(silent);
}

/// Set for this binary re-executed as a cluster's owner: it starts a `LocalCluster` of two
/// worker processes, prints `PIDS <pid> <pid> DIR <local directory>` and waits to be killed.
const ENV_OWNER: &str = "DASK_COMM_TEST_OWNER";

fn owner() -> ! {
    let cluster = LocalCluster::with(ClusterOptions {
        workers: 2,
        memory_limit: dask_comm::MemoryLimit::Bytes(1 << 30),
        ..Default::default()
    })
    .unwrap();
    let client = cluster.client().unwrap();
    client
        .blocking()
        .wait_for_workers(2, Duration::from_secs(30))
        .unwrap();
    let pids: Vec<String> = cluster.worker_pids().iter().map(u32::to_string).collect();
    println!(
        "PIDS {} DIR {}",
        pids.join(" "),
        cluster.local_directory().display()
    );
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let exists = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
    exists
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z"))
}

/// A program holding a `LocalCluster` dies without cleaning up: with `kill -9`, and with
/// Ctrl-C (SIGINT to its whole process group, as a terminal sends it). Its worker processes
/// notice their parent is gone and stop, and the last removes the cluster's folder: nothing
/// is left running or on disk.
fn owner_killed_leaves_nothing_behind() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    for (how, sig) in [("kill -9", libc::SIGKILL), ("Ctrl-C", libc::SIGINT)] {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(ENV_OWNER, "1")
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.first(), Some(&"PIDS"), "{line:?}");
        let dir_at = words.iter().position(|w| *w == "DIR").unwrap();
        let pids: Vec<u32> = words[1..dir_at]
            .iter()
            .map(|p| p.parse().unwrap())
            .collect();
        let dir = std::path::PathBuf::from(words[dir_at + 1]);
        assert_eq!(pids.len(), 2);
        assert!(dir.is_dir());
        let pgid = child.id() as libc::pid_t;
        let target = if sig == libc::SIGINT { -pgid } else { pgid };
        // SAFETY: kill only sends a signal; the group is the one this test started.
        let sent = unsafe { libc::kill(target, sig) };
        assert_eq!(sent, 0);
        let _ = child.wait();
        let started = Instant::now();
        while (pids.iter().any(|&p| alive(p)) || dir.exists())
            && started.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        println!(
            "  {how}: workers gone and folder removed after {:.2} s",
            started.elapsed().as_secs_f64()
        );
        assert!(left.is_empty(), "{how}: workers still running: {left:?}");
        assert!(!dir.exists(), "{how}: {} left behind", dir.display());
    }
}

/// One worker per GPU: each worker process sees the GPU list rotated to start at its own
/// (its device 0), as `LocalCUDACluster` pins them; no GPU is needed to see the pinning.
fn workers_are_pinned_to_their_gpus() {
    let c = LocalCluster::with(ClusterOptions {
        protocol: Protocol::Tcp,
        ..ClusterOptions::one_worker_per_gpu(&[3, 5])
    })
    .unwrap();
    let client = c.client().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    // Slow tasks spread over both one-thread workers; a few rounds at most.
    for round in 0..10i64 {
        let fs = client
            .blocking()
            .map("p-visible-gpus", (0..40).map(|i| i + round * 40))
            .unwrap();
        for v in client.blocking().gather(&fs).unwrap() {
            seen.insert(v.downcast_ref::<String>().unwrap().clone());
        }
        if seen.len() == 2 {
            break;
        }
    }
    let want: std::collections::BTreeSet<String> = ["3,5".into(), "5,3".into()].into();
    assert_eq!(seen, want);
    // In-process workers cannot be pinned.
    let e = LocalCluster::with(ClusterOptions {
        processes: false,
        protocol: Protocol::Inproc,
        gpus: Some(vec![0]),
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("worker processes"), "{e}");
}

/// Set for this binary re-executed as a worker process of a program that forgot to call
/// `run_if_worker` first: `LocalCluster::new` must refuse rather than start a cluster of its
/// own (or exit).
const ENV_FORGOT: &str = "DASK_COMM_TEST_FORGOT_RUN_IF_WORKER";

fn forgot_run_if_worker() -> ! {
    match LocalCluster::new(1, 1) {
        Err(e @ dask_comm::Error::Config(_)) => {
            println!("refused: {e}");
            std::process::exit(0)
        }
        Err(e) => {
            println!("another error: {e}");
            std::process::exit(1)
        }
        Ok(_) => {
            println!("a worker process started a cluster");
            std::process::exit(1)
        }
    }
}

/// A worker process reaching `LocalCluster::new` (its program did not call `run_if_worker`)
/// gets a `Config` error saying so; nothing exits the process behind the caller's back.
fn worker_process_without_run_if_worker_is_refused() {
    let out = Command::new(std::env::current_exe().unwrap())
        .env("DASK_COMM_WORKER", "1")
        .env(ENV_FORGOT, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("refused:"), "{stdout}");
    assert!(stdout.contains("run_if_worker"), "{stdout}");
}

fn main() {
    register();
    if std::env::var_os(ENV_FORGOT).is_some() {
        forgot_run_if_worker();
    }
    dask_comm::run_if_worker();
    if std::env::var_os(ENV_OWNER).is_some() {
        owner();
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .try_init();
    let tests: Vec<test_support::NamedTest> = vec![
        (
            "process_cluster_tcp",
            Box::new(|| process_cluster(Protocol::Tcp)),
        ),
        (
            "process_cluster_ucx",
            Box::new(|| process_cluster(Protocol::Ucx)),
        ),
        (
            "process_cluster_tls",
            Box::new(|| process_cluster(Protocol::Tls)),
        ),
        (
            "killed_worker_loses_nothing",
            Box::new(killed_worker_loses_nothing),
        ),
        ("command_line", Box::new(command_line)),
        (
            "worker_process_without_run_if_worker_is_refused",
            Box::new(worker_process_without_run_if_worker_is_refused),
        ),
        (
            "workers_are_pinned_to_their_gpus",
            Box::new(workers_are_pinned_to_their_gpus),
        ),
        (
            "owner_killed_leaves_nothing_behind",
            Box::new(owner_killed_leaves_nothing_behind),
        ),
        (
            "strangers_are_refused_tcp",
            Box::new(|| strangers_are_refused(Protocol::Tcp)),
        ),
        (
            "strangers_are_refused_ucx",
            Box::new(|| strangers_are_refused(Protocol::Ucx)),
        ),
    ];
    test_support::run_tests(tests);
}
