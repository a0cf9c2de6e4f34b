"""UCXX's module functions, ``Endpoint`` and ``Listener``, over the native module."""

import asyncio
import atexit
import fcntl
import gc
import logging
import os
import socket
import struct
import sys
import weakref

from . import _ucxrs
from ._ucxrs import UCXCloseError, UCXError

# UCXX's logger's name, so that a program's logging set-up for UCXX applies unchanged.
logger = logging.getLogger("ucx")

_I128 = 1 << 127

# At exit, let awaitables still in flight end before the interpreter shuts down (their results
# could not be delivered after that).
atexit.register(_ucxrs.quiesce, 2.0)
# From exit on, the loops' steps keep the GIL (a thread that asks for it back while the
# interpreter finalizes is ended mid-Rust, which aborts the process).
atexit.register(_ucxrs.exiting)


# Each event loop's doorbell (ucxrs._ucxrs.Bell): in thread and blocking modes, the thread
# that completes an operation wakes its awaitable through it, on the loop's own thread. In
# blocking mode the loop also watches the worker's event fd and progresses the worker itself.
_bells = weakref.WeakKeyDictionary()
_transport_bells = weakref.WeakKeyDictionary()


def _forget(loop, bell):
    loop.remove_reader(bell.fileno())
    if bell.worker_fd() is not None:
        loop.remove_reader(bell.worker_fd())
    if _bells.get(loop) is bell:
        del _bells[loop]
    if _transport_bells.get(loop) is bell:
        del _transport_bells[loop]


def _worker_event(loop, bell):
    state = bell.on_worker_event()
    if state == "gone":
        _forget(loop, bell)
    elif state == "busy":  # not armed: the fd would not wake the loop for what is pending
        loop.call_soon(_worker_event, loop, bell)


def _bell(loop=None):
    loop = loop or asyncio.get_running_loop()
    bell = _bells.get(loop)
    if bell is not None and not bell.current():  # made before a reset()
        _forget(loop, bell)
        bell = None
    if bell is None:
        bell = _ucxrs.Bell()
        loop.add_reader(bell.fileno(), bell.ring)
        if bell.worker_fd() is not None:
            loop.add_reader(bell.worker_fd(), _worker_event, loop, bell)
        _bells[loop] = bell
    return bell



def _transport_bell(loop=None):
    """The loop's doorbell for ``transport`` connections (the Dask comm): it needs no UCXX-API
    core (so a Dask process makes none). Rung by the transport's threads; in the transport's
    ``"loop"`` progress mode the loop also watches the transport's worker and progresses it."""
    loop = loop or asyncio.get_running_loop()
    bell = _transport_bells.get(loop)
    if bell is None:
        bell = _ucxrs.Bell(transport=True)
        loop.add_reader(bell.fileno(), bell.ring)
        if bell.worker_fd() is not None:
            loop.add_reader(bell.worker_fd(), _worker_event, loop, bell)
        _transport_bells[loop] = bell
    return bell


