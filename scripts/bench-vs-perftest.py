#!/usr/bin/env python3
"""Runs ucx_perftest and our ucx-echo client side by side, in one run, and prints ratios.

Both sides: server pinned to CPU 0, client to CPU 1, loopback, the same UCX_TLS.
  * latency: ucx_perftest -t tag_lat (median one-way) vs our ping-pong median (half a round trip)
  * bandwidth: ucx_perftest -t tag_bw vs our streamed sends (16 in flight, acknowledged at the end)
Rounds alternate A B A B so that drift on a shared machine hits both. Usage:
  cargo build --release --bin ucx-echo && python3 scripts/bench-vs-perftest.py [--rounds 3]
"""
import argparse, json, os, re, statistics, subprocess, sys

from compare import perftest  # scripts/ is on the path when this runs

ECHO = os.path.join(os.path.dirname(__file__), "..", "target", "release", "ucx-echo")
SIZES = [8, 1 << 20, 64 << 20]
MIB = float(1 << 20)


def perftest_row(test, size, env, iters):
    f = perftest(test, size, iters, env)
    return {"p50_us": f[1], "avg_us": f[2], "bw_MiBps": f[4]}


def ours(variant, env, iters):
    """variant: a progress mode, with "+direct" for an endpoint connected by worker address."""
    mode, _, direct = variant.partition("+")
    srv = subprocess.Popen([ECHO, "server", "--bind", "127.0.0.1", "--cpu", "0", "--mode", mode, "--once"],
                           env=env, stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline().split()[1])
        out = subprocess.run([ECHO, "client", "--connect", f"127.0.0.1:{port}", "--cpu", "1", "--mode", mode,
                              "--sizes", ",".join(map(str, SIZES)), "--iters", str(iters), "--bw", "--json"]
                             + (["--direct"] if direct else []),
                             env=env, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
    finally:
        srv.wait(timeout=30)
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    return {r["bytes"]: r for r in rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--tls", default="default,tcp")
    ap.add_argument("--modes", default="polling,polling+direct,blocking,thread")
    ap.add_argument("--criterion", action="store_true",
                    help="also run `cargo bench --bench tag_pingpong` (default TLS) in this run")
    a = ap.parse_args()
    print(f"{subprocess.run(['ucx_info', '-v'], capture_output=True, text=True).stdout.splitlines()[0].strip('# ')}, "
          f"{a.rounds} interleaved rounds, medians of rounds; bandwidth in MiB/s")
    for tls in a.tls.split(","):
        env = dict(os.environ)
        if tls != "default":
            env["UCX_TLS"] = tls
        res = {"perftest": []}
        for m in a.modes.split(","):
            res[m] = []
        for _ in range(a.rounds):
            pt = {"lat": perftest_row("tag_lat", 8, env, a.iters)}
            for s in SIZES[1:]:
                pt[s] = perftest_row("tag_bw", s, env, max(20, a.iters * 4096 // s))
            res["perftest"].append(pt)
            for m in a.modes.split(","):
                res[m].append(ours(m, env, a.iters))
        med = statistics.median
        p_lat = med(r["lat"]["p50_us"] for r in res["perftest"])
        print(f"\n== UCX_TLS={tls}")
        print(f"{'':22}{'8 B lat (us)':>14}{'ratio':>8}{'1 MiB bw':>12}{'ratio':>8}{'64 MiB bw':>12}{'ratio':>8}")
        bws = {s: med(r[s]["bw_MiBps"] for r in res["perftest"]) for s in SIZES[1:]}
        print(f"{'ucx_perftest':22}{p_lat:>14.3f}{1:>8.2f}{bws[1<<20]:>12.0f}{1:>8.2f}{bws[64<<20]:>12.0f}{1:>8.2f}")
        for m in a.modes.split(","):
            lat = med(r[8]["median_us"] for r in res[m])
            line = f"{'ucx-rs ' + m:22}{lat:>14.3f}{lat / p_lat:>8.2f}"
            for s in SIZES[1:]:
                bw = med(r[s]["stream_MBps"] * 1e6 / MIB for r in res[m])
                line += f"{bw:>12.0f}{bw / bws[s]:>8.2f}"
            print(line)
            pp = "  ping-pong bw: " + ", ".join(
                f"{s >> 20} MiB {med(r[s]['pingpong_MBps'] * 1e6 / MIB for r in res[m]):.0f}" for s in SIZES[1:])
            print(f"{'':22}{pp}")
        if a.criterion and tls == "default":
            criterion(p_lat, bws)


def criterion(p_lat, bws):
    """Runs the criterion bench and prints its estimates beside ucx_perftest's."""
    out = subprocess.run(["cargo", "bench", "-j2", "--bench", "tag_pingpong", "--", "--noplot"],
                         capture_output=True, text=True, timeout=1800,
                         cwd=os.path.join(os.path.dirname(__file__), "..")).stdout
    unit = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}
    print("\n== criterion (cargo bench --bench tag_pingpong), one-way time per message")
    for m in re.finditer(r"(tag_pingpong_\w+)/(\d+)\s+time:\s+\[\S+ \S+ (\S+) (\S+)", out):
        name, size, val, u = m.group(1), int(m.group(2)), float(m.group(3)), m.group(4)
        us = val * unit[u]
        if size == 8:
            print(f"{name:24} 8 B: {us:.3f} us, {us / p_lat:.2f}x ucx_perftest tag_lat")
        else:
            bw = size / (us * 1e-6) / MIB
            print(f"{name:24} {size >> 20} MiB: {bw:.0f} MiB/s, {bw / bws[size]:.2f} of ucx_perftest tag_bw")


if __name__ == "__main__":
    sys.exit(main())
