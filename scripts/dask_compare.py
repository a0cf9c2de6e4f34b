#!/usr/bin/env python3
"""dask-comm against Dask distributed on the same workloads, in the same run, interleaved.

    python3 scripts/dask_compare.py                       # the full comparison (about 25 min)
    python3 scripts/dask_compare.py --quick               # small workloads, 1 round (CI smoke)
    python3 scripts/dask_compare.py --million             # also a 1M-task merge (ours only)

Workloads (the same graphs on both sides; see dask-comm/src/bench.rs):
  merge-N   N independent `inc` tasks feeding one `sum`
  tree-E    a binary tree of `add` over 2^E `inc` leaves
  chain-N   N `inc` tasks, each needing the one before (latency-bound)
  roundtrip submit one task and wait for its result (median of 200; Dask: of 50)

Both sides: a local cluster of 2 worker processes x 1 thread, raw graphs (no fusion), one
untimed warm-up run of each workload, then `--rounds` timed rounds; a round runs Dask once,
then ours over tcp:// and ucx://, then ours with zero-work workers (they answer without
running anything: the runtime alone). Medians are reported, and every answer is checked: ours
against the closed form, Dask's against ours.

Dask runs from target/dask-venv (installed from PyPI on first use). A Dask workload of 50,000
tasks or more takes minutes per run on two cores; it runs `--big-rounds` times (default 1).
"""
import argparse, json, os, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner import built, cargo_build, skip_or_fail  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "dask-venv")
VPY = os.path.join(VENV, "bin", "python")
OURS = built("dask-comm")
FULL = "merge-10000,merge-100000,tree-12,tree-15,chain-10000,roundtrip"
QUICK = "merge-10000,tree-12,chain-1000,roundtrip"
BIG = 50_000


# ---- the Dask side (runs inside the venv, driven over stdin/stdout) ------------------------

def inc(x):
    return x + 1


def add(x, y):
    return x + y


