#!/usr/bin/env python3
"""A real UCXX (PyPI ucxx-cu12/-cu13) peer for the interop tests against `ucxx-peer` (Rust),
and, with `--module ucxrs`, the same script over our Python package (python/, UCXX's API), for
the interop tests of that package against real UCXX.

Roles:
  server                       listen, print "LISTENING <port>", answer one client (responder)
  client --port P              connect to 127.0.0.1:P and drive the script (initiator)
  bad-handshake --port P       connect, receive the listener's 16 handshake bytes, answer with
                               a wrong checksum, and exit
Options: --closer client|server (who closes at the end; the other side's pending receive must
fail), --steps tagless,tags,forced,obj,multi,am (default all), --memory host|cuda (cuda: CuPy),
--module ucxx|ucxrs (the module that speaks UCXX's API: real UCXX, default, or ours).

The script, initiator side (the responder mirrors it):
  tagless  uint8 arrays of 1 B .. 16 MiB and a float64 array: send with no tag, receive the echo
  tags     for each tag t of TAGS: send t as i64 on tag t, in reverse order; receive each echo
  forced   a message on the raw tag 0xC0FFEE, echoed on raw tag 0xC0FFEE + 1
  obj      send_obj of 100,000 bytes, echoed with send_obj
  multi    send_multi of 1, 3 and 150 frames, echoed with send_multi
  am       am_send of 100 B and 1 MiB, echoed with am_send
  close    the closer closes its endpoint; the other side's pending receive must fail
Exit status 0 when every step checked out; prints "OK <step>" per step.
"""
import argparse
import asyncio
import importlib
import struct
import sys

import numpy as np

ucxx = None  # the module --module names (UCXX's API), imported in main()

SIZES = [1, 1000, 65536, 16 << 20]
TAGS = [0, 1, 12345, -1, -123456789, 2**61 - 2, 2**63 + 5, -(2**70)]
# (-2 is left out: Python hashes -1 and -2 alike, so UCXX gives them the same wire tag.)
FORCED = 0xC0FFEE
MULTI = [1, 3, 150]
AM_SIZES = [100, 1 << 20]
STEP_TIMEOUT = 60


def xp(memory):
    if memory == "cuda":
        import cupy

        return cupy
    return np


def data(n, seed):
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed) % 251).astype(np.uint8)


def same(a, b):
    a = a.get() if hasattr(a, "get") else np.asarray(a)
    b = b.get() if hasattr(b, "get") else np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())


def as_u8(buf):
    if hasattr(buf, "__cuda_array_interface__"):
        import cupy

        return cupy.asarray(buf).view(cupy.uint8).ravel()
    return np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)


async def initiator(ep, steps, memory):
    m = xp(memory)
    if "tagless" in steps:
        for i, n in enumerate(SIZES):
            out = m.asarray(data(n, i))
            back = m.empty(n, dtype=m.uint8)
            await ep.send(out)
            await ep.recv(back)
            assert same(out, back), f"tagless {n} B differs"
        out = m.linspace(-1.5, 2.5e9, 4099, dtype=m.float64)
        back = m.empty_like(out)
        await ep.send(out)
        await ep.recv(back)
        assert same(out, back), "float64 differs"
        print("OK tagless", flush=True)
    if "tags" in steps:
        for t in reversed(TAGS):
            await ep.send(np.array([t & ((1 << 64) - 1)], dtype=np.uint64), tag=t)
        for t in TAGS:
            back = np.empty(1, dtype=np.uint64)
            await ep.recv(back, tag=t)
            assert int(back[0]) == (t & ((1 << 64) - 1)) ^ 0xFF, f"tag {t}: got {int(back[0])}"
        print("OK tags", flush=True)
    if "forced" in steps:
        out = data(4096, 7)
        await ep.send(out, tag=FORCED, force_tag=True)
        back = np.empty(4096, dtype=np.uint8)
        await ep.recv(back, tag=FORCED + 1, force_tag=True)
        assert same(out, back), "forced tag echo differs"
        print("OK forced", flush=True)
    if "obj" in steps:
        out = bytes(data(100_000, 3))
        await ep.send_obj(out)
        back = await ep.recv_obj()
        assert bytes(back) == out, "obj differs"
        print("OK obj", flush=True)
    if "multi" in steps:
        for k in MULTI:
            frames = [m.asarray(data(17 * j + 1, j)) for j in range(k)]
            await ep.send_multi(frames)
            back = await ep.recv_multi()
            assert len(back) == k, f"multi {k}: {len(back)} frames came back"
            for f, b in zip(frames, back):
                assert same(f, as_u8(b)), f"multi {k}: a frame differs"
        print("OK multi", flush=True)
    if "am" in steps:
        for n in AM_SIZES:
            out = data(n, 11)
            await ep.am_send(out)
            back = await ep.am_recv()
            assert same(out, as_u8(back)), f"am {n} differs"
        print("OK am", flush=True)


