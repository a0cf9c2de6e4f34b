#!/usr/bin/env python3
"""Message rate: many 8 B messages in flight, ucx-rs (`ucx-echo client --bw`) beside
`ucx_perftest -t tag_bw -s 8`, interleaved rounds in one run, server on CPU 0, client on CPU 1.

  cargo build --release --bin ucx-echo && python3 scripts/msgrate-vs-perftest.py [--rounds 3]
"""
import argparse, json, os, statistics, subprocess, time

ECHO = os.path.join(os.path.dirname(__file__), "..", "target", "release", "ucx-echo")


def perftest(port, n, env):
    srv = subprocess.Popen(["ucx_perftest", "-c", "0", "-p", str(port)], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-c", "1", "-t", "tag_bw",
                              "-s", "8", "-n", str(n)], env=env, capture_output=True, text=True,
                             timeout=300).stdout
    finally:
        srv.wait(timeout=30)
    f = [l for l in out.splitlines() if l.startswith("Final:")][0].split()
    return float(f[7])  # overall message rate, messages per second


def ours(n, window, direct, env):
    srv = subprocess.Popen([ECHO, "server", "--bind", "127.0.0.1", "--cpu", "0", "--mode", "polling", "--once"],
                           env=env, stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline().split()[1])
        out = subprocess.run([ECHO, "client", "--connect", f"127.0.0.1:{port}", "--cpu", "1", "--mode", "polling",
                              "--sizes", "8", "--iters", str(n), "--bw", "--window", str(window), "--json"]
                             + (["--direct"] if direct else []), env=env, capture_output=True, text=True,
                             timeout=600)
    finally:
        srv.wait(timeout=30)
    row = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")][0]
    return row["stream_MBps"] * 1e6 / 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--window", type=int, default=64)
    a = ap.parse_args()
    env = dict(os.environ)
    res = {"ucx_perftest tag_bw -s 8": [], "ucx-rs client-server": [], "ucx-rs direct": []}
    port = 14100
    for _ in range(a.rounds):
        port += 1
        res["ucx_perftest tag_bw -s 8"].append(perftest(port, a.messages, env))
        res["ucx-rs client-server"].append(ours(a.messages // 4, a.window, False, env))
        res["ucx-rs direct"].append(ours(a.messages // 4, a.window, True, env))
    base = statistics.median(res["ucx_perftest tag_bw -s 8"])
    print(f"8 B message rate, {a.rounds} interleaved rounds (medians), window {a.window}")
    for k, v in res.items():
        m = statistics.median(v)
        print(f"{k:28} {m / 1e6:8.2f} M msg/s  {m / base:6.2f} of ucx_perftest")


if __name__ == "__main__":
    main()
