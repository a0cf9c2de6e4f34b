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
/// keeps its own `main`).
pub type NamedTest<'a> = (&'a str, Box<dyn Fn() + 'a>);

/// Runs `tests` in order, those whose name contains the first command-line argument (when
/// there is one that is not a flag), printing a line for each and a closing line as
/// libtest's; a test fails by panicking, which ends the run with the panic's status.
///
/// ```
/// let ran = std::cell::Cell::new(0);
/// test_support::run_tests(vec![("counts", Box::new(|| ran.set(ran.get() + 1)))]);
/// assert_eq!(ran.get(), 1);
/// ```
pub fn run_tests(tests: Vec<NamedTest<'_>>) {
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let mut ran = 0;
    for (name, t) in tests {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let t0 = std::time::Instant::now();
        t();
        println!("test {name} ... ok ({:.1?})", t0.elapsed());
        ran += 1;
    }
    println!("test result: ok. {ran} passed");
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
