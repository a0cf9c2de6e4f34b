//! A transport handle: the configuration connections are made with, and what it owns.
//!
//! A [`Transport`] owns its UCX configuration ([`UcxIntent`](crate::UcxIntent)) with the UCX
//! context and worker made from it, and its receive budget: two handles configured
//! differently live side by side in one process, and their `ucx://` connections use their own
//! context, worker and budget. The free functions ([`crate::connect`], [`crate::listen`], ...)
//! use the process-wide default, [`Transport::global`], configured by
//! [`configure_ucx`](crate::configure_ucx) and [`set_receive_budget`](crate::set_receive_budget)
//! before its first use. The buffer pool received frames come from stays process-wide: a
//! cache of free memory, shared so that one handle reuses what another freed.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), transport::Error> {
//! use transport::{Message, Transport, TransportConfig};
//! let t = Transport::new(TransportConfig::default())?;
//! let mut listener = t.listen(&"tcp://127.0.0.1:0".parse()?).await?;
//! let addr = listener.local_addr().clone();
//! let (server, client) = tokio::join!(listener.accept(), t.connect(&addr));
//! let (server, client) = (server?, client?);
//! client.send(0, Message::from(vec![b"hi".to_vec()])).await?;
//! assert_eq!(server.recv().await?.1.host(0), Some(&b"hi"[..]));
//! assert!(!t.same_as(Transport::global()));
//! # Ok(()) }
//! ```

use std::sync::{Arc, OnceLock};

use crate::{Address, Connection, Listener, Options, Result};

/// What a [`Transport`] is made with.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TransportConfig {
    /// The UCX transports and progress mode of its `ucx://` connections.
    #[cfg(feature = "ucx")]
    pub ucx: crate::UcxIntent,
    /// The bytes its `ucx://` connections may have announced and not yet received, all
    /// together (see [`set_receive_budget`](crate::set_receive_budget); rounded up to KiB).
    #[cfg(feature = "ucx")]
    pub receive_budget: u64,
}

// Without `ucx` the struct is empty, and clippy would have the impl derived.
#[cfg_attr(not(feature = "ucx"), allow(clippy::derivable_impls))]
impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            #[cfg(feature = "ucx")]
            ucx: crate::UcxIntent::default(),
            #[cfg(feature = "ucx")]
            receive_budget: crate::DEFAULT_RECEIVE_BUDGET,
        }
    }
}

/// A transport: makes connections and listeners with the configuration it owns. Cheap to
/// clone (clones share everything).
#[derive(Clone)]
pub struct Transport {
    pub(crate) shared: Arc<Shared>,
}

/// What a handle and its connections share.
pub(crate) struct Shared {
    /// Its UCX configuration and budget bytes; `None` for the process-wide transport, which
    /// takes [`configure_ucx`](crate::configure_ucx)'s and
    /// [`set_receive_budget`](crate::set_receive_budget)'s at its first `ucx://` use (so
    /// they may still run after a `tcp://` connection).
    #[cfg(feature = "ucx")]
    own: Option<(crate::UcxIntent, u64)>,
    #[cfg(feature = "ucx")]
    budget: OnceLock<crate::budget::Budget>,
    #[cfg(feature = "ucx")]
    pub(crate) ucx: crate::ucx_backend::UcxState,
}

#[cfg(feature = "ucx")]
impl Shared {
    /// The UCX configuration.
    pub(crate) fn intent(&self) -> &crate::UcxIntent {
        match &self.own {
            Some((intent, _)) => intent,
            None => crate::ucx_config::chosen(),
        }
    }

    /// The receive budget.
    pub(crate) fn budget(&self) -> &crate::budget::Budget {
        self.budget.get_or_init(|| {
            crate::budget::Budget::new(match &self.own {
                Some((_, bytes)) => *bytes,
                None => crate::budget::global_bytes(),
            })
        })
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Transport");
        // What it was made with; the process-wide one's settings are not read here (reading
        // them fixes them).
        #[cfg(feature = "ucx")]
        match &self.shared.own {
            Some((intent, budget)) => d
                .field("ucx", &intent.to_string())
                .field("receive_budget", budget),
            None => d.field("settings", &"process-wide"),
        };
        d.finish_non_exhaustive()
    }
}

impl Transport {
    /// A transport configured by `config`; its UCX context and worker are made at its first
    /// `ucx://` use. Refused when the UCX configuration is inconsistent.
    pub fn new(config: TransportConfig) -> Result<Transport> {
        #[cfg(feature = "ucx")]
        config.ucx.options()?;
        #[cfg(not(feature = "ucx"))]
        let _ = config;
        Ok(Transport {
            shared: Arc::new(Shared {
                #[cfg(feature = "ucx")]
                own: Some((config.ucx, config.receive_budget)),
                #[cfg(feature = "ucx")]
                budget: OnceLock::new(),
                #[cfg(feature = "ucx")]
                ucx: Default::default(),
            }),
        })
    }

    /// The process-wide transport the free functions use: configured by
    /// [`configure_ucx`](crate::configure_ucx) and
    /// [`set_receive_budget`](crate::set_receive_budget) if they ran first, else the defaults;
    /// fixed from its first use on.
    pub fn global() -> &'static Transport {
        static G: OnceLock<Transport> = OnceLock::new();
        G.get_or_init(|| Transport {
            shared: Arc::new(Shared {
                #[cfg(feature = "ucx")]
                own: None,
                #[cfg(feature = "ucx")]
                budget: OnceLock::new(),
                #[cfg(feature = "ucx")]
                ucx: Default::default(),
            }),
        })
    }

    /// Listens on `addr` with the default [`Options`].
    pub async fn listen(&self, addr: &Address) -> Result<Listener> {
        self.listen_with(addr, &Options::default()).await
    }

    /// Listens on `addr`; accepted connections get `opts`.
    pub async fn listen_with(&self, addr: &Address, opts: &Options) -> Result<Listener> {
        crate::listen_on(&self.shared, addr, opts).await
    }

    /// Connects to `addr` with the default [`Options`].
    pub async fn connect(&self, addr: &Address) -> Result<Connection> {
        self.connect_with(addr, &Options::default()).await
    }

    /// Connects to `addr` within `opts.connect_timeout`.
    pub async fn connect_with(&self, addr: &Address, opts: &Options) -> Result<Connection> {
        crate::connect_on(&self.shared, addr, opts).await
    }

    /// This transport's `ucx://` worker (made on first use; see [`crate::ucx_worker`]).
    #[cfg(feature = "ucx")]
    pub fn ucx_worker(&self) -> Result<ucx::Worker> {
        crate::ucx_backend::worker(&self.shared)
    }

    /// Its UCX configuration (for [`Transport::global`], reading it fixes it, as its first
    /// `ucx://` use does).
    #[cfg(feature = "ucx")]
    pub fn ucx_intent(&self) -> &crate::UcxIntent {
        self.shared.intent()
    }

    /// Its receive budget in bytes: its own, not shared with other transports (for
    /// [`Transport::global`], reading it fixes it).
    #[cfg(feature = "ucx")]
    pub fn receive_budget(&self) -> u64 {
        self.shared.budget().bytes()
    }

    /// Whether two handles are the same transport (clones of one).
    pub fn same_as(&self, other: &Transport) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}
