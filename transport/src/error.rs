//! What can go wrong on a connection, typed so that a runtime can tell a peer that left from
//! one that failed and from one that broke the protocol.

use std::sync::Arc;
use std::time::Duration;

use crate::address::AddressError;
use crate::frame::HeaderError;

/// Everything that can go wrong on a connection.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The address did not parse.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// The connection is closed; the reason says who closed it and how.
    #[error("connection closed: {0}")]
    Closed(CloseReason),
    /// The peer sent bytes the wire format does not allow. The connection is closed (its
    /// [`CloseReason`] is [`CloseReason::Refused`]) and nothing was allocated for them.
    #[error("protocol error from the peer: {0}")]
    Protocol(#[from] ProtocolError),
    /// An outgoing message over this connection's limits, or on a reserved channel: nothing
    /// was sent, and the connection is still open.
    #[error("message refused before sending: {0}")]
    Refused(Refusal),
    /// Connecting did not finish in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The shared-secret challenge at connect failed ([`crate::Options::secret`]); the
    /// connection is closed.
    #[error("authentication: {0}")]
    Auth(#[from] crate::auth::AuthError),
    /// TLS could not be set up, or its handshake failed.
    #[cfg(feature = "tls")]
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// An operating-system error other than the peer going away (also its
    /// [`source`](std::error::Error::source)).
    #[error("{0}")]
    Io(#[source] Arc<std::io::Error>),
    /// An error from UCX other than the peer going away.
    #[cfg(feature = "ucx")]
    #[error("UCX: {0}")]
    Ucx(#[from] ucx::Error),
    /// The address's scheme needs a feature this build of `transport` does not have.
    #[error("{scheme}:// is not built in: enable transport's `{feature}` feature")]
    NotBuilt {
        /// The scheme asked for.
        scheme: &'static str,
        /// The cargo feature that provides it.
        feature: &'static str,
    },
    /// Nothing listens on that `inproc://` name, or it is taken.
    #[error("{0}")]
    Inproc(InprocError),
    /// hwloc could not describe the machine, or a CPU list did not parse.
    #[cfg(feature = "topology")]
    #[error("topology: {0}")]
    Topology(String),
    /// The transport configuration is inconsistent or came too late (a programming error: the
    /// text says what).
    #[error("configuration: {0}")]
    Config(String),
}

impl Error {
    /// The operating system's error, for [`Error::Io`] (also its `source()`, as an
    /// `Arc<io::Error>`: errors are `Clone`).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }

    /// Why the connection closed, when this error means it did.
    pub fn close_reason(&self) -> Option<&CloseReason> {
        match self {
            Error::Closed(r) => Some(r),
            _ => None,
        }
    }

    /// Whether the connection is gone (closed by either side, failed, or refused).
    pub fn is_closed(&self) -> bool {
        matches!(self, Error::Closed(_) | Error::Protocol(_))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::ConnectionReset | K::BrokenPipe | K::ConnectionAborted => {
                Error::Closed(CloseReason::PeerFailed(Failure::Io(e.kind())))
            }
            K::UnexpectedEof => Error::Closed(CloseReason::PeerFailed(Failure::Truncated)),
            _ => Error::Io(Arc::new(e)),
        }
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        use std::io::ErrorKind as K;
        let kind = match &e {
            Error::Io(io) => io.kind(),
            Error::Closed(CloseReason::Local) => K::NotConnected,
            Error::Closed(CloseReason::PeerFailed(Failure::Io(k))) => *k,
            Error::Closed(_) => K::ConnectionReset,
            Error::Protocol(_) => K::InvalidData,
            Error::Timeout(_) => K::TimedOut,
            Error::Address(_) | Error::Refused(_) | Error::Config(_) => K::InvalidInput,
            _ => K::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// Why a connection closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloseReason {
    /// This side closed it ([`Connection::close`](crate::Connection::close), or a send dropped
    /// part-way through a message on `tcp://`, which cannot be taken back).
    #[error("closed by this side")]
    Local,
    /// The peer closed it (its close arrived after everything it sent).
    #[error("closed by the peer")]
    PeerClosed,
    /// The peer went away without closing: crashed, killed, or the network failed.
    #[error("the peer failed: {0}")]
    PeerFailed(Failure),
    /// This side closed it because the peer broke the wire format.
    #[error("refused: {0}")]
    Refused(ProtocolError),
}

/// How a peer failed (see [`CloseReason::PeerFailed`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// UCX's error handling reported the peer failed, with this status.
    #[cfg(feature = "ucx")]
    #[error("UCX: {0}")]
    Ucx(ucx::Status),
    /// The operating system reported this on the socket.
    #[error("{0}")]
    Io(std::io::ErrorKind),
    /// The connection ended between messages without the peer's close.
    #[error("the connection ended without a close")]
    Vanished,
    /// The connection ended in the middle of a message.
    #[error("the connection ended in the middle of a message")]
    Truncated,
}

/// Bytes from a peer that the wire format does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A header that does not decode or is over the limits.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// A frame whose size differs from its header's.
    #[error("a {got}-byte frame announced as {announced}")]
    FrameSize {
        /// Bytes that arrived.
        got: u64,
        /// Bytes announced.
        announced: u64,
    },
    /// `ucx://`: a first message longer than [`crate::UCX_FIRST_MAX`].
    #[error("a {got}-byte first message (at most {max})")]
    FirstMessage {
        /// Bytes that arrived (0 when UCX does not say).
        got: usize,
        /// The most allowed.
        max: usize,
    },
    /// `ucx://`: a header whose parts do not add up.
    #[error("a header of {frames} frames in {got} bytes")]
    HeaderParts {
        /// Frames announced.
        frames: u32,
        /// Header bytes that arrived.
        got: usize,
    },
    /// `ucx://`: an inlined message whose bytes do not match its header.
    #[error("{got} bytes after the header for {announced} bytes of frames")]
    Inline {
        /// Bytes after the header.
        got: usize,
        /// Bytes the header announced.
        announced: u64,
    },
    /// `ucx://`: a credit grant that is not one.
    #[error("a credit grant of {got} bytes for {bytes} bytes")]
    Grant {
        /// Bytes of the grant message.
        got: usize,
        /// Bytes it grants.
        bytes: u64,
    },
    /// A device frame could not be placed (no device memory), so the message cannot be
    /// received in order: the connection ends.
    #[error("a device frame could not land: {0}")]
    DeviceFrame(String),
    /// No host memory could be had for a frame the header announced (within the limits): the
    /// message cannot be received in order, so the connection ends.
    #[error("no memory for a frame of {size} bytes")]
    FrameMemory {
        /// The frame's announced size.
        size: u64,
    },
    /// `ucx://`: a bundle (messages of a batched send in one UCX message) holding something
    /// other than whole inlined messages.
    #[error("a bundled message that is not whole ({at} bytes into the bundle)")]
    Bundled {
        /// Where in the UCX message the part starts.
        at: usize,
    },
    /// `ucx://`: a message of the lanes exchange (after connecting) that is not one.
    #[error("a {got}-byte message in the ucx:// lanes exchange")]
    Lanes {
        /// Bytes that arrived.
        got: usize,
    },
    /// `ucx://`: a message of the shared-memory ring exchange (after connecting) that is not
    /// one (docs/transport.md, "Which lane carries what on one host").
    #[error("a {got}-byte message in the ucx:// ring exchange")]
    RingOffer {
        /// Bytes that arrived.
        got: usize,
    },
    /// `ucx://`: a ring message's plan that does not name one offset per ring frame.
    #[error("a {got}-byte ring plan for {want} bytes of offsets")]
    RingPlanSize {
        /// Bytes that arrived.
        got: usize,
        /// Bytes the header implies.
        want: usize,
    },
    /// `ucx://`: a ring frame placed outside the ring.
    #[error("a {len}-byte ring frame at offset {offset} of a {size}-byte ring")]
    RingPlan {
        /// Where the plan put it.
        offset: u64,
        /// Its bytes.
        len: u64,
        /// The ring's bytes.
        size: u64,
    },
    /// `ucx://`: the receiver counted ring frames copied out that were never placed (or
    /// fewer than it had counted).
    #[error("{count} ring frames counted copied out of {placed} placed")]
    RingCount {
        /// What the receiver counted.
        count: u64,
        /// Frames placed.
        placed: u64,
    },
}

/// Why an outgoing message was refused before sending (see [`Error::Refused`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Over the connection's [`Limits`](crate::frame::Limits).
    #[error(transparent)]
    Limits(#[from] HeaderError),
    /// Channel [`CLOSE_CHANNEL`](crate::CLOSE_CHANNEL) is the transport's own.
    #[error("channel {0} is reserved for the transport's close")]
    Channel(u32),
}

/// `inproc://` name errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InprocError {
    /// Another listener has the name.
    #[error("inproc://{0} is already listening")]
    Taken(String),
    /// No listener has the name (or it stopped).
    #[error("nothing listens on inproc://{0}")]
    NotListening(String),
}
