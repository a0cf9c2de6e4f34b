//! The sending half of a `ucx://` connection: a message of up to [`FIRST_MAX`] bytes as one
//! UCX message, larger ones as a header and one UCX message per frame, batches of small ones
//! bundled; and the credit that bounds what a sender may have unread at the peer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::{closed_or, ring, Conn, COPY_MAX, CREDIT_TAG, FIRST_MAX, MAX_RUN, TAG};
use crate::frame;
use crate::{
    check_outgoing, encode_header, encode_whole, ucx_charge, CloseReason, Frame, Message,
    ProtocolError, Result, UCX_GRANT_EVERY,
};

/// How long a sender first waits for room in its ring ([`Conn::wait_for_ring`]).
const RING_PAUSE: std::time::Duration = std::time::Duration::from_micros(50);
/// The longest single wait for room in the ring.
const RING_PAUSE_MAX: std::time::Duration = std::time::Duration::from_millis(5);

impl Conn {
    pub(crate) async fn send(&self, channel: u32, msg: Message) -> Result<()> {
        self.sent.store(true, Ordering::Relaxed);
        // Awaited in place, and the error mapped after (an `async fn` taking the future as
        // an argument kept two copies of it in its state: the send's future doubled in size,
        // and was moved once more per message).
        self.send_inner(channel, msg)
            .await
            .map_err(|e| self.cut_reason(e))
    }

    pub(crate) async fn send_batch(&self, channel: u32, msgs: Vec<Message>) -> Result<()> {
        self.sent.store(true, Ordering::Relaxed);
        self.send_batch_inner(channel, msgs)
            .await
            .map_err(|e| self.cut_reason(e))
    }

    /// Small messages are bundled: as many whole inlined messages as fit [`COPY_MAX`] go in
    /// one UCX message (one larger than that, up to [`FIRST_MAX`], goes alone), which the
    /// receiver unpacks in order; runs of bundles go as one
    /// [`ucx::Endpoint::send_batch`] (posted in one pass, one completion) under one take of
    /// credit. Larger messages go between them as [`Self::send`] sends them. Every message is
    /// checked against the limits before anything is sent (by the caller).
    async fn send_batch_inner(&self, channel: u32, msgs: Vec<Message>) -> Result<()> {
        let mut run: Vec<Vec<u8>> = Vec::new();
        let mut charge = 0;
        for msg in msgs {
            let bytes = msg.len();
            let len = frame::header_len(msg.frames.len()) + bytes;
            if len > FIRST_MAX || msg.has_cuda() {
                self.send_run(std::mem::take(&mut run), std::mem::take(&mut charge))
                    .await?;
                self.send_inner(channel, msg).await?;
                continue;
            }
            let c = ucx_charge(bytes);
            // A run takes no more credit than one message may (UCX_CHARGE_CAP), so a batch
            // cannot wait for more than the window holds.
            if charge + c > crate::UCX_CHARGE_CAP || run.len() == MAX_RUN {
                self.send_run(std::mem::take(&mut run), std::mem::take(&mut charge))
                    .await?;
            }
            match run.last_mut() {
                // Bundles stay within COPY_MAX, as the receiver takes them ahead (a message
                // that does not fit starts a bundle of its own).
                Some(bundle) if bundle.len() + len <= COPY_MAX => {
                    encode_whole(bundle, channel, &msg)
                }
                _ => {
                    let mut bundle = Vec::with_capacity(len.max(COPY_MAX.min(len * 64)));
                    encode_whole(&mut bundle, channel, &msg);
                    run.push(bundle);
                }
            }
            charge += c;
        }
        self.send_run(run, charge).await
    }

    /// Sends inlined messages as one UCX batch, after taking their credit.
    async fn send_run(&self, run: Vec<Vec<u8>>, charge: u64) -> Result<()> {
        if run.is_empty() {
            return Ok(());
        }
        self.take_credit(charge).await?;
        let send = std::pin::pin!(self.ep().send_batch(run, TAG));
        let (r, _) = self.post_in_order(send).await;
        r.map_err(|e| {
            // Part of the run may be on the wire: the peer's stream is out of step.
            if !e.is_disconnect() {
                tracing::warn!(error = %e, "a batch failed part-way: closing the UCX connection");
                self.cut_off(CloseReason::Local);
            }
            closed_or(e)
        })
    }

