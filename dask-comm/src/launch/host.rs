//! The address a launched rank listens on: a named interface's, loopback when every rank is
//! on this host, or the address this host's name resolves to; IPv4 or IPv6.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};

use super::LaunchError;

/// Which addresses a launched rank listens on (`--address-family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AddressFamily {
    /// IPv4 (the default).
    #[default]
    Ipv4,
    /// IPv6 (link-local addresses excluded: they need a zone, which addresses here cannot
    /// carry).
    Ipv6,
}

impl AddressFamily {
    fn holds(self, ip: &IpAddr) -> bool {
        match (self, ip) {
            (AddressFamily::Ipv4, IpAddr::V4(_)) => true,
            // fe80::/10, link-local.
            (AddressFamily::Ipv6, IpAddr::V6(v6)) => (v6.segments()[0] & 0xffc0) != 0xfe80,
            _ => false,
        }
    }

    fn loopback(self) -> IpAddr {
        match self {
            AddressFamily::Ipv4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
            AddressFamily::Ipv6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
        }
    }
}

impl std::fmt::Display for AddressFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddressFamily::Ipv4 => "IPv4",
            AddressFamily::Ipv6 => "IPv6",
        })
    }
}

impl std::str::FromStr for AddressFamily {
    type Err = crate::Error;
    /// `ipv4` or `ipv6` (any case; `inet`, `inet6`, `4` and `6` too).
    fn from_str(s: &str) -> crate::Result<AddressFamily> {
        match s.to_ascii_lowercase().as_str() {
            "ipv4" | "inet" | "4" => Ok(AddressFamily::Ipv4),
            "ipv6" | "inet6" | "6" => Ok(AddressFamily::Ipv6),
            _ => Err(crate::Error::Config(format!(
                "address family {s:?}: expected ipv4 or ipv6"
            ))),
        }
    }
}

/// The IPv4 and IPv6 addresses of the network interfaces, by name.
fn interfaces() -> Result<Vec<(String, IpAddr)>, LaunchError> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocated into `head` (a valid out-pointer) or
    // fails; the list is freed below, after the last read of it.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(LaunchError::Interfaces {
            reason: std::io::Error::last_os_error().to_string(),
        });
    }
    let mut out = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs gave, not yet freed.
        let ifa = unsafe { &*at };
        at = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr points to a sockaddr whose family says its type.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = if family == libc::AF_INET {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let a = unsafe { *(ifa.ifa_addr as *const libc::sockaddr_in) };
            IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)))
        } else if family == libc::AF_INET6 {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let a = unsafe { *(ifa.ifa_addr as *const libc::sockaddr_in6) };
            IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr))
        } else {
            continue;
        };
        // SAFETY: the name is a NUL-terminated string of the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        out.push((name.to_string_lossy().into_owned(), ip));
    }
    // SAFETY: `head` came from getifaddrs and is freed once; nothing above keeps a pointer
    // into it.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The IPv4 address of interface `name` (`ib0`, `eth0`, ...).
pub fn interface_address(name: &str) -> Result<Ipv4Addr, LaunchError> {
    match interface_address_of(name, AddressFamily::Ipv4)? {
        IpAddr::V4(a) => Ok(a),
        IpAddr::V6(_) => unreachable!("an IPv4 address was asked for"),
    }
}

/// The first address of `family` of interface `name`.
///
/// ```
/// use dask_comm::launch::{interface_address_of, AddressFamily};
/// let lo = interface_address_of("lo", AddressFamily::Ipv4).unwrap();
/// assert!(lo.is_loopback());
/// ```
pub fn interface_address_of(name: &str, family: AddressFamily) -> Result<IpAddr, LaunchError> {
    let all = interfaces()?;
    all.iter()
        .find(|(n, a)| n == name && family.holds(a))
        .map(|(_, a)| *a)
        .ok_or_else(|| {
            let mut have: Vec<String> = all.into_iter().map(|(n, _)| n).collect();
            have.sort();
            have.dedup();
            LaunchError::NoInterface {
                name: name.to_string(),
                family,
                have,
            }
        })
}

/// Where to listen: the interface's address of `family` if one is named; loopback when the
/// launcher says every rank runs on this host; else the first address of `family` this host's
/// name resolves to that is not loopback.
pub(crate) fn listen_host(
    interface: Option<&str>,
    one_host: Option<bool>,
    family: AddressFamily,
) -> Result<IpAddr, LaunchError> {
    if let Some(i) = interface {
        return interface_address_of(i, family);
    }
    if one_host == Some(true) {
        return Ok(family.loopback());
    }
    let host = hostname()?;
    let found = (host.as_str(), 0)
        .to_socket_addrs()
        .ok()
        .into_iter()
        .flatten()
        .map(|a| a.ip())
        .find(|ip| family.holds(ip) && !ip.is_loopback());
    found.ok_or(LaunchError::NoAddress { host, family })
}

fn hostname() -> Result<String, LaunchError> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return Err(LaunchError::Interfaces {
            reason: std::io::Error::last_os_error().to_string(),
        });
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_an_interface_and_strangers_are_named() {
        assert_eq!(interface_address("lo").unwrap(), Ipv4Addr::LOCALHOST);
        match interface_address("no-such-if0") {
            Err(LaunchError::NoInterface { name, family, have }) => {
                assert_eq!(name, "no-such-if0");
                assert_eq!(family, AddressFamily::Ipv4);
                assert!(have.iter().any(|h| h == "lo"), "{have:?}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            listen_host(None, Some(true), AddressFamily::Ipv4).unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(
            listen_host(None, Some(true), AddressFamily::Ipv6).unwrap(),
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        );
    }

    #[test]
    fn ipv6_addresses_are_listed_and_link_local_ones_left_out() {
        let all = interfaces().unwrap();
        // Where the kernel has IPv6 at all, loopback has ::1.
        if std::path::Path::new("/proc/net/if_inet6").exists() {
            assert!(
                all.contains(&("lo".into(), IpAddr::V6(Ipv6Addr::LOCALHOST))),
                "{all:?}"
            );
            assert_eq!(
                interface_address_of("lo", AddressFamily::Ipv6).unwrap(),
                IpAddr::V6(Ipv6Addr::LOCALHOST)
            );
        }
        let link_local: IpAddr = "fe80::1".parse().unwrap();
        assert!(!AddressFamily::Ipv6.holds(&link_local));
        assert!(AddressFamily::Ipv6.holds(&"fd00::1".parse().unwrap()));
        assert!(!AddressFamily::Ipv4.holds(&"::1".parse().unwrap()));
        for (text, want) in [("ipv6", AddressFamily::Ipv6), ("INET", AddressFamily::Ipv4)] {
            assert_eq!(text.parse::<AddressFamily>().unwrap(), want);
        }
        assert!("ipx".parse::<AddressFamily>().is_err());
    }
}
