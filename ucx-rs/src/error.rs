//! One error type for the crate, and the single place where a `ucs_status_t` becomes a
//! `Result` ([`completed`], [`received`], [`check`]).
//!
//! Bytes from a peer that do not decode (a handshake, a multi-buffer header, a packed key, an
//! object's length) are [`Error::Protocol`] with a [`ProtocolError`] saying what was wrong; they
//! convert to [`std::io::ErrorKind::InvalidData`].

use std::ffi::CStr;
use std::fmt;
use std::time::Duration;

use ucx_sys as sys;

/// A UCX status code (`ucs_status_t`) other than `UCS_OK`, with UCX's own message.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Status(pub(crate) sys::ucs_status_t);

impl Status {
    /// The raw `ucs_status_t` value (negative for errors).
    pub fn code(self) -> i32 {
        i32::from(self.0)
    }

    /// UCX's description of the status (`ucs_status_string`).
    pub fn message(self) -> &'static str {
        // SAFETY: ucs_status_string accepts any status value and returns a pointer to a static,
        // NUL-terminated string (an "unknown" text for values it does not know).
        let s = unsafe { CStr::from_ptr(sys::ucs_status_string(self.0)) };
        s.to_str().unwrap_or("invalid UTF-8 in UCX status string")
    }

    /// Whether this status means the remote peer failed or went away.
    pub fn is_peer_failure(self) -> bool {
        matches!(
            self.0,
            sys::UCS_ERR_CONNECTION_RESET
                | sys::UCS_ERR_ENDPOINT_TIMEOUT
                | sys::UCS_ERR_UNREACHABLE
                | sys::UCS_ERR_REJECTED
                | sys::UCS_ERR_IO_ERROR
                | sys::UCS_ERR_NOT_CONNECTED
        )
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Status({}, {:?})", self.0, self.message())
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (status {})", self.message(), self.0)
    }
}

/// Which part of the UCXX handshake failed, for [`Error::Handshake`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer's handshake had the wrong length.
    #[error("expected {expected} handshake bytes, got {got}")]
    Length {
        /// Bytes received.
        got: usize,
        /// Bytes a handshake has.
        expected: usize,
    },
    /// The peer's checksum does not match its tag.
    #[error("bad checksum {got:#018x} for tag {tag:#018x} (expected {expected:#018x})")]
    Checksum {
        /// The tag the peer announced.
        tag: u64,
        /// The checksum it sent.
        got: u64,
        /// The checksum of `tag`.
        expected: u64,
    },
    /// Sending our handshake failed.
    #[error("sending the handshake: {0}")]
    Sending(Box<Error>),
    /// Receiving the peer's handshake failed.
    #[error("receiving the handshake: {0}")]
    Receiving(Box<Error>),
    /// The handshake did not finish within the listener's limit.
    #[error("no handshake within {0:?}")]
    TimedOut(Duration),
    /// The task running the handshake ended before it finished (the runtime shut down).
    #[error("the handshake task ended before the handshake did")]
    Aborted,
}

/// Bytes from a peer that are not what the protocol allows. Nothing was allocated for them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A multi-buffer header of the wrong length.
    #[error("multi-buffer header of {got} bytes, expected {expected}")]
    MultiHeaderLength {
        /// Bytes received.
        got: usize,
        /// Bytes a header has.
        expected: usize,
    },
    /// A multi-buffer header whose `next` flag is not a bool.
    #[error("multi-buffer header: `next` is {0}, not a bool")]
    MultiHeaderNext(u8),
    /// A multi-buffer header announcing more frames than one header holds.
    #[error("multi-buffer header announces {got} frames, at most {max}")]
    MultiHeaderFrames {
        /// Frames announced.
        got: u64,
        /// Frames one header holds.
        max: usize,
    },
    /// A multi-buffer frame whose size does not fit this machine's `usize`.
    #[error("multi-buffer frame {index} has size {size}")]
    MultiFrameSize {
        /// The frame's position.
        index: usize,
        /// The announced size.
        size: u64,
    },
    /// A multi-buffer message announcing more frames than allowed.
    #[error("multi-buffer message announces over {max} frames")]
    TooManyFrames {
        /// The limit.
        max: usize,
    },
    /// A message announcing more bytes than the receiver accepts.
    #[error("the peer announced more than {max} bytes")]
    TooLarge {
        /// The receiver's limit ([`Endpoint::set_max_message`](crate::Endpoint::set_max_message)).
        max: usize,
    },
    /// A frame or object whose size differs from what was announced.
    #[error("{got} bytes arrived where {announced} were announced")]
    SizeMismatch {
        /// Bytes that arrived.
        got: usize,
        /// Bytes announced.
        announced: usize,
    },
    /// `recv_obj`'s length message is not 8 bytes.
    #[error("the object's length message has {got} bytes, expected 8")]
    ObjectLength {
        /// Bytes received.
        got: usize,
    },
    /// A packed remote key that was truncated, corrupted or not made by
    /// [`MemoryHandle::pack_rkey`](crate::MemoryHandle::pack_rkey).
    #[error("remote key rejected: {0}")]
    RemoteKey(RkeyError),
}

