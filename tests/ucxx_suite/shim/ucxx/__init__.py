"""``import ucxx`` as ``ucxrs``: the name under which UCXX's own test-suite runs against ucxrs.

Only for ``tests/ucxx_suite/run.sh``. It renames, and maps the private hooks that UCXX's test
helpers (``ucxx._lib_async.utils_test``, shipped in UCXX's wheel) reach into:

- ``ucxx.core._get_ctx().progress_mode``: ``ucxrs.progress_mode()``;
- ``Listener._wait_for_active_clients(progress)``: waits, bounded, until the listener's
  ``active_clients`` (public in both) is 0, progressing in polling mode.

And one that a test reads (``test_version``): ``ucxx.core._ctx`` is ``None`` until UCX is
initialised. Everything else is ucxrs's own. UCXX's pure-Python helpers (``ucxx.testing``,
``ucxx._lib_async.utils_test``, ``.utils``, ``.pytest_stash_keys``, ``ucxx.benchmarks``) are
loaded from the UCXX wheel's files (``UCXX_PACKAGE_DIR``); nothing of UCXX's native code is.
"""

import asyncio
import os
import sys
import time
import types

import ucxrs
from ucxrs import *  # noqa: F401, F403
from ucxrs import __ucx_version__, __version__  # noqa: F401
from ucxrs import _ucxrs
from ucxrs import core as _ours
from ucxrs import exceptions  # noqa: F401

_REAL = os.environ.get("UCXX_PACKAGE_DIR")
if not _REAL or not os.path.isfile(os.path.join(_REAL, "testing.py")):
    raise ImportError(
        "the ucxx shim needs UCXX_PACKAGE_DIR: the UCXX wheel's package directory "
        "(site-packages/ucxx), for its pure-Python test helpers"
    )
# Submodules not defined here (testing, utils, benchmarks) come from UCXX's files.
__path__ = [_REAL]


def _package(name, directory):
    """A package whose modules are UCXX's files, without running UCXX's ``__init__`` (which
    loads its native library)."""
    module = types.ModuleType(name)
    module.__path__ = [directory]
    module.__package__ = name
    sys.modules[name] = module
    return module


_lib_async = _package(__name__ + "._lib_async", os.path.join(_REAL, "_lib_async"))


class _Context:
    """What ``ucxx.core._get_ctx()`` gives UCXX's helpers: the progress mode."""

    @property
    def progress_mode(self):
        return ucxrs.progress_mode()


class _Core(types.ModuleType):
    def __getattr__(self, name):
        if name == "_ctx":
            return _Context() if _ucxrs.initialised() else None
        return getattr(_ours, name)

    @staticmethod
    def _get_ctx():
        return _Context()


core = _Core(__name__ + ".core")
sys.modules[core.__name__] = core


async def _wait_for_active_clients(self, progress=None, timeout=60.0):
    deadline = time.monotonic() + timeout
    while self.active_clients > 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{self.active_clients} client handlers still running")
        await asyncio.sleep(1e-3)
        if progress is not None:
            progress()


ucxrs.Listener._wait_for_active_clients = _wait_for_active_clients
