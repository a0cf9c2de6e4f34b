//! Remote memory access: the server registers a region and sends its key; the client puts
//! into it, flushes, and gets it back.
//!
//! ```text
//! cargo run --release --example rma
//! ```

use ucx::{Context, Endpoint, Listener, MemoryHandle, ProgressMode, Worker};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ucx::Result<()> {
    let ctx = Context::new()?;
    let a = Worker::new(&ctx, ProgressMode::Blocking)?;
    let b = Worker::new(&ctx, ProgressMode::Blocking)?;
    let mut listener = Listener::bind(&a, "127.0.0.1:0".parse().unwrap())?;
    let addr = listener.local_addr();
    let (server, client) = tokio::join!(listener.accept(), Endpoint::connect(&b, addr));
    let (server, client) = (server?, client?);

    let region = MemoryHandle::alloc(&ctx, 1 << 20)?;
    let (sent, key) = tokio::join!(server.send(region.pack_rkey()?, 0), client.recv_vec(0));
    sent.0?;
    let key = client.unpack_rkey(&key?)?;

    // The server keeps a receive pending while the client works, so its worker progresses
    // (over TCP lanes, puts are applied by the target's worker).
    let serve = server.recv_vec(1);
    let work = async {
        let data = b"written by a remote put".to_vec();
        let (r, data) = key.put(data, 4096).await;
        r?;
        client.flush().await?;
        let (n, got) = key.get(Vec::with_capacity(data.len()), 4096).await;
        n?;
        assert_eq!(got, data);
        let (r, _) = client.send(b"done".to_vec(), 1).await;
        r?;
        Ok::<_, ucx::Error>(data)
    };
    let (done, data) = tokio::join!(serve, work);
    done?;
    let data = data?;
    let contents = region.read();
    assert_eq!(&contents[4096..4096 + data.len()], &data[..]);
    println!(
        "the server's region now holds {:?}",
        String::from_utf8_lossy(&contents[4096..4096 + data.len()])
    );
    drop(key);
    region.unmap()?;
    client.close().await
}
