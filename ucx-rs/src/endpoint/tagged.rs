//! Tagged messages (UCXX's tags, objects, receives of unknown size) and the UCP stream.

use std::sync::atomic::{AtomicBool, Ordering};

use ucx_sys as sys;

use super::{Endpoint, EpShared};
use crate::buffer::{IoBuf, IoBufMut};
use crate::error::{Error, ProtocolError, Result};
use crate::ops;
use crate::probe::{ProbedMessage, TagInfo};
use crate::wire::Tag;

/// User tags whose raw tags an endpoint keeps.
const TAG_CACHE: usize = 32;

impl EpShared {
    pub(crate) async fn tag_send<B: IoBuf>(&self, buf: B, tag: u64) -> (Result<()>, B) {
        self.send_like(buf, 0, |ep, p, n, param| {
            // SAFETY: see send_like.
            unsafe { sys::ucp_tag_send_nbx(ep, p.cast(), n, tag, param) }
        })
        .await
    }

    /// Receives one message on `tag`. Messages that arrived before the peer failed are still
    /// delivered: a receive refused (or cancelled) with the peer's failure takes a message
    /// still waiting in UCX's queue, if there is one, before reporting the failure.
    pub(crate) async fn tag_recv<B: IoBufMut>(&self, buf: B, tag: u64) -> (Result<usize>, B) {
        let (r, buf) = self
            .recv_on(buf, |locked, _ep, landing| {
                // SAFETY: `recv_on` passes the landing to `complete` right after posting, which
                // keeps it until UCX is done with it.
                unsafe { ops::tag_recv(locked, landing, tag, u64::MAX) }
            })
            .await;
        self.rescue_queued(r, buf, tag).await
    }

    /// After a receive on `tag` ended with `r`: one refused (or cancelled) with the peer's
    /// failure takes a message still waiting in UCX's queue, if there is one; a receive that
    /// succeeded is counted.
    pub(crate) async fn rescue_queued<B: IoBufMut>(
        &self,
        r: Result<usize>,
        buf: B,
        tag: u64,
    ) -> (Result<usize>, B) {
        let (r, buf) = match r {
            Err(Error::Ucx(s)) if self.ended_by() == Some(s) => {
                match crate::probe::probe_raw(&self.worker, tag, u64::MAX, true)
                    .and_then(|p| p.message)
                {
                    // Boxed: the rare path keeps every receive's future small.
                    Some(queued) => Box::pin(queued.recv(buf)).await,
                    None => (Err(Error::Ucx(s)), buf),
                }
            }
            r => (r, buf),
        };
        if r.is_ok() {
            self.count_recv();
        }
        (r, buf)
    }

    /// Probes for a message on `tag`, removing it from UCX's unexpected queue when found.
    /// A message that arrived before the peer failed is still delivered.
    /// The message handle is returned as an address so that futures holding it stay `Send`.
    async fn probe(&self, tag: u64) -> Result<(usize, usize)> {
        self.wait_for(|locked| {
            let mut info = sys::ucp_tag_recv_info_t::default();
            // SAFETY: the worker is locked; info is a valid out-pointer.
            let msg =
                unsafe { sys::ucp_tag_probe_nb(locked.handle(), tag, u64::MAX, 1, &mut info) };
            (!msg.is_null()).then_some((msg as usize, info.length))
        })
        .await
    }

    /// Receives the next message on `tag` into a buffer of exactly its size (at most `max`).
    pub(crate) async fn recv_probed(&self, tag: u64, max: usize) -> Result<Vec<u8>> {
        let (msg, len) = self.probe(tag).await?;
        let mut buf: Vec<u8> = Vec::new();
        let fits = len <= max && buf.try_reserve_exact(len).is_ok();
        let cap = if fits { len } else { 0 };
        let posted = {
            let locked = self.worker.lock();
            // SAFETY: msg came from ucp_tag_probe_nb with remove=1 on this worker and is
            // received exactly once, here; cap <= the buffer's capacity; the buffer goes to
            // `complete` right below. A message that does not fit is received into 0 bytes,
            // which discards it.
            unsafe { ops::msg_recv(&locked, msg, &mut buf, cap) }
        };
        let (mut c, mut buf) = self.complete(posted, buf, true).await;
        // ucp_tag_msg_recv_nbx does not report the length of an immediate completion; the
        // probe already told it.
        c.length = len;
        if !fits {
            return Err(Error::Truncated {
                message: len,
                buffer: max.min(len.saturating_sub(1)),
            });
        }
        self.received(&c, &mut buf, cap)?;
        self.count_recv();
        Ok(buf)
    }

