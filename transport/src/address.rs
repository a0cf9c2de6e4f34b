//! Addresses as URIs: `ucx://host:port`, `tcp://host:port`, `tls://host:port`, `inproc://name`.

use std::fmt;
use std::str::FromStr;

/// Where to listen or connect.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Address {
    /// UCX client-server connection (UCXX wire format).
    Ucx {
        /// Host name or IP address (IPv6 without brackets).
        host: String,
        /// Port (0 when listening picks a free one).
        port: u16,
    },
    /// Plain TCP with length-prefixed frames.
    Tcp {
        /// Host name or IP address (IPv6 without brackets).
        host: String,
        /// Port (0 when listening picks a free one).
        port: u16,
    },
    /// TCP inside TLS (mutual authentication; see [`crate::tls`]).
    Tls {
        /// Host name or IP address (IPv6 without brackets); the server name checked unless
        /// the configuration fixes one.
        host: String,
        /// Port (0 when listening picks a free one).
        port: u16,
    },
    /// In-process channels, by name.
    Inproc(String),
}

/// Why an address did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad address `{input}`: {why}")]
pub struct AddressError {
    /// What was given.
    pub input: String,
    /// What is wrong with it.
    pub why: String,
}

impl FromStr for Address {
    type Err = AddressError;

    /// ```
    /// use transport::Address;
    /// let a: Address = "tcp://[::1]:8786".parse().unwrap();
    /// assert_eq!(a, Address::Tcp { host: "::1".into(), port: 8786 });
    /// assert_eq!(a.to_string(), "tcp://[::1]:8786");
    /// assert!("udp://x:1".parse::<Address>().unwrap_err().to_string().contains("scheme"));
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why: &str| AddressError {
            input: s.to_string(),
            why: why.to_string(),
        };
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| err("expected scheme://..., e.g. tcp://127.0.0.1:8786"))?;
        match scheme {
            "inproc" => {
                if rest.is_empty() {
                    return Err(err("inproc:// needs a name"));
                }
                Ok(Address::Inproc(rest.to_string()))
            }
            "tcp" | "ucx" | "tls" => {
                let (host, port) = split_host_port(rest).map_err(|w| err(&w))?;
                Ok(match scheme {
                    "tcp" => Address::Tcp { host, port },
                    "tls" => Address::Tls { host, port },
                    _ => Address::Ucx { host, port },
                })
            }
            other => Err(err(&format!(
                "unknown scheme `{other}` (expected ucx, tcp, tls or inproc)"
            ))),
        }
    }
}

fn split_host_port(rest: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or("an IPv6 address needs a closing `]`")?;
        let port = after
            .strip_prefix(':')
            .ok_or("expected `:port` after the IPv6 address")?;
        (host, port)
    } else {
        let (host, port) = rest.rsplit_once(':').ok_or("expected host:port")?;
        if host.contains(':') {
            return Err("write IPv6 addresses in brackets: [::1]:port".into());
        }
        (host, port)
    };
    if host.is_empty() {
        return Err("empty host".into());
    }
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("port `{port}` is not a number from 0 to 65535"))?;
    Ok((host.to_string(), port))
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hp = |f: &mut fmt::Formatter<'_>, scheme: &str, host: &str, port: u16| {
            if host.contains(':') {
                write!(f, "{scheme}://[{host}]:{port}")
            } else {
                write!(f, "{scheme}://{host}:{port}")
            }
        };
        match self {
            Address::Ucx { host, port } => hp(f, "ucx", host, *port),
            Address::Tcp { host, port } => hp(f, "tcp", host, *port),
            Address::Tls { host, port } => hp(f, "tls", host, *port),
            Address::Inproc(name) => write!(f, "inproc://{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_every_scheme() {
        for s in [
            "ucx://10.0.0.1:13337",
            "tcp://localhost:0",
            "tcp://[fe80::1]:9",
            "tls://node7:8786",
            "inproc://scheduler",
        ] {
            let a: Address = s.parse().unwrap();
            assert_eq!(a.to_string(), s);
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let cases = [
            ("127.0.0.1:80", "scheme"),
            ("tcp://host", "host:port"),
            ("tcp://host:99999", "port"),
            ("tcp://:80", "empty host"),
            ("tcp://::1:80", "brackets"),
            ("tcp://[::1:80", "closing"),
            ("inproc://", "name"),
            ("quic://a:1", "unknown scheme"),
        ];
        for (input, expect) in cases {
            let e = input.parse::<Address>().unwrap_err();
            assert!(e.to_string().contains(expect), "{input}: {e}");
        }
    }
}
