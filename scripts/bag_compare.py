#!/usr/bin/env python3
"""dask-collections' bag against Dask's bag and plain Python on the same files, in the same
run, interleaved, with every answer checked against plain Python's.

    python3 scripts/bag_compare.py               # full sizes, 3 rounds
    python3 scripts/bag_compare.py --small       # small sizes, 1 round (CI smoke)

Workloads (issue 18's bag workloads):
  word-count  ~100 MB of text in 20 files (Zipf-distributed words from a 50,000-word
              vocabulary): read_text().str.split().flatten().frequencies().topk(10, key=1);
              Python: collections.Counter over every file's split lines, most_common(10)
  json-lines  1,000,000 JSON records in 20 files: read_text().map(json.loads)
              .filter(x > 0.5).pluck("y").sum(); Python: a loop over the lines
  rsds-bag    RSDS's bench_bag: 10,000 people in 50 partitions, filter(age > 30), product with
              itself (2,500 partitions), filter(first older than second), pluck(1),
              map(len(name)), sum; Python: the same loops over one list
  groupby     the JSON records grouped by y (100 keys) on a shuffle, each group's size:
              read_text().map(json.loads).groupby(y).map((key, len)); ours on the
              peer-to-peer shuffle, Dask's default (disk/partd locally, tasks on
              distributed); Python: a dict of lists

Engines, on this machine's 2 cores: Python (one process), Dask threaded (2 threads), Dask's
bag default (multiprocessing, 2 processes), Dask distributed (LocalCluster, 2 worker
processes x 1 thread), ours on `Threaded` (2 threads) and ours on a LocalCluster (2 worker
processes x 1 thread, tcp://). Each engine runs each workload in a fresh process; cluster
start-up and reading people.jsonl into memory are not timed (Dask's `make_people` makes the
records in memory). Medians of the rounds. The files are written once under
target/bag-data (kept; delete it to rewrite). Dask runs from target/dask-venv.
"""
import argparse, json, os, random, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collections_bench as bench  # noqa: E402
from collections_bench import ROOT  # noqa: E402

OURS = bench.example("bag_tour")
WORKLOADS = ["word-count", "json-lines", "rsds-bag", "groupby"]


