#!/usr/bin/env python3
"""Stock Dask on three comms, interleaved in one run: Dask's `tcp`, distributed-ucxx's `ucx`
(PyPI `distributed-ucxx-cu12`, with its libucx) and ours, `ucxrs` (python/ucxrs/distributed.py).

    python3 scripts/dask_comm_compare.py [--rounds 2] [--runs 3] [--chunk 1000000] [--quick]

For each protocol, per round, a fresh `LocalCluster` (2 worker processes x 1 thread, 127.0.0.1)
runs:
- the seed's merge benchmark (dask-cuda's `local_cudf_merge --type cpu`), with pandas: two
  frames of `--chunk` rows per worker (int64 key, int64 payload), about 30% of the right
  side's keys matching the left's, merged with Dask's task shuffle (`--shuffle p2p` for the
  other), `--runs` times; per run the wall clock and the throughput (both frames' bytes / wall
  clock); per worker pair the 25/50/75% of the bandwidth of the transfers of 1 MiB and more
  from the workers' transfer logs (Dask's own measure: request to deserialised), and the bytes
  moved: the table the seed's benchmark prints.
- a transfer microbenchmark: a value of 1 KiB, 1 MiB or 64 MiB made on one worker and used by
  a task on the other (a NumPy array, as Dask moves one), the median transfer time and rate
  from the receiver's transfer log (Dask counts at least 1 ms per transfer); the first of
  each size is a warm-up, not counted.
Every run's answer (rows, payload sums) must be equal across protocols and to pandas'.

With `--memory cuda` (a GPU machine: CuPy, ucxrs built with CUDA) the values are CuPy arrays,
moved both ways between the two workers on one GPU (the merge is not run: it is pandas'), and
with `--perftest BIN` each size is also measured by `ucx_perftest -t tag_bw -m cuda` in the
same round: the median transfer rates, their ratio to perftest's bandwidth, and per worker pair
the seed's 25/50/75% table. `--python PY` runs the clusters with that interpreter and this
environment as it is (scripts/gpu/prove.sh's), not target/ucxx-venv.

Runs in target/ucxx-venv (given Dask, and the ucxrs-cu12 wheel installed into it, by
scripts/dask_backend_test.sh --setup), so both UCX comms run the same UCX. Figures are for a
2-core VM whose two workers, scheduler and client share the cores: a benchmark, never a test.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "ucxx-venv")
VPY = os.path.join(VENV, "bin", "python")
PROTOCOLS = ["tcp", "ucx", "ucxrs"]
SIZES = [1 << 10, 1 << 20, 64 << 20]
MIB = 1 << 20


def fmt_bytes(n):
    for unit, k in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n} B"


# ---- in the child: one protocol, one cluster ------------------------------------------------


def make_left(i, rows, seed):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed + 2 * i)
    return pd.DataFrame({"key": rng.permutation(rows) + i * rows,
                         "payload": rng.integers(0, 1 << 40, rows)})


def make_right(i, rows, seed, n_total):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed + 2 * i + 1)
    match = rng.random(rows) < 0.3
    key = np.where(match, rng.integers(0, n_total, rows), rng.integers(n_total, 4 * n_total, rows))
    return pd.DataFrame({"key": key, "payload": rng.integers(0, 1 << 40, rows)})


def expected(rows, parts, seed):
    import pandas as pd

    left = pd.concat([make_left(i, rows, seed) for i in range(parts)])
    right = pd.concat([make_right(i, rows, seed, rows * parts) for i in range(parts)])
    m = left.merge(right, on="key", how="inner")
    return [len(m), int(m.payload_x.sum()), int(m.payload_y.sum())]


def pair_table(logs, names, ignore=MIB):
    """{'(w1,w2)': [q25, q50, q75, total]} from the receivers' transfer logs."""
    import numpy as np

    out = {}
    for receiver, entries in logs.items():
        by_sender = {}
        for e in entries:
            by_sender.setdefault(e["who"], []).append(e)
        for sender, es in by_sender.items():
            rates = [e["total"] / e["duration"] for e in es if e["total"] >= ignore and e["duration"] > 0]
            total = sum(e["total"] for e in es)
            q = [float(v) for v in np.quantile(rates, [0.25, 0.5, 0.75])] if rates else [0.0] * 3
            out[f"({names[receiver]},{names[sender]})"] = q + [total]
    return out


