//! Starting a cluster where HPC jobs start things: under Open MPI's `mpirun`, MPICH's
//! `mpiexec` or Slurm's `srun` (as dask-mpi does; MPI is only used to start the right
//! number of processes).
//!
//! [`initialize`] is called at the top of a program that every rank runs: rank 0 becomes the
//! scheduler, ranks 2 and up workers (neither returns: each exits when the cluster shuts
//! down), and rank 1 gets a [`Launched`] client and runs the rest of `main`; when that ends
//! (or unwinds), the cluster shuts down and every rank exits.
//!
//! ```no_run
//! use dask_comm::launch::{initialize, LaunchOptions};
//! # fn is_prime(n: u64) -> bool { n > 1 && (2..n).all(|d| n % d != 0) }
//! dask_graph::registry().register("is_prime", is_prime);
//! let cluster = initialize(LaunchOptions::default())?; // mpirun -np 6 ./program
//! let flags = cluster.client().blocking().map("is_prime", 1u64..1000)?;
//! # Ok::<(), dask_comm::Error>(())
//! ```
//!
//! The ranks find the scheduler through a scheduler file on a file system they share
//! (`LaunchOptions::scheduler_file`, by default `dask-comm-scheduler-{job}.json` in the
//! working directory, named after the launcher's job id). `dask-comm mpi` starts a scheduler
//! and workers alone, for a client started elsewhere.

mod env;
mod host;

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use transport::Address;

use crate::cli::SchedulerFile;
use crate::client::Client;
use crate::cluster::Protocol;
use crate::dashboard::At;
use crate::error::{Error, Result};
use crate::scheduler::SchedulerServer;
use crate::security::Secret;
use crate::worker::{run_worker, MemoryLimit, WorkerOptions};

pub use env::{Launcher, Rank};
pub use host::{interface_address, interface_address_of, AddressFamily};

/// Why a launched process could not take its part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// No launcher's variables are set.
    #[error("not started by a launcher (mpirun, mpiexec, srun): none of OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, SLURM_PROCID is set")]
    NotLaunched,
    /// A rank variable without the matching size variable.
    #[error("the launcher set a rank but not {variable}")]
    NoSize {
        /// The size variable looked for.
        variable: &'static str,
    },
    /// A variable that is not a number.
    #[error("{name}={value:?} is not a number")]
    BadVariable {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// A rank not below the size.
    #[error("rank {rank} of a job of {size}")]
    BadRank {
        /// The rank.
        rank: u32,
        /// The size.
        size: u32,
    },
    /// Too few ranks for the parts.
    #[error("{size} ranks: this needs at least {need} ({parts})")]
    TooFewRanks {
        /// The job's size.
        size: u32,
        /// The least it needs.
        need: u32,
        /// What the ranks are for.
        parts: &'static str,
    },
    /// The scheduler's rank is not in the job.
    #[error("scheduler rank {rank} in a job of {size}")]
    SchedulerRank {
        /// The rank asked for.
        rank: u32,
        /// The size.
        size: u32,
    },
    /// No interface of that name with an address of the family asked for.
    #[error("no network interface {name:?} with an {family} address (there are {have:?})")]
    NoInterface {
        /// The name asked for.
        name: String,
        /// The address family asked for.
        family: AddressFamily,
        /// The interfaces there are.
        have: Vec<String>,
    },
    /// The ranks may span hosts and no address other ranks could reach was found.
    #[error("the ranks may span hosts and {host:?} resolves to no {family} address but loopback: name a network interface (--interface)")]
    NoAddress {
        /// This host's name.
        host: String,
        /// The address family asked for.
        family: AddressFamily,
    },
    /// The interfaces could not be listed.
    #[error("listing the network interfaces: {reason}")]
    Interfaces {
        /// The system's reason.
        reason: String,
    },
    /// The protocol cannot be used between launched processes.
    #[error("protocol {0:?} under a launcher: use tcp or ucx")]
    Protocol(Protocol),
}

