#!/usr/bin/env python3
"""The comparison tool: ucx_perftest beside everything that moves the same bytes, in one run.

Ping-pong over loopback, server and client pinned to two CPUs, one-way median latency (half a
round trip), rounds interleaved A B C A B C so that drift on a shared machine hits all of
them. Each result is printed with its ratio to ucx_perftest measured in the same run, and
a paired ratio "p": the reference also runs after every row, and each run is
set against the mean of the reference runs either side of it, since this VM moves between
a fast and a slow state for seconds at a time (`--no-bracket`: the reference once per round):

  ucx_perftest -t tag_lat -e    the reference (system UCX) with peer error handling, as every
                                ucx-rs endpoint has it, and ucx-rs's default options
                                (UCX_RS_DEFAULTS): UCX 1.13 then uses the same lanes and
                                rendezvous scheme for both (on one host sysv alone; without -e it
                                adds CMA, which moves 1 MiB+ at about half the speed on this VM:
                                docs/performance.md); plain ucx_perftest on the row below
  ucx-rs                        `ucx-echo`: client-server endpoint, and a direct (worker-address)
                                endpoint as ucx_perftest uses, per progress mode (--modes); every
                                round's payload is stamped afresh and checked
  transport ucx://, tcp://      `transport-echo` (one frame per message); ucx:// on its
                                client-server endpoint and with Options::ucx_direct ("direct")
                                tcp:// spins 50 µs before parking a receive (Options::tcp_spin,
                                while replies come within it); "no spin" parks at once
  tokio TCP ping-pong           `transport-echo --raw-tcp`: plain tokio sockets, no framing (the
                                floor of what tokio's TCP does here)
  UCXX (Python)                 `python -m ucxx.benchmarks.send_recv`, its defaults (numpy,
                                thread progress), UCX from its wheel; when installed
  async-ucx                     the published crate through scripts/async-ucx-bench (it bundles
                                UCX 1.12.1); when built (--build-async-ucx)

Options that add or change tables:
  --tls default,tcp     repeat everything under each UCX_TLS (default: UCX's own choice)
  --modes polling,blocking,thread
                        ucx-rs and transport ucx:// in each progress mode (default: polling)
  --ops stream,am,put,get
                        the other UCP operations beside ucx_perftest's stream_lat, ucp_am_lat,
                        ucp_put_lat and ucp_get (ours: put = put + flush, get = one blocking get,
                        both full round trips; perftest's put_lat needs none and ucp_get streams)
  --stream              streamed sends (64 in flight, or --window's; acknowledged at the end) beside
                        ucx_perftest -t tag_bw -e (the reference, configured as above) and
                        plain tag_bw: bandwidth, and messages per second below 64 KiB;
                        for ucx-rs and transport ucx://, tcp:// also in batches of 64
                        ("batched": send_batch, two batches in flight; ucx-rs's receiver posts
                        recv_batch of 64 too; transport's receiver takes them one by one)
  --msgrate             --stream at 8 B only (message rate)
  --window W            W sends in flight in --stream (batches of W), and ucx_perftest -O W
                        (without it: 64 for ours, ucx_perftest's own default for the reference)
  --ab OLD NEW          A/B of two ucx-echo builds instead (latency, client-server and direct;
                        with --msgrate the message rate too)
  --ab-transport OLD NEW
                        A/B of two transport-echo builds instead (ucx://, client-server and
                        direct, beside ucx_perftest -e; with --msgrate, --stream their streams)
  --interop             UCXX's own send_recv client against a UCXX listener and against ours
                        (ucxx-peer bench-server, built against the wheel's UCX)

  cargo build --release -p ucx-stack --bin ucx-echo && cargo build --release -p ucxrs-transport --bins
  python3 scripts/compare.py [--rounds 3] [--sizes 8,1m,64m] [options above] [--json FILE]

Optional peers:
  UCXX:      bash tests/interop/run.sh   (creates target/ucxx-venv with ucxx-cu12 and numpy),
             or --ucxx-python PATH to a python that can `import ucxx`.
  async-ucx: python3 scripts/compare.py --build-async-ucx   (copies scripts/async-ucx-bench to
             ~/.cache/ucx-stack/async-ucx-bench, outside the repository, and builds it there:
             needs crates.io and a C toolchain, a few minutes).
"""
import argparse, glob, json, os, shutil, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner import (CLIENT_CPU, SERVER_CPU, bracketed_rounds, json_rows, next_port, pair, perftest, pin,  # noqa: E402
                    size_arg, size_name, start_server, stop, built, PROFILE)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ECHO = built("ucx-echo")