async def responder(ep, steps, memory):
    m = xp(memory)
    if "tagless" in steps:
        for n in SIZES:
            buf = m.empty(n, dtype=m.uint8)
            await ep.recv(buf)
            await ep.send(buf)
        buf = m.empty(4099, dtype=m.float64)
        await ep.recv(buf)
        await ep.send(buf)
        print("OK tagless", flush=True)
    if "tags" in steps:
        for t in TAGS:
            buf = np.empty(1, dtype=np.uint64)
            await ep.recv(buf, tag=t)
            assert int(buf[0]) == t & ((1 << 64) - 1), f"tag {t}: got {int(buf[0])}"
            await ep.send(buf ^ np.uint64(0xFF), tag=t)
        print("OK tags", flush=True)
    if "forced" in steps:
        buf = np.empty(4096, dtype=np.uint8)
        await ep.recv(buf, tag=FORCED, force_tag=True)
        await ep.send(buf, tag=FORCED + 1, force_tag=True)
        print("OK forced", flush=True)
    if "obj" in steps:
        obj = await ep.recv_obj()
        await ep.send_obj(obj)
        print("OK obj", flush=True)
    if "multi" in steps:
        for k in MULTI:
            frames = await ep.recv_multi()
            assert len(frames) == k, f"multi: {len(frames)} frames, expected {k}"
            await ep.send_multi(list(frames))
        print("OK multi", flush=True)
    if "am" in steps:
        for _ in AM_SIZES:
            buf = await ep.am_recv()
            await ep.am_send(buf)
        print("OK am", flush=True)


async def finish(ep, closer, me):
    """The closer closes; the other side's pending receive must fail."""
    if closer == me:
        # Let the peer post its receive first.
        await asyncio.sleep(0.5)
        await ep.close()
        print("OK close (closed)", flush=True)
        return
    try:
        await asyncio.wait_for(ep.recv(np.empty(8, dtype=np.uint8)), STEP_TIMEOUT)
    except asyncio.TimeoutError:
        raise AssertionError("pending receive still waiting after the peer closed")
    except Exception as e:  # UCXX raises its own error types for a closed peer
        print(f"OK close (pending receive failed: {type(e).__name__})", flush=True)
        return
    raise AssertionError("pending receive completed after the peer closed")


async def run_server(a):
    done = asyncio.get_running_loop().create_future()

    async def handler(ep):
        try:
            await asyncio.wait_for(responder(ep, a.steps, a.memory), STEP_TIMEOUT * 4)
            await finish(ep, a.closer, "server")
            done.set_result(None)
        except BaseException as e:
            done.set_exception(e)

    listener = ucxx.create_listener(handler)
    print(f"LISTENING {listener.port}", flush=True)
    await asyncio.wait_for(done, STEP_TIMEOUT * 5)
    listener.close()


async def run_client(a):
    ep = await ucxx.create_endpoint("127.0.0.1", a.port)
    await asyncio.wait_for(initiator(ep, a.steps, a.memory), STEP_TIMEOUT * 4)
    await finish(ep, a.closer, "client")


async def run_bad_handshake(a):
    from ucxx._lib import libucxx as ucx_api
    from ucxx._lib.arr import Array

    ctx = ucxx.core._get_ctx()
    ctx.continuous_ucx_progress()
    ep = ucx_api.UCXEndpoint.create(ctx.worker, "127.0.0.1", a.port, True)
    theirs = bytearray(16)
    await asyncio.wait_for(ep.stream_recv(Array(theirs)).wait(), 10)
    tag, _ = struct.unpack("QQ", theirs)
    mine = Array(bytearray(struct.pack("QQ", 0x1234, 0xBAD)))
    await asyncio.wait_for(ep.stream_send(mine).wait(), 10)
    print("OK bad-handshake sent", flush=True)
    await asyncio.sleep(0.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["server", "client", "bad-handshake"])
    ap.add_argument("--port", type=int)
    ap.add_argument("--closer", choices=["client", "server"], default="client")
    ap.add_argument("--steps", default="tagless,tags,forced,obj,multi,am")
    ap.add_argument("--memory", choices=["host", "cuda"], default="host")
    ap.add_argument("--module", choices=["ucxx", "ucxrs"], default="ucxx")
    a = ap.parse_args()
    global ucxx
    ucxx = importlib.import_module(a.module)
    a.steps = set(a.steps.split(",")) if a.steps else set()
    run = {"server": run_server, "client": run_client, "bad-handshake": run_bad_handshake}[a.role]
    try:
        asyncio.run(run(a))
    except AssertionError as e:
        print(f"FAIL {e}", flush=True)
        sys.exit(1)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
