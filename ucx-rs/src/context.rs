//! The UCP context: features, configuration, version and info.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fmt;
use std::ops::BitOr;
use std::ptr;
use std::sync::Arc;

use ucx_sys as sys;

use crate::error::{check, Error, Result, Status};

/// UCP features a context enables (`UCP_FEATURE_*`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Features(u64);

impl Features {
    /// Tagged messaging.
    pub const TAG: Features = Features(sys::UCP_FEATURE_TAG as u64);
    /// The stream API (also used by the UCXX handshake).
    pub const STREAM: Features = Features(sys::UCP_FEATURE_STREAM as u64);
    /// Active messages.
    pub const AM: Features = Features(sys::UCP_FEATURE_AM as u64);
    /// Remote memory access.
    pub const RMA: Features = Features(sys::UCP_FEATURE_RMA as u64);
    /// Event-driven progress (`ucp_worker_get_efd`), needed by the blocking and thread modes.
    pub const WAKEUP: Features = Features(sys::UCP_FEATURE_WAKEUP as u64);
    /// Everything UCX-Py enables by default.
    pub const ALL: Features = Features(
        (sys::UCP_FEATURE_TAG
            | sys::UCP_FEATURE_STREAM
            | sys::UCP_FEATURE_AM
            | sys::UCP_FEATURE_RMA
            | sys::UCP_FEATURE_WAKEUP) as u64,
    );

    /// Whether every feature in `other` is enabled here.
    pub fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Features {
    type Output = Features;
    fn bitor(self, rhs: Features) -> Features {
        Features(self.0 | rhs.0)
    }
}

impl fmt::Debug for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Features::TAG, "TAG"),
            (Features::STREAM, "STREAM"),
            (Features::AM, "AM"),
            (Features::RMA, "RMA"),
            (Features::WAKEUP, "WAKEUP"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(b, _)| self.contains(*b))
            .map(|(_, n)| *n)
            .collect();
        write!(f, "Features({})", set.join(" | "))
    }
}

/// Which wins when an option is given both in code and in the environment (`UCX_<KEY>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precedence {
    /// Options given to the builder override the environment (UCX-Py's default).
    #[default]
    Options,
    /// A `UCX_<KEY>` environment variable overrides the builder's option of the same key.
    Environment,
}

/// Options this crate sets unless the caller or the environment (`UCX_<KEY>`) sets them.
///
/// * `MM_ERROR_HANDLING=y`: endpoints always use peer error handling (so that a dead peer fails
///   pending operations instead of hanging them), and UCX 1.13 then drops its shared-memory
///   transports unless they are allowed to handle errors through keepalive. Without this, two
///   processes on one host talk over TCP loopback (measured: 7.1 us vs 1.1 us median one-way
///   latency for 8 B with `ucx-echo demo`).
/// * `TCP_PUT_ENABLE=n`, on UCX 1.13 only (where it was measured; with UCX 1.21 a ucx-rs
///   client set so could not wire up to a UCXX listener left at UCX's defaults): UCX 1.13
///   otherwise makes TCP's emulated zero-copy put the rendezvous lane of every client-server
///   endpoint, even between two processes on one host that share memory, and large messages
///   crawl through loopback sockets. Without it, rendezvous goes through shared memory on one
///   host (as on an endpoint connected by worker address) and through TCP active messages
///   across hosts. Measured with `ucx-echo --bw --window 16`, client-server, one host: 1 MiB
///   streamed 5.3 → 9.5 GB/s, 64 MiB 2.2 → 4.6 GB/s (the direct endpoint: 11.6 and 4.6);
///   across two network namespaces over TCP (`scripts/netns_compare.py`, one run each way)
///   1 MiB ping-pong went from 630 to 197 µs one-way and 64 KiB from 47 to 36 µs, for
///   `ucx_perftest` as for us, while 4 MiB and 64 MiB came out 11–13% slower for us (0–14% for
///   `ucx_perftest`) (docs/performance.md).
///
/// Keys are named as in the environment, without `UCX_`; setting either in the builder or the
/// environment leaves it to you.
pub const DEFAULT_OPTIONS: &[(&str, &str)] = &[("MM_ERROR_HANDLING", "y"), ("TCP_PUT_ENABLE", "n")];

