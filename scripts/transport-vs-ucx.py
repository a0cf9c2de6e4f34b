#!/usr/bin/env python3
"""Message ping-pong through `transport` (ucx:// and tcp://) beside ucx-rs directly, in one run.

All three: two processes on loopback, server on CPU 0, client on CPU 1, one frame per message,
polling progress for UCX, one-way medians (half a round trip). Rounds alternate so that drift
on a shared machine hits every variant. Usage:
  cargo build --release --bin ucx-echo -p ucx-stack && cargo build --release -p transport --bins
  python3 scripts/transport-vs-ucx.py [--rounds 3]
"""
import argparse, json, os, statistics, subprocess

ROOT = os.path.join(os.path.dirname(__file__), "..")
ECHO = os.path.join(ROOT, "target", "release", "ucx-echo")
TECHO = os.path.join(ROOT, "target", "release", "transport-echo")
SIZES = [8, 1 << 20, 64 << 20]
ITERS = {8: 5000, 1 << 20: 500, 64 << 20: 40}


def run_pair(server_cmd, client_cmd):
    srv = subprocess.Popen(["taskset", "-c", "0", *server_cmd], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = srv.stdout.readline()
        addr = line.split()[1]
        out = subprocess.run(["taskset", "-c", "1", *[c.replace("ADDR", addr) for c in client_cmd]],
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
    finally:
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]


def ucx_rs(size):
    rows = run_pair([ECHO, "server", "--bind", "127.0.0.1", "--mode", "polling", "--once"],
                    [ECHO, "client", "--connect", "127.0.0.1:ADDR", "--mode", "polling", "--sizes", str(size),
                     "--iters", str(ITERS[size]), "--json"])
    return rows[0]["median_us"]


def transport(scheme, size):
    flags = ["--ucx-progress", "polling"] if scheme == "ucx" else []
    rows = run_pair([TECHO, "server", "--listen", f"{scheme}://127.0.0.1:0", "--once", *flags],
                    [TECHO, "client", "--connect", "ADDR", "--sizes", str(size), "--iters", str(ITERS[size]), *flags])
    return rows[0]["median_us"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    res = {k: {s: [] for s in SIZES} for k in ("ucx-rs", "transport ucx://", "transport tcp://")}
    for r in range(a.rounds):
        for s in SIZES:
            res["ucx-rs"][s].append(ucx_rs(s))
            res["transport ucx://"][s].append(transport("ucx", s))
            res["transport tcp://"][s].append(transport("tcp", s))
        print(f"round {r + 1}/{a.rounds} done", flush=True)
    med = {k: {s: statistics.median(v) for s, v in d.items()} for k, d in res.items()}
    print(f"\n{'one-way median':20}{'8 B':>13}  {'1 MiB':>22}  {'64 MiB':>22}")
    for k in res:
        cells = []
        for s in SIZES:
            us = med[k][s]
            cells.append(f"{us:>10.2f} us" if s == 8 else f"{us:>9.1f} us {s / us / 1e3:>6.2f} GB/s")
        print(f"{k:20}" + "  ".join(cells))
    base = med["ucx-rs"]
    t = med["transport ucx://"]
    print(f"\ntransport ucx:// over ucx-rs: latency {t[8] / base[8]:.3f}x at 8 B; "
          f"bandwidth {base[1 << 20] / t[1 << 20]:.3f} at 1 MiB, {base[64 << 20] / t[64 << 20]:.3f} at 64 MiB")
    c = med["transport tcp://"]
    print(f"transport tcp:// vs ucx://: latency {c[8] / t[8]:.2f}x at 8 B; "
          f"bandwidth {t[1 << 20] / c[1 << 20]:.2f}x slower at 1 MiB, {t[64 << 20] / c[64 << 20]:.2f}x at 64 MiB")
    print(json.dumps({k: {str(s): v for s, v in d.items()} for k, d in res.items()}))


if __name__ == "__main__":
    main()
