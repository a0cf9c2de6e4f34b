#!/usr/bin/env python3
"""ucxrs (our Python package) beside UCXX's Python API and raw UCX, in one run.

For each size and progress mode, in interleaved rounds: `ucx_perftest -t tag_lat` (C, the
physical reference; `-e`, as UCXX's endpoints have error handling, with ucx-rs's default
`UCX_MM_ERROR_HANDLING=y`, so shared memory carries it as it carries ucxrs's traffic), ucxrs's ping-pong
(python/benchmarks/send_recv.py) and UCXX's `python -m ucxx.benchmarks.send_recv`, all three
on the same UCX (the libucx wheel's, through one interpreter that has ucxrs and UCXX:
`bash tests/interop/run.sh` makes target/ucxx-venv so). Each round runs perftest, then every
mode's ucxrs and UCXX; ratios are taken within a round and their median reported.

    python3 scripts/python_compare.py                          # 8 B, 1 MiB, 64 MiB; 3 rounds
    python3 scripts/python_compare.py --short                  # CI: 8 B and 1 MiB, 1 round
    python3 scripts/python_compare.py --memory cuda            # CuPy arrays, perftest -m cuda

Prints one table (one-way medians; ucxrs/UCXX below 1 is faster than UCXX; perftest/ucxrs is
the fraction of raw UCX's speed that ucxrs reaches) and writes it as JSON with `--json`.
"""
import argparse, json, os, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner import (ROOT, SERVER_CPU, CLIENT_CPU, next_port, perftest, pin, size_arg, size_name,  # noqa: E402
                    skip_or_fail, start_server, stop)
BENCH = os.path.join(ROOT, "python", "benchmarks", "send_recv.py")


def iters_for(size, scale):
    n = 2000 if size <= 64 << 10 else 200 if size <= 4 << 20 else 20
    return max(5, int(n * scale))


