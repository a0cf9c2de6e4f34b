//! Head-of-line blocking, measured between two processes: an 8 B control round trip sent
//! while one large message is in flight, on the same connection and on a separate one, over
//! `tcp://` and `ucx://`.
//!
//! A connection is one ordered stream: a control message sent after a 256 MiB message waits
//! for it. A runtime keeps bulk data on connections of its own (dask-comm moves data between
//! workers on data connections, never on its control connections).
//!
//! ```text
//! cargo run --release -p ucxrs-transport --example head_of_line [-- SIZE_MIB]
//! ```
//! The example re-executes itself as the server (`head_of_line serve ADDR`), which echoes
//! channel 0 and takes channel 1 on every connection.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use transport::{connect, listen, Address, Connection, Message};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The server: echo channel 0, take channel 1, on every connection until it closes.
async fn serve(addr: &str) -> Result<(), BoxError> {
    let mut l = listen(&addr.parse::<Address>()?).await?;
    println!("LISTENING {}", l.local_addr());
    loop {
        let c = l.accept().await?;
        tokio::spawn(async move {
            while let Ok((ch, m)) = c.recv().await {
                if ch == 0 && c.send(0, m).await.is_err() {
                    break;
                }
            }
        });
    }
}

/// The first control round trip on `ctrl`, sent 2 ms after `bulk` began carrying `size`
/// bytes, then the median of 19 more, and the bulk message's time.
async fn control_while_bulk(
    ctrl: &Connection,
    bulk: &Connection,
    size: usize,
) -> Result<(Duration, Duration, Duration), transport::Error> {
    let t0 = Instant::now();
    let send_bulk = async {
        bulk.send(1, Message::from(vec![vec![0u8; size]])).await?;
        // A control round trip behind it on the same connection marks its arrival.
        bulk.send(0, Message::from(vec![vec![2u8; 8]])).await?;
        Ok::<_, transport::Error>(())
    };
    let control = async {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut rts = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            ctrl.send(0, Message::from(vec![vec![1u8; 8]])).await?;
            loop {
                // On the same connection the bulk's marker echo may come first.
                let (_, m) = ctrl.recv().await?;
                if m.host(0) == Some(&[1u8; 8][..]) {
                    break;
                }
            }
            rts.push(t.elapsed());
        }
        let first = rts[0];
        rts.sort();
        Ok::<_, transport::Error>((first, rts[rts.len() / 2]))
    };
    let ((), (first, rest)) = tokio::try_join!(send_bulk, control)?;
    if !std::ptr::eq(ctrl, bulk) {
        bulk.recv().await?; // the marker's echo
    }
    Ok((first, rest, t0.elapsed()))
}

async fn measure(addr: &str, size: usize) -> Result<(), BoxError> {
    let exe = std::env::current_exe()?;
    let mut server = Command::new(exe)
        .args(["serve", addr])
        .stdout(Stdio::piped())
        .spawn()?;
    let run = async {
        let at: Address =
            test_support::listening(&mut server, test_support::START_LIMIT)?.parse()?;
        let (a, b) = (connect(&at).await?, connect(&at).await?);
        for (what, bulk) in [("same connection", &a), ("separate connection", &b)] {
            let (first, rest, bulk_time) = control_while_bulk(&a, bulk, size).await?;
            println!(
                "{:<5} {what:<20} first {first:>9.1?}, then {rest:>8.1?}; bulk {bulk_time:>8.1?}",
                addr.split("://").next().unwrap_or(addr),
            );
        }
        a.close().await?;
        b.close().await?;
        Ok::<_, BoxError>(())
    };
    let r = run.await;
    let _ = server.kill();
    let _ = server.wait();
    r
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        return serve(args.get(2).ok_or("serve ADDR")?).await;
    }
    let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    println!(
        "an 8 B control round trip sent while one {mib} MiB message is in flight to another \
         process (then the median of 19 more), and the bulk message's time"
    );
    for addr in ["tcp://127.0.0.1:0", "ucx://127.0.0.1:0"] {
        measure(addr, mib << 20).await?;
    }
    Ok(())
}
