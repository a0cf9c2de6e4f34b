#!/usr/bin/env python3
"""dask-collections' array against Dask and NumPy on the same workloads, in the same run,
interleaved, with every answer checked against NumPy's.

    python3 scripts/array_compare.py               # full sizes, 3 rounds
    python3 scripts/array_compare.py --small       # small sizes, 1 round (CI smoke)

Engines, on this machine's 2 cores: NumPy (one call per expression; its BLAS may use both
cores), Dask threaded (2 threads), Dask distributed (LocalCluster, 2 worker processes x 1
thread), ours on `Threaded` (2 threads) and ours on a LocalCluster (2 worker processes x 1
thread, tcp://). Every engine runs each workload in a fresh process (a process's first large
allocations pay their page faults; none inherits another workload's heap). Cluster start-up is
not timed; building the graph is. Medians of the rounds.

Workloads (issue 15's, those the array has so far):
  xxt          (x + x.T - x.mean(axis=0)).sum(), x = ones((10000, 10000), chunks=1000)
  exp-slice    exp(ones((10000, 10000), chunks=100))[1:100, 1:100].sum()
  random-mean  random((20000, 20000), chunks=2000).mean()
  rechunk      random((20000, 20000), chunks=(20000, 100)).rechunk((100, 20000)).sum()
  matmul       (a @ a).sum(), a = ones((4000, 4000), chunks=1000)
  overlap      (x.map_overlap(mean3x3, depth=1, boundary="reflect") * x).sum(),
               x = sin(0.37 i + 0.11 j) on 8000 x 8000 in chunks of 1000 (NumPy: a symmetric pad)
  cholesky     cholesky(ones((4000, 4000)) + 4000 * eye(4000)).sum(), chunks 1000
  cholesky-250 the same in chunks of 250
  svd          svd(x)[1].sum(), x = sin(0.00037 i (j + 1)), 2,000,000 x 20 in 100,000-row blocks
Then a .npy stack round trip: ours writes one NumPy loads, NumPy writes one ours reads.
Dask and NumPy run from target/dask-venv (installed from PyPI on first use).
"""
import argparse, json, os, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collections_bench as bench  # noqa: E402
from collections_bench import VPY  # noqa: E402

OURS = bench.example("array_tour")
WORKLOADS = ["xxt", "exp-slice", "random-mean", "rechunk", "matmul", "overlap", "cholesky",
             "cholesky-250", "svd"]

# Runs inside the venv: argv = engine, small (0/1), workloads...; one JSON line per workload.
PY_SIDE = r'''
import json, sys, time
engine, small, names = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
import numpy as np
n, c = (2000, 200) if small else (10000, 1000)
m, k = (800, 200) if small else (4000, 1000)
o, oc = (1600, 200) if small else (8000, 1000)
ch = 800 if small else 4000
chunks_of = {"cholesky": 200 if small else 1000, "cholesky-250": 50 if small else 250}
tn, tc = (200_000, 10_000) if small else (2_000_000, 100_000)
def mean3x3(b):
    out = b.copy()
    r, c = b.shape
    if r >= 3 and c >= 3:
        acc = sum(b[i:r - 2 + i, j:c - 2 + j] for i in range(3) for j in range(3))
        out[1:-1, 1:-1] = acc / 9.0
    return out
if engine == "numpy":
    def xxt():
        x = np.ones((n, n)); return (x + x.T - x.mean(axis=0)).sum()
    def exp_slice():
        return np.exp(np.ones((n, n)))[1:100, 1:100].sum()
    def random_mean():
        return np.random.default_rng(0).random((2 * n, 2 * n)).mean()
    def rechunk():  # NumPy has no blocks: the sum of the same kind of array
        return np.random.default_rng(0).random((2 * n, 2 * n)).sum()
    def matmul():
        a = np.ones((m, m)); return (a @ a).sum()
    def overlap():
        x = np.sin(np.arange(o)[:, None] * 0.37 + np.arange(o)[None, :] * 0.11)
        return (mean3x3(np.pad(x, 1, mode="symmetric"))[1:-1, 1:-1] * x).sum()
    def cholesky(c):
        return np.linalg.cholesky(np.ones((ch, ch)) + ch * np.eye(ch)).sum()
    def svd():
        x = np.sin(np.arange(tn)[:, None] * np.arange(1, 21)[None, :] * 0.00037)
        return np.linalg.svd(x, full_matrices=False)[1].sum()
    run = lambda f: f()
else:
    import dask, dask.array as da
    if engine == "dask-distributed":
        from distributed import Client, LocalCluster
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        run = lambda f: f().compute()
    else:
        run = lambda f: f().compute(scheduler="threads", num_workers=2)
    def xxt():
        x = da.ones((n, n), chunks=c); return (x + x.T - x.mean(axis=0)).sum()
    def exp_slice():
        return da.exp(da.ones((n, n), chunks=c // 10))[1:100, 1:100].sum()
    def random_mean():
        return da.random.random((2 * n, 2 * n), chunks=2 * c).mean()
    def rechunk():
        l, w = (4000, 20) if small else (20000, 100)
        return da.random.random((l, l), chunks=(l, w)).rechunk((w, l)).sum()
    def matmul():
        a = da.ones((m, m), chunks=k); return (a @ a).sum()
    def overlap():
        i = da.arange(o, chunks=oc)
        x = da.sin(i[:, None] * 0.37 + i[None, :] * 0.11)
        return (x.map_overlap(mean3x3, depth=1, boundary="reflect") * x).sum()
    def cholesky(c):
        a = da.ones((ch, ch), chunks=c) + ch * da.eye(ch, chunks=c)
        return da.linalg.cholesky(a, lower=True).sum()
    def svd():
        i = da.arange(tn, chunks=tc)
        x = da.sin(i[:, None] * da.arange(1, 21, chunks=20)[None, :] * 0.00037)
        return da.linalg.svd(x)[1].sum()
fs = {"xxt": xxt, "exp-slice": exp_slice, "random-mean": random_mean, "rechunk": rechunk,
      "matmul": matmul, "overlap": overlap, "svd": svd,
      "cholesky": lambda: cholesky(chunks_of["cholesky"]),
      "cholesky-250": lambda: cholesky(chunks_of["cholesky-250"])}
for name in names:
    t0 = time.perf_counter()
    v = float(run(fs[name]))
    print(json.dumps({"workload": name, "seconds": time.perf_counter() - t0, "answer": v}), flush=True)
'''


