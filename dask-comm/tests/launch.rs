//! `dask_comm::initialize`'s promise in real processes: however rank 1's `main` ends (it
//! returns, returns an error, panics, exits without unwinding, or is killed), every other rank
//! of the job exits by itself, the scheduler and the workers with status 0. No launcher here:
//! this binary starts the ranks itself with the variables MPICH's `mpiexec` sets (`PMI_RANK`,
//! `PMI_SIZE`), so nothing but our own shutdown can end them (`mpirun` and `srun` would kill
//! the rest of a job whose rank failed; scripts/launch_test.sh and slurm_test.sh run the real
//! launchers).
//!
//! Its own `main` (no test harness): the ranks re-execute this binary.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use dask_comm::{LaunchOptions, Protocol};
use dask_graph::{registry, Arg};

/// Set in a rank's environment: what rank 1's `main` does once the cluster is up.
const MODE: &str = "LAUNCH_TEST_MAIN";
/// Set in a rank's environment: the job's folder (scheduler file, the client's marker).
const DIR: &str = "LAUNCH_TEST_DIR";
/// Set in a rank's environment: `tcp` or `ucx`.
const PROTOCOL: &str = "LAUNCH_TEST_PROTOCOL";
/// Set in a rank's environment: the scheduler's rank (`LaunchOptions::scheduler_rank`).
const SCHEDULER_RANK: &str = "LAUNCH_TEST_SCHEDULER_RANK";
/// Set in a rank's environment: `ipv4` or `ipv6` (`LaunchOptions::address_family`).
const FAMILY: &str = "LAUNCH_TEST_FAMILY";
/// How long a whole job may take before the test calls it hung.
const LIMIT: Duration = Duration::from_secs(90);

fn register() {
    dask_comm::bench::register();
    registry().register("refuse", |x: i64| -> Result<i64, String> {
        Err(format!("{x} refused on purpose"))
    });
}

/// What the program's `main` returns in the `error` mode.
type Failure = Box<dyn std::error::Error>;

