//! Driving real processes in tests, benchmarks and tools.
//!
//! Every server tool of the stack (`ucx-echo`, `ucx-gpu-echo`, `transport-echo`, `ucxx-peer`,
//! and the dask-comm processes) prints one line, `LISTENING <address>`, once it accepts
//! connections. [`listening`] reads it, with a time limit, so a test never hangs on a server
//! that failed to start.
//!
//! ```
//! use std::process::{Command, Stdio};
//! let mut child = Command::new("sh")
//!     .args(["-c", "echo LISTENING 127.0.0.1:4242"])
//!     .stdout(Stdio::piped())
//!     .spawn()
//!     .unwrap();
//! let addr = test_support::listening(&mut child, std::time::Duration::from_secs(10)).unwrap();
//! assert_eq!(addr, "127.0.0.1:4242");
//! assert_eq!(test_support::port_of(&addr), Some(4242));
//! child.wait().unwrap();
//! ```

use std::io::{BufRead, BufReader, Error, ErrorKind};
use std::process::Child;
use std::sync::mpsc;
use std::time::Duration;

/// Reads the child's first line of output, which must be `LISTENING <address>`, and returns
/// the address. The child must have been spawned with a piped stdout (taken here). Fails,
/// without waiting longer, when the child says something else, closes its output, or says
/// nothing within `limit`.
pub fn listening(child: &mut Child, limit: Duration) -> std::io::Result<String> {
    let out = child
        .stdout
        .take()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "the server's stdout is not piped"))?;
    let (tx, rx) = mpsc::channel();
    // A reader thread, so that the wait is bounded: a blocked read cannot be timed out.
    std::thread::spawn(move || {
        let mut line = String::new();
        let r = BufReader::new(out).read_line(&mut line).map(|_| line);
        let _ = tx.send(r);
    });
    let line = rx.recv_timeout(limit).map_err(|_| {
        Error::new(
            ErrorKind::TimedOut,
            format!("the server printed no LISTENING line within {limit:?}"),
        )
    })??;
    line.strip_prefix("LISTENING ")
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .ok_or_else(|| Error::new(ErrorKind::InvalidData, format!("the server said {line:?}")))
}

/// [`listening`], for servers that print a port (or an address ending in one): the port.
pub fn listening_port(child: &mut Child, limit: Duration) -> std::io::Result<u16> {
    let address = listening(child, limit)?;
    port_of(&address).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidData,
            format!("the server listens on {address:?}, which has no port"),
        )
    })
}

/// How long tools and tests wait for a server's `LISTENING` line.
pub const START_LIMIT: Duration = Duration::from_secs(60);

/// The port of an address printed as `PORT`, `HOST:PORT` or `SCHEME://HOST:PORT`.
///
/// ```
/// assert_eq!(test_support::port_of("13337"), Some(13337));
/// assert_eq!(test_support::port_of("ucx://[::1]:80"), Some(80));
/// assert_eq!(test_support::port_of("inproc://x"), None);
/// ```
pub fn port_of(address: &str) -> Option<u16> {
    address.rsplit(':').next()?.parse().ok()
}

/// One named test of a harness-less test binary (one whose processes re-execute it, so it
/// keeps its own `main`): a test of the fast tier, run by every `cargo test`.
pub type NamedTest<'a> = (&'a str, Box<dyn Fn() + 'a>);

/// The tests of a harness-less test binary, in the two tiers libtest has: fast tests, and
/// drills (long, heavy or needing more than this machine: libtest's `#[ignore = "drill: .."]`).
/// [`Tests::run`] reads the command line as libtest does: a filter (the first argument that is
/// not a flag), `--ignored` (only the drills), `--include-ignored` (both tiers), `--list`.
///
/// ```
/// let ran = std::cell::Cell::new(0);
/// let mut tests = test_support::Tests::new();
/// tests.fast("counts", || ran.set(ran.get() + 1));
/// tests.drill("counts_a_million", "a million rounds", || ran.set(ran.get() + 1_000_000));
/// tests.run_with(&[]);
/// assert_eq!(ran.get(), 1);
/// tests.run_with(&["--include-ignored".to_string()]);
/// assert_eq!(ran.get(), 1_000_002);
/// ```
#[derive(Default)]
pub struct Tests<'a> {
    tests: Vec<Entry<'a>>,
}

/// One test: its name, why it is a drill (`None`: of the fast tier), and the test.
struct Entry<'a> {
    name: &'a str,
    drill: Option<&'a str>,
    run: Box<dyn Fn() + 'a>,
}

impl std::fmt::Debug for Tests<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.tests.iter().map(|t| (t.name, t.drill)).collect();
        f.debug_struct("Tests").field("tests", &names).finish()
    }
}