def ucxrs_run(py, size, mode, iters, memory, env):
    common = ["--bytes", str(size), "--iters", str(iters), "--warmup", str(max(2, iters // 10)),
              "--mode", mode, "--memory", memory]
    srv, port = start_server(pin(SERVER_CPU, [py, BENCH, "server", *common]), env)
    try:
        out = subprocess.run(pin(CLIENT_CPU, [py, BENCH, "client", "--port", port, *common]),
                             capture_output=True, text=True, timeout=600, env=env)
    finally:
        stop(srv)
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not rows:
        raise RuntimeError(f"ucxrs {mode} {size}: {out.stderr.strip()[-500:]}")
    return rows[0]["median_us"]


def ucxx_run(py, size, mode, iters, memory, env):
    common = ["-m", "ucxx.benchmarks.send_recv", "-n", str(size), "--n-iter", str(iters),
              "--n-warmup-iter", str(max(2, iters // 10)), "--progress-mode", mode,
              "-o", "cupy" if memory == "cuda" else "numpy", "--reuse-alloc"]
    port = next_port()
    srv = subprocess.Popen([py, *common, "--server-only", "-p", port, "-b", SERVER_CPU],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        time.sleep(2)  # UCXX's server says nothing when it is ready
        run = subprocess.run([py, *common, "--client-only", "-s", "127.0.0.1", "-p", port, "-c", CLIENT_CPU,
                              "--no-detailed-report"], capture_output=True, text=True, timeout=600, env=env)
    finally:
        stop(srv)
    for line in (run.stdout + run.stderr).splitlines():
        if line.startswith("Latency (median)"):
            return float(line.split("|")[1].split()[0]) / 1000.0
    raise RuntimeError(f"UCXX send_recv {mode} {size}: no result\n{(run.stdout + run.stderr)[-500:]}")


def perftest_run(binary, size, iters, memory, env):
    extra = ["-e"] + (["-m", "cuda"] if memory == "cuda" else [])
    # ucx-rs's default options (ucx-rs/src/context.rs): error handling keeps shared memory.
    env = dict(env, UCX_MM_ERROR_HANDLING="y")
    return perftest("tag_lat", size, max(iters, 100) * 5, env=env, extra=extra, binary=binary,
                    cpus=(SERVER_CPU, CLIENT_CPU))["lat_us"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=os.path.join(ROOT, "target", "ucxx-venv", "bin", "python"),
                    help="an interpreter with ucxrs and ucxx (default: target/ucxx-venv)")
    ap.add_argument("--sizes", default="8,1m,64m")
    ap.add_argument("--modes", default="thread,blocking,polling")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the iteration counts")
    ap.add_argument("--memory", choices=["host", "cuda"], default="host")
    ap.add_argument("--perftest", default=None, help="default: the libucx wheel's ucx_perftest")
    ap.add_argument("--short", action="store_true", help="8 B and 1 MiB, one round, fewer iterations")
    ap.add_argument("--ucxx-mm", action="store_true",
                    help="run UCXX with UCX_MM_ERROR_HANDLING=y too (ucxrs's default; UCXX's own "
                         "default sends loopback traffic with error handling over TCP)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.short:
        a.sizes, a.rounds, a.scale = "8,1m", 1, 0.25
    py = a.python
    probe = subprocess.run([py, "-c", "import os, libucx, ucxx, ucxrs; print(os.path.dirname(libucx.__file__))"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        skip_or_fail(f"python_compare: {py} lacks ucxrs, ucxx or libucx (bash tests/interop/run.sh "
                     f"makes target/ucxx-venv with all three): {probe.stderr.strip()[-300:]}")
        return
    libucx = probe.stdout.strip()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [os.path.join(libucx, "lib"), env.get("LD_LIBRARY_PATH")]))
    env.setdefault("UCX_MODULE_DIR", os.path.join(libucx, "lib", "ucx"))
    ucxx_env = dict(env, UCX_MM_ERROR_HANDLING="y") if a.ucxx_mm else env
    binary = a.perftest or os.path.join(libucx, "bin", "ucx_perftest")
    sizes = [size_arg(s) for s in a.sizes.split(",")]
    modes = a.modes.split(",")
    raw = {}  # (size, impl, mode) -> [us per round]
    failed = []

    def record(key, f):
        """One run, tried twice: UCXX's benchmark fails a run now and then (a connection reset
        at its start). A run that fails twice is reported; a row with no result fails the script."""
        for attempt in (1, 2):
            try:
                raw.setdefault(key, []).append(f())
                return
            except Exception as e:
                failed.append(f"{key} (attempt {attempt}): {str(e)[-300:]}")
        raw[key].append(None)

    for r in range(a.rounds):
        for size in sizes:
            n = iters_for(size, a.scale)
            record((size, "perftest", "-"), lambda: perftest_run(binary, size, n, a.memory, env))
            for mode in modes:
                record((size, "ucxrs", mode), lambda: ucxrs_run(py, size, mode, n, a.memory, env))
                record((size, "ucxx", mode), lambda: ucxx_run(py, size, mode, n, a.memory, ucxx_env))
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    def ratio(num, den):
        pairs = [n / d for n, d in zip(num, den) if n is not None and d]
        return statistics.median(pairs) if pairs else None

    fmt = lambda v, spec=".2f": "-" if v is None else format(v, spec)
    rows = []
    print(f"\none-way medians over {a.rounds} round(s), {a.memory} memory, UCX from {libucx}; "
          f"perftest with UCX_MM_ERROR_HANDLING=y (ucxrs's default), UCXX with "
          f"{'the same' if a.ucxx_mm else 'its defaults'}")
    print("| size | mode | ucx_perftest -e | ucxrs | UCXX | ucxrs/UCXX | perftest/ucxrs |")
    print("|---|---|---|---|---|---|---|")
    for size in sizes:
        ref = raw[(size, "perftest", "-")]
        for mode in modes:
            ours, theirs = raw[(size, "ucxrs", mode)], raw[(size, "ucxx", mode)]
            row = {"size": size, "mode": mode, "memory": a.memory, "perftest_us": med(ref),
                   "ucxrs_us": med(ours), "ucxx_us": med(theirs),
                   "ucxrs_over_ucxx": ratio(ours, theirs), "perftest_over_ucxrs": ratio(ref, ours)}
            rows.append(row)
            print(f"| {size_name(size)} | {mode} | {fmt(row['perftest_us'])} µs | {fmt(row['ucxrs_us'])} µs "
                  f"| {fmt(row['ucxx_us'])} µs | {fmt(row['ucxrs_over_ucxx'])} | {fmt(row['perftest_over_ucxrs'])} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if failed:
        print("\nfailed runs:\n  " + "\n  ".join(failed), file=sys.stderr)
    empty = [k for k, v in raw.items() if all(x is None for x in v)]
    if empty:
        sys.exit(f"no result at all for {empty}")


if __name__ == "__main__":
    main()
