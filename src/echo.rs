//! The echo protocol (see the crate docs): server side and client measurements.

use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use ucx::{Endpoint, Error, MemoryHandle, Result, Tag};

use crate::measure::Summary;

/// Tag of commands and acknowledgements.
pub const CTRL_TAG: Tag = Tag::User(2);
/// Tag of data messages.
pub const DATA_TAG: Tag = Tag::User(1);

/// `count` times: receive `size` bytes on DATA_TAG and send them back.
pub const PINGPONG: u64 = 1;
/// Receive `count` messages of `size` bytes on DATA_TAG (many in flight), then answer with one
/// byte on CTRL_TAG.
pub const SINK: u64 = 2;
/// The client's worker address follows (`size` bytes); the server connects to it, answers with
/// its own address and serves that address-connected endpoint until `BYE`.
const ADDRESS: u64 = 3;
const BYE: u64 = 4;
/// `count` times: receive an active message and send it back.
const AM_ECHO: u64 = 5;
/// `count` times: receive a multi-buffer message on DATA_TAG and send it back.
const MULTI_ECHO: u64 = 6;
/// `count` times: receive exactly `size` stream bytes and send them back.
const STREAM_ECHO: u64 = 7;
/// Expose a `size`-byte region: send its packed key on CTRL_TAG, wait for a CTRL_TAG message
/// (the client flushed its puts), answer with the region's contents on DATA_TAG.
const RMA_REGION: u64 = 8;
/// As [`SINK`], with receives posted in batches ([`Endpoint::recv_batch`]).
pub const SINK_BATCH: u64 = 9;
/// Longest worker address accepted.
const MAX_ADDRESS: u64 = 64 << 10;
/// Largest message the server accepts in a command (guards its allocation).
pub const MAX_SIZE: u64 = 1 << 30;
/// Receive buffers the server rotates through while sinking a stream ([`sink_window`]). They
/// are kept from one command to the next (a warm-up stream, then the timed one), so that the
/// timed stream lands in pages already mapped and registered, as `ucx_perftest`'s reused
/// buffers do.
pub const SINK_WINDOW: usize = 4;
/// Most bytes of receive buffers the sink rotates through: `ucx_perftest -t tag_bw` receives
/// every message of a window into one buffer, so at 64 MiB its whole footprint (128 MiB, both
/// sides) stays in a large L3 (260 MiB on the development machine) where four 64 MiB receive
/// buffers would not: 0.79 of its bandwidth with four, 0.93 with one (docs/performance.md).
pub const SINK_BYTES: usize = 64 << 20;

/// Receives the sink keeps posted for messages of `size` bytes: [`SINK_WINDOW`], fewer where
/// that many buffers would pass [`SINK_BYTES`], at least one.
///
/// ```
/// use ucx_stack::echo::sink_window;
/// assert_eq!(sink_window(8), 4);
/// assert_eq!(sink_window(16 << 20), 4);
/// assert_eq!(sink_window(64 << 20), 1);
/// ```
pub fn sink_window(size: usize) -> usize {
    (SINK_BYTES / size.max(1)).clamp(1, SINK_WINDOW)
}
/// Receives per batch of [`SINK_BATCH`] below 64 KiB (from there, [`SINK_WINDOW`]).
pub const SINK_BATCH_LEN: usize = 64;

/// One command of the echo protocol: 24 bytes on [`CTRL_TAG`], `kind`, `size` and `count` as
/// native-endian `u64`s, in that order. `ucx-echo` and `ucx-gpu-echo` speak the same layout.
///
/// ```
/// use ucx_stack::echo::{Command, SINK};
/// let c = Command::new(SINK, 4096, 10);
/// assert_eq!(Command::decode(&c.encode()).unwrap(), c);
/// assert!(Command::decode(&[0u8; 23]).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command {
    /// What to do ([`PINGPONG`], [`SINK`], ...).
    pub kind: u64,
    /// Message size in bytes.
    pub size: u64,
    /// Number of messages.
    pub count: u64,
}

impl Command {
    /// Bytes of an encoded command.
    pub const LEN: usize = 24;

    /// A command of `kind` for `count` messages of `size` bytes.
    pub fn new(kind: u64, size: usize, count: usize) -> Command {
        Command {
            kind,
            size: size as u64,
            count: count as u64,
        }
    }

