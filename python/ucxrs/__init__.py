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

UCX comes from the libucx wheel (``ucxrs-cu12`` and ``ucxrs-cu13`` depend on it), or from a UCX
this process already loaded, or from the system (a build from source): ``ucxrs._load`` says
how, and ``python -m ucxrs`` prints what was found.
"""

from ._load import load as _load_ucx

_ucxrs = _load_ucx()  # UCX's libraries first, then the native module
__version__ = _ucxrs.__version__
#: The loaded UCX's version, as text (``"1.22.0"``).
__ucx_version__ = "%d.%d.%d" % _ucxrs.get_ucx_version()

from . import exceptions  # noqa: E402, F401
from .exceptions import (  # noqa: E402
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
from .core import (  # noqa: E402
    Endpoint,
    Listener,
    UCXAddress,
    create_endpoint,
    create_endpoint_from_worker_address,
    create_listener,
    cuda_support,
    get_active_transports,
    get_address,
    get_config,
    get_ucp_context_info,
    get_ucp_worker_info,
    get_ucx_address_from_buffer,
    get_ucx_version,
    get_worker_address,
    init,
    progress,
    progress_mode,
    recv,
    reset,
    stop_notifier_thread,
    ucx_library,
)

__all__ = [
    "__ucx_version__",
    "__version__",
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
    "get_active_transports",
    "get_address",
    "get_config",
    "get_ucp_context_info",
    "get_ucp_worker_info",
    "get_ucx_address_from_buffer",
    "get_ucx_version",
    "get_worker_address",
    "init",
    "progress",
    "progress_mode",
    "recv",
    "reset",
    "stop_notifier_thread",
    "ucx_library",
]
