#!/usr/bin/env python3
"""One comparison run: ucx_perftest beside everything that moves the same bytes.

Ping-pong, loopback, server on CPU 0 and client on CPU 1 for every implementation, one-way
median latency (half a round trip), rounds interleaved A B C A B C so that drift on a shared
machine hits all of them. Each result is printed with its ratio to ucx_perftest:

  ucx_perftest -t tag_lat       the reference (system UCX)
  ucx-rs                        `ucx-echo` (client-server endpoint, polling progress), and with
                                a direct (worker-address) endpoint as ucx_perftest uses
  transport ucx://, tcp://      `transport-echo` (one frame per message, polling for UCX)
  UCXX (Python)                 `python -m ucxx.benchmarks.send_recv`, its defaults (numpy,
                                thread progress), UCX from its wheel; when installed
  async-ucx                     the published crate through scripts/async-ucx-bench (it bundles
                                UCX 1.12.1); when built (--build-async-ucx)

With --msgrate it also streams 8 B messages (many in flight) through ucx-rs beside
`ucx_perftest -t tag_bw -s 8`, and reports messages per second.

  cargo build --release -p ucx-stack --bin ucx-echo && cargo build --release -p transport --bins
  python3 scripts/compare.py [--rounds 3] [--sizes 8,1m,64m] [--msgrate] [--json FILE]

Optional peers:
  UCXX:      bash tests/interop/run.sh   (creates target/ucxx-venv with ucxx-cu12 and numpy),
             or --ucxx-python PATH to a python that can `import ucxx`.
  async-ucx: python3 scripts/compare.py --build-async-ucx   (copies scripts/async-ucx-bench to
             ~/.cache/ucx-stack/async-ucx-bench, outside the repository, and builds it there:
             needs crates.io and a C toolchain, a few minutes).
"""
import argparse, glob, json, os, shutil, statistics, subprocess, sys, time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ECHO = os.path.join(ROOT, "target", "release", "ucx-echo")
TECHO = os.path.join(ROOT, "target", "release", "transport-echo")
SCRATCH = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ucx-stack",
                       "async-ucx-bench")
ASYNC_UCX = os.path.join(SCRATCH, "target", "debug", "async-ucx-bench")
UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
# Server and client on two different CPUs this process may use (the same one if only one).
_CPUS = sorted(os.sched_getaffinity(0))
SERVER_CPU, CLIENT_CPU = str(_CPUS[0]), str(_CPUS[min(1, len(_CPUS) - 1)])


def size_arg(text):
    t = text.strip().lower()
    return int(t[:-1]) * UNITS[t[-1]] if t[-1] in UNITS else int(t)


def iters_for(size):
    return 20000 if size <= 4096 else max(20, min(2000, (512 << 20) // size))


def pin(cpu, cmd):
    return ["taskset", "-c", cpu, *cmd]


def pair(server, client, env=None, timeout=600):
    """Starts `server`, reads its first line (it names the address), runs `client` with the
    address substituted for ADDR/PORT; returns the client's stdout."""
    srv = subprocess.Popen(server, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = srv.stdout.readline().split()
        if len(line) < 2:
            raise RuntimeError(f"{server[2]}: no address from the server")
        addr = line[1]
        port = addr.rsplit(":", 1)[-1]
        cmd = [c.replace("ADDR", addr).replace("PORT", port) for c in client]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"{cmd[2]} failed: {out.stderr.strip()[-500:]}")
        return out.stdout
    finally:
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def json_rows(text):
    return [json.loads(l) for l in text.splitlines() if l.startswith("{")]


_PORT = [15000]


def perftest(test, size, iters, env=None):
    """One ucx_perftest run (server CPU 0, client CPU 1, loopback); returns its "Final:" fields:
    iters, typical (p50) latency us, avg latency, overall latency, avg bw MiB/s, overall bw,
    avg msg rate, overall msg rate."""
    _PORT[0] += 1
    p = str(_PORT[0])
    srv = subprocess.Popen(["ucx_perftest", "-c", SERVER_CPU, "-p", p], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=env)
    try:
        time.sleep(0.5)
        out = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", p, "-c", CLIENT_CPU, "-t", test, "-s", str(size),
                              "-n", str(iters)], capture_output=True, text=True, timeout=600, env=env).stdout
    finally:
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
    final = [l for l in out.splitlines() if l.startswith("Final:")]
    if not final:
        raise RuntimeError(f"ucx_perftest -t {test} -s {size}: no result\n{out[-500:]}")
    return [float(x) for x in final[0].split()[1:]]


