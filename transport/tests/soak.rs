//! Soak: many messages of mixed sizes on one connection, per backend, with this process's RSS
//! sampled at every tenth of the run; after the first three tenths (pools and caches warm), it
//! must stay within 10% of what it was then, plus two of the largest (4 MiB) messages.
//!
//! A drill (`cargo test -p ucxrs-transport --test soak -- --ignored`): 200,000 messages per backend;
//! `SOAK_MESSAGES=10000000` (in `scripts/faults.sh`) the long run. Sizes: mostly 8 B–4 KiB,
//! one in 1,000 of 256 KiB, one in 10,000 of 4 MiB; the receiver checks each message's size
//! and first byte. The sender runs ahead of the receiver as far as the backend lets it
//! (credits, socket buffers, channel capacity). `SOAK_RSS_CHECK=0` skips the RSS check (for
//! runs under valgrind, whose own memory is in the RSS).

use std::time::{Duration, Instant};

use transport::{connect_with, listen_with, Address, Message, Options};

mod common;

const SAMPLES: u64 = 10;
/// The largest message, in MiB (see [`size_of`]).
const LARGEST_MIB: f64 = 4.0;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn size_of(i: u64) -> usize {
    if i % 10_000 == 9_999 {
        4 << 20
    } else if i % 1_000 == 999 {
        256 << 10
    } else {
        8 << (i % 10) // 8 B .. 4 KiB
    }
}

async fn soak(at: &str, n: u64) -> Vec<f64> {
    let opts = common::for_addr(at, &Options::default());
    let mut listener = listen_with(&at.parse::<Address>().expect("address"), &opts)
        .await
        .expect("listen");
    let addr = listener.local_addr().clone();
    let (server, client) = tokio::join!(listener.accept(), connect_with(&addr, &opts));
    let (server, client) = (server.expect("accept"), client.expect("connect"));
    let sender = tokio::spawn(async move {
        for i in 0..n {
            let msg = Message::from(vec![vec![(i % 251) as u8; size_of(i)]]);
            client.send(1, msg).await.expect("send");
        }
        client
    });
    let every = (n / SAMPLES).max(1);
    let mut samples = Vec::new();
    for i in 0..n {
        let (_, msg) = server.recv().await.expect("recv");
        let f = msg.frames[0].as_host().expect("host frame");
        assert_eq!(f.len(), size_of(i), "message {i}");
        assert_eq!(f.first().copied(), Some((i % 251) as u8), "message {i}");
        if (i + 1) % every == 0 {
            samples.push(rss_mib());
        }
    }
    let client = sender.await.expect("sender");
    client.close().await.expect("close");
    samples
}

#[test]
#[ignore = "drill: 200,000 messages on each of four backends"]
fn mixed_sizes_on_one_connection_keep_memory_flat() {
    let n: u64 = std::env::var("SOAK_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for at in [
        "inproc://soak",
        "tcp://127.0.0.1:0",
        #[cfg(feature = "tls")]
        "tls://127.0.0.1:0",
        #[cfg(feature = "ucx")]
        "ucx://127.0.0.1:0",
    ] {
        let t0 = Instant::now();
        let samples = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(1800), soak(at, n)).await })
            .unwrap_or_else(|_| panic!("{at}: the soak did not finish in 30 minutes"));
        let secs = t0.elapsed().as_secs_f64();
        // The first three tenths warm pools and caches; the rest must not exceed them by more
        // than 10%, plus two of the largest messages: in a process of 15 MiB, whether a 4 MiB
        // buffer is in flight or still held by the allocator at a sample is more than 10%.
        let base = samples.iter().take(3).copied().fold(0.0, f64::max);
        let high = samples.iter().skip(3).copied().fold(base, f64::max);
        let allowed = base * 1.10 + 2.0 * LARGEST_MIB;
        let shown: Vec<String> = samples.iter().map(|m| format!("{m:.0}")).collect();
        eprintln!(
            "{at}: {n} messages in {secs:.1} s ({:.0}/s); RSS MiB at each tenth: {} \
             (bound {allowed:.0} MiB)",
            n as f64 / secs,
            shown.join(" ")
        );
        // Under valgrind (`SOAK_RSS_CHECK=0`, scripts/faults.sh) RSS is valgrind's own.
        let check = std::env::var("SOAK_RSS_CHECK").map_or(true, |v| v != "0");
        assert!(
            !check || high <= allowed,
            "{at}: RSS grew from {base:.0} to {high:.0} MiB (allowed {allowed:.0})"
        );
    }
}
