"""Device arrays on a GPU: CuPy arrays (``__cuda_array_interface__`` version 3, with its
stream), PyTorch tensors (the interface, and DLPack alone), host to device and back, every
byte checked. Skipped, with the reason, where no GPU can be used (CI has none):
scripts/gpu/prove.sh runs them on one."""

import numpy as np
import pytest

import ucxrs
from helpers import echo_pair, until_peer_closes

cupy = pytest.importorskip("cupy", reason="device arrays need CuPy and a GPU")


@pytest.fixture(autouse=True)
def needs_gpu():
    support = ucxrs.cuda_support()
    if support not in ("zero-copy", "staged"):
        pytest.skip(f"ucxrs.cuda_support() is {support!r}: no GPU to test on")


SIZES = [0, 1, 8, 4099, 1 << 20, (16 << 20) + 3]


def pattern(n, dtype="u1", xp=np):
    return (xp.arange(n, dtype=xp.uint64) * 2654435761 % 251).astype(dtype)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("where", ["device-device", "host-device", "device-host"])
async def test_cupy_echo(size, where):
    send_dev, recv_dev = where.split("-")
    make = {"device": lambda n: cupy.empty(n, dtype=cupy.uint8), "host": lambda n: np.empty(n, np.uint8)}

    async def serve(ep):
        buf = make[recv_dev](size)
        await ep.recv(buf)
        await ep.send(buf)
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    sent = pattern(size, xp=cupy if send_dev == "device" else np)
    back = make[send_dev](size)
    await ep.send(sent)
    await ep.recv(back)
    got = back.get() if send_dev == "device" else back
    want = sent.get() if send_dev == "device" else sent
    assert np.array_equal(got, want)
    await ep.close()
    listener.close()


@pytest.mark.parametrize("dtype", ["f4", "f8", "c16", "i2"])
async def test_cupy_dtypes_and_shapes(dtype):
    sent = cupy.asarray(pattern(3 * 1000, dtype).reshape(3, 1000))

    async def serve(ep):
        got = cupy.empty((3, 1000), dtype=dtype)
        await ep.recv(got)
        await ep.send(got)
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    back = cupy.zeros_like(sent)
    await ep.send(sent)
    await ep.recv(back)
    assert bool((back == sent).all())
    await ep.close()
    listener.close()


async def test_producer_stream_is_synchronised():
    """Work queued on a non-blocking stream is finished before UCX reads the array (the
    interface's version 3 `stream`): the receiver sees the result, never the input."""
    n = 64 << 20

    async def serve(ep):
        got = cupy.empty(n // 4, dtype=cupy.float32)
        await ep.recv(got)
        await ep.send(got[:1024].copy())
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        x = cupy.ones(n // 4, dtype=cupy.float32)
        for _ in range(20):
            x = x * 2.0  # queued on `s`, likely still running when send starts
        await ep.send(x)
    back = cupy.empty(1024, dtype=cupy.float32)
    await ep.recv(back)
    assert bool((back == 2.0**20).all()), f"got {back[:4]}"
    await ep.close()
    listener.close()


async def test_recv_into_read_only_and_non_contiguous_refused():
    async def serve(ep):
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    strided = cupy.zeros(100, dtype=cupy.float64)[::2]
    with pytest.raises(ValueError, match="not contiguous"):
        await ep.send(strided)

    class ReadOnly:
        def __init__(self, a):
            cai = dict(a.__cuda_array_interface__)
            cai["data"] = (cai["data"][0], True)
            self.__cuda_array_interface__ = cai
            self.a = a

    with pytest.raises(ValueError, match="read-only"):
        await ep.recv(ReadOnly(cupy.zeros(8, dtype=cupy.uint8)))
    await ep.close()
    listener.close()


async def test_torch_tensors_by_interface_and_by_dlpack():
    torch = pytest.importorskip("torch")

    class OnlyDLPack:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            return self.t.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    async def serve(ep):
        got = torch.empty(1 << 18, dtype=torch.float32, device="cuda")
        await ep.recv(OnlyDLPack(got))
        await ep.send(got)  # the interface
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    sent = torch.arange(1 << 18, dtype=torch.float32, device="cuda") * 0.5
    back = torch.zeros_like(sent)
    await ep.send(OnlyDLPack(sent))
    await ep.recv(back)
    assert torch.equal(back, sent)
    await ep.close()
    listener.close()


async def test_multi_obj_and_am_with_device_arrays():
    frames = [cupy.asarray(pattern(17 * j + 1)) for j in range(4)]
    obj = cupy.asarray(pattern(100_003))

    async def serve(ep):
        got = await ep.recv_multi()
        await ep.send_multi(got)
        o = await ep.recv_obj(allocator=lambda n: cupy.empty(n, dtype=cupy.uint8))
        assert isinstance(o, cupy.ndarray)
        await ep.send_obj(o)
        a = await ep.am_recv()
        await ep.am_send(a)
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    await ep.send_multi(frames)
    back = await ep.recv_multi()
    for f, b in zip(frames, back):
        assert np.array_equal(f.get(), np.frombuffer(b, np.uint8))
    await ep.send_obj(obj)
    o = await ep.recv_obj(allocator=lambda n: cupy.empty(n, dtype=cupy.uint8))
    assert bool((o == obj).all())
    await ep.am_send(obj)
    a = await ep.am_recv()
    assert np.array_equal(np.frombuffer(a, np.uint8), obj.get())
    await ep.close()
    listener.close()


async def test_cancelled_device_receive_keeps_the_array_until_ucx_lets_go():
    import asyncio
    import gc

    async def serve(ep):
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    for _ in range(10):
        buf = cupy.empty(1 << 20, dtype=cupy.uint8)
        task = asyncio.ensure_future(ep.recv(buf, tag=77))
        await asyncio.sleep(0.001)
        task.cancel()
        del buf
        gc.collect()
        cupy.cuda.Device().synchronize()
    await ep.close()
    listener.close()
