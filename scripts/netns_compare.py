#!/usr/bin/env python3
"""Across two "hosts": ucx_perftest beside transport-echo, server and client in two network
namespaces joined by a veth pair (as transport/tests/netns.rs builds them), UCX restricted to
`self,tcp` so the bytes cross the link (namespaces do not isolate shared memory). Rounds are
interleaved A B C A B C; one-way medians (half a round trip), the median over rounds, each
with its ratio to ucx_perftest -t tag_lat from the same run.

This VM moves between a fast and a slow state for seconds at a time (8 B: ucx_perftest 4.8 or
6.8 us, every other row shifted alike), so two rows' medians can come from different states.
The reference therefore also runs before every row and after the last (`--no-bracket`: once
per round), and each row gets a second ratio ("p"): the median over rounds of its run against
the mean of the reference runs either side of it.

Rows: ucx-rs alone (`ucx-echo`, client-server endpoint) per mode, when built; ucx_perftest as ucx-rs's endpoints run (the reference: -e, ucx::DEFAULT_OPTIONS), without
-e, and with UCX's own options; transport ucx:// in each progress mode (--modes), on its client-server
endpoint and with Options::ucx_direct ("direct": endpoints by worker address, which across
hosts carry the TCP lanes of the peers' worker addresses); transport tcp://.

  cargo build --release -p ucxrs-transport --bins   (and -p ucx-stack --bin ucx-echo for ucx-rs rows)
  sudo python3 scripts/netns_compare.py [--rounds 5] [--sizes 8,64k,4m] [--modes polling,blocking,thread]
  sudo python3 scripts/netns_compare.py --ab OLD/transport-echo NEW/transport-echo   (A/B of two builds)
  sudo python3 scripts/netns_compare.py --against-tcp   (ucx:// per mode, with our tcp:// as the
                                                         reference that brackets every row)

TCP congestion control matters at 4 MiB. It is per namespace and starts as the host's default,
which the table's title names. With BBR and no `fq` qdisc (this VM's default), the kernel paces
a connection that has left BBR's start-up phase with a timer, and a connection that has not
left it is hardly paced at all. Which of the two a process gets depends on its connection's
history, so 4 MiB rows swing by 1.5-2x from process to process. `--cc cubic` sets both
namespaces to cubic (the usual Linux default), adding it to the host's allowed list for the
run if it is not there.

Needs root and `ip netns`; removes the namespaces (and restores the allowed list) when done.
"""
import argparse, os, signal, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner import (CLIENT_CPU, SERVER_CPU, bracketed_rounds, json_rows, next_port, size_arg,  # noqa: E402
                    size_name, start_server, stop, built)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TECHO = built("transport-echo")
UECHO = built("ucx-echo")
SERVER_IP, CLIENT_IP = "10.231.9.1", "10.231.9.2"
UCX_TCP = ["--ucx-tcp", "--ucx-no-shm"]  # UCX_TLS=self,tcp


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


PROC_NET = "/proc/sys/net/ipv4"