def ensure_venv():
    """Dask's array and distributed parts (NumPy among them) and SciPy (Dask's cholesky calls
    it)."""
    bench.ensure_venv("import numpy, scipy, dask.array, distributed",
                      ["dask[array,distributed]", "scipy"])


def python_engine(engine, small, names):
    return bench.python_engine(PY_SIDE, [engine, "1" if small else "0"], names)


def our_engine(scheduler, small, names):
    return bench.our_engine(OURS, ["--scheduler", scheduler] + (["--small"] if small else []),
                            names)


def agrees(name, got, want, small):
    if name == "random-mean":  # different generators: both must be near the true mean
        return abs(got - 0.5) < 1e-3
    if name == "rechunk":  # a sum of uniform numbers: near half their count
        count = (4000 if small else 20000) ** 2
        return abs(got / count - 0.5) < 1e-3
    return abs(got - want) <= 1e-6 * max(abs(want), 1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    a = ap.parse_args()
    rounds = a.rounds or (1 if a.small else 3)
    names = a.workloads.split(",")
    ensure_venv()
    bench.build_example("array_tour")
    engines = {
        "numpy": lambda: python_engine("numpy", a.small, names),
        "dask threaded": lambda: python_engine("dask-threads", a.small, names),
        "dask distributed": lambda: python_engine("dask-distributed", a.small, names),
        "ours threaded": lambda: our_engine("threaded", a.small, names),
        "ours cluster": lambda: our_engine("cluster", a.small, names),
    }
    med, answers = bench.rounds(engines, names, rounds)
    bad = bench.disagreements(answers, "numpy", lambda n, v, w: agrees(n, v, w, a.small))
    bench.table(names, engines, med, "numpy")
    if bad:
        sys.exit(f"answers disagree with NumPy's: {bad}")
    print("every answer agrees with NumPy's")
    npy_round_trip()


NPY_CHECK = r'''
import json, os, sys
import numpy as np
d, mode = sys.argv[1], sys.argv[2]
if mode == "check":
    info = json.load(open(os.path.join(d, "info.json")))
    parts = [np.load(os.path.join(d, f"{i}.npy")) for i in range(len(info["chunks"]))]
    x = np.concatenate(parts, axis=info["axis"])
    assert x.dtype == np.int64 and x.shape == (6, 10), (x.dtype, x.shape)
    assert (x == np.arange(60).reshape(6, 10)).all()
    assert [p.shape[0] for p in parts] == info["chunks"] == [2, 3, 1]
else:
    x = np.asfortranarray(np.arange(24, dtype=np.float32).reshape(4, 6))
    np.save(os.path.join(d, "0.npy"), x[:3])
    np.save(os.path.join(d, "1.npy"), np.asfortranarray(x[3:]))
    json.dump({"axis": 0, "chunks": [3, 1], "shape": [4, 6], "dtype": "<f4"},
              open(os.path.join(d, "info.json"), "w"))
'''


def npy_round_trip():
    """Our .npy stack read by NumPy, and NumPy's (C and Fortran order) read by us."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([OURS, "--npy-write", d], check=True, timeout=300)
        subprocess.run([VPY, "-c", NPY_CHECK, d, "check"], check=True, timeout=300)
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([VPY, "-c", NPY_CHECK, d, "write"], check=True, timeout=300)
        out = subprocess.run([OURS, "--npy-read", d], check=True, capture_output=True,
                             text=True, timeout=300).stdout
        row = json.loads(out.strip().splitlines()[-1])
        if row != {"shape": [4, 6], "sum": 276.0}:
            sys.exit(f"our reading of NumPy's .npy stack: {row}")
    print(".npy stacks: ours loads in NumPy, NumPy's read by ours")


if __name__ == "__main__":
    main()
