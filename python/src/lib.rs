//! `ucxrs._ucxrs`: the native half of the `ucxrs` Python package (the Python half,
//! `ucxrs/`, gives UCXX's names). Rust does the work: one UCX context and worker per process,
//! created on first use, endpoints and listeners of ucx-rs, and Python buffers lent to UCX
//! without copies ([`buffer`]). Awaitables are tokio futures bridged to asyncio by
//! pyo3-async-runtimes.
//!
//! Two rules keep the GIL and ucx-rs's worker lock apart: every call that may take the worker
//! lock runs detached from the GIL, and nothing Python is released or called while a ucx-rs
//! lock is held (buffers queue their release, callbacks are scheduled on the event loop).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyImportError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod awaitable;
mod buffer;
mod comm;
#[cfg(feature = "cuda")]
mod device;
mod device_frames;
mod dlpack;
mod endpoint;
mod errors;
mod listener;
mod read_ahead;

use errors::{to_py, UCXError};

/// The process's UCX context and worker.
#[derive(Debug)]
struct Core {
    context: ucx::Context,
    worker: ucx::Worker,
    mode: ucx::ProgressMode,
    /// The process that created them: UCX and tokio do not survive `fork`.
    pid: u32,
    connect_timeout: Duration,
    /// Its endpoints and listeners not yet closed ([`Live`]).
    live: Arc<AtomicUsize>,
}

static CORE: Mutex<Option<Arc<Core>>> = Mutex::new(None);

/// Counts a live endpoint or listener of one core (`reset` reports them): from creation until
/// closed here or dropped.
#[derive(Debug)]
struct Live(Arc<AtomicUsize>);

