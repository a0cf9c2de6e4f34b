//! Safe, async, cancellation-safe UCX.
//!
//! The entry points, in the order you use them:
//! 1. [`Context`] (features and UCX options) →
//! 2. [`Worker`] (pick a [`ProgressMode`]) →
//! 3. [`Listener::bind`] on one side, [`Endpoint::connect`] on the other →
//! 4. [`Endpoint::send`] / [`Endpoint::recv`] with owned buffers ([`IoBuf`], [`IoBufMut`]),
//!    `send_obj`/`recv_obj`, the stream API →
//! 5. [`Endpoint::close`].
//!
//! Many small messages at once: [`Endpoint::send_batch`], [`Endpoint::recv_batch`] and
//! [`Endpoint::recv_arrived`] (one pass under the worker lock, one completion).
//!
//! Beyond tagged messages: [`Endpoint::send_multi`]/[`Endpoint::recv_multi`] (UCXX's
//! multi-buffer format, [`multi`]), [`Endpoint::am_send`]/[`Endpoint::am_recv`] (active
//! messages, [`am`]), probes ([`Endpoint::tag_probe`], [`Worker::tag_recv`]), RMA
//! ([`MemoryHandle`], [`Endpoint::unpack_rkey`], [`RemoteKey::put`]/[`RemoteKey::get`],
//! [`Endpoint::flush`], [`Worker::fence`]), [`Endpoint::close_after_n_recv`] and introspection
//! ([`Endpoint::transports`], [`Context::cuda_support`]; which UCX was loaded, from which file,
//! against which headers this was built: [`library`]).
//!
//! Endpoints speak UCXX's wire format (handshake and tags), so a Python UCXX peer can connect to
//! a Rust listener and the other way round.
//!
//! Guarantees: no use-after-free across the FFI even when a future is dropped mid-flight
//! (buffers are owned by the operation and parked until UCX completes it); every pending
//! operation ends with an error when the peer fails or the endpoint closes; bad handshakes are
//! rejected with an error, never a panic.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> ucx::Result<()> {
//! use ucx::{Context, Endpoint, Listener, ProgressMode, Worker};
//!
//! let ctx = Context::new()?;
//! let server = Worker::new(&ctx, ProgressMode::Blocking)?;
//! let client = Worker::new(&ctx, ProgressMode::Blocking)?;
//! let mut listener = Listener::bind(&server, "127.0.0.1:0".parse().unwrap())?;
//! let port = listener.port();
//!
//! let echo = tokio::spawn(async move {
//!     let ep = listener.accept().await?;
//!     let msg = ep.recv_vec(0).await?;
//!     let (r, _) = ep.send(msg, 0).await;
//!     r
//! });
//! let ep = Endpoint::connect(&client, ("127.0.0.1", port)).await?;
//! let (r, _) = ep.send(b"ping".to_vec(), 0).await;
//! r?;
//! let (n, buf) = ep.recv(vec![0u8; 16], 0).await;
//! assert_eq!(&buf[..n?], b"ping");
//! echo.await.unwrap()?;
//! # Ok(()) }
//! ```
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod address;
pub mod am;
mod buffer;
mod context;
#[cfg(feature = "cuda")]
pub mod cuda;
mod endpoint;
mod error;
mod exit;
pub mod library;
mod listener;
pub mod multi;
mod ops;
mod probe;
mod progress;
mod request;
mod rma;
mod sync;
pub mod wire;
mod worker;

pub use am::{AmAllocator, AmBuffer, HostAllocator};
pub use buffer::{advise_huge_pages, host_buffer, IoBuf, IoBufMut, MemoryType};
pub use context::{
    version, Context, ContextBuilder, CudaSupport, Features, Precedence, DEFAULT_CUDA_STAGE_BELOW,
    DEFAULT_OPTIONS,
};
pub use endpoint::{ConnectOptions, Endpoint, DEFAULT_MAX_MESSAGE, DEFAULT_TIMEOUT};
pub use error::{Error, HandshakeError, ProtocolError, Result, RkeyError, Status};
pub use listener::{Arrivals, Listener};
pub use probe::{Probed, ProbedMessage, TagInfo};
pub use rma::{parse_packed_rkey, MemoryHandle, RemoteKey};
pub use wire::Tag;
pub use worker::{ProgressMode, Worker};
