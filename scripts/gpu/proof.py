#!/usr/bin/env python3
"""Proves device buffers on a GPU machine and measures them beside ucx_perftest -m cuda.

Runs against the UCX of the PyPI libucx-cu13 wheel (cuda_copy/cuda_ipc). Needs the release
`ucx-gpu-echo` binary built against the wheel's headers:

  UCX_PREFIX=$W/libucx cargo build --release --features cuda --bin ucx-gpu-echo
  LD_LIBRARY_PATH=$W/libucx/lib:$W/libucx_cu13.libs UCX_MODULE_DIR=$W/libucx/lib/ucx \
    python3 scripts/gpu/proof.py --echo target/release/ucx-gpu-echo --perftest $W/libucx/bin/ucx_perftest \
    [--part echo|bench|sweep|mixed|floor|array|all] [--tour device_tour]

Parts:
  echo   two processes echo 1 B .. 1 GiB, every byte of every round trip compared, for
         device->device, host->device and device->host, on the zero-copy path and the staged
         path (UCX_TLS without cuda, and --stage-below max).
  mixed  peers whose UCX differ (one without the CUDA transports): reported, not required
         (UCX 1.22 fails device rendezvous between them).
  bench  ping-pong with device buffers beside ucx_perftest -m cuda (tag_lat, and tag_bw for
         reference), interleaved rounds, ratios of medians.
  sweep  small device messages: UCX's own device path vs staging through pinned host memory.
  array  device blocks of 64 MiB fetched between two workers of a dask-comm cluster
         (dask-collections' device_tour --bench) over ucx:// and tcp://, per worker pair,
         beside ucx_perftest -m cuda tag_bw at 64 MiB.
  floor  where the ~150 us floor of small device messages comes from: ucx_perftest -m cuda
         variants (receive or send side on the device, transports) and ucx-gpu-echo with one or
         both sides in device memory, staged or not.
"""
import argparse, json, os, statistics, subprocess, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from runner import perftest as run_perftest, start_server, stop  # noqa: E402

SERVER_CPU, CLIENT_CPU = "2", "4"


def log(*a):
    print(*a, flush=True)


def server(echo, memory, env, extra=()):
    srv, port = start_server(["taskset", "-c", SERVER_CPU, echo, "server", "--bind", "127.0.0.1",
                              "--memory", memory, "--once", *extra], env)
    return srv, int(port)


def client(echo, port, memory, sizes, iters, env, check, extra=(), timeout=150):
    cmd = ["taskset", "-c", CLIENT_CPU, echo, "client", "--connect", f"127.0.0.1:{port}",
           "--memory", memory, "--sizes", ",".join(map(str, sizes)), "--iters", str(iters), "--json",
           *(["--check"] if check else []), *extra]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    return out.returncode, rows, out.stderr


def run_pair(echo, smem, cmem, sizes, iters, senv, cenv, check, sextra=(), cextra=()):
    srv, port = server(echo, smem, senv, sextra)
    try:
        rc, rows, err = client(echo, port, cmem, sizes, iters, cenv, check, cextra)
    finally:
        stop(srv, 60)
    return rc, rows, err, srv.returncode


def info(echo, env):
    return subprocess.run([echo, "info"], env=env, capture_output=True, text=True, timeout=60).stdout


