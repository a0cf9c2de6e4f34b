import pytest

import ucxrs


@pytest.fixture(autouse=True)
def fresh_ucx():
    """Each test starts and ends with no endpoint or listener of its own left (reset() would
    fail otherwise: that is checked)."""
    yield
    import gc

    gc.collect()
    ucxrs.reset()
