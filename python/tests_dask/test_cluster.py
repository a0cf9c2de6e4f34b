"""Real Dask clusters on ``ucxrs://``: worker processes, the seed's primes, a dask.array and a
dask.dataframe merge on Dask's p2p shuffle, a worker killed mid-computation, a stranger sending
garbage to the scheduler, and the command-line launchers (``dask scheduler``/``dask worker``,
and workers started by ``mpirun``)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster, wait

import ucxrs


def is_prime(n):
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def ucxrs_cluster():
    """Two worker processes (each under its nanny) and a scheduler, on ucxrs://127.0.0.1."""
    return LocalCluster(protocol="ucxrs", n_workers=2, threads_per_worker=1, processes=True,
                        dashboard_address=None, worker_dashboard_address=None, host="127.0.0.1")


@pytest.fixture(scope="module")
def client():
    with ucxrs_cluster() as cluster, Client(cluster) as c:
        yield c


def test_cluster_is_on_ucxrs(client):
    assert client.scheduler.address.startswith("ucxrs://")
    workers = client.scheduler_info()["workers"]
    assert len(workers) == 2 and all(w.startswith("ucxrs://") for w in workers)


def test_primes_map_gather(client):
    numbers = range(10_000_000, 10_002_000)
    futures = client.map(is_prime, numbers)
    assert client.gather(futures) == [is_prime(n) for n in numbers]


def test_array(client):
    x = da.random.RandomState(42).random((2000, 2000), chunks=(500, 500))
    y = (x + x.T).mean(axis=0)
    got = y.compute()
    whole = x.compute()
    np.testing.assert_allclose(got, (whole + whole.T).mean(axis=0))


def test_large_values_between_workers(client):
    """Values of 1 KiB, 1 MiB and 64 MiB made on one worker and used on the other."""
    a, b = sorted(client.scheduler_info()["workers"])
    for n in (1 << 10, 1 << 20, 64 << 20):
        made = client.submit(np.full, n, 3, dtype="u1", workers=[a], pure=False)
        total = client.submit(lambda v: int(v.sum()), made, workers=[b])
        assert total.result() == 3 * n