/// Why a packed remote key was refused (see [`ProtocolError::RemoteKey`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RkeyError {
    /// Shorter than the fixed part of a packed key.
    #[error("{0} bytes is too short")]
    TooShort(usize),
    /// The magic is not ours.
    #[error("not a key packed by MemoryHandle::pack_rkey")]
    Magic,
    /// The length does not match the key's announced length.
    #[error("length {got} does not match its {rkey}-byte key")]
    Length {
        /// Bytes of the packed key.
        got: usize,
        /// The UCX key length it announces.
        rkey: usize,
    },
    /// The checksum does not match (corrupted).
    #[error("checksum mismatch (corrupted)")]
    Checksum,
    /// The region's length does not fit this machine's `usize`.
    #[error("region length {0}")]
    RegionLength(u64),
    /// The UCX key inside does not have the layout `ucp_rkey_pack` gives (memory-domain map,
    /// memory type, a length-prefixed key per domain, the optional device distances), so UCX
    /// would read past it; the byte offset where it stops making sense.
    #[error("not a UCX remote key (layout breaks at byte {0})")]
    Layout(usize),
}

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// UCX returned an error status. A peer that failed or went away shows up here
    /// ([`Status::is_peer_failure`]), also for operations that were pending when it did.
    #[error("UCX: {0}")]
    Ucx(Status),
    /// A message arrived that is larger than the receive buffer. Nothing was delivered.
    #[error("message truncated: a {message}-byte message arrived for a {buffer}-byte buffer")]
    Truncated {
        /// Size of the incoming message in bytes, when UCX reports it (0 when unknown).
        message: usize,
        /// Size of the receive buffer in bytes.
        buffer: usize,
    },
    /// The UCXX connection handshake failed.
    #[error("handshake failed: {0}")]
    Handshake(HandshakeError),
    /// Bytes from the peer that the protocol does not allow.
    #[error("protocol error: {0}")]
    Protocol(ProtocolError),
    /// An operation did not finish within its time limit.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The endpoint was closed locally (close, abort, drop, `close_after_n_recv`) before or
    /// during the operation. Operations pending at that moment are cancelled and end with this
    /// error: it is what UCX's `UCS_ERR_CANCELED` means in this crate.
    #[error("endpoint closed")]
    Closed,
    /// A stream receive was dropped while in flight earlier; UCX cannot cancel those, so the
    /// stream's byte position is lost and further stream receives on this endpoint fail.
    #[error("a stream receive was abandoned mid-flight: the stream position is lost")]
    StreamAbandoned,
    /// Memory for a receive could not be allocated.
    #[error("cannot allocate {bytes} bytes")]
    Alloc {
        /// The size asked for.
        bytes: usize,
    },
    /// A UCX configuration key that the loaded UCX does not know.
    #[error("unknown UCX configuration option `{0}`")]
    UnknownOption(String),
    /// A UCX configuration value that UCX rejected.
    #[error("invalid value `{value}` for UCX option `{key}`: {status}")]
    InvalidOption {
        /// The option key, without the `UCX_` prefix.
        key: String,
        /// The rejected value.
        value: String,
        /// What UCX said.
        status: Status,
    },
    /// An argument the caller passed is not acceptable (a programming error: the text says
    /// which and why).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The progress mode needs a tokio runtime and none is running on this thread.
    #[error("no tokio runtime on this thread: {0} needs one (call it inside a tokio runtime)")]
    NoRuntime(&'static str),
    /// CUDA is not usable (no driver library, no GPU) or a CUDA driver call failed.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// The UCX library loaded is older than the headers this program was built against
    /// ([`library::check_version`](crate::library::check_version)): it may lack what the
    /// program calls. Load that UCX or a newer one.
    #[error(
        "built against UCX {built}, but the UCX loaded is {loaded} ({library}), which is \
         older: load UCX {built} or newer"
    )]
    IncompatibleUcx {
        /// The UCP API version built against (`1.19`).
        built: String,
        /// The loaded library's version (`1.13.1`).
        loaded: String,
        /// The loaded library's file.
        library: String,
    },
    /// An operating-system call failed.
    #[error("{op}: {message}")]
    Os {
        /// The call that failed.
        op: &'static str,
        /// The kind of `std::io::Error` it returned.
        kind: std::io::ErrorKind,
        /// `std::io::Error`'s description.
        message: String,
    },
}

