//! Hostile peers cannot take a server's memory: 200 connections that each send a valid header
//! announcing one 3 GiB frame, then 100 bytes (or nothing), and hold the connection open,
//! against a `transport-echo server` process, while a good client keeps echoing. The good
//! client is served, the server's RSS (sampled) stays under 1 GiB, and the server lives.
//!
//! Over `tcp://` and `tls://` the server grows a frame's buffer only as bytes arrive. Over `ucx://` the
//! frame's receive is posted into memory that is reserved but never touched until bytes land.
//! (`inproc://` peers live in the same process and hand over whole messages: nothing is
//! announced before it exists.)

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use transport::frame::{self, FrameMeta};
use transport::{connect_with, Address, Message, Options};

mod common;
use common::EchoProcess;

const BIN: &str = env!("CARGO_BIN_EXE_transport-echo");
const HOSTILE: usize = 200;
const ANNOUNCED: u64 = 3 << 30;
const RSS_LIMIT_MIB: f64 = 1024.0;

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A valid header announcing one frame of [`ANNOUNCED`] bytes on channel 1.
fn announcement() -> Vec<u8> {
    frame::encode(
        1,
        &[FrameMeta {
            size: ANNOUNCED,
            cuda: false,
        }],
    )
}

/// Echoes 64 KiB messages for a while, sampling the server's RSS; returns the largest sample.
async fn good_client(server: &mut EchoProcess, addr: &Address) -> f64 {
    let opts = common::for_addr(&addr.to_string(), &Options::default());
    let conn = connect_with(addr, &opts)
        .await
        .expect("the good client connects");
    let pid = server.0.id();
    let payload = vec![0x5au8; 64 << 10];
    let mut peak: f64 = rss_mib(pid);
    let t0 = Instant::now();
    for i in 0..200 {
        let sent = Message::from(vec![payload.clone()]);
        tokio::time::timeout(Duration::from_secs(20), async {
            conn.send(2, sent).await.expect("send");
            let (ch, back) = conn.recv().await.expect("echo");
            assert_eq!(ch, 2);
            assert_eq!(
                back.frames[0].as_host().expect("host frame")[..],
                payload[..]
            );
        })
        .await
        .unwrap_or_else(|_| panic!("echo {i} took over 20 s"));
        if i % 10 == 0 {
            peak = peak.max(rss_mib(pid));
        }
        if t0.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    assert!(
        server.0.try_wait().expect("wait").is_none(),
        "the server died"
    );
    peak.max(rss_mib(pid))
}

/// While the hostile peers hold on: the good client is served and the server's RSS peak stays
/// under the limit.
fn served_within_limit(scheme: &str, server: &mut EchoProcess, addr: &Address) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let peak = rt.block_on(good_client(server, addr));
    eprintln!("{scheme}: {HOSTILE} peers announcing 3 GiB each; server peak RSS {peak:.0} MiB");
    assert!(peak < RSS_LIMIT_MIB, "server RSS {peak:.0} MiB");
}

#[test]
fn tcp_announcements_cost_nothing() {
    let (mut server, addr) = EchoProcess::start(BIN, "tcp");
    let Address::Tcp { host, port } = &addr else {
        panic!("{addr}")
    };
    let mut hostile = Vec::with_capacity(HOSTILE);
    for i in 0..HOSTILE {
        let mut s = TcpStream::connect((host.as_str(), *port)).expect("connect");
        s.write_all(&announcement()).expect("header");
        if i % 2 == 0 {
            s.write_all(&[7u8; 100]).expect("100 bytes");
        }
        hostile.push(s);
    }
    served_within_limit("tcp", &mut server, &addr);
    drop(hostile);
}

/// Over `tls://` the hostile peers are insiders: they hold the cluster's certificate, finish
/// the TLS handshake, then announce 3 GiB. The frame grows with what arrives, as on `tcp://`.
#[test]
fn tls_announcements_cost_nothing() {
    let (mut server, addr) = EchoProcess::start(BIN, "tls");
    let Address::Tls { host, port } = &addr else {
        panic!("{addr}")
    };
    let config = common::test_tls().0.client_config();
    let mut hostile = Vec::with_capacity(HOSTILE);
    for i in 0..HOSTILE {
        let s = TcpStream::connect((host.as_str(), *port)).expect("connect");
        let name = rustls::pki_types::ServerName::try_from(host.clone()).expect("a name");
        let tls = rustls::ClientConnection::new(std::sync::Arc::clone(&config), name)
            .expect("a TLS client");
        let mut s = rustls::StreamOwned::new(tls, s);
        s.write_all(&announcement()).expect("handshake and header");
        if i % 2 == 0 {
            s.write_all(&[7u8; 100]).expect("100 bytes");
        }
        s.flush().expect("flush");
        hostile.push(s);
    }
    served_within_limit("tls", &mut server, &addr);
    drop(hostile);
}

#[test]
fn ucx_announcements_cost_nothing() {
    let (mut server, addr) = EchoProcess::start(BIN, "ucx");
    let Address::Ucx { host, port } = &addr else {
        panic!("{addr}")
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctx = ucx::Context::new().expect("UCX context");
        let worker = ucx::Worker::new(&ctx, ucx::ProgressMode::Blocking).expect("UCX worker");
        let mut hostile = Vec::with_capacity(HOSTILE);
        for i in 0..HOSTILE {
            let ep = tokio::time::timeout(
                Duration::from_secs(20),
                ucx::Endpoint::connect(&worker, (host.as_str(), *port)),
            )
            .await
            .expect("connects in time")
            .expect("connect");
            common::decline_rings(&ep).await;
            let (r, _) = ep.send(announcement(), transport::UCX_TAG).await;
            r.expect("header");
            if i % 2 == 0 {
                // Arrives where the 3 GiB frame was posted: a short frame, refused.
                let (r, _) = ep.send(vec![7u8; 100], transport::UCX_TAG).await;
                r.expect("100 bytes");
            }
            hostile.push(ep);
        }
        let peak = good_client(&mut server, &addr).await;
        eprintln!("ucx: {HOSTILE} peers announcing 3 GiB each; server peak RSS {peak:.0} MiB");
        assert!(peak < RSS_LIMIT_MIB, "server RSS {peak:.0} MiB");
        drop(hostile);
    });
}