impl<'a> Tests<'a> {
    /// No tests yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A test of the fast tier.
    pub fn fast(&mut self, name: &'a str, test: impl Fn() + 'a) -> &mut Self {
        self.tests.push(Entry {
            name,
            drill: None,
            run: Box::new(test),
        });
        self
    }

    /// A drill: run only with `--ignored` or `--include-ignored`; `why` says what makes it one
    /// (printed where it is left out, as libtest prints an ignore reason).
    pub fn drill(&mut self, name: &'a str, why: &'a str, test: impl Fn() + 'a) -> &mut Self {
        self.tests.push(Entry {
            name,
            drill: Some(why),
            run: Box::new(test),
        });
        self
    }

    /// Runs the tests this process's command line selects (see [`Tests`]).
    pub fn run(&self) {
        let args: Vec<String> = std::env::args().skip(1).collect();
        self.run_with(&args);
    }

    /// Runs the tests that `args` (a command line without the program) selects, in order,
    /// printing a line for each and a closing line as libtest's; a test fails by panicking,
    /// which ends the run with the panic's status.
    pub fn run_with(&self, args: &[String]) {
        let flag = |f: &str| args.iter().any(|a| a == f);
        let (only_drills, both) = (flag("--ignored"), flag("--include-ignored"));
        let filter = args.iter().find(|a| !a.starts_with('-'));
        let selected = |name: &str| match filter {
            Some(f) => name.contains(f.as_str()),
            None => true,
        };
        if flag("--list") {
            for t in self.tests.iter().filter(|t| selected(t.name)) {
                println!("{}: test", t.name);
            }
            return;
        }
        let t0 = std::time::Instant::now();
        let (mut ran, mut ignored, mut filtered) = (0, 0, 0);
        for Entry { name, drill, run } in &self.tests {
            if !selected(name) {
                filtered += 1;
                continue;
            }
            let runs = match drill {
                Some(_) => only_drills || both,
                None => !only_drills,
            };
            if !runs {
                match drill {
                    Some(why) => println!("test {name} ... ignored, drill: {why}"),
                    None => println!("test {name} ... ignored, not a drill"),
                }
                ignored += 1;
                continue;
            }
            let t = std::time::Instant::now();
            run();
            println!("test {name} ... ok ({:.1?})", t.elapsed());
            ran += 1;
        }
        println!(
            "test result: ok. {ran} passed; 0 failed; {ignored} ignored; 0 measured; \
             {filtered} filtered out; finished in {:.2}s",
            t0.elapsed().as_secs_f64()
        );
    }
}

/// Runs `tests`, all of the fast tier, as [`Tests::run`] does.
///
/// ```
/// let ran = std::cell::Cell::new(0);
/// test_support::run_tests(vec![("counts", Box::new(|| ran.set(ran.get() + 1)))]);
/// assert_eq!(ran.get(), 1);
/// ```
pub fn run_tests(tests: Vec<NamedTest<'_>>) {
    let mut all = Tests::new();
    for (name, test) in tests {
        all.fast(name, test);
    }
    all.run();
}

/// Whether this run is CI's (the `CI` variable set and not empty, as CI services set it).
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// A test that cannot run here, for want of something CI is expected to have (root, network
/// namespaces, a launcher, IPv6): outside CI it prints why and the caller returns; in CI it
/// fails, since a skip there would pass a check that did not run.
pub fn skip_unless_ci(why: &str) {
    assert!(!in_ci(), "CI must be able to run this test: {why}");
    eprintln!("skipped: {why}");
}

/// A test that needs a GPU and has none: prints why, and, where `TEST_SKIPS_FILE` names a
/// file (scripts/test.sh sets it), appends a line to it so the run's summary lists every
/// test that did not run its device part. Never fails, in CI either: CI has no GPU.
pub fn skip_without_gpu(test: &str, why: &str) {
    eprintln!("skipped (no GPU): {test}: {why}");
    if let Some(path) = std::env::var_os("TEST_SKIPS_FILE") {
        use std::io::Write;
        let line = format!("{test}: {why}\n");
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn sh(script: &str) -> Child {
        Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    }

    #[test]
    fn refuses_other_output_and_silence() {
        let mut c = sh("echo hello");
        let e = listening(&mut c, Duration::from_secs(10)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        c.wait().unwrap();
        let mut c = sh("exit 3");
        assert!(listening(&mut c, Duration::from_secs(10)).is_err());
        c.wait().unwrap();
        let mut c = sh("sleep 5");
        let e = listening(&mut c, Duration::from_millis(100)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut);
        c.kill().unwrap();
        c.wait().unwrap();
    }
}
