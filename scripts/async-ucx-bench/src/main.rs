//! Tag ping-pong over the published `async-ucx` crate, the same protocol as `ucx-echo`'s
//! ping-pong (the client sends, the server echoes on the same tag; one-way time is half a round
//! trip), so scripts/compare.py can put it beside ucx_perftest and ucx-rs.
//!
//! ```text
//! async-ucx-bench server            # prints "LISTENING <port>"
//! async-ucx-bench client HOST:PORT SIZE ITERS   # prints one JSON line
//! ```

use std::error::Error;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use async_ucx::ucp::{Context, Endpoint, Worker};

type Res<T> = Result<T, Box<dyn Error>>;

/// Carries (size, round trips) from the client to the server.
const CTRL_TAG: u64 = 1;
/// Carries the ping-pong messages.
const DATA_TAG: u64 = 2;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let context = Context::new()?;
        let worker = context.create_worker()?;
        // async-ucx's own busy-polling progress task (its fastest mode).
        tokio::task::spawn_local(worker.clone().polling());
        match args.get(1).map(String::as_str) {
            Some("server") => server(&worker).await,
            Some("client") if args.len() == 5 => {
                client(&worker, &args[2], args[3].parse()?, args[4].parse()?).await
            }
            _ => Err("usage: async-ucx-bench server | client HOST:PORT SIZE ITERS".into()),
        }
    })
}

/// The first `n` received bytes of `buf` as a slice.
fn received(buf: &[MaybeUninit<u8>], n: usize) -> &[u8] {
    let n = n.min(buf.len());
    // SAFETY: UCX wrote the first `n` bytes of `buf` (the receive's reported length, capped at
    // the buffer's length); MaybeUninit<u8> and u8 have the same layout.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) }
}

async fn server(worker: &std::rc::Rc<Worker>) -> Res<()> {
    let mut listener = worker.create_listener("127.0.0.1:0".parse()?)?;
    println!("LISTENING {}", listener.socket_addr()?.port());
    let ep: Endpoint = worker.accept(listener.next().await).await?;
    let mut ctrl = [MaybeUninit::uninit(); 16];
    let n = worker.tag_recv(CTRL_TAG, &mut ctrl).await?;
    let ctrl = received(&ctrl, n);
    if ctrl.len() != 16 {
        return Err(format!("a {}-byte control message", ctrl.len()).into());
    }
    let size = u64::from_le_bytes(ctrl[..8].try_into()?) as usize;
    let count = u64::from_le_bytes(ctrl[8..].try_into()?);
    if size > 1 << 30 {
        return Err(format!("size {size} over 1 GiB").into());
    }
    let mut buf = vec![MaybeUninit::<u8>::uninit(); size.max(1)];
    for _ in 0..count {
        let n = worker.tag_recv(DATA_TAG, &mut buf).await?;
        ep.tag_send(DATA_TAG, received(&buf, n)).await?;
    }
    // Let the last send drain before the endpoint goes away.
    let _ = ep.flush().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

async fn client(worker: &std::rc::Rc<Worker>, addr: &str, size: usize, iters: usize) -> Res<()> {
    let ep = worker.connect_socket(addr.parse()?).await?;
    let warmup = iters.div_ceil(10).max(2);
    let total = warmup + iters;
    let mut ctrl = (size as u64).to_le_bytes().to_vec();
    ctrl.extend_from_slice(&(total as u64).to_le_bytes());
    ep.tag_send(CTRL_TAG, &ctrl).await?;
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let mut back = vec![MaybeUninit::<u8>::uninit(); size.max(1)];
    let mut rts: Vec<Duration> = Vec::with_capacity(iters);
    for i in 0..total {
        let t0 = Instant::now();
        ep.tag_send(DATA_TAG, &data).await?;
        let n = worker.tag_recv(DATA_TAG, &mut back).await?;
        let rt = t0.elapsed();
        if (i == 0 || i + 1 == total) && received(&back, n) != &data[..] {
            return Err(format!("the echo of {size} bytes came back different").into());
        }
        if i >= warmup {
            rts.push(rt);
        }
    }
    rts.sort_unstable();
    let pick = |q: f64| rts[((rts.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6 / 2.0;
    println!(
        "{{\"bytes\":{size},\"iters\":{iters},\"median_us\":{:.3},\"p99_us\":{:.3}}}",
        pick(0.5),
        pick(0.99)
    );
    Ok(())
}