impl Live {
    fn new(core: &Core) -> Live {
        core.live.fetch_add(1, Ordering::SeqCst);
        Live(Arc::clone(&core.live))
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Set at exit (`exiting`): from then on the event loops' steps keep the GIL.
static EXITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Registered with `atexit` (`ucxrs.core`): once the interpreter begins to finalize, a thread
/// that asks for the GIL back is ended with `pthread_exit`, whose forced unwind through Rust
/// frames aborts the process ("FATAL: exception not rethrown"; seen in 3 of 5 runs of a
/// dask-mpi client whose loop thread was still stepping awaitables). So from exit on, the
/// loops' steps (short: progress for at most 50 µs) run without letting the GIL go.
#[pyfunction]
fn exiting() {
    EXITING.store(true, Ordering::SeqCst);
}

/// `py.detach(f)`, or `f()` with the GIL held once the process is exiting (see [`exiting`]).
/// Holding the GIL while taking ucx-rs's locks cannot deadlock: nothing takes the GIL under
/// them.
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: pyo3::marker::Ungil + FnOnce() -> T,
    T: pyo3::marker::Ungil,
{
    if EXITING.load(Ordering::SeqCst) {
        f()
    } else {
        py.detach(f)
    }
}

/// Registered with `atexit`: releases the buffers of operations that ended since the last
/// call into the module. (Every awaitable's result is produced on its event loop's thread, by
/// the loop stepping it, so none can arrive after the interpreter has begun to shut down;
/// `timeout` is kept for the registration's signature.)
#[pyfunction]
fn quiesce(py: Python<'_>, timeout: f64) {
    let _ = timeout;
    buffer::release_pending(py);
}

fn check_pid(core: &Core) -> PyResult<()> {
    if core.pid != std::process::id() {
        return Err(UCXError::new_err(
            "UCX was initialised in this process's parent before it forked: UCX's and the \
             runtime's threads did not come along, so the parent's endpoints, listeners and \
             worker cannot be used here. Call ucxrs.reset() in the child, then use it afresh \
             (or start children with multiprocessing's 'spawn' or 'forkserver').",
        ));
    }
    Ok(())
}

/// UCX's keepalive interval unless the options or the environment set one (UCX's default: 20 s).
const KEEPALIVE_INTERVAL: &str = "1s";

fn build(
    options: Vec<(String, String)>,
    env_takes_precedence: bool,
    mode: ucx::ProgressMode,
    connect_timeout: Duration,
) -> PyResult<Arc<Core>> {
    let precedence = if env_takes_precedence {
        ucx::Precedence::Environment
    } else {
        ucx::Precedence::Options
    };
    let mut options = options;
    let keepalive_set = options
        .iter()
        .any(|(k, _)| k.trim_start_matches("UCX_") == "KEEPALIVE_INTERVAL")
        || std::env::var_os("UCX_KEEPALIVE_INTERVAL").is_some();
    if !keepalive_set {
        // UCX keeps the sockets of a connection whose two sides closed at once until a
        // keepalive round finds the peer gone: with UCX's 20 s a server in thread mode (where
        // the two closes usually cross) held two descriptors and about 30 KB per client for
        // 20 s, and stopped accepting at a limit of 1,024 after a few hundred clients.
        options.insert(0, ("KEEPALIVE_INTERVAL".into(), KEEPALIVE_INTERVAL.into()));
    }
    let context = ucx::Context::builder()
        .options(options)
        .precedence(precedence)
        .build()
        .map_err(to_py)?;
    // Every future that is not an awaitable runs on pyo3-async-runtimes' runtime. Blocking
    // mode is UCXX's: each event loop watches the worker's event fd and progresses it
    // (`awaitable::Bell`), so the worker is ucx-rs's `External` one.
    let _rt = pyo3_async_runtimes::tokio::get_runtime().enter();
    let worker_mode = match mode {
        ucx::ProgressMode::Blocking => ucx::ProgressMode::External,
        m => m,
    };
    let worker = ucx::Worker::new(&context, worker_mode).map_err(to_py)?;
    tracing::debug!(?mode, version = %ucx::version(), "ucxrs initialised");
    Ok(Arc::new(Core {
        context,
        worker,
        mode,
        pid: std::process::id(),
        connect_timeout,
        live: Arc::default(),
    }))
}

/// A time limit given in seconds: positive, finite, and at most a day.
fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    if s.is_finite() && s > 0.0 && s <= 86_400.0 {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(PyValueError::new_err(format!(
            "{what} must be a positive number of seconds (at most a day), not {s}"
        )))
    }
}

/// The process's core, created with the defaults (`UCXPY_PROGRESS_MODE` or thread) on first use.
fn core() -> PyResult<Arc<Core>> {
    let mut slot = CORE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = slot.as_ref() {
        check_pid(c)?;
        return Ok(c.clone());
    }
    let c = build(Vec::new(), false, default_mode()?, ucx::DEFAULT_TIMEOUT)?;
    *slot = Some(c.clone());
    Ok(c)
}

fn default_mode() -> PyResult<ucx::ProgressMode> {
    match std::env::var("UCXPY_PROGRESS_MODE") {
        Ok(m) => parse_mode(&m),
        Err(_) => Ok(ucx::ProgressMode::Thread),
    }
}

fn parse_mode(m: &str) -> PyResult<ucx::ProgressMode> {
    m.parse().map_err(|_| {
        PyValueError::new_err(format!(
            "unknown progress mode {m:?}: 'thread', 'blocking' or 'polling'"
        ))
    })
}

/// Initialises UCX with `options` (UCX configuration keys without the `UCX_` prefix).
#[pyfunction]
#[pyo3(signature = (options=None, env_takes_precedence=false, progress_mode=None, connect_timeout=None))]
fn init(
    py: Python<'_>,
    options: Option<&Bound<'_, PyDict>>,
    env_takes_precedence: bool,
    progress_mode: Option<&str>,
    connect_timeout: Option<f64>,
) -> PyResult<()> {
    buffer::release_pending(py);
    let mut pairs = Vec::new();
    if let Some(d) = options {
        for (k, v) in d.iter() {
            pairs.push((k.str()?.to_string(), v.str()?.to_string()));
        }
    }
    let mode = match progress_mode {
        Some(m) => parse_mode(m)?,
        None => default_mode()?,
    };
    let timeout = match connect_timeout {
        Some(s) => seconds("connect_timeout", s)?,
        None => ucx::DEFAULT_TIMEOUT,
    };
    let mut slot = CORE.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_some() {
        return Err(PyRuntimeError::new_err(
            "UCX is already initialised: call reset() first to initialise it with new options",
        ));
    }
    let core = py.detach(|| build(pairs, env_takes_precedence, mode, timeout))?;
    *slot = Some(core);
    Ok(())
}

/// Forgets the process's UCX context and worker, so that `init` can make new ones, as UCXX's
/// `reset` does: endpoints and listeners still open keep the old ones alive and working, and
/// are reported with `UCXError` (after which `init` works). In a child forked after UCX was
/// initialised, it drops the parent's state without touching it.
#[pyfunction]
fn reset(py: Python<'_>) -> PyResult<()> {
    buffer::release_pending(py);
    let Some(core) = CORE.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return Ok(());
    };
    if core.pid != std::process::id() {
        // The parent's threads are not here: tearing its UCX down could hang.
        std::mem::forget(core);
        return Ok(());
    }
    let live = core.live.load(Ordering::SeqCst);
    // The last reference, unless open endpoints or listeners hold it: then they keep it.
    py.detach(move || drop(core));
    if live > 0 {
        tracing::warn!(live, "reset() with endpoints or listeners still open");
        return Err(UCXError::new_err(format!(
            "Trying to reset UCX but not all Endpoints and/or Listeners are closed(): {live} \
             still alive. They keep the previous UCX context working until they are closed; \
             init() now starts a new one."
        )));
    }
    Ok(())
}