    pub(crate) async fn stream_send<B: IoBuf>(&self, buf: B) -> (Result<()>, B) {
        self.send_like(buf, 0, |ep, p, n, param| {
            // SAFETY: see send_like.
            unsafe { sys::ucp_stream_send_nbx(ep, p.cast(), n, param) }
        })
        .await
    }

    pub(crate) async fn stream_recv_exact<B: IoBufMut>(&self, buf: B) -> (Result<usize>, B) {
        if self.stream_abandoned.load(Ordering::Acquire) {
            return (Err(Error::StreamAbandoned), buf);
        }
        // ucp_request_cancel ignores stream receives: if this future is dropped mid-flight,
        // mark the stream abandoned instead of letting a later receive read shifted bytes.
        let guard = AbandonOnDrop(&self.stream_abandoned);
        let r = self
            .recv_on(buf, |locked, ep, landing| {
                // SAFETY: ep is live under the lock; `recv_on` passes the landing to `complete`
                // right after posting.
                unsafe { ops::stream_recv(locked, ep, landing) }
            })
            .await;
        std::mem::forget(guard);
        r
    }
}

/// Marks the endpoint's stream abandoned when dropped (forgotten on completion).
struct AbandonOnDrop<'a>(&'a AtomicBool);

impl Drop for AbandonOnDrop<'_> {
    fn drop(&mut self) {
        tracing::debug!("stream receive dropped in flight: the stream is abandoned");
        self.0.store(true, Ordering::Release);
    }
}

