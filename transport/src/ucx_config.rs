//! UCX transport selection from intent, in the spirit of dask-cuda's `--enable-tcp-over-ucx`,
//! `--enable-infiniband`, `--enable-nvlink` and `--enable-rdmacm`: say what you want, get the
//! matching `UCX_TLS`, `UCX_SOCKADDR_TLS_PRIORITY` and `UCX_NET_DEVICES`, applied to the
//! process's UCX context for `ucx://` connections ([`configure_ucx`]) and printable.
//!
//! ```
//! use transport::UcxIntent;
//! let intent = UcxIntent { tcp: true, nvlink: true, ..UcxIntent::default() };
//! assert_eq!(
//!     intent.to_string(),
//!     "UCX_TLS=self,sm,tcp,cuda_copy,cuda_ipc UCX_SOCKADDR_TLS_PRIORITY=tcp"
//! );
//! // Nothing asked: UCX picks everything it finds.
//! assert_eq!(UcxIntent::default().to_string(), "UCX defaults (UCX_TLS=all)");
//! ```

use std::fmt;
use std::sync::OnceLock;

use crate::{Error, Result};

/// What the `ucx://` backend should use. With no transport flag set, UCX chooses (`all`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UcxIntent {
    /// TCP between hosts (`tcp`).
    pub tcp: bool,
    /// InfiniBand / RoCE verbs (`rc`, with `ud` for wire-up).
    pub infiniband: bool,
    /// NVLink / CUDA IPC between GPUs of one node (`cuda_ipc`, with `cuda_copy`).
    pub nvlink: bool,
    /// Host↔device copies for GPU buffers (`cuda_copy`).
    pub cuda_copy: bool,
    /// Connection establishment over RDMA CM instead of TCP sockets (needs `infiniband`).
    pub rdmacm: bool,
    /// Shared memory between processes of one host (`sm`), on by default.
    pub shared_memory: bool,
    /// Restrict to these devices (`UCX_NET_DEVICES`, e.g. `"mlx5_0:1"` or `"eth0"`).
    pub net_devices: Option<String>,
    /// How the backend's worker makes progress.
    pub progress: ucx::ProgressMode,
    /// Bytes of the shared-memory ring each `ucx://` connection offers its peer for large
    /// host frames ([`DEFAULT_SAME_HOST_RING`]; 0: none, and a peer's ring is declined). A
    /// peer on the same host that may take it (same user, ptrace allowed) receives those
    /// frames through it instead of UCX's rendezvous, which needs the sender's progress for
    /// every 8 KiB (docs/transport.md, "Which lane carries what on one host"). Pages are
    /// allocated as frames touch them; a message whose large frames take more than half the
    /// ring goes over UCX. Off when `shared_memory` is off.
    pub same_host_ring: u64,
}

/// [`UcxIntent::same_host_ring`]'s default: 16 MiB (messages with up to 8 MiB of large frames
/// go through it; the shuffle's messages are at most 8 MiB).
pub const DEFAULT_SAME_HOST_RING: u64 = 16 << 20;

impl Default for UcxIntent {
    fn default() -> Self {
        UcxIntent {
            tcp: false,
            infiniband: false,
            nvlink: false,
            cuda_copy: false,
            rdmacm: false,
            shared_memory: true,
            net_devices: None,
            progress: ucx::ProgressMode::Thread,
            same_host_ring: DEFAULT_SAME_HOST_RING,
        }
    }
}

impl UcxIntent {
    fn any_transport(&self) -> bool {
        self.tcp || self.infiniband || self.nvlink || self.cuda_copy
    }

    /// The ring each connection offers ([`UcxIntent::same_host_ring`]): 0 without shared
    /// memory.
    pub(crate) fn ring_bytes(&self) -> u64 {
        let tls = std::env::var("UCX_TLS").ok();
        if self.shared_memory && shared_memory_allowed(tls.as_deref()) {
            self.same_host_ring
        } else {
            0
        }
    }

    /// The UCX options (keys without `UCX_`) this intent stands for, or why it is inconsistent.
    pub fn options(&self) -> Result<Vec<(&'static str, String)>> {
        if self.same_host_ring != 0
            && !(crate::UCX_RING_MIN..=crate::UCX_RING_MAX).contains(&self.same_host_ring)
        {
            return Err(Error::Config(format!(
                "same_host_ring {} is outside {}..={} bytes (or 0: none)",
                self.same_host_ring,
                crate::UCX_RING_MIN,
                crate::UCX_RING_MAX
            )));
        }
        if self.rdmacm && !self.infiniband {
            return Err(Error::Config(
                "rdmacm needs infiniband: RDMA CM connects over IB/RoCE devices".into(),
            ));
        }
        if !self.any_transport() && !self.shared_memory {
            return Err(Error::Config(
                "no transport left: enable tcp, infiniband, nvlink, cuda_copy or shared memory"
                    .into(),
            ));
        }
        let mut opts = Vec::new();
        if self.any_transport() || !self.shared_memory {
            let mut tls = vec!["self"];
            if self.shared_memory {
                tls.push("sm");
            }
            if self.tcp {
                tls.push("tcp");
            }
            if self.infiniband {
                tls.extend(["rc", "ud"]);
            }
            if self.cuda_copy || self.nvlink {
                tls.push("cuda_copy");
            }
            if self.nvlink {
                tls.push("cuda_ipc");
            }
            opts.push(("TLS", tls.join(",")));
            let cm = if self.rdmacm { "rdmacm" } else { "tcp" };
            opts.push(("SOCKADDR_TLS_PRIORITY", cm.to_string()));
        }
        if let Some(dev) = &self.net_devices {
            if dev.trim().is_empty() || dev.contains(char::is_whitespace) {
                return Err(Error::Config(format!(
                    "net_devices {dev:?}: give device names separated by commas"
                )));
            }
            opts.push(("NET_DEVICES", dev.clone()));
        }
        Ok(opts)
    }
}