/// How many endpoints and listeners of the current context are open (0 before `init`).
#[pyfunction]
fn live_objects() -> usize {
    CORE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map_or(0, |c| c.live.load(Ordering::SeqCst))
}

/// Whether UCX is initialised: `init` (or a first use) made a context that `reset` has not
/// forgotten.
#[pyfunction]
fn initialised() -> bool {
    CORE.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}

/// The loaded UCX's version, as `(major, minor, release)`.
#[pyfunction]
fn get_ucx_version() -> PyResult<(u32, u32, u32)> {
    let v = ucx::version();
    let mut it = v.split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .unwrap_or(0)
    });
    Ok((
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    ))
}

/// The effective UCX configuration (keys without `UCX_`), and where UCX was loaded from.
#[pyfunction]
fn get_config(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    buffer::release_pending(py);
    let core = py.detach(core)?;
    let d = PyDict::new(py);
    for (k, v) in core.context.config() {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// The progress mode of the process's worker.
#[pyfunction]
fn progress_mode() -> PyResult<&'static str> {
    Ok(match core()?.mode {
        ucx::ProgressMode::Polling => "polling",
        ucx::ProgressMode::Blocking => "blocking",
        ucx::ProgressMode::Thread => "thread",
        ucx::ProgressMode::External => "external",
    })
}

/// Progresses the worker once (what polling mode needs when no operation is being awaited:
/// completions of cancelled operations, for one); returns the number of events UCX handled.
#[pyfunction]
fn progress(py: Python<'_>) -> PyResult<u32> {
    buffer::release_pending(py);
    let core = py.detach(core)?;
    let n = py.detach(|| core.worker.progress());
    buffer::release_pending(py);
    Ok(n)
}

/// This process's worker address, sealed (ucx-rs's `Worker::sealed_address`): pass it,
/// unchanged, to `create_endpoint_from_worker_address` in this or another process.
#[pyfunction]
fn get_worker_address(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyBytes>> {
    let core = py.detach(core)?;
    let sealed = py.detach(|| core.worker.sealed_address()).map_err(to_py)?;
    Ok(pyo3::types::PyBytes::new(py, &sealed))
}

/// How device arrays move: `"zero-copy"` (the loaded UCX reads and writes device memory),
/// `"staged"` (through pinned host memory: UCX without CUDA transports, a GPU present),
/// `"unavailable"` (no GPU or driver), or `"not built"` (this build has no `cuda` feature).
#[pyfunction]
fn cuda_support() -> PyResult<&'static str> {
    if !cfg!(feature = "cuda") {
        return Ok("not built");
    }
    Ok(match core()?.context.cuda_support() {
        ucx::CudaSupport::ZeroCopy => "zero-copy",
        ucx::CudaSupport::Staged => "staged",
        _ => "unavailable",
    })
}

/// The loaded UCX library's file (where the dynamic linker found `libucp`).
#[pyfunction]
fn ucx_library() -> Option<String> {
    ucx::library::library_path().map(|p| p.display().to_string())
}

/// The UCP API version this module was built against (`(1, 19)`): the oldest UCX it runs on.
#[pyfunction]
fn built_against_ucx() -> (u32, u32) {
    ucx::library::built_against()
}

/// UCX's description of the process's context (`ucp_context_print_info`): its components,
/// memory domains and the transport resources it found (`resource N : ... tl/device`).
#[pyfunction]
fn ucx_context_info(py: Python<'_>) -> PyResult<String> {
    let core = py.detach(core)?;
    core.context.info().map_err(to_py)
}

/// UCX's description of the process's worker (`ucp_worker_print_info`): its transports and
/// address.
#[pyfunction]
fn ucx_worker_info(py: Python<'_>) -> PyResult<String> {
    let core = py.detach(core)?;
    let worker = core.worker.clone();
    py.detach(move || worker.info()).map_err(to_py)
}

/// Makes GPU `ordinal`'s primary context current on the calling thread, opening it (and CUDA's
/// driver) first: what UCX needs to find before it starts, to use CUDA's transports
/// (dask-cuda's `create-cuda-context`). Raises `RuntimeError` with the reason where no GPU can
/// be used, or in a build without CUDA.
#[pyfunction]
#[pyo3(signature = (ordinal = 0))]
fn cuda_context_before_ucx(ordinal: i32) -> PyResult<()> {
    #[cfg(feature = "cuda")]
    {
        let g = device::gpu(ordinal)?;
        g.ctx
            .bind_to_thread()
            .map_err(|e| PyRuntimeError::new_err(format!("CUDA: cuCtxSetCurrent: {e}")))?;
        tracing::info!(ordinal, "CUDA context made current before UCX starts");
        Ok(())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(PyRuntimeError::new_err(
            "this build of ucxrs has no CUDA support (the `cuda` feature)",
        ))
    }
}

#[pymodule]
fn _ucxrs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // A UCX older than the headers this module was built against may lack what it calls:
    // refused here, as an ImportError the Python package explains (ucxrs/_load.py).
    ucx::library::check_version().map_err(|e| PyImportError::new_err(e.to_string()))?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(reset, m)?)?;
    m.add_function(wrap_pyfunction!(live_objects, m)?)?;
    m.add_function(wrap_pyfunction!(initialised, m)?)?;
    m.add_function(wrap_pyfunction!(ucx_worker_info, m)?)?;
    m.add_function(wrap_pyfunction!(get_ucx_version, m)?)?;
    m.add_function(wrap_pyfunction!(get_config, m)?)?;
    m.add_function(wrap_pyfunction!(progress_mode, m)?)?;
    m.add_function(wrap_pyfunction!(ucx_library, m)?)?;
    m.add_function(wrap_pyfunction!(built_against_ucx, m)?)?;
    m.add_function(wrap_pyfunction!(ucx_context_info, m)?)?;
    m.add_function(wrap_pyfunction!(progress, m)?)?;
    m.add_function(wrap_pyfunction!(quiesce, m)?)?;
    m.add_function(wrap_pyfunction!(exiting, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_support, m)?)?;
    m.add_function(wrap_pyfunction!(endpoint::connect, m)?)?;
    m.add_function(wrap_pyfunction!(endpoint::connect_address, m)?)?;
    m.add_function(wrap_pyfunction!(endpoint::worker_recv, m)?)?;
    m.add_function(wrap_pyfunction!(get_worker_address, m)?)?;
    m.add_function(wrap_pyfunction!(listener::listen, m)?)?;
    m.add_class::<endpoint::RawEndpoint>()?;
    m.add_class::<listener::RawListener>()?;
    m.add_class::<awaitable::Bell>()?;
    m.add_function(wrap_pyfunction!(comm::transport_listen, m)?)?;
    m.add_function(wrap_pyfunction!(comm::transport_connect, m)?)?;
    m.add_function(wrap_pyfunction!(comm::transport_configure, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_context_before_ucx, m)?)?;
    m.add_function(wrap_pyfunction!(device_frames::transport_device_frames, m)?)?;
    #[cfg(feature = "cuda")]
    m.add_function(wrap_pyfunction!(
        device_frames::receive_device_frames_with,
        m
    )?)?;
    #[cfg(feature = "cuda")]
    m.add_function(wrap_pyfunction!(device_frames::device_frame_allocator, m)?)?;
    m.add_class::<comm::Conn>()?;
    m.add_class::<comm::Listen>()?;
    m.add_class::<comm::RecvFrame>()?;
    #[cfg(feature = "cuda")]
    m.add_class::<device_frames::DeviceFrame>()?;
    Ok(())
}

/// `fut` as an awaitable polled on the event loop's own thread ([`awaitable::Polled`]): in
/// polling mode by yielding to the loop while pending; in the other modes, woken through the
/// loop's doorbell by whichever thread completes the operation.
fn awaitable<'py, F, T>(py: Python<'py>, core: &Arc<Core>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: std::future::Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let how = match core.mode {
        ucx::ProgressMode::Polling => awaitable::Wait::Yield,
        ucx::ProgressMode::Blocking => awaitable::Wait::Arm {
            worker: core.worker.clone(),
            transport: false,
        },
        _ => awaitable::Wait::Bell,
    };
    awaitable::Polled::wrap(py, fut, how)
}

/// The current core, if `core` is it (not reset since).
fn is_current(core: &Arc<Core>) -> bool {
    CORE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|c| Arc::ptr_eq(c, core))
}
