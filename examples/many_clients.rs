//! One listener, many clients at once: each client sends its id and gets it back.
//!
//! ```text
//! cargo run --release --example many_clients -- 100
//! ```

use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ucx::Result<()> {
    let clients: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    let ctx = Context::new()?;
    let server_worker = Worker::new(&ctx, ProgressMode::Thread)?;
    let client_worker = Worker::new(&ctx, ProgressMode::Thread)?;
    let mut listener = Listener::bind(&server_worker, "127.0.0.1:0".parse().unwrap())?;
    let port = listener.port();

    let server = tokio::spawn(async move {
        let mut handlers = Vec::new();
        for _ in 0..clients {
            let ep = listener.accept().await?;
            handlers.push(tokio::spawn(async move {
                let id = ep.recv_vec(0).await?;
                let (r, _) = ep.send(id, 0).await;
                r?;
                // Wait for the client to close.
                let _ = ep.recv_vec(0).await;
                Ok::<_, ucx::Error>(())
            }));
        }
        for h in handlers {
            h.await.expect("handler")?;
        }
        Ok::<_, ucx::Error>(())
    });

    let t0 = std::time::Instant::now();
    let mut tasks = Vec::new();
    for id in 0..clients as u64 {
        let w = client_worker.clone();
        tasks.push(tokio::spawn(async move {
            let ep = Endpoint::connect(&w, ("127.0.0.1", port)).await?;
            let (r, _) = ep.send(id.to_le_bytes().to_vec(), 0).await;
            r?;
            let back = ep.recv_vec(0).await?;
            assert_eq!(back, id.to_le_bytes());
            ep.close().await
        }));
    }
    for t in tasks {
        t.await.expect("client")?;
    }
    server.await.expect("server")?;
    println!(
        "{clients} clients connected, echoed and closed in {:?}",
        t0.elapsed()
    );
    Ok(())
}
