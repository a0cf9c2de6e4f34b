//! `ucx://` same-host lanes ([`crate::Options::ucx_direct`], set on both sides): right after
//! connecting (before the secret's challenge, when there is one), two peers exchange worker
//! addresses and move their traffic to endpoints connected by address.
//!
//! A client-server endpoint carries the listener's TCP lanes beside shared memory, and UCX
//! polls those sockets on every progress call and stripes large messages across them; an
//! endpoint connected by worker address uses what the two workers share, as `ucx_perftest`
//! does (shared memory on one host, the fabric's own lanes across hosts).
//!
//! **The exchange**, on the client-server endpoint (one byte of verdict or offer flag, then
//! the worker address where there is one):
//! 1. connector → acceptor, [`LANES_TAG`]: `1` + its address.
//! 2. acceptor → connector, [`LANES_TAG`]: `1` + its address, or `0` (declined: no endpoint
//!    could be made to the offered address). The acceptor connects to
//!    the offered address and sends a hello there ([`PATH_TAG`]).
//! 3. connector → acceptor, [`LANES_TAG`]: `1` if it received the acceptor's hello on the new
//!    path within [`PATH_TIMEOUT`] and its own hello went out; it connects to the acceptor's
//!    address and sends its hello first.
//! 4. acceptor → connector, [`LANES_TAG`]: `1` if the verdict was `1` and the connector's hello
//!    arrived. Both move on this final byte, or both stay; nothing of the application has
//!    moved yet, so no message can overtake another across the two paths.
//!
//! The acceptor hands UCX an address from a peer it has not authenticated. UCX unpacks
//! addresses without validating them, but its listener already unpacks the worker address
//! every client sends in its connection request (UCX's client-server wire-up), so a peer able
//! to connect could already hand UCX an address; the exchange bounds the offer at
//! [`MAX_OFFER`] bytes and checks its shape.
//!
//! A path that does not carry a hello in time (workers on two hosts whose addresses name
//! interfaces the other cannot reach) leaves the connection on its client-server endpoint. A
//! peer that answers nothing fails the connect within its time limit.
//!
//! **After the move** the client-server endpoint stays open, unused: its TCP connection tells
//! at once when the peer dies or cuts the connection, which an endpoint on shared memory learns
//! only from UCX's keepalive (20 s by default), and a cut-off peer (refused, or one whose send
//! failed part-way) is told nothing at all on shared memory. A close sends a goodbye on it
//! ([`LANES_TAG`], `2`) after the close marker, so that its reset is not taken for a failure;
//! a reset without a goodbye ends the connection's pending operations with
//! [`crate::CloseReason::PeerFailed`]. The price: UCX still polls that endpoint's TCP sockets
//! on every progress call (about 0.4 µs of each 8-byte one-way trip here; docs/transport.md).

use std::time::{Duration, Instant};

use crate::ucx_backend::Conn;
use crate::{Error, Options, ProtocolError, Result};

/// The tag the exchange travels on (over the client-server endpoint).
pub const LANES_TAG: ucx::Tag = ucx::Tag::User(0x5457);
/// The tag of the hellos that prove a new path carries messages.
pub const PATH_TAG: ucx::Tag = ucx::Tag::User(0x5458);
/// How long a side waits for the peer's hello on the new path.
pub const PATH_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest offer accepted: a flag and a worker address (a few hundred bytes with shared
/// memory and TCP; more with many RDMA devices).
pub const MAX_OFFER: usize = 64 << 10;

/// Which side of the exchange this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Connector,
    Acceptor,
}

/// Runs the exchange on `conn` before `deadline`; on agreement the connection's traffic moves
/// to the new endpoint. Fails only if the client-server endpoint itself fails (or the peer
/// breaks the exchange), or the deadline passes.
pub(crate) async fn settle(
    conn: &Conn,
    role: Role,
    opts: &Options,
    deadline: Instant,
) -> Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    let exchange = async {
        match role {
            Role::Connector => connector(conn).await,
            Role::Acceptor => acceptor(conn).await,
        }
    };
    match tokio::time::timeout(left, exchange).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout(opts.connect_timeout)),
    }
}

async fn connector(conn: &Conn) -> Result<()> {
    let cs = conn.client_server();
    send(cs, [&[1u8][..], &cs.worker().address()?].concat()).await?;
    let answer = recv(cs, MAX_OFFER).await?;
    let Some(address) = offered(&answer)? else {
        tracing::debug!("ucx:// stays on its client-server endpoint (the peer declined)");
        return Ok(());
    };
    // SAFETY: the address comes from the listener this side chose to connect to, which
    // answered the UCXX handshake (a trusted peer), and it is the exchange's unmodified bytes.
    let path = match unsafe { cs.connect_address_alike(address) } {
        Ok(ep) => Some(ep),
        Err(e) => {
            tracing::debug!(error = %e, "no endpoint to the peer's worker address");
            None
        }
    };
    let carried = match &path {
        Some(ep) => {
            let (sent, heard) = tokio::join!(hello(ep), heard(ep));
            sent && heard
        }
        None => false,
    };
    send(cs, vec![u8::from(carried)]).await?;
    let fin = flag(&recv(cs, 1).await?)?;
    finish(conn, path, carried && fin);
    Ok(())
}

