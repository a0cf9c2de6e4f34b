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

/// `addr`, with a unique suffix for `inproc://` names (process-wide; tests run in parallel).
#[allow(dead_code)] // not every test file uses every helper
pub fn unique(addr: &str) -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    if addr.starts_with("inproc://") {
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        format!("{addr}-{n}")
    } else {
        addr.to_string()
    }
}

/// A `ucx://` listening address whose connections the helpers make with
/// [`Options::ucx_direct`] on both sides (by name: the other suites use 127.0.0.1): suites run over it as
/// one more backend.
#[cfg(feature = "ucx")]
#[allow(dead_code)] // not every test file uses every helper
pub const UCX_DIRECT: &str = "ucx://localhost:0";

/// `opts` with the test cluster's certificate for a `tls://` address that has none.
#[allow(dead_code)] // not every test file uses every helper
pub fn for_addr(addr: &str, opts: &Options) -> Options {
    #[cfg(feature = "ucx")]
    if addr.starts_with(UCX_DIRECT) {
        return Options {
            ucx_direct: true,
            ..opts.clone()
        };
    }
    #[cfg(feature = "tls")]
    if addr.starts_with("tls://") && opts.tls.is_none() {
        return Options {
            tls: Some(test_tls().0.clone()),
            ..opts.clone()
        };
    }
    let _ = addr;
    opts.clone()
}

/// This test process's cluster certificate: its configuration, and a folder holding it as
/// `cert.pem` and `key.pem` (for `transport-echo --tls-dir`).
#[cfg(feature = "tls")]
#[allow(dead_code)] // not every test file uses every helper
pub fn test_tls() -> &'static (transport::tls::TlsConfig, std::path::PathBuf) {
    static TLS: std::sync::OnceLock<(transport::tls::TlsConfig, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    TLS.get_or_init(|| {
        let pair = transport::tls::ClusterCertificate::generate(&[]).unwrap();
        let dir = std::env::temp_dir().join(format!("transport-test-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cert.pem"), &pair.cert_pem).unwrap();
        std::fs::write(dir.join("key.pem"), &pair.key_pem).unwrap();
        (transport::tls::TlsConfig::cluster(&pair).unwrap(), dir)
    })
}

/// [`pair`] with `opts` on both sides.
#[allow(dead_code)] // not every test file uses every helper
pub async fn pair_with(addr: &str, opts: &Options) -> (Connection, Connection) {
    let opts = &for_addr(addr, opts);
    let addr = unique(addr);
    let mut l = transport::listen_with(&addr.parse::<Address>().unwrap(), opts)
        .await
        .unwrap();
    let a = l.local_addr().clone();
    let (s, c) = tokio::time::timeout(STEP, async {
        tokio::join!(l.accept(), transport::connect_with(&a, opts))
    })
    .await
    .expect("connect in time");
    let (s, c) = (s.unwrap(), c.unwrap());
    // Both sides moved exactly when the options asked for it (a silent fallback would leave
    // the ucx_direct suites testing the client-server endpoint).
    assert_eq!(
        s.is_ucx_direct(),
        opts.ucx_direct && addr.starts_with("ucx://"),
        "{addr}"
    );
    assert_eq!(c.is_ucx_direct(), s.is_ucx_direct(), "{addr}");
    (s, c)
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
    let (server, raw) = tokio::join!(l.accept(), async {
        let raw = ::ucx::Endpoint::connect(worker, ("127.0.0.1", port))
            .await
            .unwrap();
        decline_rings(&raw).await;
        raw
    });
    (server.unwrap(), raw)
}

/// The ring exchange every `ucx://` connection starts with, from a raw peer that has no ring
/// and takes none.
#[cfg(feature = "ucx")]
#[allow(dead_code)] // not every test file uses every helper
pub async fn decline_rings(raw: &::ucx::Endpoint) {
    let (r, _) = raw.send(vec![0u8], transport::UCX_RING_OFFER_TAG).await;
    r.unwrap();
    raw.recv_vec(transport::UCX_RING_OFFER_TAG).await.unwrap();
    let (r, _) = raw.send(vec![0u8], transport::UCX_RING_VERDICT_TAG).await;
    r.unwrap();
    raw.recv_vec(transport::UCX_RING_VERDICT_TAG).await.unwrap();
}

/// A `transport-echo server` process (`bin`, the test's `CARGO_BIN_EXE_transport-echo`)
/// listening on `scheme://127.0.0.1:0`, killed when dropped.
#[allow(dead_code)]
pub struct EchoProcess(pub std::process::Child);

#[allow(dead_code)]
impl EchoProcess {
    /// Starts it and reads the address it prints.
    pub fn start(bin: &str, scheme: &str) -> (EchoProcess, Address) {
        Self::start_with(bin, scheme, &[])
    }

    /// [`start`](Self::start) with more `transport-echo server` flags.
    pub fn start_with(bin: &str, scheme: &str, flags: &[&str]) -> (EchoProcess, Address) {
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["server", "--listen", &format!("{scheme}://127.0.0.1:0")]);
        cmd.args(flags);
        #[cfg(feature = "tls")]
        if scheme == "tls" {
            cmd.arg("--tls-dir").arg(&test_tls().1);
        }
        let mut child = cmd
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
