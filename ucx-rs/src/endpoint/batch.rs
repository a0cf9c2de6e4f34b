//! Batches of tagged messages: many sends (or receives) posted in one pass under the worker
//! lock and awaited as one, for control traffic whose cost is the call, not the bytes.
//!
//! A batch of sends shares one completion: sends that UCX finishes at once (every eager
//! message) allocate nothing, and the batch's future is ready without a progress call. A
//! batch of receives posts every receive before any is awaited. Buffers in device memory take
//! the one-message path, still posted in order.

use futures::future::join_all;
use ucx_sys as sys;

use super::{Endpoint, EpShared};
use crate::buffer::{IoBuf, IoBufMut, MemoryType};
use crate::error::{Error, Result};
use crate::request::{post_recvs, Cancel, InFlight};

impl EpShared {
    pub(crate) async fn tag_send_batch<B: IoBuf>(
        &self,
        bufs: Vec<B>,
        tag: u64,
    ) -> (Result<()>, Vec<B>) {
        if bufs.iter().any(|b| b.memory_type() != MemoryType::Host) {
            // join_all polls in order, so the sends are posted in order.
            let done = join_all(bufs.into_iter().map(|b| self.tag_send(b, tag))).await;
            let mut first = Ok(());
            let bufs = done
                .into_iter()
                .map(|(r, b)| {
                    if first.is_ok() {
                        first = r;
                    }
                    b
                })
                .collect();
            return (first, bufs);
        }
        let posted = self.post_live_batch(MemoryType::Host.to_ucs(), bufs.len(), |ep, i, param| {
            let b = &bufs[i];
            // SAFETY: ep is live under the worker lock; each buffer stays alive and in place
            // until the batch completes (owned by the `InFlight` guard `sent` makes, or parked
            // in the operation if the future is dropped).
            unsafe { sys::ucp_tag_send_nbx(ep, b.stable_ptr().cast(), b.bytes_init(), tag, param) }
        });
        self.sent(posted, bufs).await
    }

    pub(crate) async fn tag_recv_batch<B: IoBufMut>(
        &self,
        bufs: Vec<B>,
        tag: u64,
    ) -> (Result<usize>, Vec<B>) {
        if bufs.iter().any(|b| b.memory_type() != MemoryType::Host) {
            let done = join_all(bufs.into_iter().map(|b| self.tag_recv(b, tag))).await;
            return gather(done.into_iter());
        }
        let mut bufs = bufs;
        let posted = {
            let locked = self.worker.lock();
            match self.live(&locked) {
                Err(e) => Err((e, bufs)),
                Ok(_) => {
                    let n = bufs.len();
                    let batch = post_recvs(&locked, MemoryType::Host.to_ucs(), n, |i, param| {
                        let b = &mut bufs[i];
                        let (p, cap) = (b.stable_mut_ptr(), b.bytes_total());
                        // SAFETY: the worker is locked; each buffer has `cap` writable bytes
                        // and stays alive and in place until the batch completes (owned by the
                        // guard made right below, before the lock is released, or parked in
                        // the batch by its drop).
                        unsafe {
                            sys::ucp_tag_recv_nbx(
                                locked.handle(),
                                p.cast(),
                                cap,
                                tag,
                                u64::MAX,
                                param,
                            )
                        }
                    });
                    if !batch.is_done() {
                        self.track(&batch);
                    }
                    Ok(InFlight::new(batch, bufs, &self.worker, true))
                }
            }
        };
        let guard = match posted {
            Ok(guard) => guard,
            // The endpoint ended before the batch was posted (its worker's progress took in
            // the peer's messages and then its failure or close): what arrived is delivered.
            Err((e, bufs)) => return self.rescue_all(e, bufs, tag).await,
        };
        let (batch, mut bufs) = guard.done().await;
        // In place while every receive succeeded (the usual case).
        let mut failed = None;
        for (i, b) in bufs.iter_mut().enumerate() {
            let cap = b.bytes_total();
            if let Err(e) = self.received(&batch.completion(i), b, cap) {
                failed = Some((i, e));
                break;
            }
        }
        let Some((at, e)) = failed else {
            self.count_recvs(bufs.len());
            return (Ok(bufs.len()), bufs);
        };
        self.count_recvs(at);
        // From the first failure on: what arrived before the peer failed is still delivered.
        let rest = bufs.split_off(at);
        let mut first = Some(e);
        let mut done: Vec<(Result<usize>, B)> = bufs.into_iter().map(|b| (Ok(0), b)).collect();
        for (i, mut b) in rest.into_iter().enumerate() {
            let r = match first.take() {
                Some(e) => Err(e),
                None => {
                    let cap = b.bytes_total();
                    self.received(&batch.completion(at + i), &mut b, cap)
                }
            };
            done.push(match r {
                Ok(n) => {
                    self.count_recv();
                    (Ok(n), b)
                }
                Err(e) => self.rescue_queued(Err(e), b, tag).await,
            });
        }
        gather(done.into_iter())
    }

