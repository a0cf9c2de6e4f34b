//! A round trip through the peer's progress engine: [`Endpoint::sync_with_peer`].
//!
//! UCX completes a send once its bytes left this process (an eager message in the peer's
//! shared-memory queue, the last fragment of a rendezvous handed to the transport); the peer
//! takes them in only when its worker progresses. A close that follows at once can overtake
//! them: the close travels on the connection manager's socket, and the peer's UCX fails the
//! endpoint (and the receive still taking a rendezvous in) when it handles that socket first.
//! Measured on one host with client-server endpoints whose lanes are all shared memory: a
//! 1 MiB echo sent just before the sender dropped its endpoint was lost in 7 runs of 40.
//!
//! So a sender that closes can first ask the peer's worker to answer: a ping (an active
//! message with a token, on the endpoint's own lanes, after everything it sent) that the
//! peer's AM handler answers at once from inside its progress, without its application. By
//! the time the answer is back, the peer has handled everything before the ping.
//! Only ucx-rs workers answer; other peers (UCXX) drop the ping, so bound the wait.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ucx_sys as sys;

use crate::endpoint::EpShared;
use crate::error::Result;
use crate::worker::WorkerShared;
use crate::Endpoint;

/// The AM id of a ping (8 bytes: a token to send back).
const PING_ID: u32 = 0x5c;
/// The AM id of the answer (the ping's 8 bytes).
const PONG_ID: u32 = 0x5d;

/// Tokens this worker waits for, and whether each came back (bounded by the local waiters:
/// an answer nobody waits for is dropped).
#[derive(Default)]
pub(crate) struct Pongs(HashMap<u64, bool>);

/// Registers the ping and answer handlers on a freshly created worker.
pub(crate) fn register(worker: &Arc<WorkerShared>) -> Result<()> {
    crate::am::set_handler(worker, PING_ID, ping_cb)?;
    crate::am::set_handler(worker, PONG_ID, pong_cb)
}

/// The 8 bytes of an eager message, if it is one of exactly 8 bytes.
///
/// # Safety
/// As UCX passes them to an AM handler: `data` readable for `length` bytes during the call.
unsafe fn token(
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> Option<[u8; 8]> {
    // SAFETY: UCX passes a valid parameter record for the duration of the call.
    let rndv = unsafe { (*param).recv_attr } & u64::from(sys::UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if rndv || length != 8 || data.is_null() {
        return None;
    }
    let mut t = [0u8; 8];
    // SAFETY: eager data: `length` (8) readable bytes at `data`, valid during the call.
    t.copy_from_slice(unsafe { std::slice::from_raw_parts(data as *const u8, 8) });
    Some(t)
}

/// Answers a ping from inside the progress call that delivered it (UCX names the endpoint to
/// answer on, `reply_ep`, for exactly this).
unsafe extern "C" fn ping_cb(
    _arg: *mut c_void,
    _header: *const c_void,
    _header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: as UCX calls AM handlers.
    let Some(t) = (unsafe { token(data, length, param) }) else {
        tracing::debug!(length, "ignoring a malformed sync ping");
        return sys::UCS_OK;
    };
    // SAFETY: as above.
    let reply_ep = unsafe { (*param).reply_ep };
    if reply_ep.is_null() {
        return sys::UCS_OK;
    }
    // The answer's bytes must outlive the send: boxed, freed by the completion callback, or
    // here when UCX finishes (or refuses) the send at once.
    let answer = Box::into_raw(Box::new(t));
    let mut p = sys::ucp_request_param_t {
        op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
            | sys::UCP_OP_ATTR_FIELD_USER_DATA
            | sys::UCP_OP_ATTR_FIELD_FLAGS,
        flags: sys::UCP_AM_SEND_FLAG_EAGER,
        user_data: answer.cast(),
        ..Default::default()
    };
    p.cb.send = Some(answer_sent);
    // SAFETY: reply_ep is valid during the handler, which runs inside a call on the worker
    // (locked by whoever progresses it); the header is empty; `answer` holds 8 bytes that live
    // until freed below or by `answer_sent`.
    let ret =
        unsafe { sys::ucp_am_send_nbx(reply_ep, PONG_ID, ptr::null(), 0, answer.cast(), 8, &p) };
    // SAFETY: only inspects the pointer value.
    if unsafe { sys::ucxrs_ptr_is_ptr(ret) } == 0 {
        // Done or refused at once: no callback will come.
        // SAFETY: `answer` came from Box::into_raw above and UCX no longer uses it.
        drop(unsafe { Box::from_raw(answer) });
    }
    sys::UCS_OK
}

unsafe extern "C" fn answer_sent(
    request: *mut c_void,
    _status: sys::ucs_status_t,
    user_data: *mut c_void,
) {
    // SAFETY: user_data is the Box::into_raw of `ping_cb`, handed to this one callback.
    drop(unsafe { Box::from_raw(user_data as *mut [u8; 8]) });
    // SAFETY: the request is UCX's, complete, and released once here.
    unsafe { sys::ucp_request_free(request) };
}

unsafe extern "C" fn pong_cb(
    arg: *mut c_void,
    _header: *const c_void,
    _header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the WorkerShared this handler was registered for (see `register`).
    let worker = unsafe { &*(arg as *const WorkerShared) };
    // SAFETY: as UCX calls AM handlers.
    if let Some(t) = unsafe { token(data, length, param) } {
        if let Some(back) = worker.pongs().0.get_mut(&u64::from_le_bytes(t)) {
            *back = true;
        }
    }
    sys::UCS_OK
}

impl EpShared {
    async fn sync_with_peer(&self) -> Result<()> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let t = NEXT.fetch_add(1, Ordering::Relaxed);
        self.worker.pongs().0.insert(t, false);
        let _forget = Forget(&self.worker, t);
        let (sent, _) = self
            .send_like(
                t.to_le_bytes().to_vec(),
                sys::UCP_AM_SEND_FLAG_REPLY | sys::UCP_AM_SEND_FLAG_EAGER,
                |ep, p, n, param| {
                    // SAFETY: see send_like; no header.
                    unsafe { sys::ucp_am_send_nbx(ep, PING_ID, ptr::null(), 0, p.cast(), n, param) }
                },
            )
            .await;
        sent?;
        self.wait_for(|_| {
            let pongs = self.worker.pongs();
            pongs.0.get(&t).copied().unwrap_or(false).then_some(())
        })
        .await
    }
}

/// Forgets a token when its wait ends, however it ends.
struct Forget<'a>(&'a WorkerShared, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.pongs().0.remove(&self.1);
    }
}

impl Endpoint {
    /// Waits until the peer's worker has taken in everything sent on this endpoint before:
    /// one active message there and back, answered by the peer's progress engine (not its
    /// application). Call it before closing when the peer must get what was just sent: UCX
    /// completes a send once it left this process, and a close can overtake what the peer has
    /// not taken in yet (see the module docs of `sync.rs`).
    ///
    /// Only ucx-rs peers answer, and a peer that does not progress answers late: bound the
    /// wait with a timeout. Fails if the endpoint fails or closes first.
    ///
    /// ```no_run
    /// # async fn f(ep: ucx::Endpoint) -> ucx::Result<()> {
    /// ep.send(vec![7u8; 1 << 20], 1).await.0?;
    /// let _ = tokio::time::timeout(std::time::Duration::from_secs(1), ep.sync_with_peer()).await;
    /// ep.close().await
    /// # }
    /// ```
    pub async fn sync_with_peer(&self) -> Result<()> {
        self.shared.sync_with_peer().await
    }
}
