//! Active messages: the receiver allocates. Small messages go eagerly, large ones by
//! rendezvous straight into the receiver's allocation.
//!
//! ```text
//! cargo run --release --example active_messages
//! ```

use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ucx::Result<()> {
    let ctx = Context::new()?;
    let a = Worker::new(&ctx, ProgressMode::Blocking)?;
    let b = Worker::new(&ctx, ProgressMode::Blocking)?;
    let mut listener = Listener::bind(&a, "127.0.0.1:0".parse().unwrap())?;
    let addr = listener.local_addr();
    let (server, client) = tokio::join!(listener.accept(), Endpoint::connect(&b, addr));
    let (server, client) = (server?, client?);
    for size in [0usize, 64, 1 << 20, 32 << 20] {
        let msg = vec![7u8; size];
        let (sent, got) = tokio::join!(client.am_send(msg), server.am_recv());
        sent.0?;
        let got = got?;
        assert_eq!(got.len(), size);
        println!(
            "active message of {size:>9} bytes received ({} bytes allocated)",
            got.capacity()
        );
    }
    client.close().await
}
