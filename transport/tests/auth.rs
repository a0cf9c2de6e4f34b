//! The shared-secret challenge on every backend: both sides prove the secret; a wrong secret,
//! a peer without one, garbage and a silent stranger are dropped while good peers are served.

mod common;

use std::time::Duration;

use common::STEP;
use transport::auth::{AuthError, Secret, AUTH_CHANNEL};
use transport::{Address, Message, Options};

fn with(secret: &Secret) -> Options {
    Options {
        secret: Some(secret.clone()),
        ..Default::default()
    }
}

async fn listen(addr: &str, opts: &Options) -> transport::Listener {
    let addr = common::unique(addr);
    transport::listen_with(&addr.parse::<Address>().unwrap(), opts)
        .await
        .unwrap()
}

/// Accepts one connection (in the background) and echoes one message on it.
fn serve_one(mut l: transport::Listener) -> tokio::task::JoinHandle<transport::Listener> {
    tokio::spawn(async move {
        let c = l.accept().await.unwrap();
        let (ch, m) = c.recv().await.unwrap();
        c.send(ch, m).await.unwrap();
        l
    })
}

async fn echo_ok(addr: &Address, opts: &Options, n: usize) {
    let c = transport::connect_with(addr, opts).await.unwrap();
    c.send(3, Message::from(vec![vec![5u8; n]])).await.unwrap();
    let (ch, m) = c.recv().await.unwrap();
    assert_eq!((ch, m.len()), (3, n));
}

async fn challenge(addr: &str) {
    let secret = Secret::generate();
    let good = common::for_addr(addr, &with(&secret));
    let l = listen(addr, &good).await;
    let at = l.local_addr().clone();
    tokio::time::timeout(STEP, async {
        // Both sides prove it; afterwards the limits are the options' again (a 1 MiB message).
        let server = serve_one(l);
        echo_ok(&at, &good, 1 << 20).await;
        let l = server.await.unwrap();

        // A wrong secret fails at connect, typed; the listener goes on to the next peer.
        let server = serve_one(l);
        let e = transport::connect_with(&at, &common::for_addr(addr, &with(&Secret::generate())))
            .await
            .unwrap_err();
        assert!(
            matches!(e, transport::Error::Auth(AuthError::WrongSecret)),
            "{addr}: {e}"
        );
        echo_ok(&at, &good, 100).await;
        let l = server.await.unwrap();

        // A peer without the secret that sends a large message instead of the challenge: it
        // is refused by the challenge's limits (nothing allocated for it) and dropped.
        let server = serve_one(l);
        let plain = common::for_addr(addr, &Options::default());
        let stranger = transport::connect_with(&at, &plain).await.unwrap();
        let _hello = stranger.recv().await.unwrap();
        let _ = stranger
            .send(AUTH_CHANNEL, Message::from(vec![vec![0u8; 100_000]]))
            .await;
        let e = tokio::time::timeout(Duration::from_secs(20), stranger.recv())
            .await
            .expect("the stranger is dropped")
            .unwrap_err();
        assert!(e.close_reason().is_some(), "{addr}: {e}");
        // A silent stranger holds up no one: good peers are served while it waits.
        let silent = transport::connect_with(&at, &plain).await.unwrap();
        echo_ok(&at, &good, 100).await;
        drop(silent);
        server.await.unwrap();
    })
    .await
    .expect("in time");
}

/// A connector with a secret against a listener without one: the connector waits for a
/// challenge that never comes and fails within its time limit, typed.
async fn listener_without_secret(addr: &str) {
    let l = listen(addr, &common::for_addr(addr, &Options::default())).await;
    let at = l.local_addr().clone();
    let opts = Options {
        connect_timeout: Duration::from_secs(1),
        ..common::for_addr(addr, &with(&Secret::generate()))
    };
    let server = tokio::spawn(async move {
        let mut l = l;
        let c = l.accept().await.unwrap();
        // Says nothing; the connector's challenge step times out.
        let _ = tokio::time::timeout(Duration::from_secs(15), c.recv()).await;
    });
    let e = tokio::time::timeout(STEP, transport::connect_with(&at, &opts))
        .await
        .expect("in time")
        .unwrap_err();
    assert!(
        matches!(e, transport::Error::Auth(AuthError::Timeout(_))),
        "{addr}: {e}"
    );
    server.abort();
}

macro_rules! backends {
    ($name:ident, $addr:expr) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn challenge() {
                super::challenge($addr).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn listener_without_secret() {
                super::listener_without_secret($addr).await;
            }
        }
    };
}

backends!(inproc, "inproc://auth");
backends!(tcp, "tcp://127.0.0.1:0");
#[cfg(feature = "ucx")]
backends!(ucx, "ucx://127.0.0.1:0");
/// With `Options::ucx_direct`. The strangers' part of `challenge` (a peer refused mid-message,
/// then one dropped while silent) aborts the process in 5 runs of 12: UCX 1.13 asserts
/// (`ucp_ep.c:437`, requests left on an endpoint being destroyed) while the endpoint by address
/// closes. Known and unsolved (docs/transport.md), so it is a reproducer, not a test of either
/// tier: `RUSTFLAGS="--cfg ucx_abort_repro" cargo test -p ucxrs-transport --test auth ucx_direct`.
#[cfg(feature = "ucx")]
mod ucx_direct {
    #[cfg(ucx_abort_repro)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn challenge() {
        super::challenge(crate::common::UCX_DIRECT).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn listener_without_secret() {
        super::listener_without_secret(crate::common::UCX_DIRECT).await;
    }
}
#[cfg(feature = "tls")]
backends!(tls, "tls://127.0.0.1:0");

/// Raw garbage on a TCP socket (a port scanner, another protocol) is dropped before the
/// listener hands out anything, and costs it nothing: the good client is served after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_garbage_is_dropped() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let secret = Secret::generate();
    let l = listen("tcp://127.0.0.1:0", &with(&secret)).await;
    let at = l.local_addr().clone();
    let Address::Tcp { port, .. } = at.clone() else {
        unreachable!()
    };
    let server = serve_one(l);
    tokio::time::timeout(STEP, async {
        let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        // The challenge arrives, then the end of the stream: the listener dropped it.
        let mut got = Vec::new();
        let _ = raw.read_to_end(&mut got).await;
        assert!(got.len() < 200, "{} bytes", got.len());
        echo_ok(&at, &with(&secret), 100).await;
        server.await.unwrap();
    })
    .await
    .expect("in time");
}
