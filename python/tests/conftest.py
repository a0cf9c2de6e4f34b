import gc
import time

import pytest

import ucxrs


@pytest.fixture(autouse=True)
def fresh_ucx():
    """Each test starts and ends with no endpoint or listener of its own left open: reset()
    fails otherwise, which fails the test. Tasks the test's event loop cancelled at its end may
    still hold an endpoint for a moment, so it is given a second to let go."""
    yield
    deadline = time.monotonic() + 1.0
    while True:
        gc.collect()
        try:
            ucxrs.reset()
            return
        except ucxrs.UCXError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
