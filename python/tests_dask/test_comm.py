"""The ``ucxrs://`` comm against Dask's comm contract, in the shape of distributed's
``comm/tests/test_comms.py``: round trips of every kind of message, closed comms detected
explicitly and implicitly, connect failures, many listeners, deserialisation on and off, repr
and addresses, and strangers that send garbage."""

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from distributed.comm import connect, listen, parse_address
from distributed.comm.core import CommClosedError
from distributed.comm.registry import get_backend
from distributed.protocol import Serialized, deserialize, serialize, to_serialize
from distributed.protocol.cuda import cuda_deserialize, cuda_serialize

import ucxrs
from ucxrs import _ucxrs
from ucxrs.distributed import UCXRS, UCXRSBackend


async def echo_server(deserialize=True, handler=None):
    """A listener whose comms echo every message until the peer closes."""

    async def echo(comm):
        try:
            while True:
                msg = await comm.read()
                await comm.write(msg)
        except CommClosedError:
            pass
        finally:
            await comm.close()

    listener = listen("ucxrs://127.0.0.1", handler or echo, deserialize=deserialize)
    await listener.start()
    return listener


async def serving_one():
    """A listener that hands its first comm to the test and then reads from it; a connected
    client comm; that comm's server side; and a future of how the server's read ended (the
    exception, or what it read)."""
    loop = asyncio.get_running_loop()
    peer, ended = loop.create_future(), loop.create_future()

    async def hold(comm):
        peer.set_result(comm)
        try:
            ended.set_result(await comm.read())
        except Exception as e:
            ended.set_result(e)

    listener = await echo_server(handler=hold)
    comm = await connect(listener.contact_address)
    return listener, comm, await asyncio.wait_for(peer, 30), ended


async def test_registered_by_entry_point():
    assert isinstance(get_backend("ucxrs"), UCXRSBackend)


@pytest.mark.parametrize(
    "msg",
    [
        {"op": "ping"},
        [1, 2.5, "three", None, b"four"],
        {"x": b"", "y": [b"a" * 10, {"nested": (1, 2)}]},
        {"data": b"\x00\xff" * 40_000},  # 80 KB: one large frame
        {"data": to_serialize(np.arange(1_000_000, dtype="f8"))},  # 8 MB, a same-host ring
        {"data": to_serialize(np.arange(20_000_000, dtype="i4"))},  # 80 MB: past the ring
        {"many": [to_serialize(np.full(10, i)) for i in range(300)]},
    ],
    ids=["dict", "list", "nested-bytes", "80KB", "8MB", "80MB", "300-frames"],
)
async def test_round_trip(msg):
    listener = await echo_server()
    comm = await connect(listener.contact_address)
    try:
        n = await comm.write(msg)
        assert n > 0
        back = await comm.read()
        assert _plain(back) == _plain(msg)
    finally:
        await comm.close()
        listener.stop()


def _plain(x):
    """A message with its arrays as lists (comparable with ==)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "data") and type(x).__name__ == "Serialize":
        x = x.data
    if isinstance(x, np.ndarray):
        return ("array", str(x.dtype), x.shape, x.tobytes()[:64], int(x.sum()))
    return x


async def test_received_arrays_are_writable():
    got = asyncio.get_running_loop().create_future()

    async def keep(comm):
        got.set_result(await comm.read())
        await comm.close()

    listener = await echo_server(handler=keep)
    comm = await connect(listener.contact_address)
    await comm.write({"a": to_serialize(np.arange(100_000, dtype="i8")), "b": b"x" * 70_000})
    msg = await asyncio.wait_for(got, 30)
    a = msg["a"]
    assert a.flags.writeable and a[-1] == 99_999
    a[:] = 7
    assert int(a.sum()) == 700_000
    await comm.close()
    listener.stop()


async def test_frames_are_one_message_and_writable():
    """Below Dask's framing: one send of many frames arrives as one list of writable frames."""
    listener = await _ucxrs.transport_listen("ucx://127.0.0.1:0")
    accept = asyncio.ensure_future(listener.accept())
    client = await _ucxrs.transport_connect(listener.address)
    server = await accept
    frames = [b"", b"small", bytearray(70_000), np.arange(500_000, dtype="u1"), memoryview(b"m" * 3)]
    assert await client.send(frames) == sum(memoryview(f).nbytes for f in frames)
    got = await server.recv()
    assert [bytes(f) for f in got] == [bytes(memoryview(f)) for f in frames]
    view = memoryview(got[3])
    assert not view.readonly
    view[0] = 255
    assert bytes(got[3])[0] == 255
    await client.close()
    with pytest.raises(ucxrs.UCXCloseError):
        await server.recv()
    assert server.closed and client.closed
    listener.close()


