"""Array protocols beyond the buffer protocol: DLPack (PyTorch tensors, JAX) taken over and
handed back, device arrays refused clearly where this build or machine cannot move them, and
`recv_obj` into what an allocator makes. Device arrays on a GPU: test_device.py."""

import gc
import sys

import numpy as np
import pytest

import ucxrs
from helpers import echo_pair, until_peer_closes


class OnlyDLPack:
    """An array that offers DLPack alone (as a PyTorch CPU tensor does: no buffer protocol)."""

    def __init__(self, a):
        self.a = a
        self.exported = 0

    def __dlpack__(self, stream=None):
        self.exported += 1
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class FakeDeviceArray:
    """Claims device memory that no GPU holds."""

    def __init__(self, n):
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": "|u1",
            "data": (0x7F0000000000, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


@pytest.mark.parametrize("dtype", ["u1", "f4", "c16"])
async def test_dlpack_send_and_recv(dtype):
    sent = (np.arange(1000) % 97).astype(dtype).reshape(10, 100)
    into = np.zeros_like(sent)

    async def serve(ep):
        got = np.empty_like(sent)
        await ep.recv(OnlyDLPack(got))
        await ep.send(OnlyDLPack(got))
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    src, dst = OnlyDLPack(sent), OnlyDLPack(into)
    await ep.send(src)
    await ep.recv(dst)
    assert src.exported == 1 and dst.exported == 1
    assert (into == sent).all()
    await ep.close()
    listener.close()


async def test_dlpack_tensor_is_handed_back():
    """The deleter runs once UCX is done: the array's export count drops back."""
    a = np.arange(4096, dtype=np.uint8)

    async def serve(ep):
        for _ in range(3):
            await ep.recv(bytearray(4096))
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    gc.collect()
    base_refs = sys.getrefcount(a)
    for _ in range(3):
        await ep.send(OnlyDLPack(a))
    gc.collect()
    assert sys.getrefcount(a) == base_refs, "the DLPack tensor still holds the array"
    await ep.close()
    listener.close()


async def test_dlpack_refuses_non_contiguous():
    a = np.arange(100, dtype=np.float64)[::2]

    async def serve(ep):
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    with pytest.raises(ValueError, match="not contiguous"):
        await ep.send(OnlyDLPack(a))
    await ep.close()
    listener.close()


async def test_neither_protocol_is_a_type_error():
    async def serve(ep):
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    with pytest.raises(TypeError, match="buffer protocol"):
        await ep.send(object())
    with pytest.raises(TypeError, match="buffer protocol"):
        await ep.recv(12)
    await ep.close()
    listener.close()


async def test_device_array_refused_clearly_without_a_gpu():
    if ucxrs.cuda_support() in ("zero-copy", "staged"):
        pytest.skip("this machine can move device arrays: test_device.py covers them")

    async def serve(ep):
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    with pytest.raises((TypeError, RuntimeError, ValueError), match="CUDA|GPU|device"):
        await ep.send(FakeDeviceArray(16))
    await ep.close()
    listener.close()


async def test_recv_obj_into_an_allocator():
    payload = bytes(range(256)) * 300

    async def serve(ep):
        await ep.send_obj(payload)
        await ep.send_obj(b"")
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    got = await ep.recv_obj(allocator=lambda n: np.empty(n, dtype=np.uint8))
    assert isinstance(got, np.ndarray) and got.tobytes() == payload
    empty = await ep.recv_obj(allocator=lambda n: np.empty(n, dtype=np.uint8))
    assert empty.size == 0
    await ep.close()
    listener.close()


async def test_recv_obj_refuses_an_announcement_past_the_limit():
    async def serve(ep):
        # What a peer announcing 2**62 bytes sends: the header alone.
        await ep.send(np.array([1 << 62], dtype=np.uint64))
        await until_peer_closes(ep)

    listener, ep = await echo_pair(serve)
    with pytest.raises(ucxrs.UCXError, match="limit"):
        await ep.recv_obj(allocator=lambda n: np.empty(n, dtype=np.uint8))
    await ep.close()
    listener.close()
