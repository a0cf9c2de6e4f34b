#!/usr/bin/env python3
"""dask-collections' dataframe against Dask's dataframe and pandas on the same files, in the
same run, interleaved, with every answer checked against pandas'.

    python3 scripts/frame_compare.py               # full sizes, 3 rounds
    python3 scripts/frame_compare.py --small       # small sizes, 1 round (CI smoke)

Workloads (issue 18's dataframe workloads):
  groupby  the seed's listing: 30 CSV files 2015-01-01.csv ... of 1,000,000 rows each
           (user_id of 10,000 values, value, a name string);
           read_csv("2015-*-*.csv").groupby("user_id").value.mean()
  merge    two parquet datasets of 8 files x 1,000,000 rows (key, and x or y), about 30% of
           the keys on both sides; an inner merge on key, then key and y
  sort     the left dataset sorted by x (a distributed sort); the rows and the sum of the
           1,000 smallest x in the order they come out

Engines, on this machine's 2 cores: pandas (one process), Dask threaded (2 threads), Dask
distributed (LocalCluster, 2 worker processes x 1 thread; its default shuffle for the merge,
which is its p2p shuffle, and for the merge also with shuffle method "tasks"), ours on
`Threaded` (2 threads) and ours on a LocalCluster (2 worker processes x 1 thread) over
tcp:// and ucx:// with our peer-to-peer shuffle, and for the merge with the tasks shuffle.
Each engine runs each workload in a fresh process; cluster start-up is not timed, reading the
files is. Medians of the rounds. The merge row also gives the input bytes (the parquet files)
per second, and for our p2p engines the bytes the workers delivered to each other and the
rate of those deliveries (their transfer logs: bytes over the time from the first byte sent
to the peer's acknowledgement), beside `ucx_perftest -t tag_bw` between two processes at the
deliveries' mean size, measured in the same run. Files are written once under
target/frame-data (kept; delete it to rewrite). Dask and pandas run from target/dask-venv.
"""
import argparse, os, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collections_bench as bench  # noqa: E402
from collections_bench import ROOT, VPY  # noqa: E402
from runner import perftest  # noqa: E402

OURS = bench.example("dataframe_tour")
WORKLOADS = ["groupby", "merge", "sort"]


# Writes the files (argv: dir, small 0/1), with NumPy's seeded generator.
WRITE = r'''
import os, sys
import numpy as np, pandas as pd
d, small = sys.argv[1], sys.argv[2] == "1"
rng = np.random.default_rng(18)
days, rows = (4, 20_000) if small else (30, 1_000_000)
names = np.array(["Alice", "Bob", "Charlie", "Dan", "Edith", "Frank", "Grace", "Hannah"])
for day in range(1, days + 1):
    pd.DataFrame({
        "user_id": rng.integers(0, 10_000, rows),
        "value": rng.random(rows),
        "name": names[rng.integers(0, len(names), rows)],
    }).to_csv(os.path.join(d, f"2015-01-{day:02}.csv"), index=False)
parts, per = (4, 20_000) if small else (8, 1_000_000)
total = parts * per
for side, start, col in (("left", 0, "x"), ("right", int(0.7 * total), "y")):
    keys = np.arange(start, start + total)
    rng.shuffle(keys)
    for p in range(parts):
        k = keys[p * per:(p + 1) * per]
        pd.DataFrame({"key": k, col: rng.random(per)}).to_parquet(
            os.path.join(d, f"{side}-{p}.parquet"), index=False)
'''

# Runs inside the venv: argv = engine, data dir, workloads...; one JSON line per workload.
PY_SIDE = r'''
import glob, json, os, sys, time
engine, d, names = sys.argv[1], sys.argv[2], sys.argv[3:]
csvs = sorted(glob.glob(os.path.join(d, "2015-*-*.csv")))
lefts = sorted(glob.glob(os.path.join(d, "left-*.parquet")))
rights = sorted(glob.glob(os.path.join(d, "right-*.parquet")))
if engine == "pandas":
    import pandas as pd
    def groupby():
        df = pd.concat([pd.read_csv(f) for f in csvs])
        m = df.groupby("user_id").value.mean()
        return [len(m), float(m.sum())]
    def merge():
        l = pd.concat([pd.read_parquet(f) for f in lefts])
        r = pd.concat([pd.read_parquet(f) for f in rights])
        m = l.merge(r, on="key", how="inner")[["key", "y"]]
        return [len(m), float(m.y.sum())]
    def sort():
        s = pd.concat([pd.read_parquet(f) for f in lefts]).sort_values("x")
        return [len(s), float(s.x.head(1000).sum())]
else:
    import dask, dask.dataframe as dd
    if engine.startswith("dask-distributed"):
        from distributed import Client, LocalCluster
        if engine.endswith("-tasks"):
            dask.config.set({"dataframe.shuffle.method": "tasks"})
        client = Client(LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=None))
    else:
        dask.config.set(scheduler="threads", num_workers=2)
    def groupby():
        m = dd.read_csv(os.path.join(d, "2015-*-*.csv")).groupby("user_id").value.mean().compute()
        return [len(m), float(m.sum())]
    def merge():
        l, r = dd.read_parquet(lefts), dd.read_parquet(rights)
        m = l.merge(r, on="key", how="inner")[["key", "y"]].compute()
        return [len(m), float(m.y.sum())]
    def sort():
        s = dd.read_parquet(lefts).sort_values("x").compute()
        return [len(s), float(s.x.head(1000).sum())]
fs = {"groupby": groupby, "merge": merge, "sort": sort}
for name in names:
    t0 = time.perf_counter()
    v = fs[name]()
    print(json.dumps({"workload": name, "seconds": time.perf_counter() - t0, "answer": v}),
          flush=True)
'''


