//! Helpers shared by the integration tests.

use std::time::Duration;

use transport::{Address, Connection, Options};

/// Time limit for one step of a test (connect, a batch of messages).
pub const STEP: Duration = Duration::from_secs(60);

/// A connected (server, client) pair on `addr` (port 0 picks a free port; `inproc://` names
/// get a unique suffix, since they are process-wide and tests run in parallel).
#[allow(dead_code)] // not every test file uses every helper
pub async fn pair(addr: &str) -> (Connection, Connection) {
    pair_with(addr, &Options::default()).await
}

/// [`pair`] with `opts` on both sides.
#[allow(dead_code)] // not every test file uses every helper
pub async fn pair_with(addr: &str, opts: &Options) -> (Connection, Connection) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let addr = if addr.starts_with("inproc://") {
        format!(
            "{addr}-{}",
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        )
    } else {
        addr.to_string()
    };
    let mut l = transport::listen_with(&addr.parse::<Address>().unwrap(), opts)
        .await
        .unwrap();
    let a = l.local_addr().clone();
    let (s, c) = tokio::time::timeout(STEP, async {
        tokio::join!(l.accept(), transport::connect_with(&a, opts))
    })
    .await
    .expect("connect in time");
    (s.unwrap(), c.unwrap())
}

/// A raw TCP socket connected to the TCP listener `l`, with the connection `l` accepted: for
/// peers that write the wire format (or garbage) by hand.
#[allow(dead_code)] // not every test file uses every helper
pub async fn raw_tcp(l: &mut transport::Listener) -> (Connection, tokio::net::TcpStream) {
    let Address::Tcp { port, .. } = l.local_addr().clone() else {
        panic!("not a tcp:// listener: {}", l.local_addr())
    };
    let raw = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    (l.accept().await.unwrap(), raw)
}

/// A raw `ucx-rs` endpoint (same handshake) connected from `worker` to the UCX listener `l`,
/// with the connection `l` accepted.
#[cfg(feature = "ucx")]
#[allow(dead_code)] // not every test file uses every helper
pub async fn raw_ucx(
    l: &mut transport::Listener,
    worker: &::ucx::Worker,
) -> (Connection, ::ucx::Endpoint) {
    let Address::Ucx { port, .. } = l.local_addr().clone() else {
        panic!("not a ucx:// listener: {}", l.local_addr())
    };
    let (server, raw) = tokio::join!(
        l.accept(),
        ::ucx::Endpoint::connect(worker, ("127.0.0.1", port))
    );
    (server.unwrap(), raw.unwrap())
}

/// A `transport-echo server` process (`bin`, the test's `CARGO_BIN_EXE_transport-echo`)
/// listening on `scheme://127.0.0.1:0`, killed when dropped.
#[allow(dead_code)]
pub struct EchoProcess(pub std::process::Child);

#[allow(dead_code)]
impl EchoProcess {
    /// Starts it and reads the address it prints.
    pub fn start(bin: &str, scheme: &str) -> (EchoProcess, Address) {
        let mut child = std::process::Command::new(bin)
            .args(["server", "--listen", &format!("{scheme}://127.0.0.1:0")])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("transport-echo starts");
        let addr = test_support::listening(&mut child, test_support::START_LIMIT)
            .expect("the server prints its address");
        (EchoProcess(child), addr.parse().expect("an address"))
    }
}

impl Drop for EchoProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
