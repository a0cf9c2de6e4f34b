//! Running one task: resolve its arguments, call the registered function, and turn an error
//! or a panic into a [`TaskFailure`] that names the key and the function. Never unwinds.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Once};

use crate::key::Key;
use crate::registry::{registry, CallError};
use crate::task::{Arg, Task};
use crate::value::{List, Value};

/// How a task failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum FailureKind {
    /// The function returned an error.
    Error,
    /// The function panicked.
    Panic,
    /// An argument was not of the type the function takes.
    Argument,
    /// The function is not registered in the process that ran the task.
    UnknownFunction,
    /// A value could not be encoded, decoded or found.
    Data,
    /// The task could not run where it was sent (a worker failed it).
    Lost,
    /// Workers died while running the task, as many times as allowed (Dask's `KilledWorker`):
    /// the task itself is the likely cause, and it is not tried again.
    KilledWorker,
    /// A shuffle's data could not be sent or collected (see [`ShuffleError`](crate::ShuffleError)):
    /// a cluster restarts the shuffle rather than failing.
    Shuffle,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::Error => "failed",
            FailureKind::Panic => "panicked",
            FailureKind::Argument => "got a bad argument",
            FailureKind::UnknownFunction => "names an unknown function",
            FailureKind::Data => "had a data error",
            FailureKind::Lost => "was lost",
            FailureKind::KilledWorker => "killed its workers",
            FailureKind::Shuffle => "lost shuffle data",
        })
    }
}

/// A task that failed: which key, which function, how, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("task {key} ({function}) {kind}: {message}{}", .worker.as_ref().map(|w| format!(" [on {w}]")).unwrap_or_default())]
pub struct TaskFailure {
    /// The task's key.
    pub key: Key,
    /// The function it called.
    pub function: String,
    /// How it failed.
    pub kind: FailureKind,
    /// The error's text, or the panic's message.
    pub message: String,
    /// Where a panic happened (captured when the task panicked).
    pub backtrace: Option<String>,
    /// The worker that ran it, on a cluster.
    pub worker: Option<String>,
}

impl TaskFailure {
    /// A failure of `key` running `function`.
    pub fn new(key: Key, function: &str, kind: FailureKind, message: impl Into<String>) -> Self {
        TaskFailure {
            key,
            function: function.to_string(),
            kind,
            message: message.into(),
            backtrace: None,
            worker: None,
        }
    }

    /// The same failure, as seen on `worker`.
    pub fn on_worker(mut self, worker: impl Into<String>) -> Self {
        self.worker = Some(worker.into());
        self
    }
}

thread_local! {
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
    static PANIC_TRACE: RefCell<Option<String>> = const { RefCell::new(None) };
    /// The key and function of the task being called (nested ones included).
    static CALLING: Cell<Option<(Key, crate::key::Name)>> = const { Cell::new(None) };
}

/// Installs (once) a panic hook that, inside a task, records the panic's backtrace for the
/// failure instead of printing it; elsewhere the previous hook runs as before.
fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_TASK.with(Cell::get) {
                let trace = format!(
                    "{}\n{}",
                    info.location().map(|l| l.to_string()).unwrap_or_default(),
                    std::backtrace::Backtrace::force_capture()
                );
                PANIC_TRACE.with(|t| *t.borrow_mut() = Some(trace));
            } else {
                previous(info);
            }
        }));
    });
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-text payload".into())
}

/// Evaluates an argument.
fn eval(
    a: &Arg,
    key: Key,
    resolve: &dyn Fn(&Key) -> Option<Value>,
) -> Result<Value, Box<TaskFailure>> {
    match a {
        Arg::Key(k) => resolve(k).ok_or_else(|| {
            Box::new(TaskFailure::new(
                key,
                "",
                FailureKind::Data,
                format!("the value of {k} is not available"),
            ))
        }),
        Arg::Lit(v) => Ok(v.clone()),
        Arg::List(items) => Ok(Value::new(List(
            items
                .iter()
                .map(|a| eval(a, key, resolve))
                .collect::<Result<_, _>>()?,
        ))),
        Arg::Task(t) => call(t, t.origin.unwrap_or(key), resolve),
    }
}

fn call(
    t: &Task,
    key: Key,
    resolve: &dyn Fn(&Key) -> Option<Value>,
) -> Result<Value, Box<TaskFailure>> {
    let name = t.func.as_str();
    let fail = |kind, message: String| Err(Box::new(TaskFailure::new(key, name, kind, message)));
    let Some(f) = registry().get(t.func) else {
        return fail(
            FailureKind::UnknownFunction,
            format!("`{name}` is not registered in this process"),
        );
    };
    let args = t
        .args
        .iter()
        .map(|a| eval(a, key, resolve))
        .collect::<Result<Vec<_>, _>>()?;
    // Set after the arguments (nested tasks set their own), so a panic names this call.
    CALLING.with(|c| c.set(Some((key, t.func))));
    crate::shuffle::clear_failed();
    match f.call(&args) {
        Ok(v) => Ok(v),
        Err(CallError::Failed(m)) if crate::shuffle::failed() => fail(FailureKind::Shuffle, m),
        Err(CallError::Failed(m)) => fail(FailureKind::Error, m),
        Err(e) => fail(FailureKind::Argument, e.to_string()),
    }
}

