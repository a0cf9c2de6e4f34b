"""UCXX's module functions, ``Endpoint`` and ``Listener``, over the native module."""

import asyncio
import atexit
import fcntl
import logging
import os
import socket
import struct
import weakref

from . import _ucxrs
from ._ucxrs import UCXCloseError, UCXError

logger = logging.getLogger("ucxrs")

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


def init(options=None, env_takes_precedence=False, progress_mode=None, connect_timeout=None):
    """Initialises UCX: ``options`` are UCX configuration keys without ``UCX_`` (``{"TLS":
    "tcp"}``); by default they override the environment (``env_takes_precedence`` reverses
    that). ``progress_mode`` is ``"thread"`` (default), ``"blocking"`` or ``"polling"``, or
    ``UCXPY_PROGRESS_MODE``'s value. Without a call, the first use initialises the defaults.
    Raises ``RuntimeError`` when already initialised (``reset()`` first)."""
    _ucxrs.init(
        options=dict(options or {}),
        env_takes_precedence=env_takes_precedence,
        progress_mode=progress_mode,
        connect_timeout=connect_timeout,
    )


def reset():
    """Forgets UCX's context and worker, so that ``init`` can make new ones. Raises
    ``UCXError`` while endpoints or listeners are alive."""
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
        """Receives a message sent with ``send_multi``: a list of ``bytearray``s."""
        frames = await self._open().recv_multi(_tag(tag), force_tag)
        await self._received()
        return frames

    async def am_send(self, buffer):
        """Sends ``buffer`` as an active message: the receiver needs no buffer ready."""
        await self._open().am_send(buffer)

    async def am_recv(self):
        """Receives the next active message from the peer, as a ``bytearray``."""
        got = await self._open().am_recv()
        await self._received()
        return got

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
            raise UCXError("close_after_n_recv has already been set")
        if n < self._finished_recv_count:
            raise UCXError(f"{self._finished_recv_count} receives have already finished: {n} is past")
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

    def __init__(self, raw):
        self._raw = raw
        self.active_clients = 0

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

    def __repr__(self):
        return f"<ucxrs.Listener {self.ip}:{self.port} closed={self.closed}>"


def create_listener(callback_func, port=None):
    """Listens on ``port`` (any free one by default) of every interface; each connection,
    handshaken, is passed as an ``Endpoint`` to ``callback_func``, a function or a coroutine
    function, run on the current event loop."""
    loop = asyncio.get_running_loop()
    listener = None

    async def run(ep):
        listener.active_clients += 1
        try:
            await callback_func(ep)
        except Exception:
            logger.exception("the listener's callback raised")
        finally:
            listener.active_clients -= 1

    def on_connection(raw):
        ep = Endpoint(raw)
        if asyncio.iscoroutinefunction(callback_func):
            loop.create_task(run(ep))
        else:
            try:
                callback_func(ep)
            except Exception:
                logger.exception("the listener's callback raised")

    listener = Listener(_ucxrs.listen(on_connection, port or 0))
    _watch()
    return listener


async def create_endpoint(ip_address, port):
    """Connects to a listener (ours or UCXX's) at ``ip_address:port``."""
    _watch()
    return Endpoint(await _ucxrs.connect(ip_address, port))



class UCXAddress:
    """A worker's address (``get_worker_address()``), to send out of band to a process that
    connects with ``create_endpoint_from_worker_address``. Its bytes (``address``, or
    ``bytes(addr)``; it also pickles) carry a seal: an address that was cut, altered, or made
    by another UCX version is refused with ``UCXError`` instead of reaching UCX, which would
    trust it. UCXX's raw worker addresses are not sealed, so they are refused too."""

    __slots__ = ("_bytes",)

    def __init__(self, address):
        self._bytes = bytes(address)

    @classmethod
    def create_from_buffer(cls, buffer):
        """The address whose bytes ``buffer`` holds (as ``address`` gave them)."""
        return cls(buffer)

    @property
    def address(self):
        return self._bytes

    @property
    def length(self):
        return len(self._bytes)

    def __bytes__(self):
        return self._bytes

    def __len__(self):
        return len(self._bytes)

    def __eq__(self, other):
        return isinstance(other, UCXAddress) and other._bytes == self._bytes

    def __hash__(self):
        return hash(self._bytes)

    def __reduce__(self):
        return (UCXAddress, (self._bytes,))

    def __repr__(self):
        return f"<UCXAddress {len(self._bytes)} bytes>"


def get_worker_address():
    """This process's worker address (``UCXAddress``)."""
    return UCXAddress(_ucxrs.get_worker_address())


def get_ucx_address_from_buffer(buffer):
    """The ``UCXAddress`` whose bytes ``buffer`` holds."""
    return UCXAddress.create_from_buffer(buffer)


async def create_endpoint_from_worker_address(address):
    """Connects to the worker whose address (``UCXAddress``, or its bytes) this is, in this
    process or another, without a listener: tags match between two endpoints made this way.
    Raises ``UCXError`` for an address that was altered or made by another UCX version."""
    _watch()
    return Endpoint(_ucxrs.connect_address(bytes(address)))