class Hosts:
    def __init__(self, cc=None):
        self.allowed = None
        tag = os.getpid() % 100000
        self.a, self.b = f"cmp-a{tag}", f"cmp-b{tag}"
        va, vb = f"vcmpa{tag}", f"vcmpb{tag}"
        try:
            ip("netns", "add", self.a)
            ip("netns", "add", self.b)
            ip("link", "add", va, "type", "veth", "peer", "name", vb)
            for ns, dev, addr in ((self.a, va, SERVER_IP), (self.b, vb, CLIENT_IP)):
                ip("link", "set", dev, "netns", ns)
                ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                ip("-n", ns, "link", "set", dev, "up")
                ip("-n", ns, "link", "set", "lo", "up")
            if cc:
                self.use_congestion_control(cc)
            self.cc = self.setting(self.a, "tcp_congestion_control")
        except BaseException:
            self.remove()
            raise

    @staticmethod
    def setting(ns, name, value=None):
        """Reads (or writes) /proc/sys/net/ipv4/NAME as seen from namespace `ns` (the host's
        with `ns` None)."""
        path = f"{PROC_NET}/{name}"
        if ns is None:
            if value is None:
                with open(path) as f:
                    return f.read().strip()
            with open(path, "w") as f:
                f.write(value)
            return value
        cmd = ["ip", "netns", "exec", ns, "cat", path] if value is None else \
            ["ip", "netns", "exec", ns, "sh", "-c", f'echo "$1" > {path}', "sh", value]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()

    def use_congestion_control(self, cc):
        """Sets `cc` in both namespaces; a namespace may only choose from the host's allowed
        list, which gets `cc` until `remove`."""
        allowed = self.setting(None, "tcp_allowed_congestion_control")
        if cc not in allowed.split():
            self.allowed = allowed
            self.setting(None, "tcp_allowed_congestion_control", f"{allowed} {cc}")
        for ns in (self.a, self.b):
            self.setting(ns, "tcp_congestion_control", cc)

    def on(self, ns, cpu, cmd):
        return ["ip", "netns", "exec", ns, "taskset", "-c", cpu, *cmd]

    def remove(self):
        for ns in (self.a, self.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if self.allowed is not None:
            try:
                self.setting(None, "tcp_allowed_congestion_control", self.allowed)
                self.allowed = None
            except OSError as e:
                print(f"could not restore {PROC_NET}/tcp_allowed_congestion_control to "
                      f"{self.allowed!r}: {e}", file=sys.stderr)


def iters_for(size):
    return 5000 if size <= 4096 else max(20, min(1000, (256 << 20) // size))


class Perftest:
    """ucx_perftest -t tag_lat. The reference (`ucx_defaults` False) runs as ucx-rs's endpoints
    do: with peer error handling (`-e`, which adds a keepalive lane beside the tag lane, as
    `UCX_LOG_LEVEL=info` shows) and `UCX_TCP_PUT_ENABLE=n` (ucx::DEFAULT_OPTIONS), so
    rendezvous goes through TCP active messages on both sides. `plain` drops `-e`; the
    `ucx_defaults` row also keeps UCX's own options (TCP's emulated put for rendezvous)."""

    def __init__(self, ucx_defaults=False, plain=False):
        self.ucx_defaults, self.plain = ucx_defaults, plain or ucx_defaults
        self.name = "ucx_perftest tag_lat" + (" (TCP put)" if ucx_defaults else "" if plain else " -e")

    def latency(self, hosts, size):
        env = dict(os.environ, UCX_TLS="self,tcp")
        if not self.ucx_defaults:
            env.setdefault("UCX_TCP_PUT_ENABLE", "n")
        extra = [] if self.plain else ["-e"]
        p = next_port()
        srv = subprocess.Popen(hosts.on(hosts.a, SERVER_CPU, ["ucx_perftest", "-p", p, *extra]), env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            out = subprocess.run(hosts.on(hosts.b, CLIENT_CPU, [
                "ucx_perftest", SERVER_IP, "-p", p, "-t", "tag_lat", "-s", str(size), "-n", str(iters_for(size)),
                *extra]), env=env, capture_output=True, text=True, timeout=300)
        finally:
            stop(srv)
        final = [l for l in out.stdout.splitlines() if l.startswith("Final:")]
        if not final:
            raise RuntimeError(f"ucx_perftest -s {size}: no result: {out.stderr[-300:]}")
        return float(final[0].split()[2])


class UcxEcho:
    """ucx-rs alone (`ucx-echo`, its client-server endpoint), UCX_TLS=self,tcp."""

    def __init__(self, mode):
        self.mode = mode
        self.name = f"ucx-rs {mode}"

    def latency(self, hosts, size):
        env = dict(os.environ, UCX_TLS="self,tcp")
        p = next_port()
        srv = subprocess.Popen(hosts.on(hosts.a, SERVER_CPU, [
            UECHO, "server", "--port", p, "--once", "--mode", self.mode]), env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            out = subprocess.run(hosts.on(hosts.b, CLIENT_CPU, [
                UECHO, "client", "--connect", f"{SERVER_IP}:{p}", "--sizes", str(size),
                "--iters", str(iters_for(size)), "--exact", "--mode", self.mode, "--json"]),
                env=env, capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise RuntimeError(f"{self.name} {size}: {out.stderr.strip()[-300:]}")
            return json_rows(out.stdout)[0]["median_us"]
        finally:
            stop(srv)


class Echo:
    def __init__(self, scheme, mode=None, direct=False, binary=TECHO, label=""):
        self.scheme, self.mode, self.direct, self.binary = scheme, mode, direct, binary
        self.name = (f"transport {scheme}://" + (f" {mode}" if mode else "") + (" direct" if direct else "")
                     + (f" {label}" if label else ""))

    def latency(self, hosts, size):
        flags = UCX_TCP + ["--ucx-progress", self.mode] if self.scheme == "ucx" else []
        if self.direct:
            flags += ["--ucx-direct"]
        srv, addr = start_server(hosts.on(hosts.a, SERVER_CPU, [
            self.binary, "server", "--once", "--listen", f"{self.scheme}://{SERVER_IP}:0", *flags]))
        try:
            out = subprocess.run(hosts.on(hosts.b, CLIENT_CPU, [
                self.binary, "client", "--connect", addr, "--sizes", str(size), "--iters", str(iters_for(size)), *flags]),
                capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise RuntimeError(f"{self.name} {size}: {out.stderr.strip()[-300:]}")
            return json_rows(out.stdout)[0]["median_us"]
        finally:
            stop(srv)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="8,64k,4m")
    ap.add_argument("--modes", default="polling,blocking,thread")
    ap.add_argument("--cc", metavar="NAME",
                    help="TCP congestion control in both namespaces (e.g. cubic); default: the host's")
    ap.add_argument("--ab", nargs=2, metavar=("OLD", "NEW"),
                    help="A/B of two transport-echo binaries: ucx_perftest -e, then OLD and NEW per mode")
    ap.add_argument("--against-tcp", action="store_true",
                    help="our tcp:// as the reference, bracketing every ucx:// row (is ucx:// slower than it?)")
    ap.add_argument("--no-bracket", dest="bracket", action="store_false",
                    help="run the reference once per round and size, not before every row")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (ip netns)")
    if not os.path.exists(TECHO):
        sys.exit(f"{TECHO} is missing: cargo build --release -p ucxrs-transport --bins")
    # `timeout` and CI stop the script with SIGTERM: exit through the `finally` that removes
    # the namespaces and restores the allowed list.
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(128 + sig))
    if a.cc:
        available = Hosts.setting(None, "tcp_available_congestion_control").split()
        if a.cc not in available:
            sys.exit(f"--cc {a.cc}: not in {PROC_NET}/tcp_available_congestion_control "
                     f"({' '.join(available)})")
    sizes = [size_arg(s) for s in a.sizes.split(",")]
    if a.ab:
        impls = [Perftest()] + [Echo("ucx", m, binary=b, label=label) for m in a.modes.split(",")
                                for b, label in zip(a.ab, ("(old)", "(new)"))]
        return report(a, sizes, impls)
    if a.against_tcp:
        impls = [Echo("tcp")] + [Echo("ucx", m, direct=d) for m in a.modes.split(",") for d in (False, True)]
        return report(a, sizes, impls)
    impls = [Perftest(), Perftest(plain=True), Perftest(ucx_defaults=True)]
    if os.path.exists(UECHO):
        impls += [UcxEcho(m) for m in a.modes.split(",")]
    for m in a.modes.split(","):
        impls += [Echo("ucx", m), Echo("ucx", m, direct=True)]
    impls.append(Echo("tcp"))
    report(a, sizes, impls)


def report(a, sizes, impls):
    """Runs `impls` in interleaved rounds across the namespaces and prints the table. With
    `a.bracket`, the reference (`impls[0]`) runs before every other row and after the last, and
    each row's run also gets a paired ratio: to the mean of the reference runs just before and
    just after it."""
    hosts = Hosts(getattr(a, "cc", None))
    res, errors = {}, {}
    ref = impls[0]

    def run(i, size):
        try:
            v = i.latency(hosts, size)
        except Exception as e:  # a row that fails is reported, the others go on
            errors[i.name] = str(e)
            return None
        res.setdefault(i.name, {}).setdefault(size, []).append(v)
        return v

    try:
        runs = bracketed_rounds(impls, sizes, a.rounds, run, bracket=a.bracket, on_round=lambda r: print(
            f"round {r + 1}/{a.rounds} done", file=sys.stderr))
        paired = {name: {s: [v / ((b + after) / 2) for v, b, after in rs] for s, rs in by_size.items()}
                  for name, by_size in runs.items()}
    finally:
        hosts.remove()
    base = {s: statistics.median(res[ref.name][s]) for s in sizes if s in res.get(ref.name, {})}
    print(f"two namespaces over veth, UCX_TLS=self,tcp, TCP congestion control {hosts.cc}; {a.rounds} "
          f"interleaved rounds; one-way medians (us), their ratio to the reference's ({ref.name}) median"
          + ("; and the median of each run's ratio to the reference runs either side of it"
             if a.bracket else ""))
    width = 24 if a.bracket else 18
    print(f"{'':34}" + "".join(f"{size_name(s):>{width}}" for s in sizes))
    for i in impls:
        cells = ""
        for s in sizes:
            v = res.get(i.name, {}).get(s)
            if not v:
                cells += f"{'failed':>{width}}"
                continue
            m = statistics.median(v)
            ratio = f"{m / base[s]:.2f}x" if s in base else "-"
            cells += f"{m:>9.1f} {ratio:>7}"
            if a.bracket:
                pr = paired.get(i.name, {}).get(s)
                cells += f" {statistics.median(pr):>5.2f}p" if pr else f" {'-':>6}"
        print(f"{i.name:34}{cells}")
    print("every run (µs), in order" + (" (the reference's: before each row and after the last)"
                                        if a.bracket else "") + ":")
    for i in impls:
        rounds = "  ".join(f"{size_name(s)}: " + " ".join(f"{v:.1f}" if v < 100 else f"{v:.0f}"
                                                          for v in res.get(i.name, {}).get(s, []))
                           for s in sizes)
        print(f"  {i.name:32}{rounds}")
    for name, e in errors.items():
        print(f"  {name}: {e}")
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
