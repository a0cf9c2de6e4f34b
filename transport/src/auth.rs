//! An optional shared-secret challenge at connect, on every backend ([`Options::secret`]).
//!
//! A cluster has a secret (32 random bytes, e.g. in a scheduler file). Before either side may
//! send anything larger than the challenge, both prove they know it, with HMAC-SHA256 over
//! fresh nonces:
//!
//! 1. acceptor → connector: [`MAGIC`], its nonce `a` (32 bytes);
//! 2. connector → acceptor: its nonce `c`, `HMAC(secret, "connector" | a | c)`;
//! 3. acceptor → connector: `HMAC(secret, "acceptor" | a | c)`, or [`REFUSED`] and a close.
//!
//! Until then the connection accepts only messages within [`HANDSHAKE_LIMITS`] (one frame of
//! at most 128 bytes), so a stranger (a wrong secret, garbage, a UCXX client, a port scanner)
//! costs a few hundred bytes, is dropped and logged; a listener keeps accepting others while
//! it does, and each step has a time limit ([`HANDSHAKE_TIMEOUT`]).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> transport::Result<()> {
//! use transport::{auth::Secret, Options};
//! let opts = Options { secret: Some(Secret::generate()), ..Default::default() };
//! let mut l = transport::listen_with(&"tcp://127.0.0.1:0".parse()?, &opts).await?;
//! let addr = l.local_addr().clone();
//! // Connections from `accept` have proved the secret.
//! let (server, client) = tokio::join!(l.accept(), transport::connect_with(&addr, &opts));
//! let (server, client) = (server?, client?);
//! client.send(1, vec![b"hello".to_vec()].into()).await?;
//! assert_eq!(server.recv().await?.1.frames[0].as_host().unwrap().as_ref(), b"hello");
//! // A stranger is refused at connect.
//! let stranger = Options { secret: Some(Secret::generate()), ..Default::default() };
//! assert!(transport::connect_with(&addr, &stranger).await.is_err());
//! # Ok(()) }
//! ```
//!
//! [`Options::secret`]: crate::Options::secret

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::frame::Limits;
use crate::{CloseReason, Connection, Error, Frame, Message, ProtocolError};

/// What a connection accepts until the peer has proved the secret.
pub const HANDSHAKE_LIMITS: Limits = Limits {
    max_frames: 1,
    max_message: 128,
};

/// How long each side may take to answer a step of the challenge.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The channel the challenge travels on (applications may use it afterwards).
pub const AUTH_CHANNEL: u32 = 1;

/// The acceptor's first bytes.
pub const MAGIC: &[u8; 9] = b"DASKCOMM1";

/// What the acceptor answers a wrong proof with, before it closes: the connector learns its
/// secret is not the listener's ([`AuthError::WrongSecret`]) rather than that the connection
/// failed. It says nothing about the secret.
pub const REFUSED: &[u8; 7] = b"REFUSED";

/// A shared secret: 32 bytes.
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

    /// The secret from its 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Secret {
        Secret(bytes)
    }

    /// The secret as 64 hex digits (for a file or the environment).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits (surrounding whitespace ignored).
    ///
    /// ```
    /// use transport::auth::{AuthError, Secret};
    /// let s = Secret::generate();
    /// assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
    /// assert!(matches!(Secret::from_hex("zz"), Err(AuthError::BadSecret)));
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

/// Why the challenge failed. The connection is closed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The peer's proof does not match the secret.
    #[error("the peer does not know the shared secret")]
    WrongSecret,
    /// The peer's first message does not start with [`MAGIC`].
    #[error("not a transport challenge (bad magic)")]
    BadMagic,
    /// The peer sent a message of the wrong shape for this step.
    #[error("not the challenge: channel {channel}, {frames} frames, {bytes} bytes where {expected} belong")]
    Shape {
        /// Its channel.
        channel: u32,
        /// Its frames.
        frames: usize,
        /// Its bytes.
        bytes: usize,
        /// The bytes this step has.
        expected: usize,
    },
    /// The peer sent more than [`HANDSHAKE_LIMITS`] allow, or broke the wire format.
    #[error("not the challenge: {0}")]
    Protocol(ProtocolError),
    /// The peer did not answer in time.
    #[error("no answer to the challenge within {0:?}")]
    Timeout(Duration),
    /// The connection failed during the challenge.
    #[error("the connection failed during the challenge: {0}")]
    Connection(Box<Error>),
    /// A secret that is not 64 hex digits.
    #[error("a secret must be 64 hex digits")]
    BadSecret,
}

