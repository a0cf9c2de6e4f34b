import gc
import time

import pytest

import ucxrs


@pytest.fixture(autouse=True)
def fresh_ucx():
    """Each test starts and ends with no endpoint or listener of its own left open: reset()
    reports one, which fails the test. Tasks the test's event loop cancelled at its end may
    still hold an endpoint for a moment, so it is given a second to let go."""
    yield
    deadline = time.monotonic() + 1.0
    while ucxrs._ucxrs.live_objects() > 0 and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.02)
    ucxrs.reset()
