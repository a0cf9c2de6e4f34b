//! One error type for the crate, and the single place where `ucs_status_t` becomes a `Result`.

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

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// UCX returned an error status.
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
    /// The UCXX connection handshake failed (bad checksum, short read, peer gone, timeout).
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// An operation did not finish within its time limit.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The endpoint was closed locally (close, abort or drop) before or during the operation.
    #[error("endpoint closed")]
    Closed,
    /// A stream receive was dropped while in flight earlier; UCX cannot cancel those, so the
    /// stream's byte position is lost and further stream receives on this endpoint fail.
    #[error("a stream receive was abandoned mid-flight: the stream position is lost")]
    StreamAbandoned,
    /// The operation was canceled before it completed.
    #[error("operation canceled")]
    Canceled,
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
    /// An argument the caller passed is not acceptable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The progress mode needs a tokio runtime and none is running on this thread.
    #[error("no tokio runtime on this thread: {0} needs one (call it inside a tokio runtime)")]
    NoRuntime(&'static str),
    /// CUDA is not usable (no driver library, no GPU) or a CUDA driver call failed.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// An operating-system call failed.
    #[error("{op}: {message}")]
    Os {
        /// The call that failed.
        op: &'static str,
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
            Error::Ucx(s) => s.is_peer_failure() || s.0 == sys::UCS_ERR_CANCELED,
            Error::Closed | Error::Canceled => true,
            _ => false,
        }
    }

    pub(crate) fn os(op: &'static str, e: std::io::Error) -> Self {
        Error::Os {
            op,
            message: e.to_string(),
        }
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        use std::io::ErrorKind as K;
        let kind = match &e {
            Error::Timeout(_) => K::TimedOut,
            Error::Closed | Error::Canceled => K::NotConnected,
            Error::Ucx(s) if s.is_peer_failure() => K::ConnectionReset,
            Error::InvalidArgument(_) | Error::UnknownOption(_) | Error::InvalidOption { .. } => {
                K::InvalidInput
            }
            Error::Truncated { .. } | Error::Handshake(_) => K::InvalidData,
            _ => K::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns a UCX status into a `Result`: `UCS_OK` (and `UCS_INPROGRESS`) are success.
pub(crate) fn check(status: sys::ucs_status_t) -> Result<()> {
    if status >= 0 {
        Ok(())
    } else {
        Err(Error::Ucx(Status(status)))
    }
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
}
