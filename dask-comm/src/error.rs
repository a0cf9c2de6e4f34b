//! dask-comm's errors.

use crate::protocol::DecodeError;
use crate::security::AuthError;

/// What can go wrong running a scheduler, a worker or a client.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The network.
    #[error("transport: {0}")]
    Transport(#[from] transport::Error),
    /// A peer did not prove it knows the cluster's secret (or we did not).
    #[error("authentication: {0}")]
    Auth(#[from] AuthError),
    /// A peer sent a message that does not decode.
    #[error("protocol: {0}")]
    Protocol(#[from] DecodeError),
    /// A peer sent a message that makes no sense where it came (the text says which).
    #[error("unexpected message: {0}")]
    Unexpected(String),
    /// A computation failed.
    #[error(transparent)]
    Compute(#[from] dask_graph::ComputeError),
    /// A value could not be encoded or decoded.
    #[error("data: {0}")]
    Data(#[from] dask_graph::DataError),
    /// The scheduler or cluster went away.
    #[error("lost the cluster: {0}")]
    Disconnected(String),
    /// A setting is wrong (the text says which and why).
    #[error("configuration: {0}")]
    Config(String),
    /// Starting or stopping a process, or a file, failed.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: String,
        /// The operating system's error (shared: errors are `Clone`).
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
    /// Something took longer than its limit.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A launched process could not take its part ([`crate::launch`]).
    #[error("launch: {0}")]
    Launch(#[from] crate::launch::LaunchError),
    /// The scheduler refused a request (a retirement); the text says why.
    #[error("refused by the scheduler: {0}")]
    Refused(String),
    /// The scheduler removed this worker or client (the text says why): a worker process
    /// exits with [`EXIT_REMOVED`](crate::EXIT_REMOVED) and its supervisor starts it again.
    #[error("removed by the scheduler: {0}")]
    Removed(String),
}

impl Error {
    /// The operating system's error, for [`Error::Os`] (also its `source()`, as an
    /// `Arc<io::Error>`: errors are `Clone`).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            Error::Os { source, .. } => Some(source),
            Error::Transport(t) => t.io_error(),
            _ => None,
        }
    }

    /// An operating-system error while doing `what`.
    pub(crate) fn os(what: impl Into<String>, e: std::io::Error) -> Error {
        Error::Os {
            what: what.into(),
            source: std::sync::Arc::new(e),
        }
    }
}

impl From<Error> for dask_graph::ComputeError {
    fn from(e: Error) -> Self {
        match e {
            Error::Compute(c) => c,
            e => dask_graph::ComputeError::Disconnected(e.to_string()),
        }
    }
}

/// dask-comm's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::io;
    use std::sync::Arc;

    use super::Error;

    #[test]
    fn operating_system_errors_keep_theirs_as_the_source() {
        let e = Error::os(
            "reading a spill file",
            io::Error::from(io::ErrorKind::NotFound),
        );
        assert!(e.to_string().starts_with("reading a spill file: "), "{e}");
        let source = e.source().expect("a source");
        let io = source
            .downcast_ref::<Arc<io::Error>>()
            .expect("the io::Error");
        assert_eq!(io.kind(), io::ErrorKind::NotFound);
        assert_eq!(
            e.io_error().map(io::Error::kind),
            Some(io::ErrorKind::NotFound)
        );
        // Clone shares it.
        let Error::Os { source: a, .. } = e.clone() else {
            unreachable!()
        };
        let Error::Os { source: b, .. } = e else {
            unreachable!()
        };
        assert!(Arc::ptr_eq(&a, &b));
        let t = transport::Error::from(io::Error::from(io::ErrorKind::PermissionDenied));
        let io = t.source().and_then(|s| s.downcast_ref::<Arc<io::Error>>());
        assert_eq!(io.map(|e| e.kind()), Some(io::ErrorKind::PermissionDenied));
        let e = Error::from(t);
        assert_eq!(
            e.io_error().map(io::Error::kind),
            Some(io::ErrorKind::PermissionDenied)
        );
    }
}
