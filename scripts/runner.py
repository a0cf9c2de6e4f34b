"""What the comparison scripts share: start a server process and read the address it prints,
run a client against it, run ucx_perftest, and run rows in interleaved rounds bracketed by
a reference (`bracketed_rounds`).

Every server tool of the stack (ucx-echo, ucx-gpu-echo, transport-echo, ucxx-peer, and
the async-ucx harness) prints one line, `LISTENING <address>`, once it accepts connections.
"""
import json, os, select, subprocess, tempfile, time

UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
# The cargo profile the scripts build and run (scripts/lib.sh says the same for the shell
# scripts): release, unless STACK_PROFILE names another (CI: dev, as its tests).
PROFILE = os.environ.get("STACK_PROFILE") or "release"


def built(*parts):
    """The path of a binary of PROFILE's build: built("examples", "array_tour")."""
    return os.path.join(TARGET, "debug" if PROFILE == "dev" else PROFILE, *parts)


def cargo_build(package, *targets):
    """Builds `targets` (`--example`, `NAME`, ...) of `package` in PROFILE; with
    STACK_ALL_FEATURES=1 (CI) as the tests were built (the workspace, every feature)."""
    if os.environ.get("STACK_ALL_FEATURES") == "1":
        which = ["--workspace", "--all-features"]
    else:
        which = ["-p", package]
    subprocess.run(["cargo", "build", "-q", "-j2", "--profile", PROFILE, *which, *targets],
                   cwd=ROOT, check=True)


def skip_or_fail(what):
    """A comparison left out for want of something CI is expected to have (PyPI, a venv):
    in CI (CI set) that fails the run; elsewhere it is printed and the run goes on."""
    if os.environ.get("CI"):
        raise SystemExit(f"FAILED: {what} (CI is expected to have it)")
    print(f"SKIPPED: {what}", flush=True)
_CPUS = sorted(os.sched_getaffinity(0))
# Server and client on two different CPUs this process may use (the same one if only one).
SERVER_CPU, CLIENT_CPU = str(_CPUS[0]), str(_CPUS[min(1, len(_CPUS) - 1)])


def size_arg(text):
    """`8`, `4k`, `1m`, `2g` -> bytes."""
    t = text.strip().lower()
    return int(t[:-1]) * UNITS[t[-1]] if t[-1] in UNITS else int(t)


def size_name(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB" if size >= 1 << 10 else f"{size} B"


def pin(cpu, cmd):
    return ["taskset", "-c", str(cpu), *cmd]


def json_rows(text):
    return [json.loads(l) for l in text.splitlines() if l.startswith("{")]


def start_server(cmd, env=None, limit=60):
    """Starts `cmd` and waits (at most `limit` seconds) for its `LISTENING <address>` line.
    Returns (process, address). The server's stderr goes to a file (a pipe nobody reads could
    fill up and stall it), shown when it fails to start."""
    err = tempfile.TemporaryFile(mode="w+")
    srv = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    ready, _, _ = select.select([srv.stdout], [], [], limit)
    line = srv.stdout.readline() if ready else ""
    if not line.startswith("LISTENING "):
        srv.kill()
        srv.wait()
        err.seek(0)
        raise RuntimeError(f"{' '.join(cmd[:5])}: no LISTENING line ({line.strip()!r}) "
                           f"{err.read().strip()[-500:]}")
    return srv, line.split()[1]


def stop(srv, limit=30):
    """Waits for a server to exit on its own (they serve one client), killing it after `limit`."""
    try:
        srv.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        srv.kill()
        srv.wait()


def pair(server, client, env=None, timeout=600):
    """Runs `client` against a fresh `server`; ADDR and PORT in the client's arguments become
    the server's address and port. Returns the client's stdout; raises on failure."""
    srv, addr = start_server(server, env)
    try:
        port = addr.rsplit(":", 1)[-1]
        cmd = [c.replace("ADDR", addr).replace("PORT", port) for c in client]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:4])} failed: {out.stderr.strip()[-500:]}")
        return out.stdout
    finally:
        stop(srv)


_PORT = [15000 + os.getpid() % 1000 * 20]


def next_port():
    """A port for a server that is told its port (ucx_perftest, UCXX's benchmark)."""
    _PORT[0] += 1
    return str(_PORT[0])


def perftest(test, size, iters, env=None, extra=(), binary="ucx_perftest", cpus=(SERVER_CPU, CLIENT_CPU)):
    """One ucx_perftest run over loopback; returns a dict of its "Final:" fields: typical
    (median) and average latency in us, average bandwidth in MiB/s and message rate."""
    p = next_port()
    srv = subprocess.Popen([binary, "-c", cpus[0], "-p", p], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=env)
    try:
        time.sleep(0.5)
        # On a loaded machine the server may not listen yet after half a second: a client
        # refused while the server still runs tries again, 10 times at most, 0.3 s apart.
        for _ in range(10):
            out = subprocess.run([binary, "127.0.0.1", "-p", p, "-c", cpus[1], "-t", test, "-s", str(size),
                                  "-n", str(iters), *extra], capture_output=True, text=True, timeout=600, env=env)
            refused = "Connection refused" in out.stdout + out.stderr
            if not refused or srv.poll() is not None:
                break
            time.sleep(0.3)
    finally:
        stop(srv)
    final = [l for l in out.stdout.splitlines() if l.startswith("Final:")]
    if not final:
        raise RuntimeError(f"ucx_perftest -t {test} -s {size}: no result\n{out.stdout[-500:]}{out.stderr[-500:]}")
    # Final: iters typical_lat avg_lat overall_lat avg_bw overall_bw avg_msgrate overall_msgrate
    f = [float(x) for x in final[0].split()[1:]]
    return {"lat_us": f[1], "avg_us": f[2], "bw_MiBps": f[4], "msgrate": f[6]}


def bracketed_rounds(impls, sizes, rounds, run, bracket=True, alternate=False, on_round=None):
    """Runs run(impl, size) for every impl and size, `rounds` times interleaved (A B C A B C);
    `run` returns a value, or None when the run failed. With `bracket`, the first impl (the
    reference) also runs after every other one, so each of their runs has a reference run on
    either side of it: this VM moves between a fast and a slow state for seconds at a time,
    and a state that lasts longer than one row's run cancels out of the run's ratio to them.
    With `alternate`, every other round runs the rows in reverse (the reference first), so no
    row always runs right after the same neighbour. `on_round(r)` is called after each round.
    Returns {name: {size: [(value, reference before, reference after)]}} (empty without
    `bracket`)."""
    paired = {}
    for r in range(rounds):
        order = impls[:1] + impls[:0:-1] if alternate and r % 2 else impls
        for s in sizes:
            before = run(order[0], s)
            for i in order[1:]:
                v = run(i, s)
                if not bracket:
                    continue
                after = run(order[0], s)
                if None not in (v, before, after):
                    paired.setdefault(i.name, {}).setdefault(s, []).append((v, before, after))
                before = after
        if on_round:
            on_round(r)
    return paired