def write_data(d, small):
    """The files of every workload in `d`, deterministic (seeded)."""
    done = os.path.join(d, "done")
    if os.path.exists(done):
        return
    os.makedirs(d, exist_ok=True)
    rng = random.Random(18)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = sorted({"".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(60000)})
    rng.shuffle(vocab)
    vocab = vocab[:50000]
    cum, total = [], 0.0
    for r in range(len(vocab)):
        total += 1.0 / (r + 1)
        cum.append(total)
    files, target = 20, (5 if small else 100) * 1_000_000 // 20
    for f in range(files):
        size, lines = 0, []
        while size < target:
            line = " ".join(rng.choices(vocab, cum_weights=cum, k=rng.randint(5, 15)))
            lines.append(line)
            size += len(line) + 1
        with open(os.path.join(d, f"words-{f:02}.txt"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
    records = 50_000 if small else 1_000_000
    for f in range(files):
        with open(os.path.join(d, f"records-{f:02}.jsonl"), "w") as fh:
            for i in range(records // files):
                fh.write(json.dumps({"x": rng.random(), "y": rng.randint(0, 1000),
                                     "name": f"r{f}-{i}"}) + "\n")
    firsts = ["Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "John",
              "Margaret", "Ken", "Radia", "Niklaus"]
    lasts = ["Lovelace", "Turing", "Hopper", "Dijkstra", "Liskov", "Knuth", "Allen",
             "Backus", "Hamilton", "Thompson", "Perlman", "Wirth"]
    jobs = ["Engineer", "Nurse", "Teacher", "Pilot", "Chemist", "Baker", "Farmer", "Judge"]
    with open(os.path.join(d, "people.jsonl"), "w") as fh:
        for i in range(2_000 if small else 10_000):
            fh.write(json.dumps({
                "age": rng.randint(16, 66),
                "name": [rng.choice(firsts), rng.choice(lasts)],
                "occupation": rng.choice(jobs),
                "telephone": f"+1-{rng.randint(200, 999)}-{rng.randint(1000000, 9999999)}",
                "address": {"address": f"{rng.randint(1, 999)} Main St", "city": "Springfield"},
            }) + "\n")
    open(done, "w").close()


# Runs inside the venv: argv = engine, data dir, workloads...; one JSON line per workload.
PY_SIDE = r'''
import glob, json, os, sys, time
engine, d, names = sys.argv[1], sys.argv[2], sys.argv[3:]
words = sorted(glob.glob(os.path.join(d, "words-*.txt")))
records = sorted(glob.glob(os.path.join(d, "records-*.jsonl")))
with open(os.path.join(d, "people.jsonl")) as fh:
    people = [json.loads(l) for l in fh if l.strip()]
if engine == "python":
    from collections import Counter
    def word_count():
        c = Counter()
        for f in words:
            with open(f) as fh:
                for line in fh:
                    c.update(line.split())
        return [[w, n] for w, n in c.most_common(10)]
    def json_lines():
        s = 0
        for f in records:
            with open(f) as fh:
                for line in fh:
                    r = json.loads(line)
                    if r["x"] > 0.5:
                        s += r["y"]
        return s
    def rsds_bag():
        p1 = [r for r in people if r["age"] > 30]
        return sum(len(b["name"]) for a in p1 for b in p1 if a["age"] > b["age"])
    def groupby():
        g = {}
        for f in records:
            with open(f) as fh:
                for line in fh:
                    r = json.loads(line)
                    g.setdefault(r["y"], []).append(r)
        return sorted([k, len(v)] for k, v in g.items())
    run = lambda f: f()
else:
    import dask, dask.bag as db
    if engine == "dask-distributed":
        from distributed import Client, LocalCluster
        client = Client(LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=None))
        run = lambda f: f()
    else:
        dask.config.set(scheduler={"dask-threads": "threads",
                                   "dask-processes": "processes"}[engine], num_workers=2)
        run = lambda f: f()
    def word_count():
        b = db.read_text(words).str.split().flatten().frequencies().topk(10, key=1)
        return [list(p) for p in b.compute()]
    def json_lines():
        return db.read_text(records).map(json.loads).filter(lambda r: r["x"] > 0.5) \
            .pluck("y").sum().compute()
    def rsds_bag():
        b = db.from_sequence(people, npartitions=50)
        p1 = b.filter(lambda r: r["age"] > 30)
        p2 = p1.product(p1)
        p3 = p2.filter(lambda x: x[0]["age"] > x[1]["age"]).pluck(1).map(lambda r: len(r["name"]))
        return p3.sum().compute()
    def groupby():
        b = db.read_text(records).map(json.loads).groupby(lambda r: r["y"]) \
            .map(lambda g: [g[0], len(g[1])])
        return sorted(b.compute())
fs = {"word-count": word_count, "json-lines": json_lines, "rsds-bag": rsds_bag,
      "groupby": groupby}
for name in names:
    t0 = time.perf_counter()
    v = run(fs[name])
    print(json.dumps({"workload": name, "seconds": time.perf_counter() - t0, "answer": v}),
          flush=True)
'''


def python_engine(engine, d, names):
    return bench.python_engine(PY_SIDE, [engine, d], names)


def our_engine(scheduler, d, names):
    return bench.our_engine(OURS, ["--data", d, "--scheduler", scheduler], names)


def agrees(got, want):
    if isinstance(want, list):  # word counts: the same pairs (ties may come in any order)
        return sorted(map(tuple, got)) == sorted(map(tuple, want)) or \
            sorted(p[1] for p in got) == sorted(p[1] for p in want)
    return got == want


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    a = ap.parse_args()
    rounds = a.rounds or (1 if a.small else 3)
    names = a.workloads.split(",")
    bench.ensure_venv("import dask.bag, distributed", ["dask[distributed]"])
    d = os.path.join(ROOT, "target", "bag-data-small" if a.small else "bag-data")
    write_data(d, a.small)
    bench.build_example("bag_tour")
    engines = {
        "python": lambda: python_engine("python", d, names),
        "dask threaded": lambda: python_engine("dask-threads", d, names),
        "dask processes": lambda: python_engine("dask-processes", d, names),
        "dask distributed": lambda: python_engine("dask-distributed", d, names),
        "ours threaded": lambda: our_engine("threaded", d, names),
        "ours cluster": lambda: our_engine("cluster", d, names),
    }
    med, answers = bench.rounds(engines, names, rounds)
    bad = bench.disagreements(answers, "python", lambda n, v, w: agrees(v, w))
    bench.table(names, engines, med, "python")
    if bad:
        sys.exit(f"answers disagree with plain Python's: {bad}")
    print("every answer agrees with plain Python's")


if __name__ == "__main__":
    main()
