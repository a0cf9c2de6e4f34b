//! The exchange that sets up a `ucx://` connection's rings ([`super::ring`]), run on every
//! `ucx://` connection right after it connects (after the lanes exchange of
//! [`crate::Options::ucx_direct`], before the secret's challenge, as that exchange is), so a
//! connector without the secret still learns from the challenge what is wrong. No frame
//! passes through a ring before the challenge is over (nothing of the application moves
//! before), and what the exchange hands a peer needs no secret to guard it: taking a ring
//! takes the right to ptrace its owner, which grants more (its whole memory); a ring taken
//! from a peer is only read where that peer's plans say, and only its control word is
//! written, once frames come through it.
//!
//! 1. Each side sends, on [`RING_OFFER_TAG`], an offer of its ring ([`ring::Offer`]), or
//!    `[0]` when it has none ([`crate::UcxIntent::same_host_ring`] is 0, or no `memfd`
//!    could be made).
//! 2. Each side tries to take the peer's ring ([`ring::RingIn::take`]; only if it is no
//!    larger than its own setting, so never with a setting of 0) and answers on
//!    [`RING_VERDICT_TAG`]: `[1]` taken, `[0]` not.
//! 3. A side sends through its ring once the peer said `[1]`; it receives through the
//!    peer's ring once it said `[1]` itself. Each direction is settled on its own.
//!
//! Both sides always run the exchange, so two processes with different settings agree (a
//! side that offers nothing and declines everything keeps UCX's lanes both ways).

use std::time::Instant;

use super::{closed_or, ring, Conn};
use crate::{Error, ProtocolError, Result};

/// The tag offers travel on.
pub const RING_OFFER_TAG: ucx::Tag = ucx::Tag::User(0x5459);
/// The tag verdicts travel on.
pub const RING_VERDICT_TAG: ucx::Tag = ucx::Tag::User(0x545A);

/// Runs the exchange on `conn` before `deadline`, offering a ring of `size` bytes (0: none,
/// and the peer's is declined).
pub(crate) async fn exchange(conn: &Conn, size: u64, deadline: Instant) -> Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, run(conn, size)).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout(left)),
    }
}

async fn run(conn: &Conn, size: u64) -> Result<()> {
    let mine = match size {
        0 => None,
        _ => ring::RingOut::create(size)
            .inspect_err(
                |e| tracing::debug!(error = %e, "no ring to offer: sending over UCX's lanes"),
            )
            .ok(),
    };
    let offer = mine.as_ref().map_or(vec![0], |r| r.offer().encode());
    let ep = conn.endpoint();
    let (sent, _) = ep.send(offer, RING_OFFER_TAG).await;
    sent.map_err(closed_or)?;
    let (r, buf) = ep
        .recv(
            vec![0u8; ring::OFFER_LEN].into_boxed_slice(),
            RING_OFFER_TAG,
        )
        .await;
    let got = match r {
        Ok(n) => n,
        Err(ucx::Error::Truncated { message, .. }) => {
            return Err(conn.refuse(ProtocolError::RingOffer { got: message }))
        }
        Err(e) => return Err(closed_or(e)),
    };
    let theirs = ring::Offer::decode(&buf[..got])
        .map_err(|()| conn.refuse(ProtocolError::RingOffer { got }))?;
    let taken = match theirs {
        Some(_) if size == 0 => None,
        // A ring larger than this side's own is declined: half of it is what one message
        // may make this side copy out (and allocate) at once.
        Some(offer) if offer.size > size => {
            tracing::debug!(
                offered = offer.size,
                own = size,
                "the peer's ring is larger than this side's: receiving over UCX's lanes"
            );
            None
        }
        Some(offer) => match ring::RingIn::take(&offer) {
            Ok(ring) => Some(ring),
            Err(e) => {
                tracing::debug!(reason = %e, "the peer's ring was not taken: receiving over UCX's lanes");
                None
            }
        },
        _ => None,
    };
    let verdict = u8::from(taken.is_some());
    if let Some(ring) = taken {
        conn.receive_through(ring);
    }
    let (sent, _) = ep.send(vec![verdict], RING_VERDICT_TAG).await;
    sent.map_err(closed_or)?;
    let (r, buf) = ep
        .recv(vec![0u8; 1].into_boxed_slice(), RING_VERDICT_TAG)
        .await;
    let took = match r {
        Ok(1) => buf[0],
        Ok(n) | Err(ucx::Error::Truncated { message: n, .. }) => {
            return Err(conn.refuse(ProtocolError::RingOffer { got: n }))
        }
        Err(e) => return Err(closed_or(e)),
    };
    if let Some(ring) = mine {
        // The peer took its own descriptor, or never will.
        ring.offered();
        match took {
            1 => conn.send_through(ring),
            0 => {}
            _ => return Err(conn.refuse(ProtocolError::RingOffer { got: 1 })),
        }
    } else if took != 0 {
        return Err(conn.refuse(ProtocolError::RingOffer { got: 1 }));
    }
    tracing::debug!(
        sending = conn.rings().0,
        receiving = conn.rings().1,
        "ucx:// rings settled"
    );
    Ok(())
}