/// What a launched cluster is made of (dask-mpi's options).
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Where the scheduler writes its address and secret for the other ranks (a file system
    /// every rank sees). `None`: `dask-comm-scheduler-{job}.json` in the working directory.
    pub scheduler_file: Option<PathBuf>,
    /// The scheduler's rank (0). The client is the lowest other rank.
    pub scheduler_rank: u32,
    /// Threads per worker (1).
    pub nthreads: usize,
    /// Each worker's memory limit (default: this host's memory shared by the ranks on it).
    pub memory_limit: MemoryLimit,
    /// The network interface to listen on (`ib0`, `eth0`); `None`: loopback when every rank
    /// runs on this host, else the address this host's name resolves to.
    pub interface: Option<String>,
    /// IPv4 (the default) or IPv6 addresses. `ucx://` over IPv6 needs UCX's
    /// `UCX_TCP_AF_PRIO=inet6` (ucx-rs says so when it is missing).
    pub address_family: AddressFamily,
    /// `tcp` or `ucx`.
    pub protocol: Protocol,
    /// The workers' folder for spilled values.
    pub local_directory: Option<PathBuf>,
    /// How long the client waits for every worker to join, and workers for the scheduler
    /// file (60 s).
    pub timeout: Duration,
    /// Where the scheduler serves its dashboard: by default loopback port 8787 (another free
    /// loopback port when that one is taken); `None`: no dashboard.
    pub dashboard: Option<At>,
}

impl Default for LaunchOptions {
    fn default() -> LaunchOptions {
        LaunchOptions {
            scheduler_file: None,
            scheduler_rank: 0,
            nthreads: 1,
            memory_limit: MemoryLimit::Auto,
            interface: None,
            address_family: AddressFamily::Ipv4,
            protocol: Protocol::Tcp,
            local_directory: None,
            timeout: Duration::from_secs(60),
            dashboard: Some(At::Default),
        }
    }
}

/// What a rank does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Runs the scheduler.
    Scheduler,
    /// Returns a client to the program.
    Client,
    /// Runs a worker.
    Worker,
}

impl LaunchOptions {
    /// The role of `rank` when a client rank is wanted (`with_client`) or not.
    pub fn role(&self, rank: &Rank, with_client: bool) -> Result<Role> {
        let need = if with_client { 3 } else { 2 };
        if rank.size < need {
            return Err(LaunchError::TooFewRanks {
                size: rank.size,
                need,
                parts: if with_client {
                    "a scheduler, a client and a worker"
                } else {
                    "a scheduler and a worker"
                },
            }
            .into());
        }
        if self.scheduler_rank >= rank.size {
            return Err(LaunchError::SchedulerRank {
                rank: self.scheduler_rank,
                size: rank.size,
            }
            .into());
        }
        let client_rank = if self.scheduler_rank == 0 { 1 } else { 0 };
        Ok(if rank.rank == self.scheduler_rank {
            Role::Scheduler
        } else if with_client && rank.rank == client_rank {
            Role::Client
        } else {
            Role::Worker
        })
    }

    /// This rank's view of the job: its id, the scheduler file, when this process began.
    fn job(&self, rank: Rank) -> Job {
        let started = SystemTime::now();
        let id = env::job_id(rank.launcher, |n| std::env::var(n).ok());
        let file = self.scheduler_file.clone().unwrap_or_else(|| {
            if id.is_none() {
                tracing::warn!(
                    "the launcher sets no job id: jobs started in this directory at once would \
                     share a scheduler file; give each its own (scheduler_file, --scheduler-file)"
                );
            }
            PathBuf::from(format!(
                "dask-comm-scheduler-{}.json",
                id.as_deref().unwrap_or("job")
            ))
        });
        Job {
            rank,
            id,
            file,
            started,
        }
    }

    fn scheme(&self) -> Result<&'static str> {
        match self.protocol {
            Protocol::Tcp => Ok("tcp"),
            Protocol::Ucx => Ok("ucx"),
            p => Err(LaunchError::Protocol(p).into()),
        }
    }
}

/// What the ranks of a job share.
struct Job {
    rank: Rank,
    /// The launcher's job id, written into the scheduler file and checked by the readers.
    id: Option<String>,
    file: PathBuf,
    started: SystemTime,
}

