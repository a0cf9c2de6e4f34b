//! The same request/reply code over `inproc://`, `tcp://`, `tls://` and `ucx://`: a server
//! task answers each message with its frames reversed, on the channel it came on; the client
//! checks. Every connection also proves a shared secret first (`Options::secret`); `tls://`
//! uses a certificate generated for the run.
//!
//! ```text
//! cargo run -p ucxrs-transport --example over_every_backend
//! ```

use std::time::Instant;

use transport::{connect_with, listen_with, Address, Message, Options};

async fn round_trips(addr: &str, opts: &Options) -> Result<(), transport::Error> {
    let mut listener = listen_with(&addr.parse::<Address>()?, opts).await?;
    let bound = listener.local_addr().clone();
    let server = tokio::spawn(async move {
        let conn = listener.accept().await?;
        // Until the client closes: answer on the same channel, frames reversed.
        while let Ok((channel, mut msg)) = conn.recv().await {
            msg.frames.reverse();
            conn.send(channel, msg).await?;
        }
        Ok::<_, transport::Error>(())
    });
    let client = connect_with(&bound, opts).await?;
    let t0 = Instant::now();
    for i in 0..100u32 {
        let frames = vec![format!("request {i}").into_bytes(), vec![i as u8; 64 << 10]];
        client.send(i % 4, Message::from(frames)).await?;
        let (channel, reply) = client.recv().await?;
        assert_eq!(channel, i % 4);
        assert_eq!(reply.frames[0].len(), 64 << 10);
        assert_eq!(reply.host(1), Some(format!("request {i}").as_bytes()));
    }
    let per = t0.elapsed() / 100;
    client.close().await?;
    server.await.expect("server task")?;
    println!(
        "{:<28} 100 request/replies of 64 KiB, {per:?} each",
        bound.to_string()
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), transport::Error> {
    // UCX progress by polling: the lowest latency when a core can spin (the default, a
    // progress thread, suits many idle connections better).
    let chosen = transport::configure_ucx(transport::UcxIntent {
        progress: ucx::ProgressMode::Polling,
        ..Default::default()
    })?;
    println!("UCX: {chosen}");
    let cert = transport::tls::ClusterCertificate::generate(&[])?;
    let opts = Options {
        secret: Some(transport::auth::Secret::generate()),
        tls: Some(transport::tls::TlsConfig::cluster(&cert)?),
        ..Default::default()
    };
    for addr in [
        "inproc://example",
        "tcp://127.0.0.1:0",
        "tls://127.0.0.1:0",
        "ucx://127.0.0.1:0",
    ] {
        round_trips(addr, &opts).await?;
    }
    Ok(())
}