async def test_deserialize_off():
    listener = await echo_server(deserialize=False)
    comm = await connect(listener.contact_address, deserialize=False)
    x = np.arange(1000)
    await comm.write({"x": to_serialize(x)})
    back = await comm.read()
    assert isinstance(back["x"], Serialized)
    assert (deserialize(back["x"].header, back["x"].frames) == x).all()
    await comm.close()
    listener.stop()


async def test_serialized_objects_pass_through():
    listener = await echo_server(deserialize=False)
    comm = await connect(listener.contact_address)
    header, frames = serialize(np.ones(10))
    await comm.write({"s": Serialized(header, frames)})
    back = await comm.read()
    assert (back["s"] == 1).all()
    await comm.close()
    listener.stop()


async def test_closed_explicitly():
    listener = await echo_server()
    comm = await connect(listener.contact_address)
    await comm.write({"op": "x"})
    assert await comm.read() == {"op": "x"}
    await comm.close()
    assert comm.closed()
    with pytest.raises(CommClosedError):
        await comm.write({})
    with pytest.raises(CommClosedError):
        await comm.read()
    await comm.close()  # twice: nothing
    listener.stop()


async def test_closed_implicitly():
    """The server closes at once: the client finds out when it reads."""

    async def close_at_once(comm):
        await comm.close()

    listener = await echo_server(handler=close_at_once)
    comm = await connect(listener.contact_address)
    with pytest.raises(CommClosedError):
        await comm.write({})
        await comm.read()
    assert comm.closed()
    listener.stop()


async def test_abort_ends_the_peers_read():
    listener, comm, server_comm, ended = await serving_one()
    comm.abort()
    assert comm.closed()
    with pytest.raises(CommClosedError):
        await comm.read()
    for _ in range(200):
        if server_comm.closed():
            break
        await asyncio.sleep(0.05)
    assert server_comm.closed()
    assert isinstance(await asyncio.wait_for(ended, 30), CommClosedError)
    listener.stop()


async def test_comm_closed_on_read_error():
    """distributed's own check: a read that times out closes the comm."""
    listener, comm, server_comm, ended = await serving_one()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(comm.read(), 0.01)
    assert comm.closed()
    with pytest.raises(CommClosedError):
        await comm.read()
    assert isinstance(await asyncio.wait_for(ended, 30), CommClosedError)
    listener.stop()


async def test_a_read_cancelled_at_any_point_closes_the_comm():
    """Reads cancelled at every point of a large message's arrival and decoding (before it,
    during it, while Dask decodes it in a thread): each closes its comm, so that a pooled comm
    never hands a late reply to the next request; a read that finished first is whole."""
    big = np.arange(10_000_000, dtype="i8")  # 80 MB: past the rings, over UCX's rendezvous
    listener = await echo_server()
    cancelled = finished = 0
    for step in range(12):
        comm = await connect(listener.contact_address)
        await comm.write({"big": to_serialize(big)})
        reading = asyncio.ensure_future(comm.read())
        await asyncio.sleep(step * 0.004)
        if not reading.done():
            reading.cancel()
        try:
            back = await reading
        except asyncio.CancelledError:
            cancelled += 1
            assert comm.closed(), step
            with pytest.raises(CommClosedError):
                await comm.read()
        else:
            finished += 1
            assert (back["big"] == big).all(), step
            assert not comm.closed()
            await comm.close()
    assert cancelled > 0
    listener.stop()