def child(args):
    import dask
    import numpy as np
    from distributed import Client, LocalCluster, wait

    def clear_log(dask_worker):
        dask_worker.transfer_incoming_log.clear()

    def read_log(dask_worker):
        return [{"who": e["who"], "total": e["total"], "duration": e["duration"]}
                for e in dask_worker.transfer_incoming_log]

    result = {"protocol": args.one, "merge": [], "transfers": {}}
    with LocalCluster(protocol=args.one, n_workers=2, threads_per_worker=1, processes=True,
                      host="127.0.0.1", dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        workers = sorted(client.scheduler_info()["workers"])
        names = {w: i for i, w in enumerate(workers)}
        parts = len(workers)
        rows = args.chunk
        if args.memory == "cuda":
            args.runs = 0  # the merge is pandas': host memory
        else:
            import dask.dataframe as dd

            meta_l = make_left(0, 2, 0).iloc[:0]
            meta_r = make_right(0, 2, 0, 4).iloc[:0]
            left = dd.from_map(make_left, range(parts), rows=rows, seed=args.seed, meta=meta_l,
                               divisions=[None] * (parts + 1)).persist()
            right = dd.from_map(make_right, range(parts), rows=rows, seed=args.seed,
                                n_total=rows * parts, meta=meta_r,
                                divisions=[None] * (parts + 1)).persist()
            wait([left, right])
        data_bytes = 2 * parts * rows * 16
        for _ in range(args.runs):
            client.run(clear_log)
            with dask.config.set({"dataframe.shuffle.method": args.shuffle}):
                t0 = time.perf_counter()
                merged = left.merge(right, on="key", how="inner").persist()
                wait(merged)
                took = time.perf_counter() - t0
            answer = [int(len(merged)), int(merged.payload_x.sum().compute()),
                      int(merged.payload_y.sum().compute())]
            logs = client.run(read_log)
            result["merge"].append({"wall": took, "throughput": data_bytes / took,
                                    "answer": answer, "pairs": pair_table(logs, names)})
            del merged
        a, b = workers
        if args.memory == "cuda":
            import cupy

            full, both_ways = cupy.full, True
        else:
            full, both_ways = np.full, False
        result["pairs"] = {}
        for size in args.sizes:
            times, entries = [], {}
            # The first of each size is not counted: it maps the receiver's buffers (page
            # faults, a pool's first use) once per process.
            for i in range(1 + (args.reps if size < 16 * MIB else max(2, args.reps // 2))):
                src, dst = (b, a) if both_ways and i % 2 else (a, b)
                made = client.submit(full, size, i % 251, dtype="u1", workers=[src], pure=False)
                wait(made)
                client.run(clear_log, workers=[dst])
                used = client.submit(lambda v: int(v[-1]), made, workers=[dst], pure=False)
                if used.result() != i % 251:
                    raise SystemExit(f"{args.one}: the {size}-byte value arrived wrong")
                log = client.run(read_log, workers=[dst])[dst]
                moved = [e for e in log if e["total"] >= size]
                if len(moved) != 1:
                    raise SystemExit(f"{args.one}: expected one transfer of {size} B, log {log}")
                if i > 0:
                    times.append(moved[0]["duration"])
                    entries.setdefault(dst, []).append(moved[0])
                del made, used
            result["transfers"][str(size)] = times
            result["pairs"][str(size)] = pair_table(entries, names, ignore=0)
    print(json.dumps(result), flush=True)


# ---- in the parent: rounds, tables ----------------------------------------------------------


def env_for_venv():
    """The venv's processes as a user runs them: UCXX's comm and ucxrs both load the libucx
    wheel's UCX themselves (no LD_LIBRARY_PATH, no UCX_MODULE_DIR)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "UCX_MODULE_DIR")}
    env["UCX_WARN_UNUSED_ENV_VARS"] = "n"
    return env


def run_one(proto, args, env):
    cmd = [args.python, os.path.abspath(__file__), "--one", proto, "--memory", args.memory,
           "--chunk", str(args.chunk),
           "--runs", str(args.runs), "--reps", str(args.reps), "--seed", str(args.seed),
           "--shuffle", args.shuffle, "--sizes", ",".join(map(str, args.sizes))]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        sys.exit(f"{proto}: the run failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=1_000_000, help="rows per worker per frame")
    ap.add_argument("--reps", type=int, default=10, help="transfers per size (half at 16 MiB+)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--shuffle", default="tasks", choices=["tasks", "p2p"])
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true",
                    help="CI's round: 1 round, 1 run, 100,000 rows, 3 transfers per size")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--json", help="also write every run's figures here")
    ap.add_argument("--memory", default="host", choices=["host", "cuda"],
                    help="cuda: CuPy values, no merge (a GPU machine)")
    ap.add_argument("--python", help="the clusters' interpreter, in this environment as it is "
                                     "(default: target/ucxx-venv's, with its libucx)")
    ap.add_argument("--perftest", help="ucx_perftest to measure each size with, in each round")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = [int(s) for s in str(args.sizes).split(",")]
    if args.one:
        return child(args)
    if args.quick:
        args.rounds, args.runs, args.chunk, args.reps = 1, 1, 100_000, 3
    if args.python:
        env = dict(os.environ)
    else:
        if not os.path.exists(VPY):
            subprocess.run(["bash", os.path.join(ROOT, "scripts", "dask_backend_test.sh"), "--setup"],
                           check=True)
        args.python, env = VPY, env_for_venv()
    protocols = args.protocols.split(",")
    want = None
    if args.memory == "host":
        want = json.loads(subprocess.run(
            [args.python, "-c", f"import sys, json; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
                        f"import dask_comm_compare as d; print(json.dumps(d.expected({args.chunk}, 2, {args.seed})))"],
            capture_output=True, text=True, check=True, env=env).stdout)
        print(f"pandas' answer: {want[0]:,} rows; {args.rounds} rounds x {args.runs} runs, "
              f"{args.chunk:,} rows per worker per frame, {args.shuffle} shuffle", flush=True)
    else:
        print(f"CuPy values between two workers on one GPU; {args.rounds} rounds", flush=True)
    results = {p: [] for p in protocols}
    args.perftest_bw = {}
    for r in range(args.rounds):
        if args.perftest:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from runner import perftest

            extra = ["-m", "cuda"] if args.memory == "cuda" else []
            for size in args.sizes:
                f = perftest("tag_bw", size, 200 if size < 16 * MIB else 50, env=env, extra=extra,
                             binary=args.perftest)
                args.perftest_bw.setdefault(size, []).append(f["bw_MiBps"] * MIB)
        for p in protocols:
            t0 = time.perf_counter()
            res = run_one(p, args, env)
            for m in res["merge"]:
                if want is not None and m["answer"] != want:
                    sys.exit(f"{p}: wrong answer {m['answer']}, pandas says {want}")
            results[p].append(res)
            merge = (f"merge {statistics.median(m['wall'] for m in res['merge']):.2f} s "
                     if res["merge"] else "")
            print(f"round {r + 1}, {p}: {merge}(cluster and all: {time.perf_counter() - t0:.0f} s)",
                  flush=True)
    summary = report(results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "summary": summary}, f, indent=1)


def report(results, args):
    summary = {}
    med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
    for p, runs in results.items():
        merges = [m for r in runs for m in r["merge"]]
        cells = {}
        if merges:
            pairs = {}
            for m in merges:
                for k, v in m["pairs"].items():
                    pairs.setdefault(k, []).append(v)
            print(f"\nMerge benchmark, protocol {p} ({len(merges)} runs)")
            print("-" * 60)
            print(f"{'wall clock':<12}| throughput")
            for m in merges:
                print(f"{m['wall']:>9.2f} s | {m['throughput'] / MIB:,.1f} MiB/s")
            print(f"{'(w1,w2)':<12}| 25% 50% 75% (total nbytes), median over runs")
            for k in sorted(pairs):
                v = pairs[k]
                q = [statistics.median(x[i] for x in v) for i in range(3)]
                total = statistics.median(x[3] for x in v)
                cells[k] = q[1]
                print(f"{k:<12}| " + " ".join(f"{x / MIB:,.0f} MiB/s" for x in q) + f" ({fmt_bytes(total)})")
        else:
            print(f"\nTransfers, protocol {p} ({args.memory} memory)")
            print("-" * 60)
        transfers = {}
        for s in args.sizes:
            times = [t for r in runs for t in r["transfers"][str(s)]]
            transfers[s] = med(times)
            print(f"transfer {fmt_bytes(s):>9}: median {transfers[s] * 1e3:8.2f} ms, "
                  f"{s / transfers[s] / MIB if transfers[s] else 0:,.1f} MiB/s")
            if args.memory == "cuda":
                # The seed's per-pair table, for this size's transfers.
                pairs = {}
                for r in runs:
                    for k, v in r.get("pairs", {}).get(str(s), {}).items():
                        pairs.setdefault(k, []).append(v)
                for k in sorted(pairs):
                    q = [med([x[i] for x in pairs[k]]) for i in range(3)]
                    print(f"  {k:<10}| " + " ".join(f"{x / MIB:,.0f} MiB/s" for x in q)
                          + " (25% 50% 75%)")
        summary[p] = {"throughput": med([m["throughput"] for m in merges]),
                      "wall": med([m["wall"] for m in merges]),
                      "pair_median": med(list(cells.values())),
                      "transfers": transfers}
    print("\nSummary (medians; ratios are ucxrs over the other)")
    print(f"{'protocol':<8}| {'wall':>8} | {'throughput':>12} | {'per pair 50%':>13} | "
          + " | ".join(f"{fmt_bytes(s):>9}" for s in args.sizes))
    for p, s in summary.items():
        print(f"{p:<8}| {s['wall']:>6.2f} s | {s['throughput'] / MIB:>7,.1f} MiB/s | "
              f"{s['pair_median'] / MIB:>8,.0f} MiB/s | "
              + " | ".join(f"{s['transfers'][x] * 1e3:>6.2f} ms" for x in args.sizes))
    ratio = lambda a, b: a / b if b else float("nan")  # noqa: E731
    if "ucxrs" in summary:
        ours = summary["ucxrs"]
        for p, s in summary.items():
            if p == "ucxrs":
                continue
            print(f"ucxrs / {p}: throughput {ratio(ours['throughput'], s['throughput']):.2f}x, "
                  f"per-pair median {ratio(ours['pair_median'], s['pair_median']):.2f}x, "
                  "transfer time " + ", ".join(
                      f"{fmt_bytes(x)} {ratio(ours['transfers'][x], s['transfers'][x]):.2f}"
                      for x in args.sizes))
    if args.perftest_bw:
        print(f"ucx_perftest -t tag_bw{' -m cuda' if args.memory == 'cuda' else ''} in the same "
              "rounds, and each protocol's median transfer rate over it (Dask's transfer time "
              "includes its request and deserialisation):")
        for x in args.sizes:
            bw = med(args.perftest_bw.get(x, []))
            rates = ", ".join(f"{p} {ratio(x / s['transfers'][x] if s['transfers'][x] else 0, bw):.2f}"
                              for p, s in summary.items())
            print(f"  {fmt_bytes(x):>9}: perftest {bw / MIB:,.0f} MiB/s; {rates}")
            for p, s in summary.items():
                s.setdefault("over_perftest", {})[x] = ratio(
                    x / s["transfers"][x] if s["transfers"][x] else 0, bw)
    return summary

if __name__ == "__main__":
    main()