impl fmt::Display for UcxIntent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.options() {
            Err(e) => write!(f, "invalid: {e}"),
            Ok(opts) if opts.is_empty() => write!(f, "UCX defaults (UCX_TLS=all)"),
            Ok(opts) => {
                let parts: Vec<String> = opts.iter().map(|(k, v)| format!("UCX_{k}={v}")).collect();
                write!(f, "{}", parts.join(" "))
            }
        }
    }
}

/// Whether a `UCX_TLS` setting (the environment's, which UCX applies too) leaves shared
/// memory in: unset, `all`, or a list naming a shared-memory transport; a `^` list that does
/// not exclude it. A process restricted to, say, `self,tcp` (as the network-namespace runs
/// that stand for two hosts are) offers no ring and takes none.
fn shared_memory_allowed(tls: Option<&str>) -> bool {
    const SHM: [&str; 6] = ["sm", "shm", "posix", "sysv", "cma", "mm"];
    let Some(tls) = tls.map(str::trim).filter(|t| !t.is_empty()) else {
        return true;
    };
    let (excluding, list) = match tls.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, tls),
    };
    let named: Vec<&str> = list.split(',').map(str::trim).collect();
    if excluding {
        !named.iter().any(|t| ["sm", "shm", "mm"].contains(t))
    } else {
        named.iter().any(|t| *t == "all" || SHM.contains(t))
    }
}

static CHOSEN: OnceLock<UcxIntent> = OnceLock::new();

/// Sets what the `ucx://` backend uses, before its first connection or listener. Returns the
/// options as text (also logged), or an error when the intent is inconsistent or the backend
/// already started with another configuration.
pub fn configure_ucx(intent: UcxIntent) -> Result<String> {
    intent.options()?;
    let text = intent.to_string();
    match CHOSEN.set(intent) {
        Ok(()) => {
            tracing::info!(ucx = %text, "UCX transports chosen");
            Ok(text)
        }
        Err(intent) if CHOSEN.get() == Some(&intent) => Ok(text),
        Err(_) => Err(Error::Config(format!(
            "the UCX backend already runs with {}; configure it once, before the first ucx:// use",
            CHOSEN.get().map(ToString::to_string).unwrap_or_default()
        ))),
    }
}

/// The configuration the backend uses (the default intent unless [`configure_ucx`] ran first);
/// fixed from the first call on.
pub(crate) fn chosen() -> &'static UcxIntent {
    CHOSEN.get_or_init(UcxIntent::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(i: &UcxIntent) -> String {
        i.options()
            .unwrap()
            .into_iter()
            .find(|(k, _)| *k == "TLS")
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    #[test]
    fn rings_follow_ucx_tls() {
        for (tls, allowed) in [
            (None, true),
            (Some(""), true),
            (Some("all"), true),
            (Some("self,sm,tcp"), true),
            (Some("posix,tcp"), true),
            (Some("self,tcp"), false),
            (Some("rc,ud"), false),
            (Some("^sm"), false),
            (Some("^tcp"), true),
        ] {
            assert_eq!(shared_memory_allowed(tls), allowed, "{tls:?}");
        }
    }

    #[test]
    fn intents_map_to_transports() {
        let d = UcxIntent::default();
        assert!(d.options().unwrap().is_empty());
        let tcp = UcxIntent {
            tcp: true,
            shared_memory: false,
            ..d.clone()
        };
        assert_eq!(tls(&tcp), "self,tcp");
        let ib = UcxIntent {
            infiniband: true,
            rdmacm: true,
            net_devices: Some("mlx5_0:1".into()),
            ..d.clone()
        };
        assert_eq!(
            ib.to_string(),
            "UCX_TLS=self,sm,rc,ud UCX_SOCKADDR_TLS_PRIORITY=rdmacm UCX_NET_DEVICES=mlx5_0:1"
        );
        let gpu = UcxIntent {
            cuda_copy: true,
            ..d.clone()
        };
        assert_eq!(tls(&gpu), "self,sm,cuda_copy");
    }

    #[test]
    fn inconsistent_intents_are_errors() {
        let d = UcxIntent::default();
        let e = UcxIntent {
            rdmacm: true,
            ..d.clone()
        }
        .options()
        .unwrap_err();
        assert!(e.to_string().contains("rdmacm needs infiniband"), "{e}");
        assert!(UcxIntent {
            shared_memory: false,
            ..d.clone()
        }
        .options()
        .is_err());
        assert!(UcxIntent {
            net_devices: Some("eth0 eth1".into()),
            ..d
        }
        .options()
        .is_err());
    }

    /// The options are real UCX keys with values UCX accepts (checked by building a context).
    #[test]
    fn options_are_accepted_by_ucx() {
        let intent = UcxIntent {
            tcp: true,
            net_devices: Some("lo".into()),
            ..UcxIntent::default()
        };
        let ctx = ucx::Context::builder()
            .options(intent.options().unwrap())
            .build()
            .unwrap();
        assert_eq!(ctx.config()["TLS"], "self,sm,tcp");
        assert_eq!(ctx.config()["NET_DEVICES"], "lo");
    }
}