async fn send(conn: &Connection, bytes: Vec<u8>) -> Result<(), AuthError> {
    tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        conn.send(AUTH_CHANNEL, Message::from(vec![bytes])),
    )
    .await
    .map_err(|_| AuthError::Timeout(HANDSHAKE_TIMEOUT))?
    .map_err(|e| AuthError::Connection(Box::new(e)))
}

/// The next message, which must be one host frame on [`AUTH_CHANNEL`] (`expected` bytes long
/// for the error that says it is not).
async fn recv_any(conn: &Connection, expected: usize) -> Result<Bytes, AuthError> {
    let (channel, msg) = tokio::time::timeout(HANDSHAKE_TIMEOUT, conn.recv())
        .await
        .map_err(|_| AuthError::Timeout(HANDSHAKE_TIMEOUT))?
        .map_err(|e| match e {
            Error::Protocol(p) => AuthError::Protocol(p),
            Error::Closed(CloseReason::Refused(p)) => AuthError::Protocol(p),
            e => AuthError::Connection(Box::new(e)),
        })?;
    match msg.frames.as_slice() {
        [Frame::Host(b)] if channel == AUTH_CHANNEL => Ok(b.clone()),
        frames => Err(AuthError::Shape {
            channel,
            frames: frames.len(),
            bytes: msg.len(),
            expected,
        }),
    }
}

/// The next message, which must be exactly `len` bytes (see [`recv_any`]).
async fn recv(conn: &Connection, len: usize) -> Result<Bytes, AuthError> {
    exactly(recv_any(conn, len).await?, len)
}

/// `b`, if it is `len` bytes long.
fn exactly(b: Bytes, len: usize) -> Result<Bytes, AuthError> {
    if b.len() != len {
        return Err(AuthError::Shape {
            channel: AUTH_CHANNEL,
            frames: 1,
            bytes: b.len(),
            expected: len,
        });
    }
    Ok(b)
}

/// The accepting side of the challenge, on a connection nothing else has used. On success the
/// connection's limits become `limits`; on failure it is closed (the peer learns at once).
/// [`crate::Listener::accept`] runs it for a listener with [`crate::Options::secret`].
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
    if secret.mac(b"connector", &a, c).verify_slice(proof).is_err() {
        let _ = send(conn, REFUSED.to_vec()).await;
        return Err(AuthError::WrongSecret);
    }
    let answer = secret.mac(b"acceptor", &a, c).finalize().into_bytes();
    send(conn, answer.to_vec()).await?;
    conn.set_limits(limits);
    Ok(())
}

/// The connecting side of the challenge, on a connection nothing else has used. On success
/// the connection's limits become `limits`; on failure it is closed. [`crate::connect_with`]
/// runs it when [`crate::Options::secret`] is set.
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
    let Some(a) = hello.strip_prefix(&MAGIC[..]) else {
        return Err(AuthError::BadMagic);
    };
    let c: [u8; 32] = rand::random();
    let proof = secret.mac(b"connector", a, &c).finalize().into_bytes();
    send(conn, [&c[..], &proof[..]].concat()).await?;
    let answer = recv_any(conn, 32).await?;
    if answer.as_ref() == REFUSED {
        return Err(AuthError::WrongSecret);
    }
    let answer = exactly(answer, 32)?;
    secret
        .mac(b"acceptor", a, &c)
        .verify_slice(&answer)
        .map_err(|_| AuthError::WrongSecret)?;
    conn.set_limits(limits);
    Ok(())
}
