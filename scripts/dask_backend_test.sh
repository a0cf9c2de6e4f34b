#!/usr/bin/env bash
# Stock Dask on our transport (python/ucxrs/distributed.py, docs/dask.md), run by scripts/test.sh:
#   bash scripts/dask_backend_test.sh           set up, the backend's tests, one short benchmark round
#   bash scripts/dask_backend_test.sh --setup   set up only
# Set-up: target/ucxx-venv (tests/interop/run.sh's, with UCXX and the libucx wheel) gains Dask
# from PyPI through distributed-ucxx-cu12 (UCXX's Dask comm, for the comparison), dask-mpi, pandas,
# pyarrow and pytest, and the ucxrs-cu12 wheel, so that both UCX comms run the same UCX. The
# tests: python/tests_dask (Dask's comm contract, real clusters, a killed
# worker, strangers, `dask scheduler`/`dask worker`, workers started by mpirun, dask-mpi), in the
# backend's default progress mode (the event loop's), and the comm contract again with UCX's
# progress thread and in blocking mode. Then scripts/dask_comm_compare.py --quick: tcp, distributed-ucxx's ucx and
# ucxrs interleaved, answers checked against pandas (figures are not judged here).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
VENV=target/ucxx-venv
PY=$VENV/bin/python
if [ ! -x "$PY" ] || ! "$PY" -c "import ucxx, distributed_ucxx, pandas, pyarrow, pytest, pytest_asyncio, pytest_timeout, dask_mpi, mpi4py" 2>/dev/null; then
  echo "dask backend: installing distributed-ucxx-cu12, pandas, pyarrow and pytest into $VENV"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  timeout 900 "$VENV/bin/pip" install -q --disable-pip-version-check distributed-ucxx-cu12 \
    pandas pyarrow numpy pytest pytest-asyncio pytest-timeout dask-mpi mpi4py \
    || skip_or_fail dask-backend "could not install distributed-ucxx-cu12 and Dask from PyPI (no network?)"
fi
# ucxrs as users install it: the ucxrs-cu12 wheel (scripts/wheel.sh, built in CI by
# scripts/python_test.sh before this), beside UCXX's comm on the same libucx wheel, which both
# load themselves: no LD_LIBRARY_PATH, no UCX_MODULE_DIR.
install_ucxrs_wheel "$VENV"
export UCX_WARN_UNUSED_ENV_VARS=n
echo "dask backend: $("$PY" -c 'import distributed, ucxrs; print("Dask", distributed.__version__, "with ucxrs", ucxrs.__version__, "on UCX", ucxrs.__ucx_version__, "from", ucxrs.ucx_library())')"
[ "${1:-}" = --setup ] && exit 0
# A test that hangs ends the run within 120 s with every thread's stack (pytest-timeout); the
# slowest test, dask-mpi's, takes about 10 s.
pytest_args=(-q -p no:cacheprovider -o asyncio_mode=auto -o asyncio_default_fixture_loop_scope=function
  --timeout 120 --timeout-method thread)
(cd /tmp && timeout 600 "$OLDPWD/$PY" -m pytest "${pytest_args[@]}" "$OLDPWD/python/tests_dask")
for mode in thread blocking; do
  echo "dask backend: the comm contract in progress mode $mode"
  (cd /tmp && DASK_DISTRIBUTED__COMM__UCXRS__PROGRESS_MODE=$mode timeout 300 "$OLDPWD/$PY" -m pytest \
    "${pytest_args[@]}" "$OLDPWD/python/tests_dask/test_comm.py")
done
timeout 600 python3 scripts/dask_comm_compare.py --quick