    /// The 24 bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        [self.kind, self.size, self.count]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect()
    }

    /// Parses the 24 bytes of a command.
    pub fn decode(bytes: &[u8]) -> Result<Command> {
        if bytes.len() != Self::LEN {
            return Err(Error::InvalidArgument(format!(
                "a {}-byte command, expected {}",
                bytes.len(),
                Self::LEN
            )));
        }
        let word = |i: usize| u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8"));
        Ok(Command {
            kind: word(0),
            size: word(1),
            count: word(2),
        })
    }

    /// Sends the command on `ep`.
    pub async fn send(self, ep: &Endpoint) -> Result<()> {
        ep.send(self.encode(), CTRL_TAG).await.0
    }

    /// The next command from `ep`, or `None` when the peer closed.
    pub async fn recv(ep: &Endpoint) -> Result<Option<Command>> {
        let (r, cmd) = ep.recv(Vec::with_capacity(Self::LEN), CTRL_TAG).await;
        match r {
            Ok(_) => Command::decode(&cmd).map(Some),
            Err(e) if e.is_disconnect() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Serves echo commands on `ep` until the peer closes. Returns the number of commands served.
pub async fn serve(ep: Endpoint) -> Result<u64> {
    serve_boxed(ep).await
}

fn serve_boxed(ep: Endpoint) -> futures::future::BoxFuture<'static, Result<u64>> {
    Box::pin(serve_inner(ep))
}

async fn serve_inner(ep: Endpoint) -> Result<u64> {
    let mut served = 0;
    // The sink's receive buffers, kept across commands (see SINK_WINDOW): fresh ones would
    // be fresh mappings for large sizes (glibc maps allocations past 32 MiB anew each time),
    // and the timed stream would pay a page fault per 4 KiB received.
    let mut sink: Vec<Vec<u8>> = Vec::new();
    loop {
        let Some(Command { kind, size, count }) = Command::recv(&ep).await? else {
            return Ok(served);
        };
        if kind == BYE {
            return Ok(served);
        }
        if kind == ADDRESS {
            if size > MAX_ADDRESS {
                return Err(Error::InvalidArgument(format!("address of {size} bytes")));
            }
            let peer = ep.recv_vec(CTRL_TAG).await?;
            // SAFETY: the echo protocol trusts its client (a benchmark peer): the bytes are the
            // client's Worker::address, sent as is over the handshaken endpoint.
            let direct = unsafe { Endpoint::connect_address(&ep.worker(), &peer) }?;
            let (r, _) = ep.send(ep.worker().address()?, CTRL_TAG).await;
            r?;
            served += serve_boxed(direct).await?;
            continue;
        }
        if size > MAX_SIZE {
            return Err(Error::InvalidArgument(format!(
                "size {size} over {MAX_SIZE}"
            )));
        }
        let size = size as usize;
        match kind {
            PINGPONG => {
                let mut buf = ucx::host_buffer(size);
                for _ in 0..count {
                    let (r, b) = ep.recv(buf, DATA_TAG).await;
                    r?;
                    let (r, b) = ep.send(b, DATA_TAG).await;
                    r?;
                    buf = b;
                }
            }
            SINK => {
                let free = sink_buffers(&mut sink, sink_window(size), size);
                sink = recv_window(&ep, free, count as usize).await?;
                let (r, _) = ep.send(vec![1u8], CTRL_TAG).await;
                r?;
            }
            SINK_BATCH => {
                let per = if size < 64 << 10 {
                    SINK_BATCH_LEN
                } else {
                    sink_window(size)
                };
                let mut bufs = sink_buffers(&mut sink, per, size);
                let mut left = count as usize;
                while left > 0 {
                    let spare = bufs.split_off(left.min(bufs.len()));
                    let n = bufs.len();
                    let (r, mut b) = ep.recv_batch(bufs, DATA_TAG).await;
                    r?;
                    b.extend(spare);
                    bufs = b;
                    left -= n;
                }
                sink = bufs;
                let (r, _) = ep.send(vec![1u8], CTRL_TAG).await;
                r?;
            }
            AM_ECHO => {
                for _ in 0..count {
                    let msg = ep.am_recv().await?;
                    let (r, _) = ep.am_send(msg).await;
                    r?;
                }
            }
            MULTI_ECHO => {
                for _ in 0..count {
                    let frames = ep.recv_multi(DATA_TAG).await?;
                    let (r, _) = ep.send_multi(frames, DATA_TAG).await;
                    r?;
                }
            }
            STREAM_ECHO => {
                for _ in 0..count {
                    let (r, buf) = ep.stream_recv_exact(Vec::with_capacity(size)).await;
                    r?;
                    let (r, _) = ep.stream_send(buf).await;
                    r?;
                }
            }
            RMA_REGION => {
                let region = MemoryHandle::alloc(ep.worker().context(), size.max(1))?;
                let (r, _) = ep.send(region.pack_rkey()?, CTRL_TAG).await;
                r?;
                ep.recv_vec(CTRL_TAG).await?;
                let (r, _) = ep.send(region.read(), DATA_TAG).await;
                r?;
                // The client is done with the region once it has our answer.
                ep.recv_vec(CTRL_TAG).await?;
                region.unmap()?;
            }
            other => return Err(Error::InvalidArgument(format!("unknown command {other}"))),
        }
        served += 1;
    }
}

/// `n` receive buffers of `size` bytes, taken from `kept` (the last command's, already
/// touched) where it has them.
fn sink_buffers(kept: &mut Vec<Vec<u8>>, n: usize, size: usize) -> Vec<Vec<u8>> {
    let mut bufs = std::mem::take(kept);
    bufs.truncate(n);
    for b in &mut bufs {
        b.resize(size, 0);
    }
    bufs.resize_with(n, || ucx::host_buffer(size));
    bufs
}

/// Switches to an endpoint connected by worker address (no TCP lanes on one host): sends our
/// address over `ep`, connects to the server's. End it with [`bye`].
pub async fn direct(ep: &Endpoint) -> Result<Endpoint> {
    let mine = ep.worker().address()?;
    Command::new(ADDRESS, mine.len(), 0).send(ep).await?;
    let (r, _) = ep.send(mine, CTRL_TAG).await;
    r?;
    let theirs = ep.recv_vec(CTRL_TAG).await?;
    // SAFETY: the server answers with its own Worker::address, unmodified (trusted peer, as
    // above).
    unsafe { Endpoint::connect_address(&ep.worker(), &theirs) }
}

/// Tells the server this endpoint is done (needed for address-connected endpoints, whose
/// close the peer may not notice).
pub async fn bye(ep: &Endpoint) -> Result<()> {
    Command::new(BYE, 0, 0).send(ep).await
}

/// Ping-pongs `size`-byte messages; returns the summary of the `iters` measured round trips.
/// Every round sends fresh bytes: a round number stamped at both ends of the message (8 bytes
/// each, fewer in small messages), checked on the echo every round; every byte is checked on
/// the first and last round trip. (Nothing can be answered from a cache or a stale buffer.)
pub async fn pingpong(ep: &Endpoint, size: usize, warmup: usize, iters: usize) -> Result<Summary> {
    let total = warmup + iters;
    Command::new(PINGPONG, size, total).send(ep).await?;
    // Huge pages from 2 MiB up, as ucx_perftest's buffers are (ucx::host_buffer).
    let mut sbuf = ucx::host_buffer(size);
    for (i, b) in sbuf.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let mut rbuf = ucx::host_buffer(size);
    let mut rts = Vec::with_capacity(iters);
    let k = size.min(8);
    for i in 0..total {
        let stamp = (i as u64 + 1).to_le_bytes();
        sbuf[..k].copy_from_slice(&stamp[..k]);
        sbuf[size - k..].copy_from_slice(&stamp[..k]);
        let t0 = Instant::now();
        let ((rr, rb), (sr, sb)) = futures::join!(ep.recv(rbuf, DATA_TAG), ep.send(sbuf, DATA_TAG));
        let elapsed = t0.elapsed();
        sr?;
        let n = rr?;
        let fresh = rb[..k] == stamp[..k] && rb[size - k..] == stamp[..k];
        if n != size || !fresh || ((i == 0 || i + 1 == total) && rb != sb) {
            return Err(Error::InvalidArgument(format!(
                "echo of {size} bytes came back wrong ({n} bytes)"
            )));
        }
        if i >= warmup {
            rts.push(elapsed);
        }
        rbuf = rb;
        sbuf = sb;
    }
    Ok(Summary::from_round_trips(size, &mut rts))
}

/// Streams `count` messages of `size` bytes with `window` sends in flight, all from one buffer
/// (shared `Bytes`, as `ucx_perftest -t tag_bw` reuses its buffer); returns bytes per second
/// until the server acknowledged the last one. A short untimed stream warms up first.
///
/// With `batched`, the sends go in batches of `window` ([`Endpoint::send_batch`], two batches
/// in flight) and the server posts its receives in batches too ([`SINK_BATCH`]).
pub async fn stream_bandwidth(
    ep: &Endpoint,
    size: usize,
    count: usize,
    window: usize,
    batched: bool,
) -> Result<f64> {
    let data = bytes::Bytes::from(filled(size, 7));
    stream_once(ep, &data, (2 * window).max(4), window, batched).await?;
    let t0 = Instant::now();
    stream_once(ep, &data, count, window, batched).await?;
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    Ok((size * count) as f64 / secs)
}

async fn stream_once(
    ep: &Endpoint,
    data: &bytes::Bytes,
    count: usize,
    window: usize,
    batched: bool,
) -> Result<()> {
    let kind = if batched { SINK_BATCH } else { SINK };
    Command::new(kind, data.len(), count).send(ep).await?;
    let ack = ep.recv(vec![0u8; 1], CTRL_TAG);
    if batched {
        send_batches(ep, data, count, window).await?;
    } else {
        send_window(ep, vec![data.clone(); window.max(1)], count).await?;
    }
    let (r, _) = ack.await;
    r.map(drop)
}

/// Sends `count` copies of `data` on [`DATA_TAG`] in batches of `window`
/// ([`Endpoint::send_batch`]), with two batches in flight.
pub async fn send_batches(
    ep: &Endpoint,
    data: &bytes::Bytes,
    count: usize,
    window: usize,
) -> Result<()> {
    let window = window.max(1);
    let mut inflight = futures::stream::FuturesOrdered::new();
    let mut spare: Vec<Vec<bytes::Bytes>> = Vec::new();
    let mut left = count;
    while left > 0 || !inflight.is_empty() {
        while left > 0 && inflight.len() < 2 {
            let n = left.min(window);
            let mut batch = spare.pop().unwrap_or_default();
            batch.clear();
            batch.extend(std::iter::repeat_n(data, n).cloned());
            inflight.push_back(ep.send_batch(batch, DATA_TAG));
            left -= n;
        }
        let (r, batch) = inflight.next().await.expect("batches in flight");
        r?;
        spare.push(batch);
    }
    Ok(())
}

/// Receives `count` messages on [`DATA_TAG`], keeping one receive posted per buffer in `free`
/// (reused as they complete); returns the buffers.
pub async fn recv_window<B: ucx::IoBufMut>(
    ep: &Endpoint,
    mut free: Vec<B>,
    count: usize,
) -> Result<Vec<B>> {
    let mut inflight = FuturesUnordered::new();
    let (mut posted, mut done) = (0, 0);
    while done < count {
        while posted < count && !free.is_empty() {
            inflight.push(ep.recv(free.pop().expect("non-empty"), DATA_TAG));
            posted += 1;
        }
        let (r, b) = inflight.next().await.expect("receives in flight");
        r?;
        free.push(b);
        done += 1;
    }
    Ok(free)
}

/// Sends `count` messages on [`DATA_TAG`], one in flight per buffer in `free` (each sent again
/// as its previous send completes); returns the buffers.
pub async fn send_window<B: ucx::IoBuf>(
    ep: &Endpoint,
    mut free: Vec<B>,
    count: usize,
) -> Result<Vec<B>> {
    let mut inflight = FuturesUnordered::new();
    let (mut posted, mut done) = (0, 0);
    while done < count {
        while posted < count && !free.is_empty() {
            inflight.push(ep.send(free.pop().expect("non-empty"), DATA_TAG));
            posted += 1;
        }
        let (r, b) = inflight.next().await.expect("sends in flight");
        r?;
        free.push(b);
        done += 1;
    }
    Ok(free)
}

/// The operations `ucx-echo client --test` can time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Tagged send/recv ping-pong.
    Tag,
    /// Stream send / receive-exactly ping-pong.
    Stream,
    /// Active-message ping-pong.
    Am,
    /// Put into the server's region, then flush (remote completion): one round trip.
    Put,
    /// Get from the server's region: one round trip.
    Get,
}