/// The name `ucp_config_modify` must be given for an option: UCX 1.13 matches a transport's
/// option only by its name inside the transport's table (`PUT_ENABLE`, not `TCP_PUT_ENABLE`;
/// the latter is accepted, never applied, and warned about as "invalid configuration" when an
/// interface opens).
fn modify_key(key: &str) -> &str {
    match key {
        "TCP_PUT_ENABLE" => "PUT_ENABLE",
        other => other,
    }
}

/// Whether a default option applies to the loaded UCX (see [`DEFAULT_OPTIONS`]).
fn default_applies(key: &str) -> bool {
    key != "TCP_PUT_ENABLE" || version().starts_with("1.13.")
}

/// Builds a [`Context`].
///
/// ```
/// let ctx = ucx::Context::builder()
///     .option("TLS", "tcp,self")
///     .build()
///     .unwrap();
/// assert_eq!(ctx.config()["TLS"], "tcp,self");
/// ```
#[derive(Debug, Clone)]
pub struct ContextBuilder {
    features: Features,
    options: Vec<(String, String)>,
    precedence: Precedence,
    name: Option<String>,
    cuda_stage_below: usize,
}

impl Default for ContextBuilder {
    fn default() -> Self {
        ContextBuilder {
            features: Features::ALL,
            options: Vec::new(),
            precedence: Precedence::Options,
            name: None,
            cuda_stage_below: DEFAULT_CUDA_STAGE_BELOW,
        }
    }
}

impl ContextBuilder {
    /// The UCP features to enable (default: [`Features::ALL`]).
    pub fn features(mut self, features: Features) -> Self {
        self.features = features;
        self
    }

