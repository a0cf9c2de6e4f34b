"""Endpoints from worker addresses, without a listener: to this process's own worker, and
between two processes that exchange addresses out of band; altered addresses refused."""

import asyncio
import pickle
import subprocess
import sys

import numpy as np
import pytest

import ucxrs

CHILD = r"""
import asyncio, sys, numpy as np, ucxrs
async def main():
    print(ucxrs.get_worker_address().address.hex(), flush=True)
    ep = await ucxrs.create_endpoint_from_worker_address(bytes.fromhex(sys.argv[1]))
    a = np.arange(100_000, dtype=np.int64)
    await ep.send(a, tag=7)
    back = np.empty_like(a)
    await ep.recv(back, tag=8)
    assert (back == a + 1).all(), "the reply is not the array + 1"
    await ep.close()
    print("CHILD OK", flush=True)
asyncio.run(main())
"""


SLEEPER = r"""
import sys, ucxrs
print(ucxrs.get_worker_address().address.hex(), flush=True)
sys.stdin.read()
"""


def test_the_address_pickles_and_compares():
    addr = ucxrs.get_worker_address()
    assert isinstance(addr, ucxrs.UCXAddress) and len(addr) == addr.length > 26
    again = pickle.loads(pickle.dumps(addr))
    assert again == addr and bytes(again) == addr.address
    assert ucxrs.get_ucx_address_from_buffer(addr.address) == addr


async def test_the_address_travels_as_a_buffer():
    """UCXX's users send the address itself (``ep.send(addr)``, ``send_obj(addr)``): it is a
    buffer, and the bytes received make the same address."""

    async def serve(ep):
        got = await ep.recv_obj()
        await ep.send_obj(got)
        await ep.close()

    listener = ucxrs.create_listener(serve)
    ep = await ucxrs.create_endpoint("127.0.0.1", listener.port)
    addr = ucxrs.get_worker_address()
    assert memoryview(addr).nbytes == len(addr)
    await ep.send_obj(addr)
    back = await ep.recv_obj()
    assert ucxrs.get_ucx_address_from_buffer(back) == addr
    await ep.close()
    listener.close()


async def test_an_endpoint_to_our_own_worker():
    ep = await ucxrs.create_endpoint_from_worker_address(ucxrs.get_worker_address())
    sent = np.arange(1 << 16, dtype=np.float32)
    got = np.empty_like(sent)
    recv = asyncio.ensure_future(ep.recv(got, tag=3))
    await ep.send(sent, tag=3)
    await recv
    assert (got == sent).all()
    await ep.close()


@pytest.mark.parametrize("how", ["truncated", "flipped", "extended", "raw", "empty"])
async def test_altered_addresses_are_refused(how):
    good = ucxrs.get_worker_address().address
    bad = {
        "truncated": good[:-1],
        "flipped": good[:40] + bytes([good[40] ^ 1]) + good[41:],
        "extended": good + b"\0",
        "raw": good[26:],  # UCX's bytes without the seal, as UCXX passes them
        "empty": b"",
    }[how]
    with pytest.raises(ucxrs.UCXError, match="not a usable worker address"):
        await ucxrs.create_endpoint_from_worker_address(bad)


async def test_two_processes_by_address():
    me = ucxrs.get_worker_address()
    child = subprocess.Popen([sys.executable, "-c", CHILD, me.address.hex()], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().strip()
        while line and not all(c in "0123456789abcdef" for c in line):  # UCX may print warnings
            line = child.stdout.readline().strip()
        ep = await ucxrs.create_endpoint_from_worker_address(bytes.fromhex(line))
        got = np.empty(100_000, dtype=np.int64)
        await asyncio.wait_for(ep.recv(got, tag=7), 60)
        await ep.send(got + 1, tag=8)
        assert child.stdout.readline().strip() == "CHILD OK"
        assert child.wait(timeout=60) == 0
        await ep.close()
    finally:
        child.kill()
        child.wait()


async def test_a_killed_peer_process_ends_the_endpoint():
    """A peer process killed (and reaped) ends an endpoint made from its worker address, over
    shared memory too: UCX's keepalive checks the peer's process (1 s here, the package's
    default). What it cannot see is a peer that is a zombie not yet reaped, or one that
    destroyed its worker and lives on (docs/ucx-notes.md)."""
    child = subprocess.Popen(
        [sys.executable, "-c", SLEEPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        line = child.stdout.readline().strip()
        while line and not all(c in "0123456789abcdef" for c in line):  # UCX may print warnings
            line = child.stdout.readline().strip()
        ep = await ucxrs.create_endpoint_from_worker_address(bytes.fromhex(line))
        await asyncio.wait_for(ep.send(np.arange(10), tag=1, force_tag=True), 30)
        assert ep.alive
        pending = asyncio.ensure_future(ep.recv(np.empty(10), tag=2, force_tag=True))
        child.kill()
        child.wait(timeout=30)
        for _ in range(300):  # bounded: 30 s
            if not ep.alive:
                break
            await asyncio.sleep(0.1)
        assert not ep.alive, "the endpoint outlived its killed peer by 30 s"
        with pytest.raises(ucxrs.exceptions.UCXError):
            await asyncio.wait_for(pending, 30)
        await ep.close()
    finally:
        child.kill()
        child.wait()
