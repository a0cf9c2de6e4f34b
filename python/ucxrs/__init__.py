"""ucxrs: UCXX's asyncio API over ucx-rs.

Code written for UCXX (``import ucxx``) runs with ``import ucxrs as ucxx``: the same module
functions, ``Endpoint`` and ``Listener`` methods and exceptions, and UCXX's wire format, so a
program using this package talks to one using UCXX. Rust does the work (``ucxrs._ucxrs``);
buffers (anything with the buffer protocol: NumPy arrays, ``bytearray``, ``memoryview``;
device arrays through ``__cuda_array_interface__`` or DLPack: CuPy, PyTorch) are lent to UCX
without copies and stay pinned until UCX has let go of them.

>>> import asyncio, ucxrs
>>> async def main():
...     async def serve(ep):
...         buf = bytearray(5)
...         await ep.recv(buf)
...         await ep.send(buf)
...         await ep.close()
...     listener = ucxrs.create_listener(serve)
...     ep = await ucxrs.create_endpoint("127.0.0.1", listener.port)
...     await ep.send(b"hello")
...     got = bytearray(5)
...     await ep.recv(got)
...     await ep.close()
...     listener.close()
...     return bytes(got)
>>> asyncio.run(main())
b'hello'
"""

from .exceptions import (
    UCXCanceled,
    UCXCanceledError,
    UCXCloseError,
    UCXConfigError,
    UCXConnectionResetError,
    UCXError,
    UCXMessageTruncatedError,
    UCXNotConnectedError,
    UCXTimedOutError,
    UCXUnreachableError,
)
from .core import (
    Endpoint,
    Listener,
    UCXAddress,
    create_endpoint,
    create_endpoint_from_worker_address,
    create_listener,
    cuda_support,
    get_address,
    get_config,
    get_ucx_address_from_buffer,
    get_ucx_version,
    get_worker_address,
    init,
    progress,
    progress_mode,
    reset,
    ucx_library,
)

__all__ = [
    "Endpoint",
    "Listener",
    "UCXAddress",
    "UCXCanceled",
    "UCXCanceledError",
    "UCXCloseError",
    "UCXConfigError",
    "UCXConnectionResetError",
    "UCXError",
    "UCXMessageTruncatedError",
    "UCXNotConnectedError",
    "UCXTimedOutError",
    "UCXUnreachableError",
    "create_endpoint",
    "create_endpoint_from_worker_address",
    "create_listener",
    "cuda_support",
    "get_address",
    "get_config",
    "get_ucx_address_from_buffer",
    "get_ucx_version",
    "get_worker_address",
    "init",
    "progress",
    "progress_mode",
    "reset",
    "ucx_library",
]
