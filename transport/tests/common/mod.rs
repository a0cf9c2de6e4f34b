//! Helpers shared by the integration tests.

use std::time::Duration;

use transport::{connect, listen, Address, Connection};

/// Time limit for one step of a test (connect, a batch of messages).
pub const STEP: Duration = Duration::from_secs(60);

/// A connected (server, client) pair on `addr` (port 0 picks a free port; `inproc://` names
/// get a unique suffix, since they are process-wide and tests run in parallel).
pub async fn pair(addr: &str) -> (Connection, Connection) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let addr = if addr.starts_with("inproc://") {
        format!(
            "{addr}-{}",
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        )
    } else {
        addr.to_string()
    };
    let mut l = listen(&addr.parse::<Address>().unwrap()).await.unwrap();
    let a = l.local_addr().clone();
    let (s, c) = tokio::time::timeout(STEP, async { tokio::join!(l.accept(), connect(&a)) })
        .await
        .expect("connect in time");
    (s.unwrap(), c.unwrap())
}