    /// A batch receive on an endpoint that already ended (`e`): as a single receive would,
    /// each buffer in turn takes a message that arrived before the peer failed or closed and
    /// still waits in UCX's queue, until none is left.
    async fn rescue_all<B: IoBufMut>(
        &self,
        e: Error,
        bufs: Vec<B>,
        tag: u64,
    ) -> (Result<usize>, Vec<B>) {
        let Error::Ucx(status) = e else {
            return (Err(e), bufs);
        };
        let mut done = Vec::with_capacity(bufs.len());
        for b in bufs {
            done.push(self.rescue_queued(Err(Error::Ucx(status)), b, tag).await);
        }
        gather(done.into_iter())
    }

    /// Receives the messages on `tag` that have already arrived, in order, without waiting
    /// for more: at most `most`, stopping before the first longer than `largest` (left for a
    /// later receive). Each lands in a buffer of exactly its size.
    pub(crate) async fn tag_recv_arrived(
        &self,
        tag: u64,
        most: usize,
        largest: usize,
    ) -> Result<Vec<Vec<u8>>> {
        let (guard, lengths) = {
            let locked = self.worker.lock();
            self.live(&locked)?;
            let mut found: Vec<(sys::ucp_tag_message_h, usize)> = Vec::new();
            while found.len() < most {
                let mut info = sys::ucp_tag_recv_info_t::default();
                // SAFETY: the worker is locked; info is a valid out-pointer. remove = 0 only
                // looks at the first matching message.
                let next =
                    unsafe { sys::ucp_tag_probe_nb(locked.handle(), tag, u64::MAX, 0, &mut info) };
                if next.is_null() || info.length > largest {
                    break;
                }
                // SAFETY: as above; with the lock held and no progress since the look, this
                // takes the same message out of the queue.
                let taken =
                    unsafe { sys::ucp_tag_probe_nb(locked.handle(), tag, u64::MAX, 1, &mut info) };
                debug_assert_eq!(taken, next);
                found.push((taken, info.length));
            }
            if found.is_empty() {
                return Ok(Vec::new());
            }
            let mut bufs: Vec<Vec<u8>> =
                found.iter().map(|&(_, n)| Vec::with_capacity(n)).collect();
            let batch = post_recvs(
                &locked,
                MemoryType::Host.to_ucs(),
                found.len(),
                |i, param| {
                    let (msg, n) = found[i];
                    // SAFETY: each message was taken out of the queue by the probe above and is
                    // received exactly once, here; each buffer has `n` writable bytes and stays in
                    // place until the batch completes (owned by the guard made right below, before
                    // the lock is released, or parked in the batch by its drop).
                    unsafe {
                        sys::ucp_tag_msg_recv_nbx(
                            locked.handle(),
                            bufs[i].as_mut_ptr().cast(),
                            n,
                            msg,
                            param,
                        )
                    }
                },
            );
            if !batch.is_done() {
                self.track(&batch);
            }
            let lengths: Vec<usize> = found.iter().map(|&(_, n)| n).collect();
            (InFlight::new(batch, bufs, &self.worker, true), lengths)
        };
        let (batch, mut bufs) = guard.done().await;
        for (i, (b, n)) in bufs.iter_mut().zip(lengths).enumerate() {
            let mut c = batch.completion(i);
            // ucp_tag_msg_recv_nbx may not report the length; the probe told it.
            c.length = n;
            self.received(&c, b, n)?;
        }
        self.count_recvs(bufs.len());
        Ok(bufs)
    }
}

/// The buffers in order, and how many were received (or the first failure).
fn gather<B>(done: impl Iterator<Item = (Result<usize>, B)>) -> (Result<usize>, Vec<B>) {
    let mut first: Result<usize> = Ok(0);
    let bufs = done
        .map(|(r, b)| {
            match (&mut first, r) {
                (Ok(n), Ok(_)) => *n += 1,
                (Ok(_), Err(e)) => first = Err(e),
                (Err(_), _) => {}
            }
            b
        })
        .collect();
    (first, bufs)
}