    /// Sets a UCX configuration option. `key` has no `UCX_` prefix (`"TLS"`, `"NET_DEVICES"`).
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.push((key.into(), value.into()));
        self
    }

    /// Sets several options at once.
    pub fn options<K: Into<String>, V: Into<String>>(
        mut self,
        opts: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.options
            .extend(opts.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Whether environment variables or builder options win (default: options win).
    pub fn precedence(mut self, p: Precedence) -> Self {
        self.precedence = p;
        self
    }

    /// A name for the context, shown in UCX's logs.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Device messages smaller than this many bytes go through pinned host memory even when
    /// UCX could move device memory itself (default [`DEFAULT_CUDA_STAGE_BELOW`]): for small
    /// messages two host copies are cheaper than UCX's CUDA protocols. `0` never stages where
    /// UCX has CUDA support; `usize::MAX` always stages.
    pub fn cuda_stage_below(mut self, bytes: usize) -> Self {
        self.cuda_stage_below = bytes;
        self
    }

    /// Reads UCX's configuration, applies the options and creates the context.
    pub fn build(self) -> Result<Context> {
        crate::library::check_version()?;
        let mut config: *mut sys::ucp_config_t = ptr::null_mut();
        // SAFETY: NULL env prefix and filename mean "defaults + environment"; config is an
        // out-pointer that UCX fills on success.
        check(unsafe { sys::ucp_config_read(ptr::null(), ptr::null(), &mut config) })?;
        let config = ConfigGuard(config);
        for (key, value) in DEFAULT_OPTIONS {
            let overridden = self.options.iter().any(|(k, _)| {
                let k = k.trim_start_matches("UCX_");
                k == *key || k == modify_key(key)
            });
            if overridden
                || std::env::var_os(format!("UCX_{key}")).is_some()
                || !default_applies(key)
            {
                continue;
            }
            let (ck, cv) = (cstring(modify_key(key))?, cstring(value)?);
            // SAFETY: as below. A key this UCX does not know is skipped (defaults are advisory).
            let st = unsafe { sys::ucp_config_modify(config.0, ck.as_ptr(), cv.as_ptr()) };
            if st != sys::UCS_OK {
                tracing::debug!(key, status = %Status(st), "default UCX option not applied");
            }
        }
        for (key, value) in &self.options {
            let key = key.strip_prefix("UCX_").unwrap_or(key);
            if self.precedence == Precedence::Environment
                && std::env::var_os(format!("UCX_{key}")).is_some()
            {
                tracing::debug!(key, "UCX option left to the environment");
                continue;
            }
            let (ck, cv) = (cstring(modify_key(key))?, cstring(value)?);
            // SAFETY: config is a live config handle; ck/cv are NUL-terminated strings that
            // outlive the call.
            let st = unsafe { sys::ucp_config_modify(config.0, ck.as_ptr(), cv.as_ptr()) };
            match st {
                sys::UCS_OK => {}
                sys::UCS_ERR_NO_ELEM => return Err(Error::UnknownOption(key.to_string())),
                // UCX 1.22 checks keys here and says INVALID_PARAM for unknown ones too.
                _ if !all_options()?.contains_key(key) => {
                    return Err(Error::UnknownOption(key.to_string()))
                }
                st => {
                    return Err(Error::InvalidOption {
                        key: key.to_string(),
                        value: value.clone(),
                        status: Status(st),
                    })
                }
            }
        }
        let ucp_effective = config.print()?;

        let name = self.name.as_deref().map(cstring).transpose()?;
        let mut params = sys::ucp_params_t {
            field_mask: (sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED)
                as u64,
            features: self.features.0,
            mt_workers_shared: 1,
            ..Default::default()
        };
        if let Some(n) = &name {
            params.field_mask |= sys::UCP_PARAM_FIELD_NAME as u64;
            params.name = n.as_ptr();
        }
        let mut handle: sys::ucp_context_h = ptr::null_mut();
        // SAFETY: params and config are valid for the call; handle is an out-pointer.
        check(unsafe { sys::ucxrs_init(&params, config.0, &mut handle) })?;
        // ucp_config_modify accepts any key (it keeps unknown ones for transports loaded
        // later), so unknown keys are found here, against every option of every loaded module.
        let all = all_options()?;
        let mut effective = all.clone();
        effective.extend(ucp_effective);
        for (key, value) in &self.options {
            let key = key.strip_prefix("UCX_").unwrap_or(key);
            if !all.contains_key(key) {
                // SAFETY: the context was just created and is not shared yet.
                unsafe { sys::ucp_cleanup(handle) };
                return Err(Error::UnknownOption(key.to_string()));
            }
            if !(self.precedence == Precedence::Environment
                && std::env::var_os(format!("UCX_{key}")).is_some())
            {
                effective.insert(key.to_string(), value.clone());
            }
        }
        tracing::debug!(features = ?self.features, version = %version(), "UCX context created");
        let memory_types = query_memory_types(handle);
        Ok(Context(Arc::new(ContextInner {
            handle,
            features: self.features,
            config: effective,
            memory_types,
            cuda_stage_below: self.cuda_stage_below,
        })))
    }
}

/// Every option of UCX and of its loaded transport modules (`ucx_info -c`), with the values
/// from the defaults and the environment.
fn all_options() -> Result<BTreeMap<String, String>> {
    let prefix = cstring("UCX_")?;
    let text = capture_file(|f| {
        // SAFETY: f is an open stream and prefix a NUL-terminated string; the shim reads UCX's
        // own registry of config tables, after ucp_init loaded the modules (as ucx_info does).
        unsafe {
            sys::ucxrs_print_all_opts(
                f,
                prefix.as_ptr(),
                (sys::UCS_CONFIG_PRINT_CONFIG | sys::UCS_CONFIG_PRINT_HIDDEN)
                    as sys::ucs_config_print_flags_t,
            )
        }
    })?;
    Ok(parse_config_text(&text))
}

fn parse_config_text(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(|l| l.trim_start_matches('#').trim())
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.starts_with("UCX_"))
        .map(|(k, v)| (k.trim_start_matches("UCX_").to_string(), v.to_string()))
        .collect()
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::InvalidArgument(format!("{s:?} contains a NUL byte")))
}

