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

use pyo3::exceptions::{PyRuntimeError, PyValueError};
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
}

static CORE: Mutex<Option<Arc<Core>>> = Mutex::new(None);
/// Endpoints and listeners open (`reset` refuses while any is): counted from creation until
/// closed here or dropped.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Counts a live endpoint or listener for as long as it is held.
#[derive(Debug)]
struct Live;

impl Live {
    fn new() -> Live {
        LIVE.fetch_add(1, Ordering::SeqCst);
        Live
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::SeqCst);
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
    }))
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
        Some(s) if s.is_finite() && s > 0.0 => Duration::from_secs_f64(s),
        Some(s) => {
            return Err(PyValueError::new_err(format!(
                "connect_timeout must be a positive number of seconds, not {s}"
            )))
        }
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

/// Forgets the process's UCX context and worker, so that `init` can make new ones. Fails while
/// endpoints or listeners are alive. In a child forked after UCX was initialised, it drops the
/// parent's state without touching it.
#[pyfunction]
fn reset(py: Python<'_>) -> PyResult<()> {
    buffer::release_pending(py);
    let mut slot = CORE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(core) = slot.take() else {
        return Ok(());
    };
    if core.pid != std::process::id() {
        // The parent's threads are not here: tearing its UCX down could hang.
        std::mem::forget(core);
        LIVE.store(0, Ordering::SeqCst);
        return Ok(());
    }
    let live = LIVE.load(Ordering::SeqCst);
    if live > 0 {
        *slot = Some(core);
        return Err(UCXError::new_err(format!(
            "reset() while {live} endpoint(s) or listener(s) are alive: close them first"
        )));
    }
    py.detach(move || drop(core));
    Ok(())
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

/// The loaded UCX library's path (where the dynamic linker found `libucp`).
#[pyfunction]
fn ucx_library() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("libucp.so"))
        .map(str::to_string)
}

#[pymodule]
fn _ucxrs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(reset, m)?)?;
    m.add_function(wrap_pyfunction!(get_ucx_version, m)?)?;
    m.add_function(wrap_pyfunction!(get_config, m)?)?;
    m.add_function(wrap_pyfunction!(progress_mode, m)?)?;
    m.add_function(wrap_pyfunction!(ucx_library, m)?)?;
    m.add_function(wrap_pyfunction!(progress, m)?)?;
    m.add_function(wrap_pyfunction!(quiesce, m)?)?;
    m.add_function(wrap_pyfunction!(exiting, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_support, m)?)?;
    m.add_function(wrap_pyfunction!(endpoint::connect, m)?)?;
    m.add_function(wrap_pyfunction!(endpoint::connect_address, m)?)?;
    m.add_function(wrap_pyfunction!(get_worker_address, m)?)?;
    m.add_function(wrap_pyfunction!(listener::listen, m)?)?;
    m.add_class::<endpoint::RawEndpoint>()?;
    m.add_class::<listener::RawListener>()?;
    m.add_class::<awaitable::Bell>()?;
    m.add_function(wrap_pyfunction!(comm::transport_listen, m)?)?;
    m.add_function(wrap_pyfunction!(comm::transport_connect, m)?)?;
    m.add_function(wrap_pyfunction!(comm::transport_configure, m)?)?;
    m.add_function(wrap_pyfunction!(device_frames::transport_device_frames, m)?)?;
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