def python_engine(engine, d, names):
    return bench.python_engine(PY_SIDE, [engine, d], names)


def our_engine(scheduler, d, names, extra=()):
    return bench.our_engine(OURS, ["--data", d, "--scheduler", scheduler, *extra], names)


def agrees(got, want):
    return got[0] == want[0] and abs(got[1] - want[1]) <= 1e-9 * max(abs(want[1]), 1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    a = ap.parse_args()
    rounds = a.rounds or (1 if a.small else 3)
    names = a.workloads.split(",")
    bench.ensure_venv("import pandas, pyarrow, dask.dataframe, distributed",
                      ["dask[dataframe,distributed]", "pyarrow"])
    d = os.path.join(ROOT, "target", "frame-data-small" if a.small else "frame-data")
    if not os.path.exists(os.path.join(d, "done")):
        os.makedirs(d, exist_ok=True)
        subprocess.run([VPY, "-c", WRITE, d, "1" if a.small else "0"], check=True, timeout=1800)
        open(os.path.join(d, "done"), "w").close()
    bench.build_example("dataframe_tour")
    merge_only = [n for n in names if n == "merge"]
    shuffled = [n for n in names if n in ("merge", "sort")]
    engines = {
        "pandas": lambda: python_engine("pandas", d, names),
        "dask threaded": lambda: python_engine("dask-threads", d, names),
        "dask distributed": lambda: python_engine("dask-distributed", d, names),
        "dask dist. tasks": lambda: python_engine("dask-distributed-tasks", d, shuffled),
        "ours threaded": lambda: our_engine("threaded", d, names),
        "ours cluster tcp": lambda: our_engine("cluster", d, names, ["--protocol", "tcp"]),
        "ours cluster ucx": lambda: our_engine("cluster", d, shuffled, ["--protocol", "ucx"]),
        "ours tasks tcp": lambda: our_engine("cluster", d, merge_only,
                                             ["--protocol", "tcp", "--shuffle", "tasks"]),
    }
    extras = {}
    med, answers = bench.rounds(engines, names, rounds, extras)
    bad = bench.disagreements(answers, "pandas", lambda n, v, w: agrees(v, w))
    bench.table(names, engines, med, "pandas")
    if "merge" in names:
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
                   if f.endswith(".parquet"))
        print(f"merge input {size / 1e6:.1f} MB (parquet): " + ", ".join(
            f"{e} {size / med[(e, 'merge')] / 1e6:.0f} MB/s" for e in engines))
        p2p = [e for e in engines if (e, "merge", "pair_mb_s") in extras and extras[(e, "merge", "deliveries")]]
        if p2p:
            moved = extras[(p2p[0], "merge", "moved_mb")]
            mean = int(moved * 1e6 / max(extras[(p2p[0], "merge", "deliveries")], 1))
            ref = perftest("tag_bw", mean, 100)["bw_MiBps"] * 1.048576
            print(f"p2p shuffle: {moved:.0f} MB moved between the workers in deliveries of "
                  f"{mean / 1e6:.1f} MB on average; ucx_perftest -t tag_bw at that size "
                  f"{ref:.0f} MB/s; " + ", ".join(
                      f"{e} {extras[(e, 'merge', 'pair_mb_s')]:.0f} MB/s "
                      f"({extras[(e, 'merge', 'pair_mb_s')] / ref:.2f} of it)" for e in p2p))
    if bad:
        sys.exit(f"answers disagree with pandas': {bad}")
    print("every answer agrees with pandas'")


if __name__ == "__main__":
    main()