struct ConfigGuard(*mut sys::ucp_config_t);

impl ConfigGuard {
    /// The effective configuration as `KEY -> value` (keys without the `UCX_` prefix).
    fn print(&self) -> Result<BTreeMap<String, String>> {
        let text = capture_file(|f| {
            // SAFETY: self.0 is a live config; f is a valid, open FILE stream.
            unsafe {
                sys::ucp_config_print(
                    self.0,
                    f,
                    ptr::null(),
                    sys::UCS_CONFIG_PRINT_CONFIG as sys::ucs_config_print_flags_t,
                )
            }
        })?;
        Ok(parse_config_text(&text))
    }
}

impl Drop for ConfigGuard {
    fn drop(&mut self) {
        // SAFETY: the config was returned by ucp_config_read and is released exactly once.
        unsafe { sys::ucp_config_release(self.0) }
    }
}

/// Runs a UCX print function against an in-memory `FILE` and returns what it wrote.
pub(crate) fn capture_file(print: impl FnOnce(*mut sys::FILE)) -> Result<String> {
    let mut buf: *mut libc::c_char = ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: open_memstream writes the buffer pointer and size through the out-pointers, which
    // stay valid until fclose below.
    let f = unsafe { libc::open_memstream(&mut buf, &mut len) };
    if f.is_null() {
        return Err(Error::os("open_memstream", std::io::Error::last_os_error()));
    }
    print(f);
    // SAFETY: f came from open_memstream; fclose flushes and sets buf/len.
    unsafe { libc::fclose(f) };
    if buf.is_null() {
        return Ok(String::new());
    }
    // SAFETY: after fclose, buf points to len bytes (plus a NUL) allocated with malloc.
    let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, len) };
    let text = String::from_utf8_lossy(bytes).into_owned();
    // SAFETY: buf was allocated by open_memstream with malloc and is not used after this.
    unsafe { libc::free(buf.cast()) };
    Ok(text)
}

struct ContextInner {
    handle: sys::ucp_context_h,
    features: Features,
    config: BTreeMap<String, String>,
    /// `ucp_context_query`'s memory types, fixed for the context's life.
    memory_types: u64,
    cuda_stage_below: usize,
}

/// The default of [`ContextBuilder::cuda_stage_below`], measured on an H100 with UCX 1.22
/// (see the README's GPU table): below it, staging beats UCX's own device path.
pub const DEFAULT_CUDA_STAGE_BELOW: usize = 1 << 20;

/// How device (CUDA) buffers are moved; see [`Context::cuda_support`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaSupport {
    /// The loaded UCX reads and writes device memory itself (`cuda_copy`/`cuda_ipc`), except
    /// for messages below [`ContextBuilder::cuda_stage_below`], which are staged.
    ZeroCopy,
    /// UCX cannot access device memory; every device transfer is staged through pinned host
    /// memory (needs the `cuda` feature and a GPU).
    Staged,
    /// No way to move device memory: UCX has no CUDA support and this build has no `cuda`
    /// feature or this machine no CUDA driver and GPU.
    Unavailable,
}

fn query_memory_types(handle: sys::ucp_context_h) -> u64 {
    let mut attr = sys::ucp_context_attr_t {
        field_mask: sys::UCP_ATTR_FIELD_MEMORY_TYPES as u64,
        ..Default::default()
    };
    // SAFETY: the context was just created; attr is a valid out-struct.
    match check(unsafe { sys::ucp_context_query(handle, &mut attr) }) {
        Ok(()) => attr.memory_types,
        Err(_) => 1 << sys::UCS_MEMORY_TYPE_HOST,
    }
}

/// Whether a device message of `len` bytes is staged through host memory.
fn stages(ucx_has_cuda: bool, stage_below: usize, len: usize) -> bool {
    !ucx_has_cuda || len < stage_below
}

