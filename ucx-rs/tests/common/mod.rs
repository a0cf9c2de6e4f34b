//! Helpers shared by the in-process integration tests.
#![allow(dead_code)]

use std::time::Duration;

use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};

pub const MODES: [ProgressMode; 3] = [
    ProgressMode::Polling,
    ProgressMode::Blocking,
    ProgressMode::Thread,
];

/// Upper bound for any single step in a test; tests fail instead of hanging.
pub const STEP: Duration = Duration::from_secs(20);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

pub fn context() -> Context {
    init_tracing();
    Context::builder()
        .option("KEEPALIVE_INTERVAL", "1s")
        .build()
        .expect("UCX context")
}

/// A connected pair on two workers of the same mode: (server side, client side).
pub async fn pair(ctx: &Context, mode: ProgressMode) -> (Endpoint, Endpoint, Worker, Worker) {
    let sw = Worker::new(ctx, mode).expect("server worker");
    let cw = Worker::new(ctx, mode).expect("client worker");
    let mut listener = Listener::bind(&sw, "127.0.0.1:0".parse().unwrap()).expect("listen");
    let addr = listener.local_addr();
    let (s, c) = tokio::time::timeout(STEP, async {
        tokio::join!(listener.accept(), Endpoint::connect(&cw, addr))
    })
    .await
    .expect("connect within the step limit");
    (s.expect("accept"), c.expect("connect"), sw, cw)
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(STEP, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {STEP:?}"))
}