/// Runs task `key` = `t`, getting its dependencies' values from `resolve`. Errors and panics
/// (with a backtrace) become a [`TaskFailure`].
pub fn run(
    t: &Task,
    key: Key,
    resolve: &dyn Fn(&Key) -> Option<Value>,
) -> Result<Value, Box<TaskFailure>> {
    install_hook();
    IN_TASK.with(|f| f.set(true));
    // The innermost task being called, for a panic's failure (fused tasks keep their keys).
    let r = catch_unwind(AssertUnwindSafe(|| call(t, key, resolve)));
    IN_TASK.with(|f| f.set(false));
    match r {
        Ok(r) => r,
        Err(p) => {
            let (at, func) = CALLING.with(Cell::get).unwrap_or((key, t.func));
            let mut failure =
                TaskFailure::new(at, func.as_str(), FailureKind::Panic, panic_message(&*p));
            failure.backtrace = PANIC_TRACE.with(|t| t.borrow_mut().take());
            Err(Box::new(failure))
        }
    }
}

/// Why a computation did not produce its values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ComputeError {
    /// The graph was refused before anything ran.
    #[error(transparent)]
    Graph(#[from] crate::GraphError),
    /// `key` could not be computed because task `cause.key` failed (the same key when the
    /// task itself failed; otherwise one it depends on).
    #[error("{key} could not be computed: {cause}")]
    Failed {
        /// The requested key.
        key: Key,
        /// The task that failed.
        cause: Arc<TaskFailure>,
    },
    /// The computation of `key` was cancelled.
    #[error("{key} was cancelled")]
    Cancelled {
        /// The key.
        key: Key,
    },
    /// A task took down `workers` workers, one after another (`allowed_failures`).
    #[error("task {key} was running on {} workers that died: {}", .workers.len(), .workers.join(", "))]
    KilledWorker {
        /// The task.
        key: Key,
        /// The workers it was running on.
        workers: Vec<String>,
    },
    /// The scheduler or cluster went away (the text says how).
    #[error("lost the cluster: {0}")]
    Disconnected(String),
}

impl ComputeError {
    /// The failed task behind this error, if a task failed.
    pub fn cause(&self) -> Option<&TaskFailure> {
        match self {
            ComputeError::Failed { cause, .. } => Some(cause),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_and_errors_become_failures_naming_the_key() {
        registry().register("exec-test-panics", |x: i64| -> i64 {
            if x > 0 {
                panic!("boom at {x}")
            }
            x
        });
        registry().register("exec-test-errs", |_x: i64| -> Result<i64, String> {
            Err("no good".into())
        });
        let key = Key::new("k", &[3]);
        let t = Task::new("exec-test-panics", [Arg::lit(5i64)]);
        let f = run(&t, key, &|_| None).unwrap_err();
        assert_eq!(f.kind, FailureKind::Panic);
        assert_eq!(f.key, key);
        assert_eq!(f.function, "exec-test-panics");
        assert_eq!(f.message, "boom at 5");
        let trace = f.backtrace.clone().unwrap();
        assert!(trace.contains("exec.rs"), "{trace}");
        assert!(f.to_string().contains("('k', 3)"), "{f}");
        let t = Task::new("exec-test-errs", [Arg::lit(1i64)]);
        let f = run(&t, key, &|_| None).unwrap_err();
        assert_eq!(
            (f.kind, f.message.as_str()),
            (FailureKind::Error, "no good")
        );
        let t = Task::new("exec-test-missing-fn", []);
        assert_eq!(
            run(&t, key, &|_| None).unwrap_err().kind,
            FailureKind::UnknownFunction
        );
        let t = Task::new("exec-test-errs", [Arg::lit(true)]);
        assert_eq!(
            run(&t, key, &|_| None).unwrap_err().kind,
            FailureKind::Argument
        );
        // A panic outside tasks still reaches the normal hook (not swallowed): not tested
        // here, since it would print.
    }

    #[test]
    fn failures_round_trip_through_the_wire() {
        let f = TaskFailure::new(Key::name_only("x"), "f", FailureKind::Panic, "m")
            .on_worker("tcp://1.2.3.4:5");
        let b = postcard::to_stdvec(&f).unwrap();
        assert_eq!(postcard::from_bytes::<TaskFailure>(&b).unwrap(), f);
    }
}