@pytest.mark.parametrize("nbytes", [9_000_000, 32 << 20])
async def test_a_large_write_completes_before_the_peer_reads(nbytes):
    """As over TCP: a write completes whether or not the peer is reading (the bytes wait at
    the receiver, within its receive budget). Large frames go by UCX's rendezvous, which waits
    for a receive: the comm receives ahead once it idles. Then a second message, and the
    first read gets the first one, whole."""
    listener, comm, server_comm, ended = await serving_one_idle()
    first = np.arange(nbytes // 8, dtype="i8")
    await asyncio.wait_for(comm.write({"n": 1, "x": to_serialize(first)}), 30)
    await asyncio.wait_for(comm.write({"n": 2}), 30)
    got = await asyncio.wait_for(server_comm.read(), 30)
    assert got["n"] == 1
    np.testing.assert_array_equal(got["x"], first)
    assert (await asyncio.wait_for(server_comm.read(), 30))["n"] == 2
    await comm.close()
    await server_comm.close()
    listener.stop()


async def serving_one_idle():
    """Like ``serving_one``, but the server's comm is not read until the test reads it."""
    loop = asyncio.get_running_loop()
    peer = loop.create_future()

    async def hold(comm):
        peer.set_result(comm)

    listener = await echo_server(handler=hold)
    comm = await connect(listener.contact_address)
    return listener, comm, await asyncio.wait_for(peer, 30), None


async def test_a_closed_listeners_port_can_be_listened_on_again_at_once():
    """As with Dask's TCP comm: a scheduler restarted on its fixed port binds it at once,
    though the comms it accepted were closed a moment ago (their sockets in TIME_WAIT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for _ in range(2):
        accepted = asyncio.get_running_loop().create_future()

        async def hold(comm, accepted=accepted):
            accepted.set_result(comm)

        listener = listen(f"ucxrs://127.0.0.1:{port}", hold)
        await listener.start()
        comm = await connect(listener.contact_address)
        server_comm = await asyncio.wait_for(accepted, 30)
        await comm.write({"op": "ping"})
        assert (await asyncio.wait_for(server_comm.read(), 30)) == {"op": "ping"}
        # The server's side closes first, as a stopping scheduler's does: its accepted
        # socket is the one left in TIME_WAIT, on the listener's port.
        listener.stop()
        await server_comm.close()
        await comm.close()


DASK_CUDA_SETTINGS = """
import asyncio, json, os
import dask
os.environ["UCX_TCP_KEEPIDLE"] = "7s"  # set outside: wins over Dask's settings
dask.config.set({
    "distributed.comm.ucx.create-cuda-context": True,
    "distributed.comm.ucx.tcp": True,
    "distributed.comm.ucx.environment": {"tcp-keepidle": "9s", "keepalive-interval": "3s",
                                         "tls": "all"},
})
import ucxrs.distributed as d
calls = []
real_cuda, real_configure = d._ucxrs.cuda_context_before_ucx, d._ucxrs.transport_configure

def cuda(ordinal):
    calls.append(["cuda", ordinal, os.environ.get("UCX_TLS")])
    return real_cuda(ordinal)  # without a GPU: RuntimeError, which the comm logs

def configure(**kw):
    calls.append(["configure"])
    return real_configure(**kw)

d._ucxrs.cuda_context_before_ucx, d._ucxrs.transport_configure = cuda, configure
from distributed.comm import listen

async def main():
    async def nothing(comm):
        pass
    listener = listen("ucxrs://127.0.0.1", nothing)
    await listener.start()
    listener.stop()

asyncio.run(main())
keys = ["UCX_TLS", "UCX_SOCKADDR_TLS_PRIORITY", "UCX_TCP_KEEPIDLE", "UCX_KEEPALIVE_INTERVAL"]
print(json.dumps({"calls": calls, "env": {k: os.environ.get(k) for k in keys}}))
"""


def test_dask_cudas_ucx_settings_apply_before_ucx_starts():
    """What distributed-ucxx takes from Dask's UCX settings (dask-cuda writes them:
    ``distributed.comm.ucx.*``), in a fresh process: the switches become UCX_TLS (winning over
    ``environment``'s), ``environment`` becomes UCX variables, the process's own environment
    wins over both, and with ``create-cuda-context`` a CUDA context is made before UCX starts
    (here without a GPU: the attempt, in that order, and a warning)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_TLS", "UCX_TCP_KEEP"))}
    env.pop("UCX_KEEPALIVE_INTERVAL", None)
    env.pop("UCX_SOCKADDR_TLS_PRIORITY", None)
    run = subprocess.run(
        [sys.executable, "-c", DASK_CUDA_SETTINGS],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["calls"] == [["cuda", 0, "tcp"], ["configure"]], got
    assert got["env"] == {
        "UCX_TLS": "tcp",
        "UCX_SOCKADDR_TLS_PRIORITY": "tcp",
        "UCX_TCP_KEEPIDLE": "7s",
        "UCX_KEEPALIVE_INTERVAL": "3s",
    }, got
    assert "ignoring tls=all in ucx.environment" in run.stderr
    if not os.path.exists("/dev/nvidiactl"):
        assert "no CUDA context before UCX" in run.stderr


FAKE_RMM = r"""
class DeviceBuffer:
    made = []

    def __init__(self, *, size=0, ptr=None, stream=None, mr=None):
        assert ptr is None, "a receive buffer is allocated, not copied"
        self.size = size
        DeviceBuffer.made.append(size)
"""

RMM_CHOICE = r"""
import json, sys
import ucxrs.distributed as d
from ucxrs import _ucxrs
d._configure()
a = _ucxrs.device_frame_allocator()
out = {"allocator": a is not None}
if a is not None:
    import rmm
    b = a(12)
    out["made"] = [type(b).__module__ + "." + type(b).__name__, b.size, rmm.DeviceBuffer.made]
    d._configured = False
    d._configure()  # again: the allocator set is kept
    out["kept"] = _ucxrs.device_frame_allocator() is a
    try:
        d.receive_device_frames_with(5)
    except TypeError as e:
        out["not_callable"] = str(e)
    d.receive_device_frames_with(None)
    out["cleared"] = _ucxrs.device_frame_allocator() is None
print(json.dumps(out))
"""


@pytest.mark.parametrize("rmm", ["importable", "absent"])
def test_device_frames_land_in_rmm_memory_where_rmm_is_importable(rmm, tmp_path):
    """Received device frames are allocated as ``rmm.DeviceBuffer(size=n)`` where RMM is
    importable, as distributed-ucxx's are (Dask's RMM deserialiser takes nothing else, and
    dask-cuda's pool holds the memory); here with a fake RMM, in a fresh process (the frames
    themselves need a GPU: tests_dask/test_device.py there)."""
    if not _ucxrs.transport_device_frames():
        pytest.fail("the wheels are built with CUDA; this build has no device frames")
    # "absent": an rmm that cannot be imported shadows any installed one (UCXX's wheel
    # brings the real RMM into the venv).
    (tmp_path / "rmm").mkdir()
    (tmp_path / "rmm" / "__init__.py").write_text(
        FAKE_RMM if rmm == "importable" else 'raise ImportError("no RMM here")\n'
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run(
        [sys.executable, "-c", RMM_CHOICE], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    if rmm == "absent":
        assert got == {"allocator": False}, got
        return
    assert got["made"] == ["rmm.DeviceBuffer", 12, [12]], got
    assert got["kept"] and got["cleared"], got
    assert "callable" in got["not_callable"], got


async def test_connect_to_nobody_fails_within_the_timeout():
    # A port that nothing listens on (bound, then freed).
    listener = await echo_server()
    address = listener.contact_address
    listener.stop()
    await asyncio.sleep(0.1)
    with pytest.raises(OSError):
        await connect(address, timeout=2)


async def test_many_listeners():
    listeners = [await echo_server() for _ in range(10)]
    assert len({l.contact_address for l in listeners}) == 10
    comms = [await connect(l.contact_address) for l in listeners]
    for i, c in enumerate(comms):
        await c.write({"i": i})
    assert [await c.read() for c in comms] == [{"i": i} for i in range(10)]
    for c in comms:
        await c.close()
    for l in listeners:
        l.stop()


async def test_many_comms_to_one_listener():
    listener = await echo_server()
    comms = await asyncio.gather(*[connect(listener.contact_address) for _ in range(20)])
    await asyncio.gather(*[c.write({"i": i}) for i, c in enumerate(comms)])
    assert await asyncio.gather(*[c.read() for c in comms]) == [{"i": i} for i in range(20)]
    await asyncio.gather(*[c.close() for c in comms])
    listener.stop()


async def test_addresses_and_repr():
    listener = await echo_server()
    scheme, loc = parse_address(listener.listen_address)
    assert scheme == "ucxrs" and loc.startswith("127.0.0.1:")
    assert listener.contact_address == listener.listen_address
    comm = await connect(listener.contact_address)
    assert isinstance(comm, UCXRS)
    assert comm.peer_address == listener.contact_address
    # Both ends have addresses, as on Dask's TCP comm (a connecting comm had none before).
    assert comm.local_address.startswith("ucxrs://127.0.0.1:") and comm.same_host
    assert "ucxrs://" in repr(comm) and comm.local_address in repr(comm)
    assert comm.extra_info["same_host_rings"] == {"out": True, "in": True}
    await comm.close()
    listener.stop()

    wildcard = listen("ucxrs://0.0.0.0:0", None)
    await wildcard.start()
    assert wildcard.listen_address.startswith("ucxrs://0.0.0.0:")
    assert not wildcard.contact_address.startswith("ucxrs://0.0.0.0")
    wildcard.stop()

    backend = get_backend("ucxrs")
    assert backend.resolve_address("localhost:1234") == "127.0.0.1:1234"
    assert backend.get_address_host_port("10.1.2.3:99") == ("10.1.2.3", 99)
    assert backend.get_local_address_for("127.0.0.1:1") == "127.0.0.1"


async def test_server_side_addresses():
    listener, comm, server_comm, ended = await serving_one()
    assert server_comm.local_address == listener.contact_address
    assert server_comm.peer_address.startswith("ucxrs://127.0.0.1:")
    assert server_comm.same_host
    # Each end's local address is the other end's peer address (distributed's
    # check_client_server).
    assert comm.local_address == server_comm.peer_address
    assert comm.peer_address == server_comm.local_address
    await comm.close()
    listener.stop()


async def test_strangers_with_garbage_are_refused(caplog):
    """A raw UCX peer sending junk, and a transport peer sending frames that are not Dask's:
    each is refused, and the listener serves a Dask comm afterwards."""
    listener = await echo_server()
    host, port = listener.contact_address[len("ucxrs://") :].rsplit(":", 1)

    ep = await ucxrs.create_endpoint(host, int(port))
    await ep.send(np.frombuffer(b"\xde\xad\xbe\xef" * 64, dtype="u1"))
    await ep.close()

    caplog.set_level(logging.WARNING, logger="ucxrs.distributed")
    conn = await _ucxrs.transport_connect("ucx://" + host + ":" + port)
    await conn.send([b"\x93not msgpack at all", b"\xff" * 100])
    with pytest.raises(ucxrs.UCXError):
        for _ in range(5):  # the listener writes its handshake, then refuses ours
            await conn.recv()
    assert any("refused a connection" in r.getMessage() for r in caplog.records)

    comm = await connect(listener.contact_address)
    await comm.write({"still": "serving"})
    assert await comm.read() == {"still": "serving"}
    await comm.close()
    listener.stop()


async def test_bad_addresses():
    with pytest.raises(ValueError):
        await _ucxrs.transport_connect("nonsense")
    with pytest.raises(ValueError):
        await _ucxrs.transport_connect("ucx://127.0.0.1:1", timeout=-1)
    listener = await _ucxrs.transport_listen("ucx://127.0.0.1:0")
    accept = asyncio.ensure_future(listener.accept())
    client = await _ucxrs.transport_connect(listener.address)
    server = await accept
    with pytest.raises(TypeError):
        client.send([b"fine", 12])  # refused before anything is sent
    await client.send([b"fine"])
    assert [bytes(f) for f in await server.recv()] == [b"fine"]
    await client.close()
    listener.close()


async def test_a_forked_child_is_refused():
    """UCX's worker and the runtime's threads do not survive fork: a child forked after the
    transport was used gets an error that says so, not a hang."""
    import os

    listener = await _ucxrs.transport_listen("ucx://127.0.0.1:0")
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            _ucxrs.transport_connect(listener.address)
            code = 1
        except ucxrs.UCXError as e:
            code = 0 if "fork" in str(e) else 2
        finally:
            os._exit(code)
    for _ in range(300):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        await asyncio.sleep(0.1)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    assert os.waitstatus_to_exitcode(status) == 0
    listener.close()


class NotDeviceMemory:
    """Claims to be a device array, at an address no GPU has."""

    __cuda_array_interface__ = {
        "shape": (16,),
        "typestr": "|u1",
        "data": (0xDEAD0000, False),
        "version": 3,
    }
    nbytes = 16

    def __len__(self):
        return 16


async def test_a_frame_that_cannot_be_sent_leaves_the_comm_usable():
    """A frame the comm cannot send (here a device array that is not one: a build without
    CUDA refuses device arrays, one without a GPU cannot open it, one with a GPU does not know
    the address) raises from `write` with the reason, before anything is posted: the comm
    goes on."""
    listener = await echo_server()
    comm = await connect(listener.contact_address)
    header = {"serializer": "cuda", "compression": (False,)}
    with pytest.raises((TypeError, ValueError, RuntimeError)) as e:
        await comm.write({"x": Serialized(header, [NotDeviceMemory()])})
    assert "device" in str(e.value) or "CUDA" in str(e.value), e.value
    assert not comm.closed()
    await comm.write({"after": 1})
    assert await asyncio.wait_for(comm.read(), 30) == {"after": 1}
    await comm.close()
    listener.stop()


class OnDevice:
    """A type with a `cuda` serialiser (as CuPy's and cuDF's types have), whose frames are
    plain bytes here."""

    def __init__(self, payload):
        self.payload = payload


@cuda_serialize.register(OnDevice)
def _(x):
    return {}, [x.payload]


@cuda_deserialize.register(OnDevice)
def _(header, frames):
    return OnDevice(bytes(frames[0]))


async def test_device_serialisers_first_in_a_build_with_cuda():
    """A build with CUDA writes with Dask's `cuda` serialisers first (device objects then
    travel as device frames, as on distributed-ucxx's comm); one without keeps Dask's default
    (host serialisers, which would copy device objects through host memory)."""
    listener = await echo_server(deserialize=False)
    comm = await connect(listener.contact_address, deserialize=False)
    await comm.write({"x": to_serialize(OnDevice(b"abc"))})
    back = (await asyncio.wait_for(comm.read(), 30))["x"]
    assert isinstance(back, Serialized)
    want = "cuda" if _ucxrs.transport_device_frames() else "pickle"
    assert back.header["serializer"] == want, back.header
    await comm.close()
    listener.stop()