/// Tagged messages and the stream.
impl Endpoint {
    /// The raw (send, receive) tags for `tag`. User tags cost two SHA-1s, so the most recent
    /// ones are cached (a short list: applications use few tags, and a scan beats hashing).
    pub(crate) fn tag_pair(&self, tag: Tag) -> (u64, u64) {
        let Tag::User(t) = tag else {
            return (tag.resolve(self.send_base), tag.resolve(self.recv_base));
        };
        let mut cache = self.tag_cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, s, r)) = cache.iter().find(|(k, _, _)| *k == t) {
            return (s, r);
        }
        let pair = (tag.resolve(self.send_base), tag.resolve(self.recv_base));
        if cache.len() >= TAG_CACHE {
            cache.remove(0);
        }
        cache.push((t, pair.0, pair.1));
        pair
    }

    /// Sends `buf` as one tagged message. Completes when the buffer may be reused.
    pub async fn send<B: IoBuf>(&self, buf: B, tag: impl Into<Tag>) -> (Result<()>, B) {
        let (t, _) = self.tag_pair(tag.into());
        self.shared.tag_send(buf, t).await
    }

    /// Receives one tagged message into `buf` (into its whole capacity for `Vec`/`BytesMut`,
    /// whose length is then set to the message size). Returns the message size.
    ///
    /// A message larger than the buffer fails with [`Error::Truncated`]. Messages that arrived
    /// before the peer failed or closed are still delivered, then the failure is reported.
    pub async fn recv<B: IoBufMut>(&self, buf: B, tag: impl Into<Tag>) -> (Result<usize>, B) {
        let (_, t) = self.tag_pair(tag.into());
        self.shared.tag_recv(buf, t).await
    }

    /// Receives one tagged message of unknown size: probes it, then allocates exactly its size
    /// (refusing more than [`max_message`](Self::set_max_message)).
    pub async fn recv_vec(&self, tag: impl Into<Tag>) -> Result<Vec<u8>> {
        let (_, t) = self.tag_pair(tag.into());
        self.shared.recv_probed(t, self.max_message).await
    }

    /// Waits for the next message on `tag` and takes it out of UCX's queue without receiving
    /// it, so its size is known before any memory is set aside for it; receive it with
    /// [`ProbedMessage::recv`] (dropping it discards the message). A message that arrived
    /// before the peer failed is still found.
    ///
    /// ```no_run
    /// # async fn f(ep: &ucx::Endpoint) -> ucx::Result<()> {
    /// let msg = ep.probe_message(7).await?;
    /// let len = msg.info().length; // allocate what arrived, not what was announced
    /// let (n, buf) = msg.recv(Vec::with_capacity(len)).await;
    /// assert_eq!(n?, buf.len());
    /// # Ok(()) }
    /// ```
    pub async fn probe_message(&self, tag: impl Into<Tag>) -> Result<ProbedMessage> {
        let (_, t) = self.tag_pair(tag.into());
        let (handle, length) = self.shared.probe(t).await?;
        let info = TagInfo {
            length,
            sender_tag: t,
        };
        Ok(ProbedMessage::taken(handle, info, &self.shared.worker))
    }

    /// Limits what [`recv_vec`](Self::recv_vec), [`recv_obj`](Self::recv_obj),
    /// [`recv_multi`](Self::recv_multi) and [`am_recv`](Self::am_recv) allocate.
    pub fn set_max_message(&mut self, bytes: usize) {
        self.max_message = bytes;
    }

    /// The limit [`set_max_message`](Self::set_max_message) set ([`DEFAULT_MAX_MESSAGE`](crate::DEFAULT_MAX_MESSAGE)
    /// unless changed): callers that allocate for an announced size check against it too.
    pub fn max_message(&self) -> usize {
        self.max_message
    }

    /// UCXX's `send_obj`: an 8-byte native-endian length message, then the payload, same tag.
    pub async fn send_obj<B: IoBuf>(&self, buf: B, tag: impl Into<Tag>) -> (Result<()>, B) {
        let (t, _) = self.tag_pair(tag.into());
        let header = (buf.bytes_init() as u64).to_ne_bytes().to_vec();
        let (h, (p, buf)) = futures::join!(
            self.shared.tag_send(header, t),
            self.shared.tag_send(buf, t)
        );
        (h.0.and(p), buf)
    }

    /// UCXX's `recv_obj`: receives the length message, then exactly that many bytes.
    pub async fn recv_obj(&self, tag: impl Into<Tag>) -> Result<Vec<u8>> {
        let (_, t) = self.tag_pair(tag.into());
        let (r, header) = self.shared.tag_recv(Vec::with_capacity(8), t).await;
        let n = r?;
        let Ok(bytes) = <[u8; 8]>::try_from(&header[..]) else {
            return Err(ProtocolError::ObjectLength { got: n }.into());
        };
        let announced = u64::from_ne_bytes(bytes);
        let body = self.shared.recv_probed(t, self.max_message).await?;
        if body.len() as u64 != announced {
            return Err(ProtocolError::SizeMismatch {
                got: body.len(),
                announced: usize::try_from(announced).unwrap_or(usize::MAX),
            }
            .into());
        }
        Ok(body)
    }

    /// Sends bytes on the endpoint's UCP stream (ordered byte stream, no tags).
    pub async fn stream_send<B: IoBuf>(&self, buf: B) -> (Result<()>, B) {
        self.shared.stream_send(buf).await
    }

    /// Receives exactly `buf.bytes_total()` bytes from the UCP stream.
    pub async fn stream_recv_exact<B: IoBufMut>(&self, buf: B) -> (Result<usize>, B) {
        self.shared.stream_recv_exact(buf).await
    }

    /// Probes for a message on `tag` (non-blocking). With `remove`, the message is taken out
    /// of UCX's queue and must be received through [`Probed::message`](crate::Probed); a
    /// message that arrived before the peer closed can still be received that way.
    pub fn tag_probe(&self, tag: impl Into<Tag>, remove: bool) -> Option<crate::Probed> {
        let (_, t) = self.tag_pair(tag.into());
        crate::probe::probe_raw(&self.shared.worker, t, u64::MAX, remove)
    }
}