def _watch():
    """Blocking mode progresses the worker from the loop: a listener or endpoint must have the
    loop watch the worker's event fd before any operation is awaited."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _bell(loop)


def init(
    options=None,
    env_takes_precedence=False,
    progress_mode=None,
    enable_delayed_submission=None,
    enable_python_future=None,
    connect_timeout=None,
):
    """Initialises UCX: ``options`` are UCX configuration keys without ``UCX_`` (``{"TLS":
    "tcp"}``); by default they override the environment (``env_takes_precedence`` reverses
    that). ``progress_mode`` is ``"thread"`` (default), ``"blocking"`` or ``"polling"``, or
    ``UCXPY_PROGRESS_MODE``'s value. Without a call, the first use initialises the defaults.
    Raises ``RuntimeError`` when already initialised (``reset()`` first).

    ``enable_delayed_submission`` and ``enable_python_future`` are UCXX's (and its
    ``UCXPY_ENABLE_*`` variables): ucxrs has neither scheme (operations are posted at once, and
    the progress thread wakes the event loop itself), so they change nothing; delayed
    submission outside thread mode is refused with ``ValueError``, as UCXX refuses it."""
    mode = progress_mode or os.environ.get("UCXPY_PROGRESS_MODE", "thread")
    if enable_delayed_submission is None:
        enable_delayed_submission = os.environ.get("UCXPY_ENABLE_DELAYED_SUBMISSION", "0") != "0"
    if enable_delayed_submission and not str(mode).startswith("thread"):
        raise ValueError(
            f"Delayed submission requested, but {mode!r} does not support it, 'thread' progress "
            "mode required."
        )
    if enable_python_future is not None and not isinstance(enable_python_future, bool):
        raise TypeError(f"enable_python_future must be True or False, not {enable_python_future!r}")
    for k, v in dict(options or {}).items():
        env_v = os.environ.get(f"UCX_{k}")
        if env_v is not None and str(env_v) != str(v):
            if env_takes_precedence:
                logger.info("Ignoring option %s=%s; using environment UCX_%s=%s", k, v, k, env_v)
            else:
                logger.info("Ignoring environment UCX_%s=%s; using option %s=%s", k, env_v, k, v)
    _ucxrs.init(
        options=dict(options or {}),
        env_takes_precedence=env_takes_precedence,
        progress_mode=progress_mode,
        connect_timeout=connect_timeout,
    )


def reset():
    """Forgets UCX's context and worker, so that ``init`` can make new ones (as UCXX's does).
    Endpoints and listeners that are still open after a garbage collection keep the old ones
    working until they are closed, and are reported with ``UCXError``; ``init`` works after it
    either way."""
    gc.collect()
    _ucxrs.reset()


def get_ucx_version():
    """The loaded UCX's version, ``(major, minor, release)``."""
    return _ucxrs.get_ucx_version()


def get_config():
    """The effective UCX configuration: keys without ``UCX_``, environment and options applied."""
    return _ucxrs.get_config()


def progress_mode():
    """The worker's progress mode: ``"thread"``, ``"blocking"`` or ``"polling"``."""
    return _ucxrs.progress_mode()


def progress():
    """Progresses the worker once; returns the number of events UCX handled. Only polling mode
    needs it, where nothing progresses while no operation is awaited."""
    return _ucxrs.progress()


def cuda_support():
    """How device arrays (CuPy, PyTorch, Numba) move: ``"zero-copy"`` (the loaded UCX reads and
    writes device memory), ``"staged"`` (through pinned host memory), ``"unavailable"`` (no GPU
    or driver) or ``"not built"`` (this build has no CUDA support)."""
    return _ucxrs.cuda_support()


def get_ucp_context_info():
    """UCX's description of the context (``ucp_context_print_info``): its components, memory
    domains and transport resources, as text."""
    return _ucxrs.ucx_context_info()


def get_ucp_worker_info():
    """UCX's description of the worker (``ucp_worker_print_info``): transports and address."""
    return _ucxrs.ucx_worker_info()


def get_active_transports():
    """The transports UCX found and may use (``"tcp"``, ``"self"``, ``"posix"``, ...): the
    ``tl`` of each resource line of ``get_ucp_context_info()``, as a set (as UCXX's)."""
    found = set()
    for line in get_ucp_context_info().splitlines():
        if line.startswith("#") and "resource" in line and "md" in line and "dev" in line:
            found.add(line.split()[-1].split("/")[0])
    return found


def ucx_library():
    """The path of the UCX library (``libucp``) this process loaded, once UCX is initialised."""
    return _ucxrs.ucx_library()


def get_address(ifname=None):
    """The IPv4 address of network interface ``ifname`` (``"eth0"``, ``"ib0"``); by default
    ``UCXPY_IFNAME``'s, else the first interface up with an address other than loopback, else
    loopback's. Raises ``OSError`` for an interface with no IPv4 address."""
    if ifname is None:
        ifname = os.environ.get("UCXPY_IFNAME")
    if ifname is None:
        names = [n for _, n in socket.if_nameindex() if n != "lo"] + ["lo"]
        for n in names:
            try:
                return _ipv4_of(n)
            except OSError:
                continue
        raise OSError("no network interface has an IPv4 address")
    return _ipv4_of(ifname)


def _ipv4_of(ifname):
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = struct.pack("256s", ifname.encode()[:15])
        return socket.inet_ntoa(fcntl.ioctl(s.fileno(), siocgifaddr, packed)[20:24])