    async fn send_inner(&self, channel: u32, msg: Message) -> Result<()> {
        check_outgoing(channel, &msg, &self.limits.get())?;
        self.take_credit(ucx_charge(msg.len())).await?;
        // Post under the lock so another sender's header or frames never land between ours
        // (UCX keeps per-tag order, not per-message order). Sends are posted on their first
        // poll, inside the lock; completions are awaited after it is released.
        let total = msg.len();
        let inline = frame::header_len(msg.frames.len()) + total;
        if inline <= FIRST_MAX && !msg.has_cuda() {
            // Messages up to FIRST_MAX travel as one UCX message: header, then the frames'
            // bytes, copied into a buffer kept for the connection (given back once UCX is done
            // with it). A copy of 64 KiB costs less than a second UCX message; UCX's own
            // gather (the IOV datatype) was slower still past its rendezvous threshold
            // (docs/notes/2026-11-26-one-ucx-message-up-to-64k.md).
            // Copied and posted under the send lock, which keeps the buffer: a send that
            // completes at once (eager, the usual case) gives it back under the same lock,
            // one lock per message. Concurrent senders on one connection wait for each
            // other's copy (at most 64 KiB), as they waited for each other's post before.
            let mut send = std::pin::pin!(None);
            let first = std::future::poll_fn(|cx| {
                let mut order = self.send_order.lock().unwrap_or_else(|e| e.into_inner());
                let mut one = order.take().unwrap_or_default();
                one.clear();
                one.reserve(inline.max(COPY_MAX));
                encode_whole(&mut one, channel, &msg);
                send.set(Some(self.ep().send(one, TAG)));
                let Some(posting) = send.as_mut().as_pin_mut() else {
                    unreachable!("set just above")
                };
                let mut polled = std::future::Future::poll(posting, cx);
                if let std::task::Poll::Ready((_, one)) = &mut polled {
                    *order = Some(std::mem::take(one));
                }
                std::task::Poll::Ready(polled)
            })
            .await;
            let r = match first {
                std::task::Poll::Ready((r, _)) => r,
                std::task::Poll::Pending => {
                    let Some(in_flight) = send.as_pin_mut() else {
                        unreachable!("set by the first poll")
                    };
                    let (r, one) = in_flight.await;
                    self.send_order
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(one);
                    r
                }
            };
            return r.map_err(closed_or);
        }
        // A header longer than FIRST_MAX goes in two parts (the receiver posts FIRST_MAX bytes).
        let header = Bytes::from(encode_header(channel, &msg));
        let parts = if header.len() > FIRST_MAX {
            vec![header.slice(..FIRST_MAX), header.slice(FIRST_MAX..)]
        } else {
            vec![header]
        };
        // With no bytes at all, the header says everything: no frame messages.
        let frames = if total > 0 { msg.frames } else { Vec::new() };
        #[cfg(feature = "cuda")]
        for f in &frames {
            // Wait for the producer's GPU work here, not under the send lock.
            if let Frame::Cuda(d) = f {
                d.stream()
                    .synchronize()
                    .map_err(|e| crate::Error::Ucx(ucx::Error::Cuda(e.to_string())))?;
            }
        }
        if let Some(ring) = self.ring_out.get() {
            let metas = frames.iter().map(|f| frame::FrameMeta {
                size: f.len() as u64,
                cuda: f.is_cuda(),
            });
            if let Some(picked) = ring::ring_frames(metas, ring.size()) {
                let results = self.post_ringed(ring, parts, frames, &picked).await?;
                return self.sent_part_way(results);
            }
        }
        let sends: Vec<_> = parts
            .into_iter()
            .map(Frame::Host)
            .chain(frames)
            .map(|f| Box::pin(self.send_frame(f)))
            .collect();
        let results = self.post_all_in_order(sends).await;
        self.sent_part_way(results)
    }

    /// The outcome of a message's sends: the first failure, after which the connection ends
    /// (part of the message may be on the wire: the peer's stream is out of step).
    fn sent_part_way(&self, results: Vec<ucx::Result<()>>) -> Result<()> {
        if let Some(e) = results.into_iter().find_map(|r| r.err()) {
            // Part of the message may be on the wire: the peer's stream is out of step, so
            // the connection ends here.
            if !e.is_disconnect() {
                tracing::warn!(error = %e, "a send failed part-way: closing the UCX connection");
                self.cut_off(CloseReason::Local);
            }
            return Err(closed_or(e));
        }
        Ok(())
    }