/// A rank of a launched job: the scheduler's and the workers' ranks never return from
/// `initialize`; the client's rank (1, or 0 when the scheduler is elsewhere) proves the
/// cluster works, says so with a marker file, then ends as `mode` says.
fn rank_main(mode: &str) {
    let dir = PathBuf::from(std::env::var(DIR).expect("LAUNCH_TEST_DIR"));
    let protocol = std::env::var(PROTOCOL).unwrap_or_else(|_| "tcp".into());
    let scheduler_rank = std::env::var(SCHEDULER_RANK).map_or(0, |r| r.parse().unwrap());
    let family = std::env::var(FAMILY).unwrap_or_else(|_| "ipv4".into());
    let r = (|| -> Result<(), Failure> {
        let cluster = dask_comm::initialize(LaunchOptions {
            scheduler_file: Some(dir.join("scheduler.json")),
            protocol: protocol.parse::<Protocol>()?,
            timeout: Duration::from_secs(30),
            scheduler_rank,
            address_family: family.parse()?,
            ..LaunchOptions::default()
        })?;
        let two = cluster.blocking().submit("inc", vec![Arg::lit(1i64)])?;
        assert_eq!(two.result_blocking()?.downcast_ref::<i64>(), Some(&2));
        // This rank's number, then the workers' addresses.
        let workers: Vec<String> = cluster
            .client()
            .workers()
            .into_iter()
            .map(|w| w.address)
            .collect();
        std::fs::write(
            dir.join("up"),
            format!("{}\n{}", cluster.rank().rank, workers.join(" ")),
        )?;
        match mode {
            "return" => Ok(()),
            // A task's error, passed up by `?`: `cluster` drops as the error leaves.
            "error" => {
                cluster
                    .blocking()
                    .submit("refuse", vec![Arg::lit(7i64)])?
                    .result_blocking()?;
                Err("the refused task succeeded".into())
            }
            "panic" => panic!("rank 1's main panics"),
            // No destructor runs: the scheduler sees only the client's connection go.
            "exit" => std::process::exit(4),
            // Until the test kills this process (which it does well within this bound).
            "hang" => {
                for _ in 0..(2 * LIMIT.as_secs()) {
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err("not killed in time".into())
            }
            other => Err(format!("unknown mode {other}").into()),
        }
    })();
    if let Err(e) = r {
        eprintln!("rank main: {e}");
        std::process::exit(1);
    }
}

/// A job of `size` ranks of this binary, each with its output in `dir`.
struct Job {
    ranks: Vec<Child>,
    dir: PathBuf,
    /// The client's rank.
    client: usize,
}

impl Job {
    fn start(name: &str, size: u32, mode: &str, protocol: &str) -> Job {
        Job::with(name, size, mode, &[(PROTOCOL, protocol)])
    }

    /// A job whose ranks also have `vars` ([`PROTOCOL`], [`SCHEDULER_RANK`], [`FAMILY`]).
    fn with(name: &str, size: u32, mode: &str, vars: &[(&str, &str)]) -> Job {
        let scheduler: u32 = vars
            .iter()
            .find(|v| v.0 == SCHEDULER_RANK)
            .map_or(0, |v| v.1.parse().unwrap());
        let dir = std::env::temp_dir().join(format!(
            "launch-test-{}-{name}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = std::env::current_exe().unwrap();
        let ranks = (0..size)
            .map(|rank| {
                let file = |s: &str| std::fs::File::create(dir.join(format!("rank-{rank}.{s}")));
                let mut cmd = Command::new(&exe);
                // Only PMI's variables, whatever launched this test.
                for v in [
                    "OMPI_COMM_WORLD_RANK",
                    "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_SIZE",
                    "PMIX_RANK",
                    "SLURM_PROCID",
                ] {
                    cmd.env_remove(v);
                }
                cmd.env("PMI_RANK", rank.to_string())
                    .env("PMI_SIZE", size.to_string())
                    .env("MPI_LOCALNRANKS", size.to_string())
                    .env(MODE, mode)
                    .env(DIR, &dir)
                    .envs(vars.iter().copied())
                    .stdin(Stdio::null())
                    .stdout(file("out").unwrap())
                    .stderr(file("err").unwrap())
                    .spawn()
                    .unwrap()
            })
            .collect();
        Job {
            ranks,
            dir,
            client: if scheduler == 0 { 1 } else { 0 },
        }
    }

    /// Waits until `path` exists (the client's marker), failing the test after `limit`.
    fn wait_for(&mut self, path: &Path, limit: Duration) {
        let t0 = Instant::now();
        while !path.exists() {
            if t0.elapsed() > limit {
                self.fail(&format!("{} never appeared", path.display()));
            }
            let client = self.client;
            if let Some(st) = self.ranks[client].try_wait().unwrap() {
                self.fail(&format!(
                    "rank {client} ended ({st}) before the cluster was up"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every rank's exit status once all have exited; fails the test (killing the ranks left)
    /// after [`LIMIT`].
    fn statuses(&mut self) -> Vec<ExitStatus> {
        let t0 = Instant::now();
        loop {
            let done: Vec<Option<ExitStatus>> = self
                .ranks
                .iter_mut()
                .map(|c| c.try_wait().unwrap())
                .collect();
            if done.iter().all(Option::is_some) {
                return done.into_iter().map(Option::unwrap).collect();
            }
            if t0.elapsed() > LIMIT {
                let left: Vec<usize> = (0..done.len()).filter(|&i| done[i].is_none()).collect();
                self.fail(&format!("ranks {left:?} still running after {LIMIT:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn output(&self, rank: usize, stream: &str) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.join(format!("rank-{rank}.{stream}"))) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    fn fail(&mut self, why: &str) -> ! {
        for c in &mut self.ranks {
            let _ = c.kill();
            let _ = c.wait();
        }
        for rank in 0..self.ranks.len() {
            eprintln!("--- rank {rank} stderr:\n{}", self.output(rank, "err"));
        }
        panic!("{why}");
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for c in &mut self.ranks {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The client rank's `main` ends as `mode` says (`hang`: killed with SIGKILL once the
/// cluster is up); every other rank must then exit by itself with status 0, and the client's
/// with `want`.
fn ends(mode: &str, protocol: &str, want: impl Fn(&ExitStatus) -> bool) {
    let loopback = |a: &str| a.contains("://127.0.0.1:");
    ends_in(Job::start(mode, 4, mode, protocol), mode, want, loopback)
}

/// As [`ends`], for `job`, whose workers' addresses must all satisfy `listens`.
fn ends_in(
    mut job: Job,
    mode: &str,
    want: impl Fn(&ExitStatus) -> bool,
    listens: impl Fn(&str) -> bool,
) {
    let up = job.dir.join("up");
    job.wait_for(&up, LIMIT);
    let client = job.client;
    // Written once the cluster computed: the client's rank, then the workers' addresses (a
    // file being written reads short).
    let t0 = Instant::now();
    let mut said = String::new();
    while !said.contains('\n') && t0.elapsed() < Duration::from_secs(5) {
        said = std::fs::read_to_string(&up).unwrap_or_default();
        std::thread::sleep(Duration::from_millis(10));
    }
    let (rank, addresses) = said.split_once('\n').unwrap_or((&said, ""));
    if rank != client.to_string() {
        job.fail(&format!(
            "rank {rank:?} got the client, expected rank {client}"
        ));
    }
    if !addresses.split(' ').all(&listens) {
        job.fail(&format!("workers listen on {addresses:?}"));
    }
    if mode == "hang" {
        job.ranks[client].kill().unwrap();
    }
    let t0 = Instant::now();
    let st = job.statuses();
    let took = t0.elapsed();
    for (rank, s) in st.iter().enumerate() {
        let ok = if rank == client { want(s) } else { s.success() };
        if !ok {
            job.fail(&format!("{mode}: rank {rank} ended with {s} (all: {st:?})"));
        }
    }
    println!(
        "  rank {client}'s main: {mode}; every rank ended {took:.1?} after the cluster was up"
    );
}

fn code(c: i32) -> impl Fn(&ExitStatus) -> bool {
    move |s| s.code() == Some(c)
}

/// Two ranks: each says it needs three and fails, none waits for the others.
fn too_few_ranks() {
    let mut job = Job::start("few", 2, "return", "tcp");
    let st = job.statuses();
    for (rank, s) in st.iter().enumerate() {
        let err = job.output(rank, "err");
        if s.success() || !err.contains("this needs at least 3") {
            job.fail(&format!("rank {rank} of 2 ended with {s}: {err}"));
        }
    }
}

fn main() {
    register();
    if let Ok(mode) = std::env::var(MODE) {
        rank_main(&mode);
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .try_init();
    use std::os::unix::process::ExitStatusExt;
    let killed = |s: &ExitStatus| s.signal() == Some(libc::SIGKILL);
    let tests: Vec<test_support::NamedTest> = vec![
        ("main_returns", Box::new(|| ends("return", "tcp", code(0)))),
        (
            "main_returns_ucx",
            Box::new(|| ends("return", "ucx", code(0))),
        ),
        ("main_errs", Box::new(|| ends("error", "tcp", code(1)))),
        ("main_panics", Box::new(|| ends("panic", "tcp", code(101)))),
        ("main_exits", Box::new(|| ends("exit", "tcp", code(4)))),
        ("main_killed", Box::new(move || ends("hang", "tcp", killed))),
        (
            "main_killed_ucx",
            Box::new(move || ends("hang", "ucx", killed)),
        ),
        (
            "scheduler_on_rank_3",
            Box::new(|| {
                // Rank 3 the scheduler, rank 0 the client, ranks 1 and 2 workers.
                let job = Job::with("rank3", 4, "return", &[(SCHEDULER_RANK, "3")]);
                ends_in(job, "return", code(0), |a| {
                    a.starts_with("tcp://127.0.0.1:")
                })
            }),
        ),
        (
            "ipv6",
            Box::new(|| {
                // Every rank on this host: IPv6 loopback. Skipped where the kernel has no IPv6
                // (except in CI, which has it).
                if !std::path::Path::new("/proc/net/if_inet6").exists() {
                    test_support::skip_unless_ci("no IPv6 here (/proc/net/if_inet6)");
                    return;
                }
                let job = Job::with("ipv6", 4, "return", &[(FAMILY, "ipv6")]);
                ends_in(job, "return", code(0), |a| a.starts_with("tcp://[::1]:"))
            }),
        ),
        ("too_few_ranks", Box::new(too_few_ranks)),
    ];
    test_support::run_tests(tests);
}
