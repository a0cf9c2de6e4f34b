#!/usr/bin/env bash
# The Python package (python/, docs/python.md): installed with pip into target/py-venv as a user
# would (`pip install ./python`), then its tests (pytest, pytest-asyncio, NumPy) in each progress
# mode, and the doctests of its module. Also checks the native crate's formatting and clippy
# (it is a workspace of its own, outside the main one's `cargo test`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
VENV=target/py-venv
PY=$VENV/bin/python
if [ ! -x "$PY" ] || ! "$PY" -c "import maturin, pytest, pytest_asyncio, pytest_timeout, numpy" 2>/dev/null; then
  echo "python: installing maturin, pytest, pytest-asyncio, pytest-timeout and numpy into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  timeout 900 "$VENV/bin/pip" install -q --disable-pip-version-check maturin pytest pytest-asyncio pytest-timeout numpy \
    || { rm -rf "$VENV"; skip_or_fail python "could not install maturin and pytest from PyPI (no network?)"; }
fi
(cd python && cargo fmt -- --check && cargo clippy -q -j2 --all-targets -- -D warnings \
  && cargo clippy -q -j2 --all-targets --features cuda -- -D warnings)
# The user's command, with device arrays built in (they need no CUDA to build or run: without a
# GPU they are refused, which python/tests/test_arrays.py checks; python/tests/test_device.py
# skips); without build isolation, so the maturin above builds it (no download).
PATH="$PWD/$VENV/bin:$PATH" CARGO_BUILD_JOBS=2 MATURIN_PEP517_ARGS="--features cuda" \
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
echo "python: $("$PY" -c 'import ucxrs; print("ucxrs on UCX %d.%d.%d, device arrays: %s" % (*ucxrs.get_ucx_version(), ucxrs.cuda_support()))')"
# The seed's example (UCX-Py's "Send/Recv with CuPy", with NumPy arrays here): a server process
# and a client.
timeout 120 "$PY" python/examples/send_recv.py
# A test that hangs ends its run within 120 s with every thread's stack (pytest-timeout).
for mode in thread blocking polling; do
  echo "python: tests, progress mode $mode"
  UCXPY_PROGRESS_MODE=$mode timeout 600 "$PY" -m pytest -q -p no:cacheprovider --timeout 120 \
    --timeout-method thread python/tests
done
# The module's doctests, against the installed package (not the source folder); the Dask comm
# (ucxrs.distributed) needs Dask, and has its own tests (scripts/dask_backend_test.sh).
PKG=$("$PY" -c "import os, ucxrs; print(os.path.dirname(ucxrs.__file__))")
(cd /tmp && timeout 300 "$OLDPWD/$PY" -m pytest -q -p no:cacheprovider -o asyncio_default_fixture_loop_scope=function \
  --doctest-modules --ignore="$PKG/distributed.py" "$PKG")