// SAFETY: the context is created with mt_workers_shared=1, so UCX protects its shared state and
// it may be used from any thread; the Rust side only reads immutable fields.
unsafe impl Send for ContextInner {}
// SAFETY: as above.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: every Worker holds an Arc to this context, so no worker is alive here.
        unsafe { sys::ucp_cleanup(self.handle) }
    }
}

/// A UCP context: the root of everything. Cheap to clone; workers keep it alive.
///
/// ```
/// let ctx = ucx::Context::new().unwrap();
/// assert!(ctx.version().starts_with("1."));
/// assert!(ctx.info().unwrap().contains("UCP context"));
/// ```
#[derive(Clone)]
pub struct Context(Arc<ContextInner>);

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("features", &self.0.features)
            .field("version", &version())
            .finish()
    }
}

impl Context {
    /// A context with all features and the configuration from the environment.
    pub fn new() -> Result<Context> {
        ContextBuilder::default().build()
    }

    /// A builder for features and options.
    pub fn builder() -> ContextBuilder {
        ContextBuilder::default()
    }

    /// The enabled features.
    pub fn features(&self) -> Features {
        self.0.features
    }

    /// The effective UCX configuration (environment and options applied), keys without `UCX_`.
    pub fn config(&self) -> &BTreeMap<String, String> {
        &self.0.config
    }

    /// How device buffers are moved: [`CudaSupport::ZeroCopy`] when the loaded UCX has CUDA
    /// transports (the PyPI `libucx-cu13` wheel with a GPU present; not Debian's build, nor
    /// `UCX_TLS` without `cuda`), else [`CudaSupport::Staged`] with the `cuda` feature and a GPU,
    /// else [`CudaSupport::Unavailable`].
    ///
    /// ```
    /// let ctx = ucx::Context::new().unwrap();
    /// println!("device buffers: {:?}", ctx.cuda_support());
    /// ```
    pub fn cuda_support(&self) -> CudaSupport {
        if self.ucx_has_cuda() {
            return CudaSupport::ZeroCopy;
        }
        #[cfg(feature = "cuda")]
        if crate::cuda::gpu_available() {
            return CudaSupport::Staged;
        }
        CudaSupport::Unavailable
    }

    fn ucx_has_cuda(&self) -> bool {
        self.0.memory_types & (1 << sys::UCS_MEMORY_TYPE_CUDA) != 0
    }

    /// Whether a device message of `len` bytes goes through pinned host memory.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn stages_cuda(&self, len: usize) -> bool {
        stages(self.ucx_has_cuda(), self.0.cuda_stage_below, len)
    }

    /// The memory types the context supports, as a bit mask of `ucs_memory_type_t`.
    pub fn memory_types(&self) -> u64 {
        self.0.memory_types
    }

    /// The version of the loaded UCX library, e.g. `"1.13.1"`.
    pub fn version(&self) -> String {
        version()
    }

    /// UCX's human-readable description of the context (`ucp_context_print_info`).
    pub fn info(&self) -> Result<String> {
        capture_file(|f| {
            // SAFETY: the context handle is alive (self holds it); f is an open stream.
            unsafe { sys::ucp_context_print_info(self.0.handle, f) }
        })
    }

    /// Refuses client-server connections over IPv6 unless UCX's TCP transport uses IPv6
    /// addresses first. With the default `TCP_AF_PRIO=inet,inet6`, accepting an IPv6
    /// connection makes UCX write past a heap buffer (`uct_tcp_ep_set_dest_addr`, seen under
    /// valgrind with UCX 1.13.1 and 1.22.0), so we fail with an explanation instead. Only the
    /// environment variable helps: set through `ucp_config_modify` the option does not reach
    /// the TCP component (measured: the overflow remains).
    pub(crate) fn check_address_family(&self, addr: &std::net::SocketAddr) -> Result<()> {
        if !addr.is_ipv6() {
            return Ok(());
        }
        let prio = std::env::var("UCX_TCP_AF_PRIO").unwrap_or_else(|_| "inet,inet6".into());
        if prio.trim().starts_with("inet6") {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "IPv6 connection to {addr} needs UCX_TCP_AF_PRIO=inet6 in the environment of both \
             processes (it is {prio}): UCX's TCP transport corrupts memory when its address \
             family differs from the connection's"
        )))
    }

    pub(crate) fn handle(&self) -> sys::ucp_context_h {
        self.0.handle
    }
}

