"""Device objects through the ``ucxrs://`` comm (a build with CUDA, a GPU, CuPy): CuPy arrays
leave as device frames that lend their memory and arrive in device memory, on one comm and
between the workers of a cluster. Skipped, with the reason, where any of the three is missing
(scripts/gpu/prove.sh runs them on a GPU machine)."""

import asyncio
import os

import numpy as np
import pytest
from distributed import Client, LocalCluster, wait
from distributed.comm import connect, listen
from distributed.comm.core import CommClosedError
from distributed.protocol import Serialized, to_serialize

from ucxrs import _ucxrs



def skip(why):
    """Skips the module, and lists it among the run's GPU skips (scripts/test.sh prints them)."""
    path = os.environ.get("TEST_SKIPS_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"python/tests_dask/test_device.py: {why}\n")
    pytest.skip(why, allow_module_level=True)


try:
    import cupy
except ImportError as e:
    skip(f"device frames need CuPy and a GPU: {e}")
if not _ucxrs.transport_device_frames():
    skip("this ucxrs was built without CUDA (--features cuda)")
try:
    cupy.cuda.runtime.getDeviceCount()
except Exception as e:  # no driver, no device
    skip(f"no GPU: {e}")

SIZES = [0, 1000, 1 << 20, 80_000_000]


async def echo_server(deserialize=True):
    async def echo(comm):
        try:
            while True:
                await comm.write(await comm.read())
        except CommClosedError:
            pass
        finally:
            await comm.close()

    listener = listen("ucxrs://127.0.0.1", echo, deserialize=deserialize)
    await listener.start()
    return listener


@pytest.mark.parametrize("size", SIZES)
async def test_cupy_round_trip(size):
    listener = await echo_server()
    comm = await connect(listener.contact_address)
    x = cupy.arange(size, dtype="u1") if size else cupy.empty(0, dtype="f8")
    await comm.write({"x": to_serialize(x), "tag": size})
    back = await asyncio.wait_for(comm.read(), 60)
    assert back["tag"] == size
    assert isinstance(back["x"], cupy.ndarray)
    assert back["x"].dtype == x.dtype and back["x"].shape == x.shape
    assert bool((back["x"] == x).all())
    back["x"][...] = 0  # received device memory is the receiver's to write
    await comm.close()
    listener.stop()


@pytest.fixture(params=["transport", "rmm"])
def landing(request):
    """Where received device frames land: the transport's own memory (``DeviceFrame``s), or
    RMM's (``rmm.DeviceBuffer``s: the comm's choice where RMM is importable). Gives the type
    name the frames arrive as."""
    import ucxrs.distributed as d

    d._configure()
    before = _ucxrs.device_frame_allocator()
    if request.param == "rmm":
        try:
            import rmm
        except Exception as e:
            pytest.fail(f"RMM is not importable here (the GPU bundle carries it): {e}")
        d.receive_device_frames_with(lambda n: rmm.DeviceBuffer(size=n))
        kind = "rmm.DeviceBuffer"
    else:
        d.receive_device_frames_with(None)
        kind = "ucxrs._ucxrs.DeviceFrame"
    yield kind
    _ucxrs.receive_device_frames_with(before)


async def test_frames_arrive_in_device_memory(landing):
    """With deserialisation off, the received frames are device memory: the comm's own device
    frames, or RMM's buffers."""
    listener = await echo_server(deserialize=False)
    comm = await connect(listener.contact_address, deserialize=False)
    x = cupy.arange(1 << 20, dtype="f4")
    await comm.write({"x": to_serialize(x)})
    back = await asyncio.wait_for(comm.read(), 60)
    assert isinstance(back["x"], Serialized)
    device = [f for f in back["x"].frames if hasattr(f, "__cuda_array_interface__")]
    assert len(device) == 1
    assert type(device[0]).__module__ + "." + type(device[0]).__name__ == landing
    assert device[0].nbytes == x.nbytes
    assert bool((cupy.asarray(device[0]).view("f4") == x).all())
    await comm.close()
    listener.stop()


@pytest.mark.parametrize("landing", ["rmm"], indirect=True)
async def test_rmm_buffers_travel_as_themselves(landing):
    """An ``rmm.DeviceBuffer`` sent arrives as one (Dask's RMM deserialiser asserts it gets
    one) where frames land in RMM's memory, with the same bytes."""
    import rmm

    listener = await echo_server()
    comm = await connect(listener.contact_address)
    for size in (0, 1000, 8 << 20):
        x = cupy.arange(size, dtype="u1")
        buf = rmm.DeviceBuffer(ptr=x.data.ptr if size else 0, size=size)
        await comm.write({"b": to_serialize(buf)})
        back = (await asyncio.wait_for(comm.read(), 60))["b"]
        assert isinstance(back, rmm.DeviceBuffer) and back.size == size
        got = cupy.asarray(back).view("u1") if size else cupy.empty(0, dtype="u1")
        assert bool((got == x).all())
    await comm.close()
    listener.stop()


async def test_a_stream_producers_work_is_sent():
    """An array written on a non-blocking stream is sent after that stream's work (version 3
    of the interface exports the stream; the comm waits for it)."""
    listener = await echo_server()
    comm = await connect(listener.contact_address)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        # Enough work queued that the send would overtake it if the stream were not waited
        # for (hundreds of passes over 64 MiB).
        x = cupy.zeros(16 << 20, dtype="f4")
        for _ in range(300):
            x += 0.01
        x += 3 - x[0]  # 3.0 everywhere once every pass has run
        await comm.write({"x": to_serialize(x)})
    back = await asyncio.wait_for(comm.read(), 60)
    assert bool((back["x"] == 3).all())
    assert float(back["x"].sum(dtype="f8")) == 3.0 * (16 << 20)
    await comm.close()
    listener.stop()


def _sum(a):
    return float(a.sum())


def test_cupy_between_workers():
    """Two worker processes on the GPU: a CuPy array made on one is used on the other (a
    device transfer through the comm), and a `dask.array` of CuPy chunks gives NumPy's sum."""
    import dask.array as da

    with LocalCluster(protocol="ucxrs", n_workers=2, threads_per_worker=1, processes=True,
                      host="127.0.0.1", dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        a, b = sorted(client.scheduler_info()["workers"])
        for size in (1 << 10, 64 << 20):
            made = client.submit(cupy.full, size, 7, dtype="u1", workers=[a], pure=False)
            wait(made)
            assert client.submit(_sum, made, workers=[b], pure=False).result() == 7.0 * size
            kinds = client.run(lambda dask_worker: [type(v).__module__ + "." + type(v).__name__
                                                    for v in dask_worker.data.values()],
                               workers=[b])[b]
            assert "cupy.ndarray" in kinds, kinds
        x = da.from_array(np.arange(4_000_000, dtype="f8"), chunks=500_000).map_blocks(cupy.asarray)
        total = (x * 2).sum().compute()
        assert float(total) == float((np.arange(4_000_000, dtype="f8") * 2).sum())