def _tag(tag):
    """A tag as the native module takes it: None, or an integer (a hashable that is not one
    is hashed, as UCXX does)."""
    if tag is None:
        return None
    if isinstance(tag, int) and -_I128 <= tag < _I128:
        return tag
    return hash(tag)


def _as_arrays(frames):
    try:
        import numpy
    except ImportError:
        return frames
    return [numpy.frombuffer(f, dtype=numpy.uint8) if isinstance(f, bytearray) else f for f in frames]


class Endpoint:
    """A connection to a peer: ``create_endpoint()`` makes one, a listener's callback gets one."""

    def __init__(self, raw):
        self._ep = raw
        self._close_after_n_recv = None
        self._finished_recv_count = 0

    @property
    def closed(self):
        """Whether the endpoint is closed (locally, or its peer closed or failed)."""
        return self._ep is None or self._ep.closed

    @property
    def alive(self):
        return not self.closed

    @property
    def uid(self):
        """A number that identifies the endpoint in this process."""
        return None if self._ep is None else self._ep.uid

    def _open(self):
        # Closed here: refused. Closed by the peer: a receive still gets what had arrived,
        # then the peer's end (UCXConnectionResetError); a send fails with it.
        if self._ep is None:
            raise UCXCloseError("Endpoint closed")
        return self._ep

    async def send(self, buffer, tag=None, force_tag=False):
        """Sends ``buffer`` (anything with the buffer protocol) as one tagged message."""
        await self._open().send(buffer, _tag(tag), force_tag)

    async def recv(self, buffer, tag=None, force_tag=False):
        """Receives one tagged message into ``buffer``, which must be writable and contiguous;
        returns its size. A larger message raises ``UCXMessageTruncatedError``."""
        n = await self._open().recv(buffer, _tag(tag), force_tag)
        await self._received()
        return n

    async def send_obj(self, obj, tag=None):
        """Sends ``obj`` (bytes-like) so that the peer's ``recv_obj`` needs no size first."""
        await self._open().send_obj(obj, _tag(tag), False)

    async def recv_obj(self, tag=None, allocator=bytearray):
        """Receives an object sent with ``send_obj``; returned as a ``bytearray``, or what
        ``allocator(nbytes)`` makes (``cupy.empty``, say), received into directly."""
        raw = self._open()
        if allocator is bytearray:
            got = await raw.recv_obj(_tag(tag), False)
        else:
            size = bytearray(8)
            await raw.recv(size, _tag(tag), False)
            (nbytes,) = struct.unpack("=Q", size)
            if nbytes > raw.max_message:
                raise UCXError(
                    f"the peer announced an object of {nbytes} bytes, over this endpoint's "
                    f"limit of {raw.max_message}"
                )
            got = allocator(nbytes)
            await raw.recv(got, _tag(tag), False)
        await self._received()
        return got

    async def send_multi(self, buffers, tag=None, force_tag=False):
        """Sends a list of buffers as one message that ``recv_multi`` receives whole."""
        if not isinstance(buffers, (list, tuple)):
            raise ValueError("The `buffers` argument must be a `list` or `tuple`")
        await self._open().send_multi(list(buffers), _tag(tag), force_tag)

    async def recv_multi(self, tag=None, force_tag=False):
        """Receives a message sent with ``send_multi``: a list of frames, each a NumPy
        ``uint8`` array (as UCXX returns them: ``frame.view(dtype)`` gives the sender's
        dtype), or a ``bytearray`` where NumPy is not installed. No copy either way."""
        frames = await self._open().recv_multi(_tag(tag), force_tag)
        await self._received()
        return _as_arrays(frames)

    async def am_send(self, buffer):
        """Sends ``buffer`` as an active message: the receiver needs no buffer ready."""
        await self._open().am_send(buffer)

    async def am_recv(self):
        """Receives the next active message from the peer: in host memory, a NumPy ``uint8``
        array (as UCXX returns it; a ``bytearray`` where NumPy is not installed), in device
        memory, the device buffer it landed in."""
        got = await self._open().am_recv()
        await self._received()
        return _as_arrays([got])[0]

    async def _received(self):
        self._finished_recv_count += 1
        n = self._close_after_n_recv
        if n is not None and self._finished_recv_count >= n:
            await self.close()

    def close_after_n_recv(self, n, count_from_ep_creation=False):
        """Closes the endpoint once ``n`` more receives have finished (counted from its
        creation with ``count_from_ep_creation``)."""
        if not count_from_ep_creation:
            n += self._finished_recv_count
        if self._close_after_n_recv is not None:
            raise UCXError(f"close_after_n_recv has already been set to {self._close_after_n_recv}")
        if n < self._finished_recv_count:
            raise UCXError(
                f"`n` cannot be less than current recv_count: {self._finished_recv_count} "
                f"receives have already finished, {n} is past"
            )
        self._close_after_n_recv = n
        if n == self._finished_recv_count:
            asyncio.ensure_future(self.close())

    def set_close_callback(self, callback_func, cb_args=None, cb_kwargs=None):
        """Calls ``callback_func(*cb_args, **cb_kwargs)`` (a function or a coroutine function)
        on the current event loop once the endpoint closes, here or by its peer."""
        args, kwargs = tuple(cb_args or ()), dict(cb_kwargs or {})
        loop = asyncio.get_running_loop()

        def fire():
            if asyncio.iscoroutinefunction(callback_func):
                loop.create_task(callback_func(*args, **kwargs))
            else:
                callback_func(*args, **kwargs)

        self._open().set_close_callback(fire)

    async def close(self):
        """Closes the endpoint, letting sends in flight finish first; pending receives end with
        ``UCXCanceledError``, the peer's with ``UCXConnectionResetError``."""
        if self._ep is not None:
            await self._ep.close()

    def abort(self):
        """Closes the endpoint at once."""
        if self._ep is not None:
            self._ep.abort()

    def __repr__(self):
        return f"<ucxrs.Endpoint uid={self.uid:#x} closed={self.closed}>"


