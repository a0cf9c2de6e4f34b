//! Every connection of a cluster starts with proof of the cluster's shared secret: the
//! transport's challenge ([`transport::auth`]: HMAC-SHA256 over fresh nonces, both ways,
//! within [`HANDSHAKE_LIMITS`] until it succeeds). The scheduler and workers require it on
//! every connection they accept; clients and workers prove it on every connection they make.

pub use transport::auth::{
    accept, connect, AuthError, Secret, HANDSHAKE_LIMITS, HANDSHAKE_TIMEOUT,
};
