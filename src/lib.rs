//! The facade of the stack: the echo protocol used by the `ucx-echo` tool, the end-to-end tests
//! and the benchmarks, plus small measurement helpers (CPU pinning, percentiles).
//!
//! The echo protocol runs over an [`ucx::Endpoint`]: the client sends a 24-byte command on
//! [`CTRL_TAG`] (`kind`, `size`, `count`, native-endian `u64`s), then:
//! * `PINGPONG`: `count` times, the client sends `size` bytes on [`DATA_TAG`] and the server
//!   echoes them back on the same tag;
//! * `SINK`: the client streams `count` messages of `size` bytes on [`DATA_TAG`] with many in
//!   flight; the server receives them all and answers with one byte on [`CTRL_TAG`].
//!
//! The server serves commands until the client closes. The protocol trusts its peer: it is for
//! benchmarks and tests (worker addresses it passes to UCX cannot be validated).

pub mod cli;
pub mod echo;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod measure;