/// A cluster started by a launcher, on the client's rank: the client, and the shutdown of
/// every rank when it is dropped.
pub struct Launched {
    client: Client,
    rank: Rank,
    workers: usize,
}

impl Launched {
    /// The connected client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// How many workers joined.
    pub fn workers(&self) -> usize {
        self.workers
    }
}

impl std::fmt::Debug for Launched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launched")
            .field("rank", &self.rank)
            .field("workers", &self.workers)
            .finish()
    }
}

impl std::ops::Deref for Launched {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        tracing::info!("the program's main is done: shutting the cluster down");
        if let Err(e) = self.client.blocking().shutdown(Duration::from_secs(10)) {
            tracing::warn!(error = %e, "shutting the launched cluster down");
        }
    }
}

/// Takes this process's part in a launched cluster (dask-mpi's `initialize`): on the
/// scheduler's rank runs the scheduler, on the client's rank returns the client once every
/// worker has joined, on the other ranks runs a worker. The scheduler's and workers' ranks
/// never return: they exit when the cluster shuts down (status 0), or with status 1 and the
/// reason on stderr when their part fails. Errors: not launched, too few ranks (3 at least),
/// no scheduler file in time, workers missing.
pub fn initialize(opts: LaunchOptions) -> Result<Launched> {
    let rank = Rank::from_env()?;
    let role = opts.role(&rank, true)?;
    let job = opts.job(rank);
    if role == Role::Client {
        return client(&opts, &job);
    }
    std::process::exit(exit_status(role, serve(&opts, &job, role, true)))
}

/// The CLI's `mpi` mode: the scheduler's rank runs the scheduler until a client shuts the
/// cluster down, every other rank a worker (returns when the part is over).
pub fn serve_ranks(opts: &LaunchOptions) -> Result<()> {
    let rank = Rank::from_env()?;
    let role = opts.role(&rank, false)?;
    serve(opts, &opts.job(rank), role, false)
}

fn exit_status(role: Role, r: Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("dask-comm {role:?} rank: {e}");
            1
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::os("starting a tokio runtime", e))
}

/// Runs the scheduler's or a worker's part; `launched`: a client rank is part of the job (the
/// scheduler stops when it leaves, or when none comes within the timeout).
fn serve(opts: &LaunchOptions, job: &Job, role: Role, launched: bool) -> Result<()> {
    let (rank, file) = (job.rank, &job.file);
    let scheme = opts.scheme()?;
    let host = host::listen_host(
        opts.interface.as_deref(),
        rank.one_host,
        opts.address_family,
    )?;
    // `[v6]:0` or `v4:0`.
    let host_port = std::net::SocketAddr::new(host, 0);
    tracing::info!(rank = rank.rank, size = rank.size, ?role, %host, file = %file.display(), "launched");
    match role {
        Role::Scheduler => {
            let until = launched.then_some(opts.timeout);
            scheduler(
                job,
                &format!("{scheme}://{host_port}"),
                until,
                opts.dashboard,
            )
        }
        Role::Worker | Role::Client => {
            let sf = fresh_file(job, opts.timeout)?;
            let mut w = WorkerOptions::new(
                parse(&sf.address)?,
                Secret::from_hex(&sf.secret)?,
                opts.nthreads.max(1),
            );
            w.listen = Some(parse(&format!("{scheme}://{host_port}"))?);
            w.memory_limit = match opts.memory_limit {
                MemoryLimit::Bytes(0) | MemoryLimit::Unlimited => None,
                MemoryLimit::Bytes(b) => Some(b),
                MemoryLimit::Auto => {
                    // The ranks on this host share its memory.
                    let local = match rank.one_host {
                        Some(true) => rank.size,
                        _ => rank.local_size.unwrap_or(1),
                    };
                    crate::worker::memory::machine_memory().map(|m| m / u64::from(local.max(1)))
                }
            };
            w.local_directory = opts.local_directory.clone();
            w.name = format!("rank-{}", rank.rank);
            w.handle_signals = true;
            // A worker the scheduler removed (it was silent: stopped, swapping) joins again as
            // a fresh worker, a bounded number of times.
            let mut r = runtime()?.block_on(run_worker(w.clone()));
            for rejoin in 1..=REJOINS {
                let Err(Error::Removed(why)) = &r else { break };
                tracing::warn!(%why, rejoin, "the scheduler removed this rank's worker: joining again");
                r = runtime()?.block_on(run_worker(w.clone()));
            }
            match r {
                // The scheduler removes its file when it stops cleanly: a worker that finds
                // it gone (it joined late, or the scheduler was signalled) has nothing to do.
                Err(e) if !file.exists() => {
                    tracing::info!(error = %e, "the scheduler has shut down: this worker ends");
                    Ok(())
                }
                r => r,
            }
        }
    }
}