def test_dataframe_merge_p2p(client):
    rng = np.random.default_rng(0)
    n = 200_000
    left = pd.DataFrame({"key": rng.permutation(n), "x": rng.random(n)})
    # About 30% of the right side's keys match the left's.
    keys = np.where(rng.random(n) < 0.3, rng.integers(0, n, n), rng.integers(n, 10 * n, n))
    right = pd.DataFrame({"key": keys, "y": rng.random(n)})
    with dask.config.set({"dataframe.shuffle.method": "p2p"}):
        merged = dd.from_pandas(left, npartitions=8).merge(
            dd.from_pandas(right, npartitions=8), on="key", how="inner"
        )
        got = merged.compute()
    want = left.merge(right, on="key", how="inner")
    assert len(got) == len(want) > 0
    got = got.sort_values(["key", "x", "y"]).reset_index(drop=True)
    want = want.sort_values(["key", "x", "y"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)


def test_in_process_cluster_and_a_second_loop():
    """Scheduler, workers and client in this process (processes=False), beside the loops this
    test process already runs (the module's client, the strangers' asyncio.run): every loop
    that awaits the transport progresses its one worker."""
    with LocalCluster(protocol="ucxrs", n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None, host="127.0.0.1") as cluster, Client(cluster) as c:
        assert c.scheduler.address.startswith("ucxrs://")
        numbers = range(2_000_000, 2_000_300)
        assert c.gather(c.map(is_prime, numbers)) == [is_prime(n) for n in numbers]
        x = da.arange(100_000, chunks=10_000)
        assert int(x.sum().compute()) == 100_000 * 99_999 // 2


def slow_square(i):
    time.sleep(0.05)
    return i * i


def test_worker_killed_mid_computation():
    with ucxrs_cluster() as cluster, Client(cluster) as c:
        futures = c.map(slow_square, range(200))
        # Kill one worker's process once some results are in (its nanny starts another).
        for _ in range(400):
            if sum(f.done() for f in futures) >= 20:
                break
            time.sleep(0.05)
        pids = c.run(os.getpid)
        victim = sorted(pids)[0]
        os.kill(pids[victim], signal.SIGKILL)
        assert c.gather(futures) == [i * i for i in range(200)]
        assert sum(c.submit(slow_square, i, pure=False).result() for i in range(5)) == 30


def test_stranger_with_garbage_does_not_stop_the_cluster(client):
    host, port = client.scheduler.address[len("ucxrs://") :].rsplit(":", 1)

    async def junk():
        from ucxrs import _ucxrs

        # A raw UCX peer, then a transport peer whose frames are not Dask's.
        ep = await ucxrs.create_endpoint(host, int(port))
        await ep.send(np.frombuffer(b"garbage!" * 128, dtype="u1"))
        await ep.close()
        conn = await _ucxrs.transport_connect(f"ucx://{host}:{port}")
        await conn.send([b"\xc1\xc1\xc1", b"\x00" * 1000])
        try:
            for _ in range(5):
                await conn.recv()
        except ucxrs.UCXError:
            pass

    import asyncio

    asyncio.run(junk())
    assert client.submit(sum, [1, 2, 3]).result() == 6
    assert len(client.scheduler_info()["workers"]) == 2


def _env():
    """The environment of the processes started here: this module importable (the tasks'
    functions are defined in it)."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    return env


def _dask_cli():
    return [sys.executable, "-m", "distributed.cli.dask_scheduler"], [
        sys.executable,
        "-m",
        "distributed.cli.dask_worker",
    ]


def _wait_for_file(path, proc, limit=60):
    for _ in range(limit * 10):
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        time.sleep(0.1)
    raise TimeoutError(f"{path} did not appear")


def _stop(*procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _check_cluster(scheduler_file, n_workers):
    with Client(scheduler_file=scheduler_file, timeout=60) as c:
        c.wait_for_workers(n_workers, timeout=120)
        assert all(w.startswith("ucxrs://") for w in c.scheduler_info()["workers"])
        numbers = range(1_000_000, 1_000_500)
        assert c.gather(c.map(is_prime, numbers)) == [is_prime(n) for n in numbers]
        x = da.ones((1000, 1000), chunks=250)
        assert float((x @ x.T).sum().compute()) == 1000.0**3


def _start_scheduler(scheduler_file):
    """`dask scheduler --protocol ucxrs` on 127.0.0.1, writing `scheduler_file`."""
    scheduler_cmd, _ = _dask_cli()
    return subprocess.Popen(
        scheduler_cmd + ["--protocol", "ucxrs", "--host", "127.0.0.1", "--port", "0",
                         "--scheduler-file", scheduler_file, "--no-dashboard"],
        env=_env(),
    )


def test_command_line_scheduler_and_workers():
    _, worker_cmd = _dask_cli()
    with tempfile.TemporaryDirectory() as tmp:
        sf = os.path.join(tmp, "scheduler.json")
        sched = _start_scheduler(sf)
        workers = []
        try:
            _wait_for_file(sf, sched)
            with open(sf) as f:
                address = json.load(f)["address"]
            assert address.startswith("ucxrs://127.0.0.1:")
            # One worker by the scheduler's address, one by the file.
            workers.append(subprocess.Popen(
                worker_cmd + [address, "--nthreads", "1", "--no-dashboard"], env=_env()))
            workers.append(subprocess.Popen(
                worker_cmd + ["--scheduler-file", sf, "--protocol", "ucxrs", "--nthreads", "1",
                              "--no-dashboard", "--host", "127.0.0.1"], env=_env()))
            _check_cluster(sf, 2)
        finally:
            _stop(*workers, sched)


def _mpirun(ranks):
    """Open MPI's mpirun for `ranks` ranks; fails in CI (which installs it), else skips, when
    it is missing."""
    path = next(filter(None, map(shutil.which, ("mpirun.openmpi", "mpirun"))), None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("mpirun is not installed (scripts/setup_test_tools.sh installs Open MPI)")
        pytest.skip("mpirun is not installed")
    launcher = [path, "--oversubscribe", "-n", str(ranks)]
    if os.getuid() == 0:
        launcher.append("--allow-run-as-root")
    return launcher


def _mpi_env():
    env = _env()
    env.setdefault("OMPI_MCA_btl", "self,tcp")  # the ranks do not use MPI to talk
    return env


def test_workers_started_by_mpirun():
    """dask-mpi's way: the workers are MPI ranks (`mpirun -n 2 dask worker ...`)."""
    launcher = _mpirun(2)
    _, worker_cmd = _dask_cli()
    with tempfile.TemporaryDirectory() as tmp:
        sf = os.path.join(tmp, "scheduler.json")
        sched = _start_scheduler(sf)
        ranks = None
        try:
            _wait_for_file(sf, sched)
            ranks = subprocess.Popen(
                launcher
                + worker_cmd
                + ["--scheduler-file", sf, "--protocol", "ucxrs", "--nthreads", "1",
                   "--no-dashboard", "--host", "127.0.0.1", "--no-nanny"],
                env=_mpi_env(),
                start_new_session=True,
            )
            _check_cluster(sf, 2)
        finally:
            if ranks is not None and ranks.poll() is None:
                os.killpg(ranks.pid, signal.SIGTERM)
                try:
                    ranks.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(ranks.pid, signal.SIGKILL)
                    ranks.wait()
            _stop(sched)


def test_dask_mpi_initialize():
    """dask_mpi.initialize(protocol="ucxrs") in 4 MPI ranks: scheduler, client, 2 workers."""
    launcher = _mpirun(4)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_cluster.py")
    ranks = subprocess.Popen(launcher + [sys.executable, script], env=_mpi_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = ranks.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(ranks.pid, signal.SIGKILL)
        out, _ = ranks.communicate()
        pytest.fail("dask-mpi under mpirun did not finish in 240 s:\n" + out[-3000:])
    assert ranks.returncode == 0, out[-3000:]
    assert "dask-mpi on ucxrs: all answers right" in out