impl Op {
    /// Parses `tag|stream|am|put|get`.
    pub fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "tag" => Op::Tag,
            "stream" => Op::Stream,
            "am" => Op::Am,
            "put" => Op::Put,
            "get" => Op::Get,
            _ => return None,
        })
    }
}

/// Times `iters` round trips of `op` with `size`-byte messages (after `warmup` untimed ones).
/// Latency is half a round trip, as `ucx_perftest` reports it.
pub async fn time_op(
    ep: &Endpoint,
    op: Op,
    size: usize,
    warmup: usize,
    iters: usize,
) -> Result<Summary> {
    let total = warmup + iters;
    let mut rts = Vec::with_capacity(iters);
    let mut record = |i: usize, t0: Instant| {
        if i >= warmup {
            rts.push(t0.elapsed());
        }
    };
    match op {
        Op::Tag => return pingpong(ep, size, warmup, iters).await,
        Op::Stream => {
            Command::new(STREAM_ECHO, size, total).send(ep).await?;
            let (mut sbuf, mut rbuf) = (filled(size, 5), Vec::with_capacity(size));
            for i in 0..total {
                let t0 = Instant::now();
                let ((rr, rb), (sr, sb)) =
                    futures::join!(ep.stream_recv_exact(rbuf), ep.stream_send(sbuf));
                sr?;
                rr?;
                record(i, t0);
                (sbuf, rbuf) = (sb, rb);
            }
        }
        Op::Am => {
            Command::new(AM_ECHO, size, total).send(ep).await?;
            let mut sbuf = filled(size, 6);
            for i in 0..total {
                let t0 = Instant::now();
                let ((sr, sb), got) = futures::join!(ep.am_send(sbuf), ep.am_recv());
                sr?;
                if got?.len() != size {
                    return Err(Error::InvalidArgument("AM echo came back wrong".into()));
                }
                record(i, t0);
                sbuf = sb;
            }
        }
        Op::Put | Op::Get => {
            Command::new(RMA_REGION, size, 1).send(ep).await?;
            let key = ep.unpack_rkey(&ep.recv_vec(CTRL_TAG).await?)?;
            let mut buf = filled(size, 7);
            for i in 0..total {
                let t0 = Instant::now();
                buf = if op == Op::Put {
                    let (r, b) = key.put(buf, 0).await;
                    r?;
                    ep.flush().await?;
                    b
                } else {
                    let (r, b) = key.get(buf, 0).await;
                    r?;
                    b
                };
                record(i, t0);
            }
            let (r, _) = ep.send(vec![1u8], CTRL_TAG).await;
            r?;
            ep.recv_vec(DATA_TAG).await?;
            drop(key);
            let (r, _) = ep.send(vec![2u8], CTRL_TAG).await;
            r?;
        }
    }
    Ok(Summary::from_round_trips(size, &mut rts))
}