    /// Sends a message whose frames at `picked` go through this side's ring ([`ring`]):
    /// under the send lock, places them in the ring and posts the header, then writes each
    /// ring frame's chunks ([`ring::CHUNK`]) and posts each chunk's offset (a little-endian
    /// `u64`) as soon as it is written, then posts the other frames; then waits for what did
    /// not complete at once, outside the lock. While the ring has no room
    /// (the peer has not copied earlier frames out yet), waits for it, outside the lock.
    async fn post_ringed(
        &self,
        ring: &ring::RingOut,
        parts: Vec<Bytes>,
        frames: Vec<Frame>,
        picked: &[usize],
    ) -> Result<Vec<ucx::Result<()>>> {
        let lens: Vec<u64> = picked.iter().map(|&i| frames[i].len() as u64).collect();
        let mut frames: Vec<Option<Frame>> = frames.into_iter().map(Some).collect();
        let mut parts = Some(parts);
        let mut pause = RING_PAUSE;
        loop {
            let mut sends = Vec::new();
            let mut done = Vec::new();
            let placed = std::future::poll_fn(|cx| {
                let _order = self.send_order.lock().unwrap_or_else(|e| e.into_inner());
                let at = match ring.place(&lens) {
                    Ok(Some(at)) => at,
                    Ok(None) => return std::task::Poll::Ready(Ok(false)),
                    Err(bad) => return std::task::Poll::Ready(Err(bad)),
                };
                let mut post = |f: Frame| {
                    let mut send = Box::pin(self.send_frame(f));
                    done.push(match std::future::Future::poll(send.as_mut(), cx) {
                        std::task::Poll::Ready(r) => Some(r),
                        std::task::Poll::Pending => None,
                    });
                    sends.push(send);
                };
                for part in parts.take().into_iter().flatten() {
                    post(Frame::Host(part));
                }
                // Each chunk announced as soon as it is written: the receiver copies it out
                // while the next is written.
                for (&off, &i) in at.iter().zip(picked) {
                    let Some(Frame::Host(b)) = &frames[i] else {
                        unreachable!("ring frames are host frames")
                    };
                    for (from, len) in ring::chunks(b.len() as u64) {
                        let chunk = &b[from as usize..(from + len) as usize];
                        ring.write(off + from, chunk);
                        ring.publish();
                        post(Frame::Host(Bytes::copy_from_slice(
                            &(off + from).to_le_bytes(),
                        )));
                    }
                }
                let rest = frames
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| !picked.contains(i))
                    .filter_map(|(_, f)| f.take());
                for f in rest {
                    post(f);
                }
                std::task::Poll::Ready(Ok(true))
            })
            .await;
            match placed {
                Ok(true) => return Ok(finish_posted(sends, done).await),
                Ok(false) => self.wait_for_ring(ring, &lens, &mut pause).await?,
                Err(bad) => return Err(self.bad_count(bad)),
            }
        }
    }

    /// Ends the connection: the peer counted ring frames copied out that were never placed.
    fn bad_count(&self, bad: ring::BadCount) -> crate::Error {
        self.refuse(ProtocolError::RingCount {
            count: bad.count,
            placed: bad.placed,
        })
    }

    /// Waits until frames of `lens` bytes fit in the ring (the peer counts frames copied out
    /// in shared memory, so this polls: 50 µs, doubling to 5 ms), or the connection ends.
    async fn wait_for_ring(
        &self,
        ring: &ring::RingOut,
        lens: &[u64],
        pause: &mut std::time::Duration,
    ) -> Result<()> {
        tracing::trace!("waiting for the peer to copy ring frames out");
        loop {
            match ring.fits(lens) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(bad) => return Err(self.bad_count(bad)),
            }
            if let Some(why) = self.state.get().or_else(|| self.cut.get().cloned()) {
                return Err(crate::Error::Closed(why));
            }
            if self.ep().is_closed() {
                let e = self.ep().peer_error().unwrap_or(ucx::Error::Closed);
                return Err(closed_or(e));
            }
            tokio::time::sleep(*pause).await;
            *pause = (*pause * 2).min(RING_PAUSE_MAX);
        }
    }

    /// Polls every send once, in order, under the send lock (each send posts on its first
    /// poll), so what one message posts is never interleaved with another's; then waits for
    /// those that did not complete at once, outside the lock.
    async fn post_all_in_order<F>(
        &self,
        mut sends: Vec<std::pin::Pin<Box<F>>>,
    ) -> Vec<ucx::Result<()>>
    where
        F: std::future::Future<Output = ucx::Result<()>>,
    {
        let mut done: Vec<Option<ucx::Result<()>>> = Vec::with_capacity(sends.len());
        std::future::poll_fn(|cx| {
            let _order = self.send_order.lock().unwrap_or_else(|e| e.into_inner());
            for s in sends.iter_mut() {
                done.push(match s.as_mut().poll(cx) {
                    std::task::Poll::Ready(r) => Some(r),
                    std::task::Poll::Pending => None,
                });
            }
            std::task::Poll::Ready(())
        })
        .await;
        finish_posted(sends, done).await
    }

    /// Takes `charge` bytes of credit, waiting for the peer's grants while there is too
    /// little left.
    async fn take_credit(&self, charge: u64) -> Result<()> {
        loop {
            let took = self
                .credits
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    c.checked_sub(charge)
                });
            if took.is_ok() {
                return Ok(());
            }
            let mut parked = self.refill.lock().await;
            if self.credits.load(Ordering::Acquire) >= charge {
                continue; // another sender received a grant meanwhile
            }
            tracing::trace!("waiting for the peer to take messages");
            let wait = parked.0.get_or_insert_with(|| {
                let ep = Arc::clone(self.ep());
                Box::pin(async move { ep.recv(vec![0u8; 8].into_boxed_slice(), CREDIT_TAG).await })
            });
            let (r, grant) = wait.as_mut().await;
            parked.0 = None;
            let n = r.map_err(closed_or)?;
            let granted = grant
                .first_chunk::<8>()
                .map_or(0, |b| u64::from_le_bytes(*b));
            let before = self.credits.fetch_add(granted, Ordering::AcqRel);
            if n != 8 || granted == 0 || before.saturating_add(granted) > self.window {
                return Err(self.refuse(ProtocolError::Grant {
                    got: n,
                    bytes: granted,
                }));
            }
        }
    }

    /// Counts a message the application took, granting credits back every
    /// [`UCX_GRANT_EVERY`] bytes.
    pub(super) async fn took(&self, charge: u64) {
        let taken = self.taken.fetch_add(charge, Ordering::AcqRel) + charge;
        if taken < UCX_GRANT_EVERY {
            return;
        }
        self.taken.fetch_sub(taken, Ordering::AcqRel);
        let (r, _) = Box::pin(self.ep().send(taken.to_le_bytes().to_vec(), CREDIT_TAG)).await;
        if let Err(e) = r {
            // The peer is gone or going: its next operation says so.
            tracing::debug!(error = %e, "a credit grant was not delivered");
        }
    }

    /// Runs `sends`, whose first poll posts them, with that first poll under the send lock:
    /// what one message posts is never interleaved with another's. Completions are awaited
    /// outside the lock. Takes the future pinned where the caller made it (by value, an
    /// `async fn` keeps two copies of its argument in its state).
    pub(super) async fn post_in_order<F: std::future::Future>(
        &self,
        mut sends: std::pin::Pin<&mut F>,
    ) -> F::Output {
        let first = std::future::poll_fn(|cx| {
            let _order = self.send_order.lock().unwrap_or_else(|e| e.into_inner());
            std::task::Poll::Ready(sends.as_mut().poll(cx))
        })
        .await;
        match first {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => sends.await,
        }
    }

    /// Sends one frame (posted on the first poll).
    async fn send_frame(&self, f: Frame) -> ucx::Result<()> {
        match f {
            Frame::Host(b) => self.ep().send(b, TAG).await.0,
            #[cfg(feature = "cuda")]
            Frame::Cuda(d) => self.ep().send(d, TAG).await.0,
        }
    }
}

/// The results of sends first polled under the send lock (`done[i]`: what the first poll of
/// `sends[i]` returned), waiting outside the lock for those that did not complete at once.
async fn finish_posted<F>(
    sends: Vec<std::pin::Pin<Box<F>>>,
    done: Vec<Option<ucx::Result<()>>>,
) -> Vec<ucx::Result<()>>
where
    F: std::future::Future<Output = ucx::Result<()>>,
{
    let mut out = Vec::with_capacity(sends.len());
    for (s, d) in sends.into_iter().zip(done) {
        out.push(match d {
            Some(r) => r,
            None => s.await,
        });
    }
    out
}
