//! Which UCX this process runs on: the loaded library's version and file, the UCP API version
//! these bindings were generated from, and the check that the first is not older than the
//! second.
//!
//! A program built against one UCX runs on the same or a newer one (UCP's API only grows
//! within a major version); on an older one it may call what that library lacks, with struct
//! fields it does not know. UCX itself only prints a warning then; [`check_version`] refuses,
//! and [`Context::new`](crate::Context::new) calls it first.
//!
//! ```
//! let loaded = ucx::library::loaded_version();
//! let (major, minor) = ucx::library::built_against();
//! assert!((loaded.major, loaded.minor) >= (major, minor));
//! ucx::library::check_version().unwrap();
//! println!("UCX {loaded} from {:?}", ucx::library::library_path());
//! ```

use std::ffi::{c_void, CStr};
use std::fmt;
use std::path::PathBuf;

use ucx_sys as sys;

use crate::error::{Error, Result};

/// A UCX release, as `ucp_get_version` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UcxVersion {
    /// The major version (`1`).
    pub major: u32,
    /// The minor version (`22` in 1.22.0).
    pub minor: u32,
    /// The release (`0` in 1.22.0).
    pub release: u32,
}

impl fmt::Display for UcxVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.release)
    }
}

/// The version of the UCX library this process loaded.
pub fn loaded_version() -> UcxVersion {
    let (mut major, mut minor, mut release) = (0u32, 0u32, 0u32);
    // SAFETY: out-pointers to three live u32s.
    unsafe { sys::ucp_get_version(&mut major, &mut minor, &mut release) };
    UcxVersion {
        major,
        minor,
        release,
    }
}

/// The UCP API version (`UCP_API_MAJOR`, `UCP_API_MINOR`) of the headers these bindings were
/// generated from: the oldest UCX this build runs on.
pub fn built_against() -> (u32, u32) {
    (sys::UCP_API_MAJOR, sys::UCP_API_MINOR)
}

/// The file the dynamic linker loaded `libucp` from (where `ucp_get_version` lives), if it can
/// tell.
pub fn library_path() -> Option<PathBuf> {
    // SAFETY: an all-zero Dl_info is a valid out-value (null pointers, zero addresses).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = sys::ucp_get_version as *const c_void;
    // SAFETY: addr is the address of a function of a loaded library; dladdr only reads the
    // loader's tables and fills `info`, whose dli_fname then points at a NUL-terminated string
    // the loader owns for as long as the library stays loaded (libucp is never unloaded: this
    // binary links it).
    let found = unsafe { libc::dladdr(addr, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: checked non-null above; see the previous block for its lifetime.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let path = PathBuf::from(name.to_string_lossy().into_owned());
    Some(std::fs::canonicalize(&path).unwrap_or(path))
}

/// Refuses a loaded UCX older than the headers this build was generated from
/// ([`Error::IncompatibleUcx`], naming both and the library's file).
pub fn check_version() -> Result<()> {
    let loaded = loaded_version();
    let (major, minor) = built_against();
    if (loaded.major, loaded.minor) >= (major, minor) {
        return Ok(());
    }
    let library = library_path().map_or_else(|| "libucp".into(), |p| p.display().to_string());
    tracing::error!(%loaded, built = %format!("{major}.{minor}"), %library, "UCX older than the one built against");
    Err(Error::IncompatibleUcx {
        built: format!("{major}.{minor}"),
        loaded: loaded.to_string(),
        library,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loaded UCX is the one this test was built against or newer, its version agrees
    /// with its version string, and its file is a libucp.
    #[test]
    fn loaded_library() {
        check_version().unwrap();
        let v = loaded_version();
        assert!(crate::version().starts_with(&format!("{}.{}", v.major, v.minor)));
        let path = library_path().expect("dladdr finds libucp");
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("libucp.so"), "{}", path.display());
        assert!(path.exists());
    }

    #[test]
    fn versions_order_by_number() {
        let v = |major, minor, release| UcxVersion {
            major,
            minor,
            release,
        };
        assert!(v(1, 9, 0) < v(1, 19, 0));
        assert!(v(1, 19, 1) < v(1, 22, 0));
        assert_eq!(v(1, 22, 0).to_string(), "1.22.0");
    }
}
