"""distributed's protocol-generic comm checks, run against ``ucxrs://``.

distributed's ``distributed/comm/tests/test_comms.py`` holds the contract every comm backend
keeps, as functions that take an address (``check_client_server``, ``check_comm_closed_implicit``,
...); its tests call them with ``tcp://``, ``tls://`` and ``inproc://`` addresses. Here each of
those tests is made again with a ``ucxrs://`` address, calling distributed's own check functions,
unedited, from the file in a checkout of distributed at the installed version
(``DISTRIBUTED_TEST_COMMS``: ``tests/distributed_suite/run.sh`` sets it).
"""

import asyncio
import importlib.util
import os

import distributed.utils_test
import pytest
from distributed.utils import get_ip, wait_for
from distributed.utils_test import gen_test

_path = os.environ.get("DISTRIBUTED_TEST_COMMS")
if not _path or not os.path.isfile(_path):
    raise ImportError("DISTRIBUTED_TEST_COMMS must name distributed's comm/tests/test_comms.py")
# Its module-level set-up reads TLS certificates from distributed's tests/ folder, which the
# wheel does not ship: the checkout's (distributed/tests/, beside comm/tests/).
_certs = os.path.join(os.path.dirname(_path), os.pardir, os.pardir, "tests")
distributed.utils_test.get_cert = lambda name: os.path.join(_certs, name)
_spec = importlib.util.spec_from_file_location("distributed_test_comms", _path)
tc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tc)

EXTERNAL_IP4 = get_ip()


def ucxrs_eq(expected_host, expected_port=None):
    """distributed's ``tcp_eq`` for a location without its scheme (``host:port``)."""
    return tc.tcp_eq(expected_host, expected_port)


@gen_test()
async def test_ucxrs_client_server_ipv4():
    await tc.check_client_server("ucxrs://127.0.0.1", ucxrs_eq("127.0.0.1"))
    await tc.check_client_server("ucxrs://127.0.0.1:3241", ucxrs_eq("127.0.0.1", 3241))
    await tc.check_client_server(
        "ucxrs://0.0.0.0", ucxrs_eq("0.0.0.0"), ucxrs_eq(EXTERNAL_IP4)
    )
    await tc.check_client_server(
        "ucxrs://0.0.0.0:3242", ucxrs_eq("0.0.0.0", 3242), ucxrs_eq(EXTERNAL_IP4, 3242)
    )
    await tc.check_client_server("ucxrs://", ucxrs_eq("0.0.0.0"), ucxrs_eq(EXTERNAL_IP4))
    await tc.check_client_server(
        "ucxrs://:3243", ucxrs_eq("0.0.0.0", 3243), ucxrs_eq(EXTERNAL_IP4, 3243)
    )


@gen_test()
async def test_ucxrs_comm_closed_implicit():
    await tc.check_comm_closed_implicit("ucxrs://127.0.0.1")


@gen_test()
async def test_ucxrs_comm_closed_explicit():
    await tc.check_comm_closed_explicit("ucxrs://127.0.0.1")


@gen_test()
async def test_ucxrs_comm_closed_on_read_error():
    # distributed's test_comm_closed_on_read_error, on a ucxrs:// pair.
    reader, writer = await tc.get_comm_pair("ucxrs://127.0.0.1")
    with pytest.raises(asyncio.TimeoutError):
        await wait_for(reader.read(), 0.01)
    assert reader.closed()
    await reader.close()
    await writer.close()


@gen_test()
async def test_ucxrs_connect_timeout():
    await tc.check_connect_timeout("ucxrs://127.0.0.1:44444")


@gen_test()
async def test_ucxrs_many_listeners():
    await tc.check_many_listeners("ucxrs://127.0.0.1")
    await tc.check_many_listeners("ucxrs://0.0.0.0")
    await tc.check_many_listeners("ucxrs://")


@gen_test()
async def test_ucxrs_deserialize():
    await tc.check_deserialize("ucxrs://")


@gen_test()
async def test_ucxrs_deserialize_roundtrip():
    await tc.check_deserialize_roundtrip("ucxrs://")


@gen_test()
async def test_ucxrs_deserialize_eoferror():
    await tc.check_deserialize_eoferror("ucxrs://")


@gen_test()
async def test_ucxrs_repr():
    a, b = await tc.get_comm_pair("ucxrs://127.0.0.1")
    assert a.local_address in repr(b)
    assert b.local_address in repr(a)
    await tc.check_repr(a, b)


@gen_test()
async def test_ucxrs_addresses():
    a, b = await tc.get_comm_pair("ucxrs://127.0.0.1")
    await tc.check_addresses(a, b)