async fn acceptor(conn: &Conn) -> Result<()> {
    let cs = conn.client_server();
    let offer = recv(cs, MAX_OFFER).await?;
    let address = offered(&offer)?;
    // SAFETY: the bytes are the peer's worker address as it sent it, unmodified; UCX's
    // listener trusted the address in this peer's connection request just the same (module
    // docs: a peer that can connect can already hand UCX an address).
    let path = address.and_then(|a| match unsafe { cs.connect_address_alike(a) } {
        Ok(ep) => Some(ep),
        Err(e) => {
            tracing::debug!(error = %e, "no endpoint to the peer's worker address");
            None
        }
    });
    let Some(ep) = path else {
        send(cs, vec![0u8]).await?;
        tracing::debug!("ucx:// stays on its client-server endpoint");
        return Ok(());
    };
    send(cs, [&[1u8][..], &cs.worker().address()?].concat()).await?;
    let (sent, verdict) = tokio::join!(hello(&ep), recv(cs, 1));
    let carried = flag(&verdict?)? && sent && heard(&ep).await;
    send(cs, vec![u8::from(carried)]).await?;
    finish(conn, Some(ep), carried);
    Ok(())
}

/// Moves to `path` if both sides agreed; otherwise lets it go.
fn finish(conn: &Conn, path: Option<ucx::Endpoint>, agreed: bool) {
    match path {
        Some(ep) if agreed => conn.move_to(ep),
        Some(ep) => {
            tracing::debug!("the path by worker address carried nothing in time: ucx:// stays on its client-server endpoint");
            ep.abort();
        }
        None => {}
    }
}

/// Sends this side's hello on the new path (within [`PATH_TIMEOUT`]).
async fn hello(ep: &ucx::Endpoint) -> bool {
    matches!(
        tokio::time::timeout(PATH_TIMEOUT, ep.send(vec![1u8], PATH_TAG)).await,
        Ok((Ok(()), _))
    )
}

/// Waits for the peer's hello on the new path (within [`PATH_TIMEOUT`]).
async fn heard(ep: &ucx::Endpoint) -> bool {
    matches!(
        tokio::time::timeout(PATH_TIMEOUT, ep.recv(vec![0u8; 1], PATH_TAG)).await,
        Ok((Ok(1), _))
    )
}

async fn send(ep: &ucx::Endpoint, bytes: Vec<u8>) -> Result<()> {
    let (r, _) = ep.send(bytes, LANES_TAG).await;
    r.map_err(crate::ucx_backend::closed_or)
}

/// Receives one message of the exchange, at most `max` bytes.
async fn recv(ep: &ucx::Endpoint, max: usize) -> Result<Vec<u8>> {
    let (r, mut buf) = ep.recv(vec![0u8; max], LANES_TAG).await;
    match r {
        Ok(n) => {
            buf.truncate(n);
            Ok(buf)
        }
        Err(ucx::Error::Truncated { message, .. }) => Err(broken(message)),
        Err(e) => Err(crate::ucx_backend::closed_or(e)),
    }
}

/// An offer or answer: `Some(address)` or `None` (declined).
fn offered(bytes: &[u8]) -> Result<Option<&[u8]>> {
    match bytes.split_first() {
        Some((0, [])) => Ok(None),
        Some((1, address)) if address.len() >= 8 => Ok(Some(address)),
        _ => Err(broken(bytes.len())),
    }
}

/// A verdict: one byte, `0` or `1`.
fn flag(bytes: &[u8]) -> Result<bool> {
    match bytes {
        [0] => Ok(false),
        [1] => Ok(true),
        _ => Err(broken(bytes.len())),
    }
}

fn broken(got: usize) -> Error {
    tracing::warn!(got, "the peer broke the ucx:// lanes exchange");
    Error::Protocol(ProtocolError::Lanes { got })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_parse_strictly() {
        assert_eq!(offered(&[0]).unwrap(), None);
        assert_eq!(
            offered(&[1, 1, 2, 3, 4, 5, 6, 7, 8]).unwrap(),
            Some(&[1, 2, 3, 4, 5, 6, 7, 8][..])
        );
        for bad in [&[][..], &[0, 1], &[1, 2, 3], &[2, 0, 0, 0, 0, 0, 0, 0, 0]] {
            assert!(matches!(
                offered(bad),
                Err(Error::Protocol(ProtocolError::Lanes { .. }))
            ));
        }
        assert!(flag(&[1]).unwrap() && !flag(&[0]).unwrap());
        assert!(flag(&[2]).is_err() && flag(&[]).is_err() && flag(&[1, 1]).is_err());
    }
}