/// The version of the loaded UCX library.
pub fn version() -> String {
    // SAFETY: returns a pointer to a static NUL-terminated string.
    let s = unsafe { CStr::from_ptr(sys::ucp_get_version_string()) };
    s.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device messages are staged when UCX cannot reach device memory, and otherwise only below
    /// the threshold.
    #[test]
    fn staging_decision() {
        assert!(stages(false, 0, 1 << 30));
        assert!(stages(true, 16, 15));
        assert!(!stages(true, 16, 16));
        assert!(!stages(true, 0, 0));
        assert!(stages(true, usize::MAX, 1 << 30));
    }

    /// Without UCX CUDA transports (Debian's UCX), the context says device buffers are staged
    /// (with a GPU) or unavailable; never zero-copy.
    #[test]
    fn cuda_support_matches_memory_types() {
        let ctx = Context::new().unwrap();
        let ucx_cuda = ctx.memory_types() & (1 << sys::UCS_MEMORY_TYPE_CUDA) != 0;
        assert_eq!(ctx.cuda_support() == CudaSupport::ZeroCopy, ucx_cuda);
        let staged = Context::builder()
            .cuda_stage_below(usize::MAX)
            .build()
            .unwrap();
        assert!(staged.stages_cuda(1 << 30));
    }

    #[test]
    fn unknown_option_is_a_clear_error() {
        let e = Context::builder()
            .option("NO_SUCH_THING", "1")
            .build()
            .unwrap_err();
        assert_eq!(e, Error::UnknownOption("NO_SUCH_THING".into()));
        assert!(e.to_string().contains("NO_SUCH_THING"));
    }

    #[test]
    fn bad_value_is_rejected() {
        let e = Context::builder()
            .option("RNDV_THRESH", "not-a-size")
            .build()
            .unwrap_err();
        assert!(matches!(e, Error::InvalidOption { .. }), "{e:?}");
    }

    #[test]
    fn options_show_in_config_and_prefix_is_optional() {
        let ctx = Context::builder()
            .option("UCX_TLS", "tcp,self")
            .option("MAX_EAGER_RAILS", "2")
            .option("TCP_NODELAY", "n")
            .build()
            .unwrap();
        assert_eq!(ctx.config()["TLS"], "tcp,self");
        assert_eq!(ctx.config()["MAX_EAGER_RAILS"], "2");
        // Transport-level options are known and shown too.
        assert_eq!(ctx.config()["TCP_NODELAY"], "n");
        assert!(ctx.config().len() > 100);
    }

    #[test]
    fn environment_precedence_is_selectable() {
        // UCX_MAX_EAGER_RAILS is read by ucp_config_read; set it for this process only.
        std::env::set_var("UCX_MAX_EAGER_RAILS", "2");
        let env_wins = Context::builder()
            .option("MAX_EAGER_RAILS", "3")
            .precedence(Precedence::Environment)
            .build()
            .unwrap();
        assert_eq!(env_wins.config()["MAX_EAGER_RAILS"], "2");
        let opts_win = Context::builder()
            .option("MAX_EAGER_RAILS", "3")
            .build()
            .unwrap();
        assert_eq!(opts_win.config()["MAX_EAGER_RAILS"], "3");
        std::env::remove_var("UCX_MAX_EAGER_RAILS");
    }

    #[test]
    fn features_debug_lists_names() {
        assert_eq!(
            format!("{:?}", Features::TAG | Features::STREAM),
            "Features(TAG | STREAM)"
        );
        assert!(Features::ALL.contains(Features::WAKEUP));
    }
}