class Perftest:
    name = "ucx_perftest tag_lat"

    def latency(self, size):
        return perftest("tag_lat", size, iters_for(size))[1]

    def msgrate(self, messages):
        return perftest("tag_bw", 8, messages)[6]


class UcxRs:
    def __init__(self, direct=False):
        self.direct = ["--direct"] if direct else []
        self.name = "ucx-rs direct endpoint" if direct else "ucx-rs (ucx-echo)"

    def latency(self, size):
        out = pair([ECHO, "server", "--bind", "127.0.0.1", "--cpu", SERVER_CPU, "--mode", "polling", "--once"],
                   [ECHO, "client", "--connect", "127.0.0.1:PORT", "--cpu", CLIENT_CPU, "--mode", "polling",
                    "--sizes", str(size), "--iters", str(iters_for(size)), "--json", *self.direct])
        return json_rows(out)[0]["median_us"]

    def msgrate(self, messages, window=64):
        out = pair([ECHO, "server", "--bind", "127.0.0.1", "--cpu", SERVER_CPU, "--mode", "polling", "--once"],
                   [ECHO, "client", "--connect", "127.0.0.1:PORT", "--cpu", CLIENT_CPU, "--mode", "polling",
                    "--sizes", "8", "--iters", str(messages), "--bw", "--window", str(window), "--json",
                    *self.direct])
        return json_rows(out)[0]["stream_MBps"] * 1e6 / 8


class Transport:
    def __init__(self, scheme):
        self.scheme = scheme
        self.name = f"transport {scheme}://"

    def latency(self, size):
        flags = ["--ucx-progress", "polling"] if self.scheme == "ucx" else []
        out = pair(pin(SERVER_CPU, [TECHO, "server", "--listen", f"{self.scheme}://127.0.0.1:0", "--once", *flags]),
                   pin(CLIENT_CPU, [TECHO, "client", "--connect", "ADDR", "--sizes", str(size), "--iters",
                           str(iters_for(size)), *flags]))
        return json_rows(out)[0]["median_us"]


