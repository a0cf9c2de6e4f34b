"""The seed's "Send/Recv with CuPy" (UCX-Py's server and client), written for ucxrs.

    python send_recv.py server [--port P]         # waits for one client, echoes its array + 1
    python send_recv.py client --port P [--host H]
    python send_recv.py                           # both: a server process and a client

With NumPy arrays (host memory). `--cupy` uses CuPy arrays, as the seed does: it needs a GPU, CuPy
and ucxrs built with `--features cuda` (docs/python.md).
"""

import argparse
import asyncio
import subprocess
import sys

import numpy as np

import ucxrs

N_BYTES = 2**20


def array_module(cupy):
    if cupy:
        import cupy as xp

        return xp
    return np


async def server(port, xp):
    done = asyncio.Event()

    async def send(ep):
        # recv buffer
        arr = xp.empty(N_BYTES, dtype="u1")
        await ep.recv(arr)
        assert int(xp.count_nonzero(arr)) == 0
        print("Received array", flush=True)

        # increment array and send back
        arr += 1
        print("Sending incremented array", flush=True)
        await ep.send(arr)
        await ep.close()
        done.set()

    lf = ucxrs.create_listener(send, port)
    print(f"LISTENING {lf.port}", flush=True)
    await asyncio.wait_for(done.wait(), 120)
    lf.close()


async def client(host, port, xp):
    ep = await ucxrs.create_endpoint(host, port)
    msg = xp.zeros(N_BYTES, dtype="u1")  # data to send

    # send message
    print("Send original array", flush=True)
    await ep.send(msg)  # send the real message

    # recv response
    print("Receive incremented array", flush=True)
    resp = xp.empty_like(msg)
    await ep.recv(resp)  # receive the echo
    await ep.close()
    assert bool((msg + 1 == resp).all()), "the echo is not the array + 1"
    print("The echo is the array + 1", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", nargs="?", choices=["server", "client", "both"], default="both")
    ap.add_argument("--host", default=None, help="default: ucxrs.get_address()")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--cupy", action="store_true")
    a = ap.parse_args()
    xp = array_module(a.cupy)
    host = a.host or ucxrs.get_address()
    if a.role == "server":
        asyncio.run(server(a.port, xp))
    elif a.role == "client":
        asyncio.run(client(host, a.port, xp))
    else:
        cmd = [sys.executable, __file__, "server"] + (["--cupy"] if a.cupy else [])
        srv = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            # UCX prints its warnings on stdout too: the port is on the LISTENING line.
            for line in srv.stdout:
                if line.startswith("LISTENING "):
                    break
                print(f"  server: {line}", end="")
            else:
                sys.exit(f"the server exited before listening ({srv.wait()})")
            asyncio.run(client(host, int(line.split()[1]), xp))
            for rest in srv.stdout:
                print(f"  server: {rest}", end="")
            if srv.wait(timeout=60) != 0:
                sys.exit(f"the server failed ({srv.returncode})")
        finally:
            srv.kill()
            srv.wait()


if __name__ == "__main__":
    main()
