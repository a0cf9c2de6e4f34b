#!/usr/bin/env bash
# The Python package (python/, docs/python.md), as its users install it:
# 1. The wheels (scripts/wheel.sh: ucxrs-cu12 and ucxrs-cu13, manylinux_2_28), and
#    ucxrs-cu12 installed with pip into a new venv (target/wheel-test-venv), its libucx-cu12
#    from the index as its dependency, in an environment with no Rust on PATH and none of
#    LD_LIBRARY_PATH, UCX_MODULE_DIR, UCX_PREFIX: `python -m ucxrs`, the package's tests in
#    every progress mode against the installed wheel (UCX from the libucx wheel, checked in
#    /proc/self/maps: tests/test_install.py), its doctests and the seed's example. The
#    interop and Dask steps install the same wheel (tests/interop/run.sh,
#    scripts/dask_backend_test.sh).
# 2. The build from source (`pip install ./python`, against Debian's UCX) into target/py-venv,
#    and its tests once, on the system's UCX.
# Also checks the native crate's formatting and clippy (a workspace of its own).
#   bash scripts/python_test.sh            both
#   bash scripts/python_test.sh --wheel    the wheels only (build, install, tests)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ROOT=$PWD
(cd python && cargo fmt -- --check && cargo clippy -q -j2 --all-targets -- -D warnings \
  && cargo clippy -q -j2 --all-targets --features cuda -- -D warnings)

bash scripts/wheel.sh
WHEEL=$(ls dist/ucxrs_cu12-*.whl)
VENV=$ROOT/target/wheel-test-venv
rm -rf "$VENV"
python3 -m venv "$VENV"
# A user's environment: the system's PATH only (no cargo, no maturin), no UCX variables.
clean_env=(env -i HOME="$HOME" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TMPDIR=/tmp CI="${CI:-}")
start=$SECONDS
"${clean_env[@]}" timeout 900 "$VENV/bin/pip" install -q --disable-pip-version-check "$WHEEL[test]" \
  || skip_or_fail python "could not install $WHEEL and its dependencies from PyPI (no network?)"
echo "python: pip install $(basename "$WHEEL")[test] into a new venv: $((SECONDS - start)) s"
"${clean_env[@]}" sh -c '! command -v cargo' >/dev/null || { echo "python: cargo on the clean PATH" >&2; exit 1; }
"${clean_env[@]}" "$VENV/bin/python" -m ucxrs
# A test that hangs ends its run within 120 s with every thread's stack (pytest-timeout).
# From /tmp: the installed package, not python/ucxrs, is what `import ucxrs` finds.
pytest_args=(-q -p no:cacheprovider --timeout 120 --timeout-method thread)
for mode in thread blocking polling; do
  echo "python: the installed wheel's tests, progress mode $mode"
  (cd /tmp && "${clean_env[@]}" UCXRS_TEST_UCX=wheel UCXPY_PROGRESS_MODE=$mode timeout 600 \
    "$VENV/bin/python" -m pytest "${pytest_args[@]}" "$ROOT/python/tests")
done
# The module's doctests, against the installed package; the Dask comm (ucxrs.distributed)
# needs Dask, and has its own tests (scripts/dask_backend_test.sh).
PKG=$("$VENV/bin/python" -c "import os, ucxrs; print(os.path.dirname(ucxrs.__file__))")
(cd /tmp && "${clean_env[@]}" timeout 300 "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  -o asyncio_default_fixture_loop_scope=function --doctest-modules --ignore="$PKG/distributed.py" "$PKG")
# The seed's example (UCX-Py's "Send/Recv with CuPy", with NumPy arrays here): a server process
# and a client.
"${clean_env[@]}" timeout 120 "$VENV/bin/python" python/examples/send_recv.py
[ "${1:-}" = --wheel ] && exit 0

# From source, as a contributor builds it: against the UCX pkg-config finds (Debian's), with
# device arrays built in, into a venv with no libucx wheel, so it runs on the system's UCX.
SRC_VENV=target/py-venv
PY=$SRC_VENV/bin/python
if [ ! -x "$PY" ] || ! "$PY" -c "import maturin, pytest, pytest_asyncio, pytest_timeout, numpy" 2>/dev/null; then
  echo "python: installing maturin, pytest, pytest-asyncio, pytest-timeout and numpy into $SRC_VENV"
  rm -rf "$SRC_VENV"
  python3 -m venv "$SRC_VENV"
  timeout 900 "$SRC_VENV/bin/pip" install -q --disable-pip-version-check maturin pytest pytest-asyncio pytest-timeout numpy \
    || { rm -rf "$SRC_VENV"; skip_or_fail python "could not install maturin and pytest from PyPI (no network?)"; }
fi
start=$SECONDS
# Without build isolation, so the maturin above builds it (no download).
PATH="$PWD/$SRC_VENV/bin:$PATH" CARGO_BUILD_JOBS=2 MATURIN_PEP517_ARGS="--features cuda" \
  "$SRC_VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
echo "python: pip install ./python (from source): $((SECONDS - start)) s"
"$PY" -m ucxrs
(cd /tmp && UCXRS_TEST_UCX=system timeout 600 "$ROOT/$PY" -m pytest "${pytest_args[@]}" "$ROOT/python/tests")
