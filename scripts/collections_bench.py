"""What the collection comparisons (array_compare.py, bag_compare.py, frame_compare.py) share:
the Dask virtual environment, running one engine's workloads (each in a fresh process), the
interleaved rounds, and the table of medians."""
import json, os, statistics, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner import built, cargo_build  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VPY = os.path.join(ROOT, "target", "dask-venv", "bin", "python")


def example(name):
    """The path of a dask-collections example, as STACK_PROFILE builds it (release by default)."""
    return built("examples", name)


def ensure_venv(probe, packages):
    """target/dask-venv, with `packages` installed from PyPI unless `probe` already imports."""
    if os.path.exists(VPY) and subprocess.run([VPY, "-c", probe],
                                              capture_output=True).returncode == 0:
        return
    print(f"installing {' '.join(packages)} from PyPI into target/dask-venv", flush=True)
    if not os.path.exists(VPY):
        subprocess.run([sys.executable, "-m", "venv", os.path.dirname(os.path.dirname(VPY))],
                       check=True)
    subprocess.run([VPY, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *packages], check=True, timeout=900)


def build_example(name):
    cargo_build("dask-collections", "--example", name)


def python_engine(side, args, names):
    """`side` run in the venv once per workload (`args`, then the workload's name): none
    inherits another's warmed-up heap. Its JSON lines."""
    rows = []
    for name in names:
        r = subprocess.run([VPY, "-c", side, *args, name],
                           capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            sys.exit(f"{args[0]} failed:\n{r.stderr[-3000:]}")
        rows += [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    return rows


def our_engine(binary, args, names):
    """Our example with `--bench NAME` and `args`, once per workload. Its JSON lines."""
    rows = []
    for name in names:
        out = subprocess.run([binary, "--bench", name, *args], check=True,
                             capture_output=True, text=True, timeout=3600).stdout
        rows += [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return rows


def rounds(engines, names, count, extras=None):
    """Every engine's workloads, engines interleaved, `count` times: the median seconds per
    (engine, workload) and each engine's last answer per workload. With `extras` (a dict),
    the medians of the rows' other numeric fields go there, by (engine, workload, field)."""
    times = {(e, n): [] for e in engines for n in names}
    fields = {}
    answers = {}
    for r in range(count):
        for e, run in engines.items():
            for row in run():
                times[(e, row["workload"])].append(row["seconds"])
                answers.setdefault(row["workload"], {})[e] = row["answer"]
                for f, v in row.items():
                    if f not in ("seconds", "answer") and isinstance(v, (int, float)):
                        fields.setdefault((e, row["workload"], f), []).append(v)
        print(f"round {r + 1} of {count} done", file=sys.stderr)
    if extras is not None:
        extras.update({k: statistics.median(v) for k, v in fields.items()})
    return {k: statistics.median(v) for k, v in times.items() if v}, answers


def table(names, engines, med, reference):
    """The medians, and Dask's best engine and `reference` over our best."""
    width = max(len(n) for n in names + ["workload"]) + 1
    print(f"{'workload':<{width}} " + " ".join(f"{e:>16}" for e in engines)
          + f" {'dask best/ours':>15} {reference + '/ours':>12}")
    for n in names:
        ours = min(med[(e, n)] for e in engines if e.startswith("ours") and (e, n) in med)
        dask = min(med[(e, n)] for e in engines if e.startswith("dask") and (e, n) in med)
        cells = [f"{med[(e, n)]:>15.3f}s" if (e, n) in med else f"{'-':>16}" for e in engines]
        print(f"{n:<{width}} " + " ".join(cells)
              + f" {dask / ours:>14.2f}x {med[(reference, n)] / ours:>11.2f}x")


def disagreements(answers, reference, agrees):
    """(workload, engine, answer) for every answer that `agrees` does not accept."""
    return [(n, e, v) for n, by in answers.items() for e, v in by.items()
            if not agrees(n, v, by[reference])]
