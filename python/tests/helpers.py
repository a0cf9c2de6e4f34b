"""What the test files share: a listener with an endpoint connected to it, and a server
side that stays open until the client closes."""

import pytest

import ucxrs


async def until_peer_closes(ep):
    """Keeps the server's endpoint open until the client closes it."""
    with pytest.raises(ucxrs.UCXError):
        await ep.recv(bytearray(1), tag=0x5EED)


async def echo_pair(serve):
    """A listener whose callback is `serve`, and an endpoint connected to it."""
    listener = ucxrs.create_listener(serve)
    ep = await ucxrs.create_endpoint("127.0.0.1", listener.port)
    return listener, ep