class Ucxx:
    name = "UCXX (Python send_recv)"

    def __init__(self, python):
        self.python = python

    def latency(self, size):
        # Its server sometimes misses the client's first connection attempt: one more try.
        try:
            return self.once(size)
        except RuntimeError:
            return self.once(size)

    def once(self, size):
        n = str(min(iters_for(size), 2000))
        common = ["-m", "ucxx.benchmarks.send_recv", "-n", str(size), "--n-iter", n, "--n-warmup-iter", "100"]
        _PORT[0] += 1
        p = str(_PORT[0])
        srv = subprocess.Popen([self.python, *common, "--server-only", "-p", p, "-b", SERVER_CPU],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(2)
            run = subprocess.run([self.python, *common, "--client-only", "-s", "127.0.0.1", "-p", p, "-c", CLIENT_CPU,
                                  "--no-detailed-report"], capture_output=True, text=True, timeout=600)
            out = run.stdout + run.stderr
        finally:
            try:
                srv.wait(timeout=30)
            except subprocess.TimeoutExpired:
                srv.kill()
        for line in out.splitlines():
            if line.startswith("Latency (median)"):
                return float(line.split("|")[1].split()[0]) / 1000.0
        raise RuntimeError(f"UCXX: no result\n{out[-500:]}")


class AsyncUcx:
    name = "async-ucx 0.1.1"

    def __init__(self, binary):
        self.binary = binary
        libs = glob.glob(os.path.join(SCRATCH, "target", "debug", "build", "ucx1-sys-*", "out", "lib"))
        # The crate links the UCX it bundles; without this the system's (another ABI) loads.
        self.env = dict(os.environ, LD_LIBRARY_PATH=":".join(libs))

    def latency(self, size):
        out = pair(pin(SERVER_CPU, [self.binary, "server"]),
                   pin(CLIENT_CPU, [self.binary, "client", "127.0.0.1:PORT", str(size), str(min(iters_for(size), 5000))]),
                   env=self.env)
        return json_rows(out)[0]["median_us"]


def build_async_ucx():
    os.makedirs(SCRATCH, exist_ok=True)
    src = os.path.join(ROOT, "scripts", "async-ucx-bench")
    shutil.copy(os.path.join(src, "Cargo.toml"), SCRATCH)
    shutil.copytree(os.path.join(src, "src"), os.path.join(SCRATCH, "src"), dirs_exist_ok=True)
    print(f"building async-ucx-bench in {SCRATCH} ...", flush=True)
    subprocess.run(["cargo", "build", "-j2"], cwd=SCRATCH, check=True)


def fmt(size, us):
    if size < (64 << 10):
        return f"{us:10.2f} us"
    return f"{size / (us * 1e-6) / 1e9:7.2f} GB/s"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="8,1m,64m")
    ap.add_argument("--msgrate", action="store_true", help="also the 8 B message rate")
    ap.add_argument("--ucxx-python", default=os.path.join(ROOT, "target", "ucxx-venv", "bin", "python"))
    ap.add_argument("--build-async-ucx", action="store_true")
    ap.add_argument("--json", help="append the raw results as JSON lines to this file")
    a = ap.parse_args()
    sizes = [size_arg(s) for s in a.sizes.split(",")]
    for tool in (ECHO, TECHO):
        if not os.path.exists(tool):
            sys.exit(f"{tool} is missing: cargo build --release -p ucx-stack --bin ucx-echo && "
                     "cargo build --release -p transport --bins")
    if a.build_async_ucx:
        build_async_ucx()
    impls = [Perftest(), UcxRs(), UcxRs(direct=True), Transport("ucx"), Transport("tcp")]
    skipped = []
    if os.path.exists(a.ucxx_python) and subprocess.run([a.ucxx_python, "-c", "import ucxx"],
                                                        capture_output=True).returncode == 0:
        impls.append(Ucxx(a.ucxx_python))
    else:
        skipped.append(f"UCXX: no python with ucxx at {a.ucxx_python} (bash tests/interop/run.sh makes one)")
    if os.path.exists(ASYNC_UCX):
        impls.append(AsyncUcx(ASYNC_UCX))
    else:
        skipped.append("async-ucx: not built (--build-async-ucx)")
    ucx = subprocess.run(["ucx_info", "-v"], capture_output=True, text=True).stdout.splitlines()[0].strip("# ")
    print(f"{ucx}; {a.rounds} interleaved rounds; one-way medians; server CPU {SERVER_CPU}, "
          f"client CPU {CLIENT_CPU}")
    for s in skipped:
        print(f"  skipped {s}")
    res = {i.name: {s: [] for s in sizes} for i in impls}
    errors = {}
    for r in range(a.rounds):
        for s in sizes:
            for i in impls:
                if i.name in errors:
                    continue
                try:
                    res[i.name][s].append(i.latency(s))
                except Exception as e:  # one peer failing must not hide the others
                    errors[i.name] = str(e).strip().splitlines()[-1][:300]
        print(f"round {r + 1}/{a.rounds} done", flush=True)
    med = statistics.median
    base = {s: med(res[Perftest.name][s]) for s in sizes}
    head = "".join(f"{(str(s >> 20) + ' MiB') if s >= 1 << 20 else (str(s) + ' B'):>26}" for s in sizes)
    print(f"\n{'':26}{head}")
    for i in impls:
        line = f"{i.name:26}"
        for s in sizes:
            v = res[i.name][s]
            if not v:
                line += f"{'-':>26}"
                continue
            m = med(v)
            ratio = m / base[s] if s < (64 << 10) else base[s] / m
            line += f"{fmt(s, m):>16} {ratio:6.2f}x  "
        print(line)
        if i.name in errors:
            print(f"{'':26}failed: {errors[i.name]}")
    print("ratios: latency over ucx_perftest's for small sizes (lower is better), bandwidth over "
          "ucx_perftest's from 64 KiB (higher is better)")
    rates = {}
    if a.msgrate:
        n = 1_000_000
        rates = {"ucx_perftest tag_bw -s 8": [], "ucx-rs (ucx-echo --bw)": [], "ucx-rs direct endpoint": []}
        for _ in range(a.rounds):
            rates["ucx_perftest tag_bw -s 8"].append(Perftest().msgrate(n))
            rates["ucx-rs (ucx-echo --bw)"].append(UcxRs().msgrate(n // 4))
            rates["ucx-rs direct endpoint"].append(UcxRs(direct=True).msgrate(n // 4))
        b = med(rates["ucx_perftest tag_bw -s 8"])
        print(f"\n8 B message rate, window 64, {a.rounds} interleaved rounds")
        for k, v in rates.items():
            print(f"{k:26}{med(v) / 1e6:10.2f} M msg/s {med(v) / b:6.2f}x")
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps({"ucx": ucx, "rounds": a.rounds, "latency_us": res, "msgrate": rates,
                                "errors": errors}) + "\n")
    core = {Perftest.name, UcxRs().name, UcxRs(direct=True).name, "transport ucx://", "transport tcp://"}
    if core & errors.keys():
        sys.exit(f"failed: {', '.join(sorted(core & errors.keys()))}")


if __name__ == "__main__":
    main()