class Listener:
    """Accepts connections on ``port``; ``create_listener()`` makes one."""

    def __init__(self, raw, clients, loop=None):
        self._raw = raw
        self._clients = clients
        self._loop = loop

    @property
    def active_clients(self):
        """How many connections are not yet served: arriving (their handshake or the event
        loop's call pending), or their callback (a coroutine function) still running."""
        return self._raw.arriving + self._clients[0]

    @property
    def port(self):
        return self._raw.port

    @property
    def ip(self):
        return self._raw.ip

    @property
    def closed(self):
        return self._raw.closed

    def close(self):
        """Stops listening; endpoints already accepted stay open."""
        self._raw.close()

    def __del__(self):
        # As UCXX warns: connections still being served lose their listener (they go on).
        try:
            active = self.active_clients
            # Not at exit, nor once the loop that runs the callbacks is closed: they cannot go on.
            gone = sys.is_finalizing() or (self._loop is not None and self._loop.is_closed())
        except Exception:
            return
        if active > 0 and not gone:
            logger.warning(
                "Listener object is being destroyed, but %d client handler(s) is(are) still "
                "alive. This usually indicates the Listener was prematurely destroyed.",
                active,
            )

    def __repr__(self):
        return f"<ucxrs.Listener {self.ip}:{self.port} closed={self.closed}>"


def create_listener(callback_func, port=None, endpoint_error_handling=True, connect_timeout=5.0):
    """Listens on ``port`` (any free one by default) of every interface; each connection,
    handshaken, is passed as an ``Endpoint`` to ``callback_func``, a function or a coroutine
    function, run on the current event loop. ``connect_timeout`` bounds each connection's
    handshake, in seconds. ``endpoint_error_handling`` is UCXX's: ucxrs's endpoints always
    handle their peer's failure (UCX's peer error mode), so ``False`` changes nothing."""
    _error_handling(endpoint_error_handling)
    loop = asyncio.get_running_loop()
    # The count of running callbacks, shared with the Listener: the callbacks must not refer to
    # the Listener (the native listener holds them), so that a Listener nobody refers to is
    # collected, and closes, as UCXX's is.
    clients = [0]

    async def run(ep):
        try:
            await callback_func(ep)
        except Exception:
            logger.exception("the listener's callback raised")
        finally:
            clients[0] -= 1

    def on_connection(raw):
        ep = Endpoint(raw)
        if asyncio.iscoroutinefunction(callback_func):
            clients[0] += 1  # from now: the task may start after this call returns
            loop.create_task(run(ep))
        else:
            try:
                callback_func(ep)
            except Exception:
                logger.exception("the listener's callback raised")

    raw = _ucxrs.listen(on_connection, port or 0, _timeout(connect_timeout))
    listener = Listener(raw, clients, loop)
    _watch()
    return listener


