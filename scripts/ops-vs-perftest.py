#!/usr/bin/env python3
"""Stream, active-message, put and get through ucx-rs beside ucx_perftest, in one run.

ucx_perftest: -t stream_lat, ucp_am_lat, ucp_put_lat (ping-pongs, one-way latency) and ucp_get
(bandwidth). ucx-rs (`ucx-echo client --test ...`): ping-pongs for stream and AM; put = put +
flush (one round trip to remote completion), get = one get (one round trip); latency is half a
round trip. Server on CPU 0, client on CPU 1. Usage:
  cargo build --release --bin ucx-echo && python3 scripts/ops-vs-perftest.py [--rounds 3]
"""
import argparse, json, os, statistics, subprocess, sys

from compare import perftest  # scripts/ is on the path when this runs

ECHO = os.path.join(os.path.dirname(__file__), "..", "target", "release", "ucx-echo")
SIZES = [8, 1 << 20]
TESTS = {"stream": "stream_lat", "am": "ucp_am_lat", "put": "ucp_put_lat", "get": "ucp_get"}


def perftest_row(test, size, iters):
    f = perftest(test, size, iters)
    return {"lat_us": f[1], "bw_MiBps": f[4]}


def ours(op, direct, iters):
    srv = subprocess.Popen([ECHO, "server", "--bind", "127.0.0.1", "--cpu", "0", "--once"],
                           stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline().split()[1])
        cmd = [ECHO, "client", "--connect", f"127.0.0.1:{port}", "--cpu", "1", "--test", op,
               "--sizes", ",".join(map(str, SIZES)), "--iters", str(iters), "--json"]
        out = subprocess.run(cmd + (["--direct"] if direct else []), capture_output=True,
                             text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
    finally:
        srv.wait(timeout=30)
    return {r["bytes"]: r for r in map(json.loads, filter(lambda l: l.startswith("{"),
                                                          out.stdout.splitlines()))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20000)
    a = ap.parse_args()
    med = statistics.median
    print(f"{a.rounds} interleaved rounds, medians; latency one-way (us), bandwidth MiB/s at 1 MiB")
    print(f"{'op':8}{'perftest 8B':>13}{'direct':>9}{'ratio':>7}{'cl-srv':>9}{'ratio':>7}"
          f"{'perftest bw':>13}{'direct bw':>11}{'ratio':>7}")
    for op, test in TESTS.items():
        pts, dirs, css = [], [], []
        for _ in range(a.rounds):
            pts.append({s: perftest_row(test, s, a.iters if s == 8 else 2000) for s in SIZES})
            dirs.append(ours(op, True, a.iters))
            css.append(ours(op, False, a.iters))
        p8 = med(r[8]["lat_us"] for r in pts)
        d8 = med(r[8]["median_us"] for r in dirs)
        c8 = med(r[8]["median_us"] for r in css)
        pbw = med(r[1 << 20]["bw_MiBps"] for r in pts)
        # One-way bandwidth: size over half a round trip, except a get moves data once per trip.
        per_trip = 2.0 if op == "get" else 1.0
        dbw = med((1 << 20) / (r[1 << 20]["median_us"] * per_trip * 1e-6) / (1 << 20) for r in dirs)
        print(f"{op:8}{p8:>13.3f}{d8:>9.3f}{d8 / p8:>7.2f}{c8:>9.3f}{c8 / p8:>7.2f}"
              f"{pbw:>13.0f}{dbw:>11.0f}{dbw / pbw:>7.2f}")


if __name__ == "__main__":
    sys.exit(main())