/// Active-message round trip through the server; returns what came back.
pub async fn am_echo(ep: &Endpoint, data: Vec<u8>) -> Result<Vec<u8>> {
    Command::new(AM_ECHO, data.len(), 1).send(ep).await?;
    let (r, _) = ep.am_send(data).await;
    r?;
    ep.am_recv().await
}

/// Multi-buffer round trip through the server; returns the frames that came back.
pub async fn multi_echo(ep: &Endpoint, frames: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
    Command::new(MULTI_ECHO, 0, 1).send(ep).await?;
    let (r, _) = ep.send_multi(frames, DATA_TAG).await;
    r?;
    ep.recv_multi(DATA_TAG).await
}

/// Stream round trip through the server; returns the bytes that came back.
pub async fn stream_echo(ep: &Endpoint, data: Vec<u8>) -> Result<Vec<u8>> {
    Command::new(STREAM_ECHO, data.len(), 1).send(ep).await?;
    let n = data.len();
    let (r, _) = ep.stream_send(data).await;
    r?;
    let (r, back) = ep.stream_recv_exact(Vec::with_capacity(n)).await;
    r?;
    Ok(back)
}

/// Puts `data` at `offset` into a `size`-byte region the server exposes, reads it back with a
/// get, and returns (what the get read, what the server saw in its region).
pub async fn rma_roundtrip(
    ep: &Endpoint,
    size: usize,
    offset: usize,
    data: Vec<u8>,
) -> Result<(Vec<u8>, Vec<u8>)> {
    Command::new(RMA_REGION, size, 1).send(ep).await?;
    let packed = ep.recv_vec(CTRL_TAG).await?;
    let key = ep.unpack_rkey(&packed)?;
    let n = data.len();
    let (r, _) = key.put(data, offset).await;
    r?;
    ep.flush().await?;
    let (r, got) = key.get(Vec::with_capacity(n), offset).await;
    r?;
    let (r, _) = ep.send(vec![1u8], CTRL_TAG).await;
    r?;
    let seen = ep.recv_vec(DATA_TAG).await?;
    drop(key);
    let (r, _) = ep.send(vec![2u8], CTRL_TAG).await;
    r?;
    Ok((got, seen))
}

/// Picks iteration counts so that each size takes a bounded time.
pub fn iterations_for(size: usize, base: usize) -> usize {
    let scaled = (base as u64 * 4096 / (size as u64).max(4096)).max(10);
    scaled as usize
}

/// Default time limit for one benchmark step in the tools.
pub const STEP_LIMIT: Duration = Duration::from_secs(120);

/// `size` bytes of `byte`, in memory as `ucx_perftest`'s buffers are: huge pages from 2 MiB up
/// ([`ucx::host_buffer`]).
fn filled(size: usize, byte: u8) -> Vec<u8> {
    let mut v = ucx::host_buffer(size);
    v.fill(byte);
    v
}