async def create_endpoint(ip_address, port, endpoint_error_handling=True, connect_timeout=5.0):
    """Connects to a listener (ours or UCXX's) at ``ip_address:port``, within
    ``connect_timeout`` seconds (connecting and the handshake; ``None``: ``init``'s)."""
    _error_handling(endpoint_error_handling)
    _watch()
    return Endpoint(await _ucxrs.connect(ip_address, port, _timeout(connect_timeout)))


def _timeout(seconds):
    return None if seconds is None else float(seconds)


def _error_handling(enabled):
    if not isinstance(enabled, bool):
        raise TypeError(f"endpoint_error_handling must be True or False, not {enabled!r}")


async def recv(buffer, tag):
    """Receives into ``buffer`` one message sent to this process's worker with the raw tag
    ``tag`` (the sender's ``send(..., tag=tag, force_tag=True)``), from any endpoint, as UCXX's
    ``ucxx.recv``: for peers connected with ``create_endpoint_from_worker_address``, before
    either has an endpoint to the other."""
    _watch()
    await _ucxrs.worker_recv(buffer, _raw_tag(tag))


def _raw_tag(tag):
    value = getattr(tag, "value", tag)  # UCXX's Tag objects, or ints
    if not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise ValueError(f"a worker receive takes a raw 64-bit tag, not {tag!r}")
    return value


def stop_notifier_thread():
    """UCXX's: stops its notifier thread (``enable_python_future``). ucxrs has none (its
    progress thread wakes the event loop itself), so there is nothing to stop."""
    logger.debug("stop_notifier_thread(): ucxrs has no notifier thread")


class UCXAddress(bytes):
    """A worker's address (``get_worker_address()``), to send out of band to a process that
    connects with ``create_endpoint_from_worker_address``. It is its bytes (a ``bytes``
    subclass: send it as any buffer, ``ep.send(addr)``; ``address`` gives them as plain
    ``bytes``; it pickles), and they carry a seal: an address that was cut, altered, or made
    by another UCX version is refused with ``UCXError`` instead of reaching UCX, which would
    trust it. UCXX's raw worker addresses are not sealed, so they are refused too."""

    __slots__ = ()

    def __new__(cls, address):
        return super().__new__(cls, bytes(address))

    @classmethod
    def create_from_buffer(cls, buffer):
        """The address whose bytes ``buffer`` holds (as ``address`` gave them)."""
        return cls(buffer)

    @property
    def address(self):
        return bytes(self)

    @property
    def length(self):
        return len(self)

    def __eq__(self, other):
        return isinstance(other, UCXAddress) and bytes.__eq__(self, other)

    def __ne__(self, other):
        return not self == other

    __hash__ = bytes.__hash__

    def __reduce__(self):
        return (UCXAddress, (bytes(self),))

    def __repr__(self):
        return f"<UCXAddress {len(self)} bytes>"


def get_worker_address():
    """This process's worker address (``UCXAddress``)."""
    return UCXAddress(_ucxrs.get_worker_address())


def get_ucx_address_from_buffer(buffer):
    """The ``UCXAddress`` whose bytes ``buffer`` holds."""
    return UCXAddress.create_from_buffer(buffer)


async def create_endpoint_from_worker_address(address, endpoint_error_handling=True):
    """Connects to the worker whose address (``UCXAddress``, or its bytes) this is, in this
    process or another, without a listener: tags match between two endpoints made this way.
    Raises ``UCXError`` for an address that was altered or made by another UCX version."""
    _error_handling(endpoint_error_handling)
    _watch()
    return Endpoint(_ucxrs.connect_address(bytes(address)))