/// Times a launched worker rank joins again after the scheduler removed it.
const REJOINS: u32 = 10;

fn parse(text: &str) -> Result<Address> {
    Ok(text.parse().map_err(transport::Error::from)?)
}

/// Runs the scheduler until a client shuts the cluster down (or SIGINT/SIGTERM), with its
/// file written meanwhile and removed after. With `client_within`, also until the clients
/// have all left (the launched client's rank ended, whichever way), or none came that soon.
fn scheduler(
    job: &Job,
    listen: &str,
    client_within: Option<Duration>,
    dashboard: Option<At>,
) -> Result<()> {
    let file = &job.file;
    // A file left by an earlier job that died must not send this job's ranks there.
    let _ = std::fs::remove_file(file);
    let listen = parse(listen)?;
    let secret = Secret::generate();
    runtime()?.block_on(async {
        let mut server =
            SchedulerServer::start(&listen, secret.clone(), crate::core::Config::default()).await?;
        let dashboard = match dashboard {
            Some(at) => Some(crate::dashboard::start(&mut server, at).await?),
            None => None,
        };
        if let Some(d) = dashboard {
            crate::cli::announce(&format!("DASHBOARD http://{d}/"));
        }
        if let Some(grace) = client_within {
            server.stop_when_clients_leave(grace);
        }
        SchedulerFile {
            address: server.address().to_string(),
            secret: secret.to_hex(),
            dashboard: dashboard.map(|d| d.to_string()),
            job: job.id.clone(),
        }
        .write(file)?;
        crate::cli::announce(&format!("LISTENING {}", server.address()));
        let ended = server.serve_until_signalled().await;
        let _ = std::fs::remove_file(file);
        ended
    })
}

/// How much older than a reading rank a scheduler file of a job without an id may be.
const SLACK: Duration = Duration::from_secs(60);

/// The scheduler file once it is there and written by this job: one naming this job's id, or
/// where the launcher sets none, one not older than this process (less [`SLACK`] for ranks
/// started at different times), so a file a dead job left cannot send the ranks to it.
fn fresh_file(job: &Job, limit: Duration) -> Result<SchedulerFile> {
    let file = &job.file;
    let deadline = Instant::now() + limit;
    let not_before = job.started - SLACK;
    loop {
        let ours = |sf: &SchedulerFile| match &job.id {
            Some(id) => sf.job.as_ref() == Some(id),
            None => std::fs::metadata(file)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t >= not_before),
        };
        if let Ok(sf) = SchedulerFile::read(file) {
            if ours(&sf) {
                return Ok(sf);
            }
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout(format!(
                "no scheduler file from this job at {} after {limit:?}",
                file.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn client(opts: &LaunchOptions, job: &Job) -> Result<Launched> {
    let rank = job.rank;
    let sf = fresh_file(job, opts.timeout)?;
    let client = Client::connect_blocking(&parse(&sf.address)?, Secret::from_hex(&sf.secret)?)?;
    let workers = (rank.size - 2) as usize;
    if let Err(e) = client.blocking().wait_for_workers(workers, opts.timeout) {
        // The other ranks must not wait for a client that gave up.
        let _ = client.blocking().shutdown(Duration::from_secs(10));
        return Err(e);
    }
    tracing::info!(rank = rank.rank, workers, "the launched cluster is up");
    Ok(Launched {
        client,
        rank,
        workers,
    })
}
