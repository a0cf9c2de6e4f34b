//! Two "hosts": network namespaces joined by a veth pair, built by this test. An echo server
//! runs in one, the client in the other, over `tcp://` and over `ucx://` (UCX restricted to TCP,
//! without shared memory, so the bytes cross the veth link). A drill: needs root and `ip netns`;
//! without them it prints why and returns, except in CI, which must have them.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_transport-echo");

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The two namespaces; removed (with the veth pair) when dropped.
struct Hosts {
    a: String,
    b: String,
}

impl Hosts {
    fn create(tag: &str) -> Result<Hosts, String> {
        let id = std::process::id() % 100_000;
        let hosts = Hosts {
            a: format!("ucxrs-{tag}a{id}"),
            b: format!("ucxrs-{tag}b{id}"),
        };
        let (va, vb) = (format!("v{tag}a{id}"), format!("v{tag}b{id}"));
        ip(&["netns", "add", &hosts.a])?;
        ip(&["netns", "add", &hosts.b])?;
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &hosts.a])?;
        ip(&["link", "set", &vb, "netns", &hosts.b])?;
        for (ns, dev, addr) in [
            (&hosts.a, &va, "10.231.7.1/24"),
            (&hosts.b, &vb, "10.231.7.2/24"),
        ] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } != 0 {
        return Some("not running as root".into());
    }
    if let Err(e) = ip(&["netns", "list"]) {
        return Some(format!("`ip netns` does not work here: {e}"));
    }
    None
}

extern "C" {
    // SAFETY (of the declaration): geteuid takes nothing and returns a uid_t (u32 on Linux).
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// Runs an echo server in `a` and a client in `b`; returns the client's JSON lines.
fn echo_across(hosts: &Hosts, listen: &str, extra: &[&str]) -> Vec<String> {
    let mut server = Command::new("timeout")
        .args([
            "120", "ip", "netns", "exec", &hosts.a, BIN, "server", "--once",
        ])
        .args(["--listen", listen])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the server");
    let addr = test_support::listening(&mut server, test_support::START_LIMIT)
        .expect("the server's address");
    let out = Command::new("timeout")
        .args(["120", "ip", "netns", "exec", &hosts.b, BIN, "client"])
        .args(["--connect", &addr, "--sizes", "8,65536,4m", "--iters", "20"])
        .args(extra)
        .output()
        .expect("run the client");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "client {addr}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.try_wait().expect("server status").is_none() {
        assert!(Instant::now() < deadline, "the server did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
    // UCX may log a warning to standard output; the results are the JSON lines.
    let lines: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for l in &lines {
        assert!(l.contains("10.231.7.1"), "{l}");
    }
    lines
}

#[test]
#[ignore = "drill: needs root and network namespaces"]
fn tcp_and_ucx_across_network_namespaces() {
    if let Some(why) = skip_reason() {
        test_support::skip_unless_ci(&format!("the two-namespace test: {why}"));
        return;
    }
    let hosts = match Hosts::create("t") {
        Ok(h) => h,
        Err(e) => {
            test_support::skip_unless_ci(&format!("the two-namespace test: {e}"));
            return;
        }
    };
    for l in echo_across(&hosts, "tcp://10.231.7.1:0", &[]) {
        eprintln!("{l}");
    }
    for l in echo_across(&hosts, "ucx://10.231.7.1:0", &["--ucx-tcp", "--ucx-no-shm"]) {
        eprintln!("{l}");
    }
}
