"""Dask ``distributed``'s comm backend over our transport: the ``ucxrs://`` scheme.

Installed with the package, it is registered under the entry-point group
``distributed.comm.backends``, so stock Dask finds it by its scheme::

    LocalCluster(protocol="ucxrs")            # or: dask scheduler --protocol ucxrs
    Client("ucxrs://10.0.0.1:8786")           #     dask worker ucxrs://10.0.0.1:8786

Each Dask message (a list of frames from ``to_frames``) is one message of ``transport``'s
``ucx://`` connection: one await and one crossing into Rust, the frames lent without copies
(UCXX's comm sends three messages per Dask message: count, sizes, frames). On one host, large
frames go through the connection's same-host rings (docs/transport.md). Received frames are
writable buffers of their own. A closed, aborted, failed or garbled connection raises
``CommClosedError``, as Dask's TCP comm does. In a build with CUDA (``--features cuda``),
device objects (CuPy arrays, cuDF frames: Dask's ``cuda`` serialisers) travel as device frames,
lent without copies and received into device memory (``DeviceFrame``s); see docs/dask.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref

import dask
import dask.utils

from distributed.comm.addressing import parse_host_port, unparse_host_port
from distributed.comm.core import BaseListener, Comm, CommClosedError, Connector
from distributed.comm.registry import Backend
from distributed.comm.utils import ensure_concrete_host, from_frames, to_frames
from distributed.utils import ensure_ip, get_ip, get_ipv6

from . import _ucxrs
from ._ucxrs import UCXConfigError, UCXError

logger = logging.getLogger("ucxrs.distributed")

PREFIX = "ucxrs://"
# The transport's own scheme for what Dask calls ucxrs://.
_TRANSPORT = "ucx://"


_configured = False


def _configure():
    """Applies Dask's ``distributed.comm.ucxrs`` settings once, before the first connection:
    ``progress-mode`` (``loop``, the default: the event loop progresses the transport's UCX
    worker, watching its event fd; ``thread``: UCX's progress thread; ``blocking``) and
    ``same-host-ring`` (bytes of each connection's same-host ring, 0 for none; 16 MiB by
    default). Also from the environment: ``DASK_DISTRIBUTED__COMM__UCXRS__PROGRESS_MODE``,
    ``DASK_DISTRIBUTED__COMM__UCXRS__SAME_HOST_RING``. ``max-message`` (bytes of one message,
    4 GiB by default) applies to each connection.

    And what distributed-ucxx takes from Dask's UCX settings (``distributed-ucxx.*``, or
    ``distributed.comm.ucx.*``: dask-cuda's): the UCX variables of ``ucx_environment()``, and,
    with ``create-cuda-context`` (or CUDA in ``UCX_TLS``), a CUDA context on the first visible
    GPU made current before UCX starts."""
    global _configured
    if _configured:
        return
    # UCX reads these from the environment when the transport starts it: Dask's UCX settings
    # (dask-cuda's), then ours; what the environment already has wins.
    for key, value in ucx_environment().items():
        os.environ.setdefault(key, str(value))
    # A listener's port can be bound again as soon as it and its comms closed, as with Dask's
    # TCP comm (SO_REUSEADDR): a scheduler restarted on its fixed port, a test-suite reusing
    # ports. UCX's default keeps it through the TIME_WAIT of the accepted connections ("Device
    # is busy"), and UCX reads this setting only from the environment.
    os.environ.setdefault("UCX_TCP_CM_REUSEADDR", "y")
    tls = os.environ.get("UCX_TLS", "")
    if _ucx_setting("create-cuda-context") is True or ("cuda" in tls and "^cuda" not in tls):
        # Before UCX starts, as distributed-ucxx does: UCX looks for a current CUDA context
        # when it starts, to use CUDA's transports. The first visible GPU (dask-cuda gives
        # each worker its own as CUDA_VISIBLE_DEVICES' first).
        try:
            _ucxrs.cuda_context_before_ucx(0)
        except RuntimeError as e:
            logger.warning("ucxrs: no CUDA context before UCX (%s): device frames go staged", e)
    if _ucxrs.transport_device_frames():
        _receive_device_frames_into_rmm()
    progress = dask.config.get("distributed.comm.ucxrs.progress-mode", default="loop")
    ring = _bytes_setting("same-host-ring")
    try:
        logger.debug("ucxrs: %s", _ucxrs.transport_configure(progress=progress, same_host_ring=ring))
    except UCXConfigError as e:
        # The transport ran before in this process (its default, or another configuration):
        # it keeps what it has.
        logger.warning("ucxrs: the Dask settings are not applied: %s", e)
    _configured = True


def _receive_device_frames_into_rmm():
    """Where RMM is importable, received device frames become ``rmm.DeviceBuffer``s from RMM's
    current memory resource (dask-cuda's pool, where it made one), as distributed-ucxx
    receives them: Dask's deserialiser of RMM buffers takes nothing else, and the memory is
    then the pool's rather than memory beside it. An allocator given before (with
    ``receive_device_frames_with``) is kept. Returns whether frames land in RMM's memory."""
    if _ucxrs.device_frame_allocator() is not None:
        return True
    try:
        import rmm
    except Exception as e:  # not installed, or no CUDA for it
        logger.debug("ucxrs: device frames are received into the transport's memory (RMM: %s)", e)
        return False
    device_buffer = rmm.DeviceBuffer
    _ucxrs.receive_device_frames_with(lambda nbytes: device_buffer(size=nbytes))
    logger.debug("ucxrs: device frames are received into RMM's memory")
    return True


def receive_device_frames_with(allocate):
    """Receives device frames into ``allocate(nbytes)`` from now on: an object that exports
    ``__cuda_array_interface__`` with at least ``nbytes`` writable bytes, which the received
    message then holds (``None``: the transport's own device memory, ``DeviceFrame``s). The
    comm sets RMM's ``DeviceBuffer`` where RMM is importable. ``allocate`` runs on the
    transport's thread with the landing GPU current, once per device frame; an exception
    ends the connection the frame came on. Needs a build with CUDA (the wheels)."""
    if not _ucxrs.transport_device_frames():
        raise RuntimeError("this ucxrs was built without CUDA (--features cuda): it has no device frames")
    _ucxrs.receive_device_frames_with(allocate)


def _ucx_setting(key, default=None):
    """Dask's UCX setting ``key``, as distributed-ucxx reads it (and dask-cuda writes it):
    ``distributed-ucxx.<key>``, else ``distributed.comm.ucx.<key>``."""
    value = dask.config.get(f"distributed-ucxx.{key}", default=None)
    if value is not None:
        return value
    return dask.config.get(f"distributed.comm.ucx.{key}", default=default)


def ucx_environment():
    """The UCX variables Dask's UCX settings ask for, as distributed-ucxx derives them: from the
    high-level switches (``tcp``, ``nvlink``, ``infiniband``, ``rdmacm``, ``cuda-copy``: what
    dask-cuda's ``--enable-*`` options set) ``UCX_TLS`` and ``UCX_SOCKADDR_TLS_PRIORITY``, and
    from ``environment`` (``{"some-name": value}``) ``UCX_SOME_NAME``; the switches win over
    ``environment``. ``_configure`` puts them in the environment unless it has them."""
    found = {}
    if any(_ucx_setting(k) for k in ("tcp", "nvlink", "infiniband")):
        tls, priority = "tcp", "rdmacm" if _ucx_setting("rdmacm") else "tcp"
        if _ucx_setting("nvlink") or _ucx_setting("cuda-copy"):
            tls += ",cuda_copy"
        if _ucx_setting("infiniband"):
            tls = "rc," + tls
        if _ucx_setting("nvlink"):
            tls += ",cuda_ipc"
        found = {"UCX_TLS": tls, "UCX_SOCKADDR_TLS_PRIORITY": priority}
    for k, v in (_ucx_setting("environment", default={}) or {}).items():
        key = "_".join(map(str.upper, ("UCX", *str(k).split("-"))))
        if key in found:
            logger.warning(
                "ucxrs: ignoring %s=%s in ucx.environment: %s=%s from the switches",
                k,
                v,
                key,
                found[key],
            )
        else:
            found[key] = v
    return found


def _bytes_setting(name):
    value = dask.config.get(f"distributed.comm.ucxrs.{name}", default=None)
    if value is None:
        return None
    return dask.utils.parse_bytes(value) if isinstance(value, str) else int(value)


def _to_transport(host, port):
    return _TRANSPORT + unparse_host_port(host or "0.0.0.0", port)


def _from_transport(address):
    """``ucx://host:port`` (the transport's) as Dask's ``ucxrs://host:port``."""
    if address.startswith(_TRANSPORT):
        address = address[len(_TRANSPORT) :]
    return PREFIX + address


# Closes under way (a task holds a reference until it is done).
_closing = set()


def _close_soon(conn):
    """Closes ``conn`` without waiting: as a task of the running loop, which progresses the
    transport's worker that the close needs in ``loop`` mode; without a running loop (a
    finalizer, shutdown) on the transport's runtime."""
    if conn.closed:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        conn.abort()
        return
    task = loop.create_task(_quiet_close(conn))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _quiet_close(conn):
    try:
        await conn.close()
    except UCXError:
        pass


def _abort_dangling(conn, name):
    if not conn.closed:
        logger.warning("closing a dangling comm: %s", name)
        _close_soon(conn)


# Whether this build carries device frames (built with `cuda`: docs/dask.md).
_DEVICE_FRAMES = _ucxrs.transport_device_frames()


class UCXRS(Comm):
    """A Dask comm over one ``transport`` connection."""

    def __init__(self, conn, local_addr, peer_addr, deserialize=True):
        self._conn = conn
        self._local_addr = local_addr
        self._peer_addr = peer_addr
        self._closed = False
        super().__init__(deserialize=deserialize)
        self._finalizer = weakref.finalize(self, _abort_dangling, conn, repr(self))
        self._finalizer.atexit = False

    @property
    def local_address(self) -> str:
        return self._local_addr

    @property
    def peer_address(self) -> str:
        return self._peer_addr

    @property
    def same_host(self) -> bool:
        # Without a local address (a transport that gives none), the peer's host is not known
        # to be ours.
        return super().same_host if self._local_addr else False

    @property
    def extra_info(self):
        ours, theirs = self._conn.rings
        return {"same_host_rings": {"out": ours, "in": theirs}}

    def _lost(self, e):
        self.abort()
        return CommClosedError(f"in {self!r}: {e}")

    async def write(self, msg, serializers=None, on_error="message"):
        if self._closed:
            raise CommClosedError(f"{self!r} is closed")
        if serializers is None and _DEVICE_FRAMES:
            # Device objects (CuPy arrays, cuDF frames) travel as device frames, as on
            # distributed-ucxx's comm; Dask's default would copy them through host memory.
            serializers = ("cuda", "dask", "pickle", "error")
        frames = await to_frames(
            msg,
            allow_offload=self.allow_offload,
            serializers=serializers,
            on_error=on_error,
            context={
                "sender": self.local_info,
                "recipient": self.remote_info,
                **self.handshake_options,
            },
        )
        try:
            # A frame that cannot be sent (a device array in a build without CUDA, one CUDA
            # does not know) raises here, before anything is posted: the comm stays usable.
            sending = self._conn.send(frames)
        except UCXError as e:
            raise self._lost(e) from e
        try:
            return await sending
        except UCXError as e:
            raise self._lost(e) from e
        except BaseException:
            # Cancelled or interrupted: on ucx:// a posted message is delivered whole, but
            # nothing says how far this one got; as Dask's TCP comm, give the comm up.
            self.abort()
            raise

    async def read(self, deserializers=None):
        if self._closed:
            raise CommClosedError(f"{self!r} is closed")
        try:
            frames = await self._conn.recv()
        except UCXError as e:
            raise self._lost(e) from e
        except BaseException:
            # Cancelled or timed out (`wait_for(comm.read(), t)`): Dask's contract, as its TCP
            # comm keeps it (distributed's `test_comm_closed_on_read_error`), is that the comm
            # is given up. Its RPC layer relies on it: a pooled comm that timed out mid-reply
            # and were used again would hand the late reply to the next request.
            self.abort()
            raise
        try:
            return await from_frames(
                frames,
                deserialize=self.deserialize,
                deserializers=deserializers,
                allow_offload=self.allow_offload,
            )
        except EOFError:
            self.abort()
            raise CommClosedError(f"in {self!r}: aborted on truncated data")
        except asyncio.CancelledError:
            # The message was taken off the connection and is lost with this read.
            self.abort()
            raise

    async def close(self):
        if self._closed and self._conn.closed:
            return
        self._closed = True
        self._finalizer.detach()
        try:
            await self._conn.close()
        except UCXError:
            pass

    def abort(self):
        self._closed = True
        self._finalizer.detach()
        _close_soon(self._conn)

    def closed(self):
        if not self._closed and self._conn.closed:
            self._closed = True
        return self._closed


class UCXRSConnector(Connector):
    prefix = PREFIX
    comm_class = UCXRS
    encrypted = False

    async def connect(self, address, deserialize=True, **connection_args):
        host, port = parse_host_port(address)
        _configure()
        try:
            conn = await _ucxrs.transport_connect(
                _to_transport(host, port), max_message=_bytes_setting("max-message")
            )
        except UCXError as e:
            # An OSError: Dask's connect retries until its own time limit.
            raise CommClosedError(f"cannot connect to {self.prefix}{address}: {e}") from e
        # The socket this end connected from: what the listener's comm gives as its peer.
        local = conn.local_address
        return self.comm_class(
            conn,
            local_addr=self.prefix + local if local else "",
            peer_addr=self.prefix + address,
            deserialize=deserialize,
        )


class UCXRSListener(BaseListener):
    prefix = PREFIX
    comm_class = UCXRS
    encrypted = False

    def __init__(
        self,
        address,
        comm_handler,
        deserialize=True,
        allow_offload=True,
        default_host=None,
        default_port=0,
        **connection_args,
    ):
        super().__init__()
        if address.startswith(self.prefix):
            address = address[len(self.prefix) :]
        self.ip, self.port = parse_host_port(address, default_port)
        self.default_host = default_host
        self.comm_handler = comm_handler
        self.deserialize = deserialize
        self.allow_offload = allow_offload
        self._listen = None
        self._bound = None
        self._serving = None
        self._handling = set()

    async def start(self):
        _configure()
        self._listen = await _ucxrs.transport_listen(
            _to_transport(self.ip, self.port), max_message=_bytes_setting("max-message")
        )
        self._bound = parse_host_port(self._listen.address[len(_TRANSPORT) :])
        self._serving = asyncio.ensure_future(self._serve())

    async def _serve(self):
        failures = 0
        while self._listen is not None:
            try:
                conn = await self._listen.accept()
            except Exception as e:
                if self._listen is None:
                    return
                # The transport drops peers whose set-up failed itself; an accept that fails
                # is the listener's: say so, and back off (at most 1 s) rather than spin.
                failures += 1
                logger.warning("%s: accept failed (%s: %s)", self.contact_address, type(e).__name__, e)
                await asyncio.sleep(min(1.0, 0.01 * 2 ** min(failures, 7)))
                continue
            failures = 0
            task = asyncio.ensure_future(self._handle(conn))
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)

    async def _handle(self, conn):
        comm = self.comm_class(
            conn,
            local_addr=self.contact_address,
            peer_addr=_from_transport(conn.peer_address),
            deserialize=self.deserialize,
        )
        comm.allow_offload = self.allow_offload
        try:
            await self.on_connection(comm)
        except CommClosedError:
            logger.info("connection from %s closed before its handshake", comm.peer_address)
            return
        except Exception as e:
            # A peer that is not Dask (or not this version of it): refuse it, keep serving.
            logger.warning(
                "refused a connection from %s: its handshake failed (%s: %s)",
                comm.peer_address,
                type(e).__name__,
                e,
            )
            comm.abort()
            return
        if self._listen is None:
            # Stopped meanwhile: abort_handshaking_comms() has run and missed this one.
            comm.abort()
            return
        try:
            await self.comm_handler(comm)
        except Exception:
            # Dask's handlers catch their own; what escapes is logged, as Tornado logs it for
            # the TCP comm, and the comm given up.
            logger.exception("the handler of a comm from %s failed", comm.peer_address)
            comm.abort()

    def stop(self):
        listen, self._listen = self._listen, None
        if self._serving is not None:
            self._serving.cancel()
        if listen is not None:
            listen.close()

    def get_host_port(self):
        if self._bound is None:
            raise ValueError("invalid operation on a UCXRSListener that is not started")
        return self._bound

    @property
    def listen_address(self):
        return self.prefix + unparse_host_port(*self.get_host_port())

    @property
    def contact_address(self):
        host, port = self.get_host_port()
        host = ensure_concrete_host(host, default_host=self.default_host)
        return self.prefix + unparse_host_port(host, port)


class UCXRSBackend(Backend):
    """The ``ucxrs://`` backend (entry point ``distributed.comm.backends: ucxrs``)."""

    def get_connector(self):
        return UCXRSConnector()

    def get_listener(self, loc, handle_comm, deserialize, **connection_args):
        return UCXRSListener(loc, handle_comm, deserialize, **connection_args)

    def get_address_host(self, loc):
        return parse_host_port(loc)[0]

    def get_address_host_port(self, loc):
        return parse_host_port(loc)

    def resolve_address(self, loc):
        host, port = parse_host_port(loc)
        return unparse_host_port(ensure_ip(host), port)

    def get_local_address_for(self, loc):
        host, _ = parse_host_port(loc)
        host = ensure_ip(host)
        local = get_ipv6(host) if ":" in host else get_ip(host)
        return unparse_host_port(local, None)
