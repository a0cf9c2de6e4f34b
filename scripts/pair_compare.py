#!/usr/bin/env python3
"""The peer-to-peer shuffle's per-worker-pair table, as dask-cuda's merge benchmark prints it
(`(w1,w2) | 25% 50% 75% (total nbytes)`), for our tcp://, our ucx:// with its same-host rings
(the default) and ucx:// on UCX's lanes alone (DASK_COMM_UCX_RING=0), beside
`ucx_perftest -t tag_bw` at the deliveries' mean size, all in one run, on an idle host and on
a loaded one.

    python3 scripts/pair_compare.py [--rounds 5] [--size 8m] [--load N]

The shuffle is `dask-comm`'s `shuffle` example: two worker processes x 1 thread, 8 inputs x
8 outputs of --size bytes, both directions at once, every byte checked. "loaded" runs N
busy-looping processes beside it (default: one per core), as a node whose cores run tasks:
the workers, their progress and ucx_perftest all share the cores with them. Rates are per
delivery: its bytes over the time from its first byte to the receiver's acknowledgement
(the workers' transfer logs). Each cell is the median over rounds of that round's
quartile; rows run interleaved round by round. Each run is a fresh cluster that shuffles
twice, and the second shuffle is the one counted: a running cluster's connections, whose
shared-memory rings are already mapped (the first large frames through a ring allocate its
pages: about 5 ms per 8 MiB here); `--cold` counts the first instead. With `--merge DATA` (target/frame-data,
written by scripts/frame_compare.py) the merge of frame_compare (workers busy with their own
tasks) runs too, per protocol, with its wall clock.
"""
import argparse, json, os, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner import built, cargo_build, perftest, size_arg  # noqa: E402

ROWS = [
    ("tcp://", "tcp", {}),
    ("ucx:// (rings)", "ucx", {}),
    ("ucx:// (UCX lanes)", "ucx", {"DASK_COMM_UCX_RING": "0"}),
]


def burners(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs):
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def run_json(cmd, env):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                         env={**os.environ, **env})
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]


def pairs_of(rows):
    """{(w1, w2): [pair dicts]} and the wall clock of each row; each row is one cluster's,
    its workers numbered in the order of their addresses."""
    out = {}
    for r in rows:
        names = sorted({p[k] for p in r["pairs"] for k in ("from", "to")})
        for p in r["pairs"]:
            out.setdefault((names.index(p["from"]), names.index(p["to"])), []).append(p)
    return out, [r["seconds"] for r in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", default="8m", help="bytes per shuffle piece")
    ap.add_argument("--load", type=int, default=os.cpu_count() or 2,
                    help="busy processes for the loaded runs")
    ap.add_argument("--merge", help="frame_compare's data folder: run its merge too")
    ap.add_argument("--cold", action="store_true", help="count each cluster's first shuffle")
    a = ap.parse_args()
    keep = 0 if a.cold else 1
    size = size_arg(a.size)
    cargo_build("dask-comm", "--example", "shuffle")
    shuffle = built("examples", "shuffle")
    tour = built("examples", "dataframe_tour")
    if a.merge:
        cargo_build("dask-collections", "--example", "dataframe_tour")
    conditions = ["idle", f"loaded ({a.load} busy)"]
    got = {}  # (condition, row) -> [json rows]
    merge = {}  # row -> [json rows]
    for r in range(a.rounds):
        for c, cond in enumerate(conditions):
            load = burners(a.load) if c else []
            try:
                for name, proto, env in ROWS:
                    got.setdefault((cond, name), []).append(run_json(
                        [shuffle, "--protocol", proto, "--size", str(size), "--rounds", "2"],
                        env)[keep])
            finally:
                stop(load)
        if a.merge:
            for name, proto, env in ROWS:
                merge.setdefault(name, []).append(run_json(
                    [tour, "--bench", "merge", "--data", a.merge, "--scheduler", "cluster",
                     "--protocol", proto, "--rounds", "2"], env)[keep])
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)

    def table(title, results, ref):
        print(f"\n{title}")
        print(f"{'':34} {'(w1,w2)':>8} | {'25%':>9} {'50%':>9} {'75%':>9} {'(total)':>10}  "
              f"{'50% / ref':>9}  {'wall s':>7}")
        for label, rows in results:
            by_pair, walls = pairs_of(rows)
            for pair, ps in sorted(by_pair.items()):
                q = [statistics.median(p["mb_s"][i] for p in ps) for i in range(3)]
                total = statistics.median(p["bytes"] for p in ps)
                print(f"{label:34} {str(pair):>8} | {q[0]:9.0f} {q[1]:9.0f} {q[2]:9.0f} "
                      f"{total / 1e6:8.0f}MB  {q[1] / ref:9.2f}  {statistics.median(walls):7.3f}")

    for c, cond in enumerate(conditions):
        rows = [r for name, _, _ in ROWS for r in got[(cond, name)]]
        deliveries = sum(p["deliveries"] for r in rows for p in r["pairs"])
        mean = int(sum(p["bytes"] for r in rows for p in r["pairs"]) / max(deliveries, 1))
        load = burners(a.load) if c else []
        try:
            time.sleep(0.2)
            refs = [perftest("tag_bw", mean, 50)["bw_MiBps"] * 1.048576 for _ in range(3)]
        finally:
            stop(load)
        ref = statistics.median(refs)
        table(f"{cond}: the shuffle example, {size / 2**20:.0f} MiB pieces, deliveries of "
              f"{mean / 1e6:.1f} MB on average; MB/s; ucx_perftest -t tag_bw at that size "
              f"{ref:.0f} MB/s (the ref, median of 3 runs{', loaded alike' if c else ''})",
              [(name, got[(cond, name)]) for name, _, _ in ROWS], ref)
    if a.merge:
        rows = [r for v in merge.values() for r in v]
        deliveries = sum(p["deliveries"] for r in rows for p in r["pairs"])
        mean = int(sum(p["bytes"] for r in rows for p in r["pairs"]) / max(deliveries, 1))
        ref = statistics.median(perftest("tag_bw", mean, 50)["bw_MiBps"] * 1.048576
                                for _ in range(3))
        load = burners(a.load)
        try:
            time.sleep(0.2)
            loaded = statistics.median(perftest("tag_bw", mean, 50)["bw_MiBps"] * 1.048576
                                       for _ in range(3))
        finally:
            stop(load)
        table(f"the merge (frame_compare's: the workers busy with its tasks), deliveries of "
              f"{mean / 1e6:.1f} MB on average; ucx_perftest -t tag_bw at that size {ref:.0f} "
              f"MB/s idle (the ref), {loaded:.0f} MB/s loaded ({a.load} busy)",
              list(merge.items()), ref)


if __name__ == "__main__":
    main()
