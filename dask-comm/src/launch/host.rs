//! The address a launched rank listens on: a named interface's, loopback when every rank is
//! on this host, or the address this host's name resolves to.

use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};

use super::LaunchError;

/// The IPv4 addresses of the network interfaces, by name.
fn interfaces() -> Result<Vec<(String, Ipv4Addr)>, LaunchError> {
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
        let family = unsafe { (*ifa.ifa_addr).sa_family };
        if i32::from(family) != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in; the name is a NUL-terminated string.
        let (addr, name) = unsafe {
            (
                *(ifa.ifa_addr as *const libc::sockaddr_in),
                std::ffi::CStr::from_ptr(ifa.ifa_name),
            )
        };
        out.push((
            name.to_string_lossy().into_owned(),
            Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
        ));
    }
    // SAFETY: `head` came from getifaddrs and is freed once; nothing above keeps a pointer
    // into it.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The IPv4 address of interface `name` (`ib0`, `eth0`, ...).
pub fn interface_address(name: &str) -> Result<Ipv4Addr, LaunchError> {
    let all = interfaces()?;
    all.iter()
        .find(|(n, _)| n == name)
        .map(|(_, a)| *a)
        .ok_or_else(|| LaunchError::NoInterface {
            name: name.to_string(),
            have: all.into_iter().map(|(n, _)| n).collect(),
        })
}

/// Where to listen: the interface's address if one is named; loopback when the launcher says
/// every rank runs on this host; else the first address this host's name resolves to that
/// is not loopback.
pub(crate) fn listen_host(
    interface: Option<&str>,
    one_host: Option<bool>,
) -> Result<IpAddr, LaunchError> {
    if let Some(i) = interface {
        return interface_address(i).map(IpAddr::V4);
    }
    if one_host == Some(true) {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let host = hostname()?;
    let found = (host.as_str(), 0)
        .to_socket_addrs()
        .ok()
        .into_iter()
        .flatten()
        .map(|a| a.ip())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback());
    found.ok_or(LaunchError::NoAddress { host })
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
            Err(LaunchError::NoInterface { name, have }) => {
                assert_eq!(name, "no-such-if0");
                assert!(have.iter().any(|h| h == "lo"), "{have:?}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            listen_host(None, Some(true)).unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
    }
}
