//! Echo servers as child processes (the tool's demo, the multi-process tests, the benches).

use std::io::{BufRead, BufReader, Error, ErrorKind};
use std::process::Child;

/// Reads the `LISTENING <port>` line that `ucx-echo server` prints once it accepts
/// connections. The child must have been spawned with a piped stdout.
pub fn listening_port(child: &mut Child) -> std::io::Result<u16> {
    let out = child
        .stdout
        .take()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "the server's stdout is not piped"))?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    line.strip_prefix("LISTENING ")
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| Error::new(ErrorKind::InvalidData, format!("the server said {line:?}")))
}
