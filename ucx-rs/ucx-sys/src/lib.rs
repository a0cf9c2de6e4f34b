//! Raw FFI bindings to UCX's UCP API.
//!
//! Generated at build time by bindgen over the installed `ucp/api/ucp.h` (Debian's `libucx-dev`, or
//! the UCX named by `UCX_PREFIX`), plus `ucxrs_*` shim functions for what bindgen cannot see: the
//! `UCS_PTR_*` macros, `ucp_dt_make_contig` and the static inline `ucp_init`. Nothing else lives
//! here: the safe API is the `ucx-rs` crate.
//!
//! ```
//! // SAFETY: ucp_get_version_string returns a pointer to a static NUL-terminated string.
//! let v = unsafe { std::ffi::CStr::from_ptr(ucx_sys::ucp_get_version_string()) };
//! assert!(v.to_str().unwrap().starts_with('1'));
//! ```
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#![allow(clippy::all)]
#![allow(missing_debug_implementations, unsafe_op_in_unsafe_fn)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