def part_echo(a, env, results):
    staged = dict(env, UCX_TLS="^cuda_copy,cuda_ipc,gdr_copy")
    log("zero-copy env:", info(a.echo, env).replace("\n", "; "))
    log("staged env (UCX_TLS=^cuda_copy,cuda_ipc,gdr_copy):", info(a.echo, staged).replace("\n", "; "))
    sizes = [1, 8, 64, 512, 4096, 32768, 262144, 1000003, 1 << 21, 1 << 24, 1 << 27, 1 << 30]
    paths = [("zero-copy", env, env, (), ()),
             ("staged (UCX_TLS without cuda)", staged, staged, (), ()),
             ("staged (--stage-below max)", env, env, ("--stage-below", "max"), ("--stage-below", "max"))]
    combos = [("cuda", "cuda", "device->device both ways"),
              ("cuda", "host", "host->device, device->host"),
              ("host", "cuda", "device->host, host->device")]
    results["echo"] = []
    for pname, senv, cenv, sx, cx in paths:
        for smem, cmem, what in combos:
            t0 = time.time()
            rc, rows, err, src = run_pair(a.echo, smem, cmem, sizes, 2, senv, cenv, True, sx, cx)
            ok = rc == 0 and src == 0 and len(rows) == len(sizes) and all(r["checked"] == 2 for r in rows)
            results["echo"].append({"path": pname, "server": smem, "client": cmem, "ok": ok,
                                    "sizes": [r["size"] for r in rows], "secs": round(time.time() - t0, 1),
                                    "stderr": err[-2000:]})
            log(f"[{'PASS' if ok else 'FAIL'}] {pname:42} server {smem:4} client {cmem:4} ({what}): "
                f"{len(rows)}/{len(sizes)} sizes, 1 B..1 GiB, every byte of 2 round trips each, "
                f"{time.time() - t0:.1f}s" + ("" if ok else f"\n{err[-2000:]}"))


def part_mixed(a, env, results):
    """Peers whose UCX differ: one side has the CUDA transports, the other not."""
    staged = dict(env, UCX_TLS="^cuda_copy,cuda_ipc,gdr_copy")
    out = []
    for sname, senv, cname, cenv in (("zero-copy", env, "UCX without cuda", staged),
                                     ("UCX without cuda", staged, "zero-copy", env)):
        for smem, cmem in (("cuda", "cuda"), ("host", "cuda"), ("cuda", "host")):
            for size in (1, 65536, 1 << 24):
                extra = ("--stage-below", "max") if "max" in cname else ()
                srv, port = server(a.echo, smem, senv)
                try:
                    rc, rows, err = client(a.echo, port, cmem, [size], 2, cenv, True, extra, timeout=8)
                    ok = rc == 0 and len(rows) == 1
                except subprocess.TimeoutExpired:
                    ok, err = False, "timeout"
                finally:
                    srv.kill()
                out.append({"server": sname, "client": cname, "smem": smem, "cmem": cmem, "size": size, "ok": ok})
                log(f"[{'PASS' if ok else 'FAIL'}] server {sname} ({smem}) <-> client {cname} ({cmem}) {size} B"
                    + ("" if ok else f": {err[-300:]}"))
    results["mixed"] = out


def perftest(pt, test, size, iters, env, memory="cuda"):
    return run_perftest(test, size, iters, env, ("-m", memory), binary=pt, cpus=(SERVER_CPU, CLIENT_CPU))


def part_bench(a, env, results):
    sizes = [8, 1 << 20, 64 << 20]
    iters = {8: 2000, 1 << 20: 1000, 64 << 20: 200}
    rounds = []
    for r in range(a.rounds):
        row = {"perftest_lat": {}, "perftest_bw": {}, "ours": {}, "ours_no_stage": {}}
        for s in sizes:
            row["perftest_lat"][s] = perftest(a.perftest, "tag_lat", s, iters[s], env)
            row["perftest_bw"][s] = perftest(a.perftest, "tag_bw", s, iters[s], env)
        for key, extra in (("ours", ()), ("ours_no_stage", ("--stage-below", "0"))):
            for s in sizes:
                rc, rows, err, _ = run_pair(a.echo, "cuda", "cuda", [s], iters[s], env, env, False, extra, extra)
                if rc != 0 or not rows:
                    raise RuntimeError(f"ours {s}: {err[-2000:]}")
                row[key][s] = rows[0]
        rounds.append(row)
        log(f"round {r + 1}/{a.rounds} done")
    results["bench"] = rounds
    med = statistics.median
    log("\nDevice->device ping-pong, one GPU, two processes (medians of rounds):")
    log(f"{'size':>10} {'perftest tag_lat':>18} {'ours':>12} {'ours, no staging':>18} {'ratio':>7}   "
        f"{'perftest BW (lat)':>18} {'ours BW':>12} {'of perftest':>11}  {'perftest tag_bw':>16}")
    for s in sizes:
        p_lat = med(r["perftest_lat"][s]["lat_us"] for r in rounds)
        o_lat = med(r["ours"][s]["median_us"] for r in rounds)
        n_lat = med(r["ours_no_stage"][s]["median_us"] for r in rounds)
        p_bw = s / p_lat / 1e3  # GB/s from one-way latency
        o_bw = s / o_lat / 1e3
        p_tbw = med(r["perftest_bw"][s]["bw_MiBps"] for r in rounds) * (1 << 20) / 1e9
        log(f"{s:>10} {p_lat:>16.2f}us {o_lat:>10.2f}us {n_lat:>16.2f}us {o_lat / p_lat:>6.2f}x   "
            f"{p_bw:>15.2f}GB/s {o_bw:>9.2f}GB/s {o_bw / p_bw:>10.2f}  {p_tbw:>13.2f}GB/s")


