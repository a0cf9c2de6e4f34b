"""Ping-pong between two processes with ucxrs (our Python package), for scripts/compare.py.

    python send_recv.py server [--mode M] [--bytes N] [--iters K]          # prints LISTENING <port>
    python send_recv.py client --port P [--mode M] [--bytes N] [--iters K] [--warmup W]

The client sends N bytes (a NumPy array, reused; a CuPy array with `--memory cuda`), the server receives them into its own array
and sends them back; after W warm-up round trips, K are timed one by one. The client prints one
JSON line: the size, the median one-way time (half a round trip) in microseconds, and the
bandwidth that gives. The server serves one client and exits.
"""

import argparse
import asyncio
import json
import statistics
import time

import numpy as np

import ucxrs


def xp(memory):
    if memory == "cuda":
        import cupy

        return cupy
    return np


async def server(a):
    done = asyncio.Event()
    m = xp(a.memory)

    async def serve(ep):
        buf = m.empty(a.bytes, dtype="u1")
        for _ in range(a.warmup + a.iters):
            await ep.recv(buf)
            await ep.send(buf)
        await ep.close()
        done.set()

    listener = ucxrs.create_listener(serve, a.port)
    print(f"LISTENING {listener.port}", flush=True)
    await asyncio.wait_for(done.wait(), 600)
    listener.close()


async def client(a):
    ep = await ucxrs.create_endpoint(a.host, a.port)
    m = xp(a.memory)
    out = m.arange(a.bytes, dtype="u8").astype("u1")
    back = m.empty(a.bytes, dtype="u1")
    for _ in range(a.warmup):
        await ep.send(out)
        await ep.recv(back)
    times = []
    clock = time.perf_counter_ns
    for _ in range(a.iters):
        t0 = clock()
        await ep.send(out)
        await ep.recv(back)
        times.append(clock() - t0)
    await ep.close()
    if not bool((back == out).all()):
        raise SystemExit("the echo differs from what was sent")
    one_way_us = statistics.median(times) / 2 / 1000
    print(json.dumps({
        "size": a.bytes,
        "median_us": one_way_us,
        "gb_per_s": a.bytes / one_way_us / 1000 if a.bytes else 0.0,
        "mode": ucxrs.progress_mode(),
        "memory": a.memory,
        "ucx": "%d.%d.%d" % ucxrs.get_ucx_version(),
    }), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["server", "client"])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--mode", default=None, help="progress mode: thread (default), blocking, polling")
    ap.add_argument("--memory", choices=["host", "cuda"], default="host", help="cuda: CuPy arrays")
    a = ap.parse_args()
    ucxrs.init(progress_mode=a.mode)
    asyncio.run(server(a) if a.role == "server" else client(a))


if __name__ == "__main__":
    main()
