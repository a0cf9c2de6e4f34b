//! Helpers shared by the in-process integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ucx::{Context, Endpoint, IoBuf, IoBufMut, Listener, ProgressMode, Worker};

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

/// A receive/send buffer over test-owned memory that is never freed. Dropping it fills the
/// memory with a canary and records the drop, so a test can see whether UCX wrote into (or
/// read from) the memory after the buffer was given up.
pub struct Canary {
    mem: *mut u8,
    len: usize,
    dropped: Arc<AtomicBool>,
}

// SAFETY: the memory is leaked (never freed) and only reached through this value.
unsafe impl Send for Canary {}

pub const CANARY: u8 = 0xAA;

impl Canary {
    pub fn new(contents: Vec<u8>) -> (Canary, &'static [u8], Arc<AtomicBool>) {
        let mem: &'static mut [u8] = Box::leak(contents.into_boxed_slice());
        let dropped = Arc::new(AtomicBool::new(false));
        let view: &'static [u8] =
            // SAFETY: the leaked memory lives forever; the test only reads it after the buffer
            // has been dropped (or to compare), which is exactly what it checks.
            unsafe { std::slice::from_raw_parts(mem.as_ptr(), mem.len()) };
        let c = Canary {
            mem: mem.as_mut_ptr(),
            len: mem.len(),
            dropped: Arc::clone(&dropped),
        };
        (c, view, dropped)
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        // SAFETY: mem is valid for len bytes for the whole program (leaked).
        unsafe { std::ptr::write_bytes(self.mem, CANARY, self.len) };
        self.dropped.store(true, Ordering::SeqCst);
    }
}

// SAFETY: the pointer is stable (leaked heap memory) and valid for len bytes.
unsafe impl IoBuf for Canary {
    fn stable_ptr(&self) -> *const u8 {
        self.mem
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
}

// SAFETY: as above, writable for len bytes.
unsafe impl IoBufMut for Canary {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.mem
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
    unsafe fn set_init(&mut self, _n: usize) {}
}
