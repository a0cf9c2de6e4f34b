//! Every connection starts with proof of the cluster's shared secret.
//!
//! A cluster has a secret (32 random bytes, in the scheduler file or given to each process).
//! Before either side may send anything larger than the handshake, they prove they know it,
//! both ways, with HMAC-SHA256 over fresh nonces:
//!
//! 1. acceptor → connector: `DASKCOMM1`, its nonce `a` (32 bytes);
//! 2. connector → acceptor: its nonce `c`, `HMAC(secret, "connector" | a | c)`;
//! 3. acceptor → connector: `HMAC(secret, "acceptor" | a | c)`.
//!
//! Until then the connection accepts only messages of [`HANDSHAKE_LIMITS`], so a stranger
//! (wrong secret, garbage, a UCXX client) costs a few hundred bytes, is dropped, and logged.
//! Each step has a time limit.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use transport::frame::Limits;
use transport::{Connection, Message};

/// What a connection accepts until the peer has authenticated.
pub const HANDSHAKE_LIMITS: Limits = Limits {
    max_frames: 1,
    max_message: 128,
};

/// How long each side may take to answer.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The channel the handshake travels on.
const AUTH_CHANNEL: u32 = 1;
const MAGIC: &[u8; 9] = b"DASKCOMM1";

/// A cluster's shared secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A fresh random secret.
    pub fn generate() -> Secret {
        Secret(rand::random())
    }

    /// The secret as 64 hex digits (for the scheduler file and the environment).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits.
    ///
    /// ```
    /// use dask_comm::Secret;
    /// let s = Secret::generate();
    /// assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
    /// assert!(Secret::from_hex("zz").is_err());
    /// ```
    pub fn from_hex(text: &str) -> Result<Secret, AuthError> {
        let text = text.trim();
        if text.len() != 64 || !text.is_ascii() {
            return Err(AuthError::BadSecret);
        }
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                .map_err(|_| AuthError::BadSecret)?;
        }
        Ok(Secret(out))
    }

    fn mac(&self, role: &[u8], a: &[u8], c: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("any key length");
        m.update(role);
        m.update(a);
        m.update(c);
        m
    }
}

/// Why a handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The peer's proof does not match the secret.
    #[error("the peer does not know the cluster's secret")]
    WrongSecret,
    /// The peer sent something that is not the handshake.
    #[error("not a dask-comm handshake ({0})")]
    NotHandshake(String),
    /// The peer did not answer in time.
    #[error("no handshake within {0:?}")]
    Timeout(Duration),
    /// The connection failed during the handshake.
    #[error("the connection failed during the handshake: {0}")]
    Connection(String),
    /// A secret that is not 64 hex digits.
    #[error("a secret must be 64 hex digits")]
    BadSecret,
}

async fn send(conn: &Connection, bytes: Vec<u8>) -> Result<(), AuthError> {
    conn.send(AUTH_CHANNEL, Message::from(vec![bytes]))
        .await
        .map_err(|e| AuthError::Connection(e.to_string()))
}