def part_array(a, env, results):
    """Device blocks of 64 MiB fetched worker to worker (dask-collections' device tour, two
    worker processes on the GPU) over ucx:// and tcp://, beside ucx_perftest -m cuda tag_bw at
    64 MiB in the same run, printed as the seed's per-worker-pair table."""
    if not a.tour:
        raise SystemExit("--part array needs --tour (the device_tour example)")
    size = 64 << 20
    out = {"perftest_bw_MBps": [], "tour": []}
    # perftest before and after the cluster's rounds (a fetch per round, --rounds of them).
    for when in ("before", "after"):
        if when == "after":
            p = subprocess.run([a.tour, "--require-gpu", "--bench", "--protocols", "ucx,tcp", "--mib", "64",
                                "--rounds", str(max(a.rounds, 2))], env=env, capture_output=True,
                               text=True, timeout=240)
            if p.returncode != 0:
                raise RuntimeError(f"device_tour --bench: {p.stdout[-2000:]}{p.stderr[-2000:]}")
            out["tour"] += [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        bw = perftest(a.perftest, "tag_bw", size, 200, env)["bw_MiBps"] * (1 << 20) / 1e6
        out["perftest_bw_MBps"].append(bw)
    results["array"] = out
    ref = statistics.median(out["perftest_bw_MBps"])
    log("\nDevice blocks (64 MiB) fetched worker to worker, per pair (MB/s: 25% 50% 75%; total bytes),")
    log(f"beside ucx_perftest -m cuda tag_bw at 64 MiB: {ref:,.0f} MB/s")
    log("| protocol | (from, to) | 25% | 50% | 75% | bytes | 50% of perftest |")
    log("|---|---|---|---|---|---|---|")
    worst = None
    for t in out["tour"]:
        for pr in t["pairs"]:
            q = pr["mb_s"]
            ratio = q[1] / ref
            if t["protocol"] == "ucx":
                worst = ratio if worst is None else min(worst, ratio)
            log(f"| {t['protocol']}:// | ({pr['from']}, {pr['to']}) | {q[0]:,.0f} | {q[1]:,.0f} | {q[2]:,.0f} "
                f"| {pr['bytes']:,} | {ratio:.2f} |")
    log(f"ucx:// device blocks at {worst:.2f} of ucx_perftest -m cuda (target: 0.8 or more)"
        if worst is not None else "no ucx:// pair measured")


def part_sweep(a, env, results):
    sizes = [8, 256, 4096, 16384, 65536, 262144]
    out = {}
    for key, extra in (("ucx device path", ("--stage-below", "0")), ("staged", ("--stage-below", "max"))):
        rc, rows, err, _ = run_pair(a.echo, "cuda", "cuda", sizes, 500, env, env, False, extra, extra)
        if rc != 0:
            raise RuntimeError(err[-2000:])
        out[key] = {r["size"]: r["median_us"] for r in rows}
    results["sweep"] = out
    log("\nSmall device messages, one-way median latency (us):")
    log(f"{'size':>8} {'UCX device path':>16} {'staged via pinned host':>24}")
    for s in sizes:
        log(f"{s:>8} {out['ucx device path'][s]:>16.2f} {out['staged'][s]:>24.2f}")


def part_floor(a, env, results):
    """ucx_perftest -m variants and our echo with one or both sides on the device (8 B and 64 KiB)."""
    out = {}
    variants = [("cuda 8B", "cuda", 8, {}), ("host,cuda 8B (recv into cuda)", "host,cuda", 8, {}),
                ("cuda,host 8B (send from cuda)", "cuda,host", 8, {}),
                ("cuda 8B MEMTYPE_CACHE=n", "cuda", 8, {"UCX_MEMTYPE_CACHE": "n"}),
                ("cuda 8B RNDV_THRESH=0", "cuda", 8, {"UCX_RNDV_THRESH": "0"}),
                ("cuda 8B TLS=sm,cuda_copy", "cuda", 8, {"UCX_TLS": "sm,cuda_copy"}),
                ("cuda 8B TLS=sm,cuda_ipc,cuda_copy", "cuda", 8, {"UCX_TLS": "sm,cuda_ipc,cuda_copy"}),
                ("cuda 8B TLS=tcp,cuda_copy", "cuda", 8, {"UCX_TLS": "tcp,cuda_copy"}),
                ("cuda 64KiB", "cuda", 65536, {}), ("cuda 64KiB TLS=^cuda_ipc", "cuda", 65536, {"UCX_TLS": "^cuda_ipc"}),
                ("cuda 1MiB TLS=^cuda_ipc", "cuda", 1 << 20, {"UCX_TLS": "^cuda_ipc"})]
    for label, mem, size, extra_env in variants:
        try:
            r = perftest(a.perftest, "tag_lat", size, 1000, dict(env, **extra_env), mem)
            out[f"perftest {label}"] = r["lat_us"]
            log(f"{'perftest ' + label:50} {r['lat_us']:10.2f} us")
        except RuntimeError as e:
            log(f"{'perftest ' + label:50} failed: {str(e)[-200:]}")
    for label, smem, cmem, extra in (("staged: server host, client cuda", "host", "cuda", ("--stage-below", "max")),
                                     ("staged: server cuda, client host", "cuda", "host", ("--stage-below", "max")),
                                     ("ucx: server host, client cuda", "host", "cuda", ("--stage-below", "0")),
                                     ("staged both, blocking mode", "cuda", "cuda",
                                      ("--stage-below", "max", "--mode", "blocking"))):
        rc, rows, err, _ = run_pair(a.echo, smem, cmem, [8, 65536], 500, env, env, False, extra, extra)
        got = {r["size"]: r["median_us"] for r in rows}
        out[f"ours {label}"] = got
        log(f"{'ours ' + label:50} " + (", ".join(f"{s} B {v:.2f} us" for s, v in got.items()) if rc == 0
                                         else f"failed: {err[-200:]}"))
    results["floor"] = out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--echo", required=True)
    ap.add_argument("--perftest", default="ucx_perftest")
    ap.add_argument("--part", default="all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tour", help="dask-collections' device_tour example (--part array)")
    a = ap.parse_args()
    env = dict(os.environ)
    results = {}
    parts = ["echo", "sweep", "bench"] if a.part == "all" else a.part.split(",")
    try:
        for p in parts:
            {"echo": part_echo, "bench": part_bench, "sweep": part_sweep, "mixed": part_mixed,
             "floor": part_floor, "array": part_array}[p](a, env, results)
    finally:
        with open(os.path.join(a.out, "gpu-proof.json"), "w") as f:
            json.dump(results, f, indent=1)
    failed = [e for e in results.get("echo", []) if not e["ok"]]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