TECHO = built("transport-echo")
SCRATCH = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ucx-stack",
                       "async-ucx-bench")
ASYNC_UCX = os.path.join(SCRATCH, "target", "debug", "async-ucx-bench")
# Sends in flight in streams (--window); None: 64 for ours and ucx_perftest's own default.
WINDOW = None
SMALL = 64 << 10  # below: report latency (lower is better); from here: bandwidth (higher is better)
PERFTEST_OPS = {"tag": "tag_lat", "stream": "stream_lat", "am": "ucp_am_lat", "put": "ucp_put_lat", "get": "ucp_get"}


# ucx::DEFAULT_OPTIONS: what every ucx-rs context sets unless told otherwise, so the reference
# runs with them too (same lanes, same rendezvous).
UCX_RS_DEFAULTS = {"UCX_MM_ERROR_HANDLING": "y", "UCX_TCP_PUT_ENABLE": "n"}


def iters_for(size):
    return 20000 if size <= 4096 else max(20, min(2000, (512 << 20) // size))


class Perftest:
    """ucx_perftest. With `peer_errors`, endpoints with peer error handling (`-e`), shared
    memory kept for them and no TCP put (`UCX_RS_DEFAULTS`): the configuration ucx-rs always uses,
    under which UCX 1.13 picks other protocols (faster at 1 MiB, slower at 8 B)."""

    def __init__(self, op="tag", peer_errors=False, tls=None):
        self.test = PERFTEST_OPS[op]
        self.peer_errors = peer_errors
        self.tls = tls
        self.name = f"ucx_perftest {self.test}" + (" -e" if peer_errors else "") + (
            f" UCX_TLS={tls}" if tls else "")

    def latency(self, size, env):
        if self.tls:
            env = dict(env or os.environ, UCX_TLS=self.tls)
        if self.peer_errors:
            env = dict(env or os.environ)
            for key, value in UCX_RS_DEFAULTS.items():
                env.setdefault(key, value)
            return perftest(self.test, size, iters_for(size), env, ("-e",))["lat_us"]
        return perftest(self.test, size, iters_for(size), env)["lat_us"]

    def stream(self, size, messages, env):
        """(MB/s, messages/s) of ucx_perftest -t tag_bw (with `peer_errors`, as in `latency`)."""
        if self.tls:
            env = dict(env or os.environ, UCX_TLS=self.tls)
        extra = ()
        if self.peer_errors:
            env = dict(env or os.environ)
            for key, value in UCX_RS_DEFAULTS.items():
                env.setdefault(key, value)
            extra = ("-e",)
        if WINDOW:
            extra += ("-O", str(WINDOW))
        r = perftest("tag_bw", size, messages, env, extra)
        return r["bw_MiBps"] * (1 << 20) / 1e6, r["msgrate"]


def takes_exact(binary, seen={}):
    """Whether this ucx-echo build has `--exact` (as many round trips at every size as asked;
    builds before it scaled them down by size, so an A/B against one compares unlike runs)."""
    if binary not in seen:
        usage = subprocess.run([binary, "client", "--no-such-flag"], capture_output=True, text=True).stderr
        seen[binary] = "--exact" in usage
    return seen[binary]


class UcxRs:
    def __init__(self, mode="polling", direct=False, op="tag", binary=ECHO, label=None, batch=False):
        self.mode, self.op, self.binary, self.batch = mode, op, binary, batch
        self.direct = ["--direct"] if direct else []
        who = label or "ucx-rs"
        self.name = (f"{who} {op + ' ' if op != 'tag' else ''}{mode}{' direct' if direct else ''}"
                     f"{' batched' if batch else ''}")

    def _run(self, size, iters, extra, env):
        return json_rows(pair(
            [self.binary, "server", "--bind", "127.0.0.1", "--cpu", SERVER_CPU, "--mode", self.mode, "--once"],
            [self.binary, "client", "--connect", "127.0.0.1:PORT", "--cpu", CLIENT_CPU, "--mode", self.mode,
             "--sizes", str(size), "--iters", str(iters), *(["--exact"] if takes_exact(self.binary) else []),
             "--test", self.op, "--json", *extra, *self.direct],
            env=env))[0]

    def latency(self, size, env):
        us = self._run(size, iters_for(size), [], env)["median_us"]
        # ucx-echo reports half of each timed operation. A put (with its flush) or a get moves
        # the data across once per operation, so its bandwidth comes from the whole operation.
        return 2 * us if self.op in ("put", "get") and size >= SMALL else us

    def stream(self, size, messages, env):
        r = self._run(size, messages, ["--bw", "--window", str(WINDOW or 64)] + (["--batch"] if self.batch else []), env)
        return r["stream_MBps"], r["stream_msgs_per_s"]


class Transport:
    def __init__(self, scheme, mode="polling", spin_us=None, direct=False, raw=False, batch=False, binary=TECHO,
                 label=None):
        # spin_us: Options::tcp_spin (None: the default, 50 µs; -1: 0, no spin)
        self.scheme, self.mode, self.spin_us, self.direct, self.raw = scheme, mode, spin_us, direct, raw
        self.batch, self.binary = batch, binary
        self.name = "tokio TCP ping-pong (no framing)" if raw else (
            (label or "transport") + f" {scheme}://" + (f" {mode}" if scheme == "ucx" else "")
            + (" direct" if direct else "") + (
                "" if spin_us is None else " no spin" if spin_us < 0 else f" spin {spin_us} us")
            + (" batched" if batch else ""))

    def _flags(self):
        flags = ["--ucx-progress", self.mode] if self.scheme == "ucx" else []
        if self.spin_us is not None:
            flags += ["--tcp-spin-us", str(max(self.spin_us, 0))]
        if self.direct:
            flags += ["--ucx-direct"]
        if self.raw:
            flags += ["--raw-tcp"]
        return flags

    def _run(self, client_args, env):
        flags = self._flags()
        out = pair(pin(SERVER_CPU, [self.binary, "server", "--listen", f"{self.scheme}://127.0.0.1:0", "--once",
                                    *flags]),
                   pin(CLIENT_CPU, [self.binary, "client", "--connect", "ADDR", *client_args, *flags]), env=env)
        return json_rows(out)[0]

    def latency(self, size, env):
        return self._run(["--sizes", str(size), "--iters", str(iters_for(size))], env)["median_us"]

    def stream(self, size, messages, env):
        """(MB/s, messages/s) of `transport-echo client --stream`: 64 sends in flight
        (`--window`), or batches of as many (two in flight)."""
        w = str(WINDOW or 64)
        how = ["--batch", w] if self.batch else ["--window", w]
        r = self._run(["--stream", "--sizes", str(size), "--count", str(messages), *how], env)
        return r["stream_MBps"], r["msgs_per_s"]


def ucxx_send_recv(python, size, iters, server_cmd, env=None, ucxx_server=True):
    """UCXX's send_recv benchmark client against a server; returns its median latency (us) and
    bandwidth line. `server_cmd` gets `-p PORT` (UCXX's server, which prints nothing) or is
    ours (prints LISTENING)."""
    common = ["-m", "ucxx.benchmarks.send_recv", "-n", str(size), "--n-iter", str(iters), "--n-warmup-iter", "100"]
    if ucxx_server:
        port = next_port()
        srv = subprocess.Popen([python, *common, "--server-only", "-p", port, "-b", SERVER_CPU, *server_cmd],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        time.sleep(2)  # UCXX's server says nothing when it is ready
    else:
        srv, addr = start_server(server_cmd, env)
        port = addr.rsplit(":", 1)[-1]
    try:
        run = subprocess.run([python, *common, "--client-only", "-s", "127.0.0.1", "-p", port, "-c", CLIENT_CPU,
                              "--no-detailed-report"], capture_output=True, text=True, timeout=600, env=env)
        out = run.stdout + run.stderr
    finally:
        stop(srv)
    for line in out.splitlines():
        if line.startswith("Latency (median)"):
            return float(line.split("|")[1].split()[0]) / 1000.0
    raise RuntimeError(f"UCXX send_recv: no result\n{out[-500:]}")


class Ucxx:
    name = "UCXX (Python send_recv)"

    def __init__(self, python):
        self.python = python

    def latency(self, size, env):
        # Its server sometimes misses the client's first connection attempt: one more try.
        n = min(iters_for(size), 2000)
        try:
            return ucxx_send_recv(self.python, size, n, [], env)
        except RuntimeError:
            return ucxx_send_recv(self.python, size, n, [], env)


class UcxxClientToRust:
    """UCXX's send_recv client against our ucxx-peer bench-server (the wheel's UCX on both sides)."""
    name = "UCXX client -> ucx-rs listener"

    def __init__(self, python, peer, env):
        self.python, self.peer, self.env = python, peer, env

    def latency(self, size, _env):
        n = min(iters_for(size), 2000)
        return ucxx_send_recv(self.python, size, n, pin(SERVER_CPU, [
            self.peer, "bench-server", "--mode", "polling", "--bytes", str(size), "--iters", str(n + 100)]),
            self.env, ucxx_server=False)


class UcxxToUcxx(UcxxClientToRust):
    name = "UCXX client -> UCXX listener"

    def latency(self, size, _env):
        return ucxx_send_recv(self.python, size, min(iters_for(size), 2000), [], self.env)


class AsyncUcx:
    name = "async-ucx 0.1.1"

    def __init__(self, binary):
        self.binary = binary
        libs = glob.glob(os.path.join(SCRATCH, "target", "debug", "build", "ucx1-sys-*", "out", "lib"))
        # The crate links the UCX it bundles; without this the system's (another ABI) loads.
        self.env = {"LD_LIBRARY_PATH": ":".join(libs)}

    def latency(self, size, env):
        out = pair(pin(SERVER_CPU, [self.binary, "server"]),
                   pin(CLIENT_CPU, [self.binary, "client", "127.0.0.1:PORT", str(size), str(min(iters_for(size), 5000))]),
                   env=dict(env or os.environ, **self.env))
        return json_rows(out)[0]["median_us"]


def build_async_ucx():
    os.makedirs(SCRATCH, exist_ok=True)
    src = os.path.join(ROOT, "scripts", "async-ucx-bench")
    shutil.copy(os.path.join(src, "Cargo.toml"), SCRATCH)
    shutil.copytree(os.path.join(src, "src"), os.path.join(SCRATCH, "src"), dirs_exist_ok=True)
    print(f"building async-ucx-bench in {SCRATCH} ...", flush=True)
    subprocess.run(["cargo", "build", "-j2"], cwd=SCRATCH, check=True)


def interop_peer(python):
    """Builds ucxx-peer against the UCX inside UCXX's wheel; returns (binary, env to run with)."""
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    libucx = os.path.join(site, "libucx")
    target = os.path.join(ROOT, "target", "ucx-ucxx")
    subprocess.run(["cargo", "build", "-q", "-j2", "--profile", PROFILE, "-p", "ucxx-peer"], cwd=ROOT, check=True,
                   env=dict(os.environ, UCX_PREFIX=libucx, CARGO_TARGET_DIR=target))
    libs = ":".join([os.path.join(libucx, "lib")] + glob.glob(os.path.join(site, "libucx_cu*.libs")))
    env = dict(os.environ, LD_LIBRARY_PATH=libs, UCX_MODULE_DIR=os.path.join(libucx, "lib", "ucx"),
               UCX_WARN_UNUSED_ENV_VARS="n")
    return os.path.join(target, "debug" if PROFILE == "dev" else PROFILE, "ucxx-peer"), env


def fmt(size, us):
    if size < SMALL:
        return f"{us:10.2f} us"
    return f"{size / (us * 1e-6) / 1e9:7.2f} GB/s"


def interleave(impls, sizes, rounds, measure, label, bracket=False):
    """Runs measure(impl, size) for every impl and size, `rounds` times interleaved; returns
    ({name: {size: [values]}}, {name: error}, {name: {size: [(value, ref before, ref after)]}}).
    With `bracket`, the first impl (the reference) also runs after every other one, so each
    of their runs has a reference run on either side of it (the third dict; empty otherwise)."""
    res = {i.name: {s: [] for s in sizes} for i in impls}
    errors = {}

    def run(i, s):
        if i.name in errors:
            return None
        try:
            v = measure(i, s)
        except Exception as e:  # one peer failing must not hide the others
            errors[i.name] = (str(e).strip().splitlines() or ["?"])[-1][:300]
            return None
        res[i.name][s].append(v)
        return v

    paired = bracketed_rounds(impls, sizes, rounds, run, bracket=bracket, alternate=True,
                              on_round=lambda r: print(f"{label}: round {r + 1}/{rounds} done", flush=True))
    for i in impls:
        paired.setdefault(i.name, {})
        for s in sizes:
            paired[i.name].setdefault(s, [])
    return res, errors, paired


def table(impls, sizes, res, errors, base, cell, title=None, paired=None, pair_cell=None):
    """One row per implementation, one column per size: cell(size, values, base values) gives
    the text and the ratio to the base row's. With `paired` (from `interleave`), each cell
    also gets the median of its runs' ratios to the reference runs either side ("p"), as
    `pair_cell` (default `paired_ratio`) computes it."""
    pair_cell = pair_cell or paired_ratio
    if title:
        print(f"\n{title}")
    width = 33 if paired else 26
    print(f"{'' if title else chr(10)}{'':34}" + "".join(f"{size_name(s):>{width}}" for s in sizes))
    for i in impls:
        line = f"{i.name:34}"
        for s in sizes:
            if not res[i.name][s] or not res[base][s]:
                line += f"{'-':>{width}}"
                continue
            text, ratio = cell(s, res[i.name][s], res[base][s])
            line += f"{text:>16} {ratio:6.2f}x"
            if paired:
                runs = paired.get(i.name, {}).get(s)
                line += f" {pair_cell(s, runs):5.2f}p  " if runs else f" {'-':>6}  "
            else:
                line += "  "
        print(line)
        if i.name in errors:
            print(f"{'':34}failed: {errors[i.name]}")


def paired_ratio(size, runs):
    """The median over runs of (value, reference before, reference after) of the run's ratio
    to the mean of the two reference runs: latency below 64 KiB (lower is better), bandwidth
    from there (higher is better)."""
    ratios = [(v / ((b + a) / 2)) if size < SMALL else ((b + a) / 2) / v for v, b, a in runs]
    return statistics.median(ratios)


def paired_stream_ratio(size, runs):
    """As `paired_ratio` for streams: messages per second below 64 KiB, bandwidth from there
    (higher is better)."""
    k = 1 if size < SMALL else 0
    return statistics.median(v[k] / ((b[k] + a[k]) / 2) for v, b, a in runs)


def latency_cell(size, values, base):
    """Latency below 64 KiB (ratio: lower is better), bandwidth from there (higher is better)."""
    m, b = statistics.median(values), statistics.median(base)
    return fmt(size, m), (m / b if size < SMALL else b / m)


def stream_cell(size, values, base):
    """Messages per second below 64 KiB, bandwidth from there; ratio: higher is better."""
    k = 1 if size < SMALL else 0
    m, b = statistics.median(v[k] for v in values), statistics.median(v[k] for v in base)
    return (f"{m / 1e6:8.2f} M msg/s" if k else f"{m / 1e3:8.2f} GB/s"), m / b


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="8,1m,64m")
    ap.add_argument("--tls", default="default", help="comma-separated UCX_TLS values; default: UCX's choice")
    ap.add_argument("--modes", default="polling", help="progress modes for ucx-rs and transport ucx://")
    ap.add_argument("--ops", default="", help="also these UCP operations: stream,am,put,get")
    ap.add_argument("--stream", action="store_true", help="streamed bandwidth / message rate beside tag_bw")
    ap.add_argument("--msgrate", action="store_true", help="--stream at 8 B only")
    ap.add_argument("--window", type=int, help="sends in flight in --stream, ours and ucx_perftest's (-O) alike")
    ap.add_argument("--ab", nargs=2, metavar=("OLD", "NEW"), help="A/B of two ucx-echo binaries")
    ap.add_argument("--ab-transport", nargs=2, metavar=("OLD", "NEW"), help="A/B of two transport-echo binaries")
    ap.add_argument("--interop", action="store_true", help="UCXX client against UCXX's listener and ours")
    ap.add_argument("--ucxx-python", default=os.path.join(ROOT, "target", "ucxx-venv", "bin", "python"))
    ap.add_argument("--build-async-ucx", action="store_true")
    ap.add_argument("--json", help="append the raw results as JSON lines to this file")
    ap.add_argument("--no-bracket", dest="bracket", action="store_false",
                    help="run the reference once per round and size, not after every row")
    a = ap.parse_args()
    if a.window is not None and a.window < 1:
        sys.exit("--window: at least 1")
    global WINDOW
    WINDOW = a.window
    if a.ab and a.ab_transport:
        sys.exit("--ab and --ab-transport: one A/B at a time")
    if a.ab and len({takes_exact(b) for b in a.ab}) > 1:
        print("note: only one of the two ucx-echo builds has --exact: the other scales its round trips "
              "down by size (10 at 4 MiB and up), so large sizes compare unlike runs")
    sizes = [size_arg(s) for s in a.sizes.split(",")]
    modes = a.modes.split(",")
    ops = [o for o in a.ops.split(",") if o]
    for o in ops:
        if o not in PERFTEST_OPS or o == "tag":
            sys.exit(f"--ops: unknown operation {o!r} (stream, am, put, get)")
    ab_pairs = [("A", a.ab_transport[0]), ("B", a.ab_transport[1])] if a.ab_transport else []
    tools = [ECHO] if a.ab or a.interop else [ECHO, TECHO]
    for tool in ([] if a.ab else [b for _, b in ab_pairs] if ab_pairs else tools):
        if not os.path.exists(tool):
            sys.exit(f"{tool} is missing: cargo build --release -p ucx-stack --bin ucx-echo && "
                     "cargo build --release -p ucxrs-transport --bins")
    if a.build_async_ucx:
        build_async_ucx()
    has_ucxx = os.path.exists(a.ucxx_python) and subprocess.run(
        [a.ucxx_python, "-c", "import ucxx"], capture_output=True).returncode == 0
    skipped = []
    base = Perftest()
    if a.ab:
        impls = [base] + [UcxRs(m, d, binary=b, label=l) for l, b in (("A", a.ab[0]), ("B", a.ab[1]))
                          for m in modes for d in (False, True)]
    elif ab_pairs:
        base = Perftest(peer_errors=True)
        impls = [base] + [Transport("ucx", m, direct=d, binary=b, label=l) for l, b in ab_pairs
                          for m in modes for d in (False, True)]
    elif a.interop:
        if not has_ucxx:
            sys.exit(f"--interop needs UCXX: no python with ucxx at {a.ucxx_python} (bash tests/interop/run.sh)")
        peer, penv = interop_peer(a.ucxx_python)
        impls = [UcxxToUcxx(a.ucxx_python, peer, penv), UcxxClientToRust(a.ucxx_python, peer, penv)]
        base = impls[0]
    else:
        # The reference: ucx_perftest with peer error handling, as every ucx-rs endpoint has it
        # (UCX then picks the same lanes and rendezvous scheme); plain ucx_perftest beside it.
        base = Perftest(peer_errors=True)
        impls = [base, Perftest()]
        for m in modes:
            impls += [UcxRs(m), UcxRs(m, direct=True)]
        impls += [Transport("ucx", m, direct=d) for m in modes for d in (False, True)]
        impls += [Transport("tcp"), Transport("tcp", spin_us=-1), Transport("tcp", raw=True), Perftest(tls="tcp")]
        if has_ucxx:
            impls.append(Ucxx(a.ucxx_python))
        elif os.environ.get("CI"):
            sys.exit(f"FAILED: UCXX: no python with ucxx at {a.ucxx_python} (CI is expected to have it: "
                     "tests/interop/run.sh makes it)")
        else:
            skipped.append(f"UCXX: no python with ucxx at {a.ucxx_python} (bash tests/interop/run.sh makes one)")
        if os.path.exists(ASYNC_UCX):
            impls.append(AsyncUcx(ASYNC_UCX))
        else:
            skipped.append("async-ucx: not built (--build-async-ucx)")
        for o in ops:
            impls += [Perftest(o)] + [UcxRs(m, d, op=o) for m in modes for d in (False, True)]
    ucx = subprocess.run(["ucx_info", "-v"], capture_output=True, text=True).stdout.splitlines()[0].strip("# ")
    print(f"{ucx}; {a.rounds} interleaved rounds; one-way medians; server CPU {SERVER_CPU}, "
          f"client CPU {CLIENT_CPU}")
    for s in skipped:
        print(f"  skipped {s}")
    # "window": --window, or null for 64 of ours beside ucx_perftest's own default.
    report = {"ucx": ucx, "rounds": a.rounds, "window": WINDOW, "tls": {}}
    failed = set()
    stream_sizes = [8] if a.msgrate else sizes if a.stream else []
    for tls in a.tls.split(","):
        env = dict(os.environ)
        if tls != "default":
            env["UCX_TLS"] = tls
        print(f"\n== UCX_TLS={tls}")
        res, errors, paired = interleave(impls, sizes, a.rounds, lambda i, s: i.latency(s, env), "latency",
                                         bracket=a.bracket)
        # Each operation's rows against its own ucx_perftest test.
        groups = [[i for i in impls if getattr(i, "op", "tag") == "tag" and
                   not (isinstance(i, Perftest) and i.test != "tag_lat")]]
        for o in ops:
            groups.append([i for i in impls if getattr(i, "op", None) == o or
                           (isinstance(i, Perftest) and i.test == PERFTEST_OPS[o])])
        for n, g in enumerate(groups):
            # Paired ratios only against the reference the runs were bracketed by.
            table(g, sizes, res, errors, g[0].name, latency_cell,
                  paired=paired if a.bracket and n == 0 else None)
        print("ratios: latency over the first row's below 64 KiB (lower is better), bandwidth over it from "
              "64 KiB (higher is better)" + ("; \"p\": the median of each run's ratio to the reference runs "
                                           "either side of it" if a.bracket else ""))
        entry = {"latency_us": res, "errors": errors, "paired": paired}
        if stream_sizes:
            # The reference with ucx-rs's configuration (same lanes, same rendezvous), then UCX's
            # own defaults (on one host CMA, slower here from 1 MiB: docs/performance.md).
            ref, plain = Perftest(peer_errors=True), Perftest()
            ref.name, plain.name = "ucx_perftest tag_bw -e", "ucx_perftest tag_bw"
            if ab_pairs:
                streamers = [ref] + [Transport("ucx", m, direct=d, batch=bt, binary=b, label=l)
                                     for l, b in ab_pairs for m in modes for d in (False, True)
                                     for bt in (False, True)]
            else:
                streamers = [ref, plain] + [i for i in impls if isinstance(i, UcxRs) and i.op == "tag"]
                streamers += [UcxRs(m, d, batch=True) for m in modes for d in (False, True)]
                streamers += [Transport("ucx", m, direct=d, batch=b) for m in modes for d in (False, True)
                              for b in (False, True)]
                streamers += [Transport("tcp", batch=b) for b in (False, True)]
            sres, serrors, spaired = interleave(
                streamers, stream_sizes, a.rounds,
                lambda i, s: i.stream(s, 1_000_000 if isinstance(i, (Perftest, UcxRs)) and s < SMALL else
                                      250_000 if s < SMALL else max(20, (2 << 30) // s), env), "stream",
                bracket=a.bracket)
            table(streamers, stream_sizes, sres, serrors, ref.name, stream_cell,
                  f"Streamed, {WINDOW or 64} in flight (message rate below {size_name(SMALL)}, bandwidth from there)",
                  paired=spaired if a.bracket else None, pair_cell=paired_stream_ratio)
            entry["stream"] = sres
            entry["stream_paired"] = spaired
            errors.update(serrors)
        report["tls"][tls] = entry
        core = {i.name for i in impls if not isinstance(i, (Ucxx, AsyncUcx))}
        failed |= core & errors.keys()
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(report) + "\n")
    if failed:
        sys.exit(f"failed: {', '.join(sorted(failed))}")


if __name__ == "__main__":
    main()
