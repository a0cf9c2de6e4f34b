//! Echo server and client over UCX, host buffers, in one process (two workers).
//!
//! The server echoes every message, whatever its size (it probes, then allocates), on the tag
//! it came on; the client checks every byte.
//!
//! ```text
//! cargo run --release --example echo
//! ```

use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ucx::Result<()> {
    let ctx = Context::new()?;
    let server_worker = Worker::new(&ctx, ProgressMode::Blocking)?;
    let client_worker = Worker::new(&ctx, ProgressMode::Blocking)?;
    let mut listener = Listener::bind(&server_worker, "127.0.0.1:0".parse().unwrap())?;
    let port = listener.port();
    println!("listening on 127.0.0.1:{port}");

    let server = tokio::spawn(async move {
        let ep = listener.accept().await?;
        let mut echoed = 0u32;
        // Serve until the client closes: its close fails our pending receive.
        while let Ok(msg) = ep.recv_vec(1).await {
            let (r, _) = ep.send(msg, 1).await;
            r?;
            echoed += 1;
        }
        Ok::<_, ucx::Error>(echoed)
    });

    let ep = Endpoint::connect(&client_worker, ("127.0.0.1", port)).await?;
    for size in [1usize, 100, 10_000, 1 << 20, 16 << 20] {
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let t0 = std::time::Instant::now();
        let (r, data) = ep.send(data, 1).await;
        r?;
        let (n, back) = ep.recv(Vec::with_capacity(size), 1).await;
        assert_eq!(n?, size);
        assert_eq!(back, data, "echo differs");
        println!("{size:>9} bytes echoed in {:?}", t0.elapsed());
    }
    ep.close().await?;
    let echoed = server.await.expect("server task")?;
    println!("server echoed {echoed} messages");
    Ok(())
}