/// Batches of tagged messages.
impl Endpoint {
    /// Sends each buffer as one tagged message on `tag`, in order, posted in one pass and
    /// completed as one: the call a runtime makes for a burst of small control messages (UCX
    /// finishes eager sends at once, so a batch of them allocates nothing and needs no
    /// progress). Gives the buffers back in order.
    ///
    /// If a send fails, the batch reports the first failure; sends after one that failed when
    /// posted are not posted (the endpoint has failed or closed).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> ucx::Result<()> {
    /// use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};
    /// let ctx = Context::new()?;
    /// let worker = Worker::new(&ctx, ProgressMode::Polling)?;
    /// let mut listener = Listener::bind(&worker, "127.0.0.1:0".parse().unwrap())?;
    /// let addr = listener.local_addr();
    /// let (server, client) = tokio::join!(listener.accept(), Endpoint::connect(&worker, addr));
    /// let (server, client) = (server?, client?);
    /// let msgs: Vec<Vec<u8>> = (0u8..16).map(|i| vec![i; 8]).collect();
    /// let bufs = (0..16).map(|_| Vec::with_capacity(8)).collect();
    /// let ((sent, _), (got, bufs)) = tokio::join!(client.send_batch(msgs, 3), server.recv_batch(bufs, 3));
    /// sent?;
    /// assert_eq!(got?, 16);
    /// assert!(bufs.iter().enumerate().all(|(i, b)| *b == vec![i as u8; 8]));
    /// # Ok(()) }
    /// ```
    pub async fn send_batch<B: IoBuf>(
        &self,
        bufs: Vec<B>,
        tag: impl Into<crate::Tag>,
    ) -> (Result<()>, Vec<B>) {
        let (t, _) = self.tag_pair(tag.into());
        self.shared.tag_send_batch(bufs, t).await
    }

    /// Receives one tagged message on `tag` into each buffer, in order (each buffer's length
    /// is set to its message's size, as [`recv`](Self::recv) does): every receive is posted in
    /// one pass, then they are awaited in turn. Returns how many were received, all of them,
    /// or the first failure (buffers before the failing one hold their messages).
    ///
    /// Messages that arrived before the peer failed or closed are still delivered.
    pub async fn recv_batch<B: IoBufMut>(
        &self,
        bufs: Vec<B>,
        tag: impl Into<crate::Tag>,
    ) -> (Result<usize>, Vec<B>) {
        let (_, t) = self.tag_pair(tag.into());
        self.shared.tag_recv_batch(bufs, t).await
    }
}

/// Messages that have arrived.
impl Endpoint {
    /// Receives the messages on `tag` that have already arrived, in order, without waiting for
    /// more: at most `most`, stopping before the first longer than `largest`, which is left
    /// for a later receive. Each lands in a buffer of exactly its size, so memory follows what
    /// arrived. Returns an empty list when nothing has (or the first waiting message is too
    /// long).
    ///
    /// The call for a reader that drains a burst of small messages: one pass under the worker
    /// lock, no receive posted in advance. It does not progress the worker: "arrived" means
    /// seen by UCX, which the progress thread or task does in the other modes, and in polling
    /// mode any pending operation's wait or [`Worker::progress`](crate::Worker::progress).
    /// (A message still on its way by rendezvous is waited for once taken.)
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> ucx::Result<()> {
    /// use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};
    /// let ctx = Context::new()?;
    /// let worker = Worker::new(&ctx, ProgressMode::Polling)?;
    /// let mut listener = Listener::bind(&worker, "127.0.0.1:0".parse().unwrap())?;
    /// let addr = listener.local_addr();
    /// let (server, client) = tokio::join!(listener.accept(), Endpoint::connect(&worker, addr));
    /// let (server, client) = (server?, client?);
    /// client.send_batch(vec![vec![1u8; 8], vec![2u8; 100], vec![3u8; 8]], 3).await.0?;
    /// let mut got = Vec::new();
    /// while got.is_empty() {
    ///     worker.progress(); // polling mode: this thread moves what arrives
    ///     got = server.recv_arrived(3, 16, 64).await?;
    /// }
    /// assert_eq!(got, vec![vec![1u8; 8]]); // the 100-byte message stopped it
    /// assert_eq!(server.recv_vec(3).await?, vec![2u8; 100]);
    /// let mut got = Vec::new();
    /// while got.is_empty() {
    ///     worker.progress();
    ///     got = server.recv_arrived(3, 16, 64).await?;
    /// }
    /// assert_eq!(got, vec![vec![3u8; 8]]);
    /// # Ok(()) }
    /// ```
    pub async fn recv_arrived(
        &self,
        tag: impl Into<crate::Tag>,
        most: usize,
        largest: usize,
    ) -> Result<Vec<Vec<u8>>> {
        let (_, t) = self.tag_pair(tag.into());
        self.shared.tag_recv_arrived(t, most, largest).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn gather_counts_until_the_first_failure() {
        let done = vec![(Ok(8), 1), (Err(Error::Closed), 2), (Ok(8), 3)];
        let (r, bufs) = gather(done.into_iter());
        assert!(matches!(r, Err(Error::Closed)));
        assert_eq!(bufs, vec![1, 2, 3]);
        let (r, _) = gather(vec![(Ok(1), ()), (Ok(2), ())].into_iter());
        assert_eq!(r.ok(), Some(2));
    }
}