impl Error {
    /// The UCX status behind this error, if it came from UCX.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Ucx(s) | Error::InvalidOption { status: s, .. } => Some(*s),
            _ => None,
        }
    }

    /// True when the error means the connection is gone: the peer failed or closed, or the
    /// endpoint was closed locally.
    pub fn is_disconnect(&self) -> bool {
        match self {
            Error::Ucx(s) => s.is_peer_failure(),
            Error::Closed => true,
            _ => false,
        }
    }

    pub(crate) fn os(op: &'static str, e: std::io::Error) -> Self {
        Error::Os {
            op,
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

impl From<ProtocolError> for Error {
    fn from(e: ProtocolError) -> Self {
        Error::Protocol(e)
    }
}

impl From<HandshakeError> for Error {
    fn from(e: HandshakeError) -> Self {
        Error::Handshake(e)
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        use std::io::ErrorKind as K;
        let kind = match &e {
            Error::Timeout(_) => K::TimedOut,
            Error::Closed => K::NotConnected,
            Error::Ucx(s) if s.is_peer_failure() => K::ConnectionReset,
            Error::InvalidArgument(_) | Error::UnknownOption(_) | Error::InvalidOption { .. } => {
                K::InvalidInput
            }
            Error::Handshake(HandshakeError::Sending(inner) | HandshakeError::Receiving(inner)) => {
                std::io::Error::from((**inner).clone()).kind()
            }
            Error::Handshake(HandshakeError::TimedOut(_)) => K::TimedOut,
            Error::Handshake(HandshakeError::Aborted) => K::Interrupted,
            Error::Truncated { .. } | Error::Handshake(_) | Error::Protocol(_) => K::InvalidData,
            Error::Alloc { .. } => K::OutOfMemory,
            Error::Os { kind, .. } => *kind,
            _ => K::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How an operation ended, as a `Result`: every completion status in the crate goes through
/// here. `UCS_OK` (and `UCS_INPROGRESS`) are success. `UCS_ERR_CANCELED` means one thing: the
/// crate cancelled the operation because its endpoint ended, so it is the peer's failure when
/// the endpoint has one (`ended_by`) and [`Error::Closed`] otherwise.
pub(crate) fn completed(status: sys::ucs_status_t, ended_by: Option<Status>) -> Result<()> {
    match status {
        s if s >= 0 => Ok(()),
        sys::UCS_ERR_CANCELED => Err(ended_by.map_or(Error::Closed, Error::Ucx)),
        s => Err(Error::Ucx(Status(s))),
    }
}

/// [`completed`] for a receive of at most `capacity` bytes that reported `length`: the bytes
/// received, or [`Error::Truncated`] when the message did not fit.
pub(crate) fn received(
    status: sys::ucs_status_t,
    length: usize,
    capacity: usize,
    ended_by: Option<Status>,
) -> Result<usize> {
    if status == sys::UCS_ERR_MESSAGE_TRUNCATED {
        return Err(Error::Truncated {
            message: length,
            buffer: capacity,
        });
    }
    completed(status, ended_by).map(|()| length.min(capacity))
}

/// A status from a call that is not tied to an endpoint, as a `Result`.
pub(crate) fn check(status: sys::ucs_status_t) -> Result<()> {
    completed(status, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_messages_come_from_ucx() {
        let e = check(sys::UCS_ERR_NO_MEMORY).unwrap_err();
        assert_eq!(e.status().unwrap().code(), -4);
        assert!(e.to_string().to_lowercase().contains("memory"), "{e}");
        assert!(check(sys::UCS_OK).is_ok());
    }

    #[test]
    fn disconnects_are_recognised() {
        assert!(Error::Ucx(Status(sys::UCS_ERR_CONNECTION_RESET)).is_disconnect());
        assert!(Error::Closed.is_disconnect());
        assert!(!Error::Timeout(Duration::from_secs(1)).is_disconnect());
        let io: std::io::Error = Error::Ucx(Status(sys::UCS_ERR_ENDPOINT_TIMEOUT)).into();
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
    }

    /// Cancelled means "the endpoint ended": its peer's failure when it has one, else closed.
    #[test]
    fn canceled_means_the_endpoint_ended() {
        assert_eq!(completed(sys::UCS_ERR_CANCELED, None), Err(Error::Closed));
        let reset = Status(sys::UCS_ERR_CONNECTION_RESET);
        assert_eq!(
            completed(sys::UCS_ERR_CANCELED, Some(reset)),
            Err(Error::Ucx(reset))
        );
        assert_eq!(check(sys::UCS_ERR_CANCELED), Err(Error::Closed));
        assert_eq!(
            received(sys::UCS_ERR_MESSAGE_TRUNCATED, 10, 4, None),
            Err(Error::Truncated {
                message: 10,
                buffer: 4
            })
        );
        assert_eq!(received(sys::UCS_OK, 3, 4, None), Ok(3));
    }

    /// Bad bytes from a peer are InvalidData; a handshake that failed to send keeps its cause.
    #[test]
    fn io_kinds() {
        let kind = |e: Error| std::io::Error::from(e).kind();
        assert_eq!(
            kind(ProtocolError::ObjectLength { got: 3 }.into()),
            std::io::ErrorKind::InvalidData
        );
        assert_eq!(
            kind(
                HandshakeError::Length {
                    got: 5,
                    expected: 16
                }
                .into()
            ),
            std::io::ErrorKind::InvalidData
        );
        assert_eq!(
            kind(HandshakeError::Receiving(Box::new(Error::Timeout(Duration::ZERO))).into()),
            std::io::ErrorKind::TimedOut
        );
        assert_eq!(
            kind(Error::Alloc { bytes: 1 }),
            std::io::ErrorKind::OutOfMemory
        );
    }
}