async fn recv(conn: &Connection, len: usize) -> Result<Bytes, AuthError> {
    let (channel, msg) = tokio::time::timeout(HANDSHAKE_TIMEOUT, conn.recv())
        .await
        .map_err(|_| AuthError::Timeout(HANDSHAKE_TIMEOUT))?
        .map_err(|e| match e {
            transport::TransportError::Protocol(p) => AuthError::NotHandshake(p.to_string()),
            e => AuthError::Connection(e.to_string()),
        })?;
    let bytes = match msg.frames.first() {
        Some(transport::Frame::Host(b)) if channel == AUTH_CHANNEL && msg.frames.len() == 1 => {
            b.clone()
        }
        _ => {
            return Err(AuthError::NotHandshake(format!(
                "channel {channel}, {} frames",
                msg.frames.len()
            )))
        }
    };
    if bytes.len() != len {
        return Err(AuthError::NotHandshake(format!(
            "{} bytes where {len} belong",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// The accepting side of the handshake. On success the connection's limits are raised to
/// `limits`; on failure it is closed (the peer learns at once).
pub async fn accept(conn: &Connection, secret: &Secret, limits: Limits) -> Result<(), AuthError> {
    let r = accept_inner(conn, secret, limits).await;
    if r.is_err() {
        let _ = conn.close().await;
    }
    r
}

async fn accept_inner(conn: &Connection, secret: &Secret, limits: Limits) -> Result<(), AuthError> {
    conn.set_limits(HANDSHAKE_LIMITS);
    let a: [u8; 32] = rand::random();
    send(conn, [&MAGIC[..], &a].concat()).await?;
    let reply = recv(conn, 64).await?;
    let (c, proof) = reply.split_at(32);
    secret
        .mac(b"connector", &a, c)
        .verify_slice(proof)
        .map_err(|_| AuthError::WrongSecret)?;
    send(
        conn,
        secret
            .mac(b"acceptor", &a, c)
            .finalize()
            .into_bytes()
            .to_vec(),
    )
    .await?;
    conn.set_limits(limits);
    Ok(())
}

/// The connecting side of the handshake. On success the connection's limits are raised to
/// `limits`; on failure it is closed.
pub async fn connect(conn: &Connection, secret: &Secret, limits: Limits) -> Result<(), AuthError> {
    let r = connect_inner(conn, secret, limits).await;
    if r.is_err() {
        let _ = conn.close().await;
    }
    r
}

async fn connect_inner(
    conn: &Connection,
    secret: &Secret,
    limits: Limits,
) -> Result<(), AuthError> {
    conn.set_limits(HANDSHAKE_LIMITS);
    let hello = recv(conn, MAGIC.len() + 32).await?;
    if &hello[..MAGIC.len()] != MAGIC {
        return Err(AuthError::NotHandshake("bad magic".into()));
    }
    let a = &hello[MAGIC.len()..];
    let c: [u8; 32] = rand::random();
    let proof = secret.mac(b"connector", a, &c).finalize().into_bytes();
    send(conn, [&c[..], &proof[..]].concat()).await?;
    let answer = recv(conn, 32).await?;
    secret
        .mac(b"acceptor", a, &c)
        .verify_slice(&answer)
        .map_err(|_| AuthError::WrongSecret)?;
    conn.set_limits(limits);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair(addr: &str) -> (Connection, Connection) {
        let mut l = transport::listen(&addr.parse().unwrap()).await.unwrap();
        let a = l.local_addr().clone();
        let (s, c) = tokio::join!(l.accept(), transport::connect(&a));
        (s.unwrap(), c.unwrap())
    }

    #[tokio::test]
    async fn both_sides_prove_the_secret() {
        let secret = Secret::generate();
        let (s, c) = pair("inproc://auth-ok").await;
        let (a, b) = tokio::join!(
            accept(&s, &secret, Limits::default()),
            connect(&c, &secret, Limits::default())
        );
        a.unwrap();
        b.unwrap();
        // Limits are back up: a large message passes.
        let (sent, got) =
            tokio::join!(c.send(2, Message::from(vec![vec![0u8; 1 << 20]])), s.recv());
        sent.unwrap();
        assert_eq!(got.unwrap().1.len(), 1 << 20);
    }

    #[tokio::test]
    async fn a_wrong_secret_or_garbage_is_refused() {
        let (s, c) = pair("inproc://auth-wrong").await;
        let (one, other) = (Secret::generate(), Secret::generate());
        let (a, b) = tokio::join!(
            accept(&s, &one, Limits::default()),
            connect(&c, &other, Limits::default())
        );
        assert_eq!(a.unwrap_err(), AuthError::WrongSecret);
        assert!(b.is_err());
        // A peer that sends a large message instead of the handshake: refused by the limits
        // before anything is allocated for it.
        let (s, c) = pair("tcp://127.0.0.1:0").await;
        let stranger = async {
            let _ = c.recv().await;
            let _ = c
                .send(AUTH_CHANNEL, Message::from(vec![vec![0u8; 100_000]]))
                .await;
        };
        let (a, ()) = tokio::join!(accept(&s, &one, Limits::default()), stranger);
        assert!(matches!(a, Err(AuthError::NotHandshake(_))), "{a:?}");
    }
}