def dask_workload(name, tag):
    """(graph, key, answer, tasks): the same graphs as dask-comm/src/bench.rs."""
    kind, n = name.split("-")
    n = int(n)
    if kind == "merge":
        x = f"x-{tag}"
        dsk = {(x, i): (inc, i) for i in range(n)}
        dsk[f"total-{tag}"] = (sum, [(x, i) for i in range(n)])
        return dsk, f"total-{tag}", n * (n + 1) // 2, n + 1
    if kind == "tree":
        t, leaves = f"t-{tag}", 1 << n
        dsk = {(t, 0, i): (inc, i) for i in range(leaves)}
        width, level = leaves, 0
        while width > 1:
            for i in range(width // 2):
                dsk[(t, level + 1, i)] = (add, (t, level, 2 * i), (t, level, 2 * i + 1))
            width //= 2
            level += 1
        return dsk, (t, level, 0), leaves * (leaves + 1) // 2, 2 * leaves - 1
    if kind == "chain":
        c = f"c-{tag}"
        dsk = {(c, 0): (inc, 0)}
        for i in range(1, n):
            dsk[(c, i)] = (inc, (c, i - 1))
        return dsk, (c, n - 1), n, n
    raise SystemExit(f"unknown workload {name!r}")


def dask_side():
    """Serves `{"workload": W, "tag": T}` lines with one JSON row each, on one LocalCluster."""
    import dask, distributed
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        print(json.dumps({"ready": True, "dask": dask.__version__,
                          "distributed": distributed.__version__}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            name = cmd["workload"]
            if name == "roundtrip":
                per = []
                for _ in range(cmd.get("repeat", 50)):
                    t0 = time.perf_counter()
                    v = client.submit(inc, 1, pure=False).result()
                    per.append(time.perf_counter() - t0)
                secs, tasks, answer, ok = statistics.median(per), 1, v, v == 2
            else:
                dsk, key, expect, tasks = dask_workload(name, cmd["tag"])
                t0 = time.perf_counter()
                answer = client.get(dsk, key)
                secs = time.perf_counter() - t0
                ok = answer == expect
            print(json.dumps({"workload": name, "tasks": tasks, "seconds": secs,
                              "answer": answer, "answer_ok": ok}), flush=True)


# ---- the driver ----------------------------------------------------------------------------

def ensure_venv():
    if os.path.exists(VPY) and subprocess.run([VPY, "-c", "import distributed"],
                                              capture_output=True).returncode == 0:
        return True
    print("installing dask[distributed] from PyPI into target/dask-venv", flush=True)
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    r = subprocess.run([VPY, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "dask[distributed]"], timeout=900)
    return r.returncode == 0


class Dask:
    def __init__(self):
        self.p = subprocess.Popen([VPY, os.path.abspath(__file__), "--dask-side"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  stderr=subprocess.DEVNULL)
        hello = json.loads(self.p.stdout.readline() or "{}")
        if not hello.get("ready"):
            raise SystemExit("Dask's LocalCluster did not start")
        self.version = hello["distributed"]

    def run(self, workload, tag):
        self.p.stdin.write(json.dumps({"workload": workload, "tag": tag}) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"Dask exited during {workload}")
        return json.loads(line)

    def close(self):
        self.p.stdin.close()
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()


def ours(workloads, protocol, zero_work=False, rounds=1, separate=False, timeout=1800):
    cmd = [OURS, "bench", "--json", "--workload", workloads, "--protocol", protocol,
           "--rounds", str(rounds)]
    if zero_work:
        cmd.append("--zero-work")
    if separate:
        cmd.append("--scheduler-process")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]


def tasks_of(name):
    kind, _, n = name.partition("-")
    n = int(n or 0)
    return {"merge": n + 1, "tree": 2 * (1 << n) - 1, "chain": n}.get(kind, 1)


def us(v):
    return "-" if v is None else f"{v:,.1f}" if v < 1000 else f"{v:,.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dask-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workloads", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-rounds", type=int, default=1,
                    help=f"Dask rounds for workloads of {BIG:,} tasks or more")
    ap.add_argument("--protocols", default="tcp,ucx")
    ap.add_argument("--quick", action="store_true", help="small workloads, one round")
    ap.add_argument("--no-dask", action="store_true", help="ours only")
    ap.add_argument("--million", action="store_true",
                    help="also merge-1000000, scheduler in a process of its own (peak RSS)")
    a = ap.parse_args()
    if a.dask_side:
        return dask_side()
    workloads = (a.workloads or (QUICK if a.quick else FULL)).split(",")
    rounds = 1 if a.quick else max(1, a.rounds)
    protocols = a.protocols.split(",")
    cargo_build("dask-comm", "--bin", "dask-comm")
    dask = None
    if not a.no_dask:
        if ensure_venv():
            dask = Dask()
        else:
            skip_or_fail("Dask: could not install dask[distributed] from PyPI")
    engines = ([("dask", None, False)] if dask else []) + \
        [("ours", p, False) for p in protocols] + [("ours", p, True) for p in protocols]
    label = {e: (f"Dask {dask.version}" if e[0] == "dask" else
                 f"ours {e[1]}{' zero-work' if e[2] else ''}") for e in engines}
    times = {(e, w): [] for e in engines for w in workloads}
    answers = {}
    print(f"2 workers x 1 thread each side; {rounds} round(s), interleaved; "
          f"time per task (us), medians", flush=True)
    if dask:
        t0 = time.time()
        for w in workloads:  # warm-up, like ours does inside each run
            row = dask.run(w, "warm")
            if not row["answer_ok"]:
                raise SystemExit(f"Dask's warm-up {w} answered {row['answer']}")
        print(f"  Dask warm-up done in {time.time() - t0:.0f} s", flush=True)
    for r in range(rounds):
        for e in engines:
            if e[0] == "dask":
                rows = []
                for w in workloads:
                    if tasks_of(w) >= BIG and r >= a.big_rounds:
                        continue
                    rows.append(dask.run(w, f"r{r}"))
            else:
                rows = ours(",".join(workloads), e[1], zero_work=e[2])
            for row in rows:
                w = row["workload"]
                if not row["answer_ok"]:
                    raise SystemExit(f"{label[e]} {w}: wrong answer {row.get('answer')}")
                secs = row["rounds"][0] if "rounds" in row else row["seconds"]
                times[(e, w)].append(secs / row["tasks"] * 1e6)
                if row.get("answer") is not None:
                    answers.setdefault(w, {})[label[e]] = row["answer"]
        print(f"  round {r + 1}/{rounds} done", flush=True)
    if dask:
        dask.close()
    for w, by in answers.items():
        if len(set(by.values())) != 1:
            raise SystemExit(f"{w}: the engines disagree: {by}")

    med = {k: statistics.median(v) if v else None for k, v in times.items()}
    head = ["workload", "tasks"] + [label[e] for e in engines]
    if dask:
        head += [f"x vs Dask ({e[1]})" for e in engines if e[0] == "ours" and not e[2]]
    rows = []
    for w in workloads:
        row = [w, f"{tasks_of(w):,}"] + [us(med[(e, w)]) for e in engines]
        if dask:
            d = med[(engines[0], w)]
            for e in engines:
                if e[0] == "ours" and not e[2]:
                    o = med[(e, w)]
                    row.append(f"{d / o:,.0f}x" if d and o else "-")
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda cells: "  ".join(str(c).rjust(n) for c, n in zip(cells, widths))
    print()
    print(fmt(head))
    for row in rows:
        print(fmt(row))
    print("(roundtrip: microseconds per submit + result; answers: every engine agreed)"
          if answers else "")

    if a.million:
        for p in protocols:
            row = ours("merge-1000000", p, separate=True, timeout=3600)[0]
            print(f"\nmerge-1000000 over {p}: {row['seconds']:.2f} s "
                  f"({row['per_task_us']:.1f} us/task), answer "
                  f"{'ok' if row['answer_ok'] else 'WRONG'}, scheduler peak RSS "
                  f"{row['scheduler_peak_rss_mib']:.0f} MiB (its own process)")


if __name__ == "__main__":
    sys.exit(main())
