#!/usr/bin/env bash
# distributed's protocol-generic comm checks (distributed/comm/tests/test_comms.py: client and
# server, closed implicitly and explicitly, closed on a read error, connect timeout, many
# listeners, deserialize, round trip, EOF, repr, addresses) against `ucxrs://`, in each of the
# comm's progress modes; test_comms_ucxrs.py calls distributed's own check functions.
#
#   bash tests/distributed_suite/run.sh DISTRIBUTED_CHECKOUT
#
# DISTRIBUTED_CHECKOUT: a checkout of github.com/dask/distributed at the version installed in
# target/ucxx-venv (this script prints it; the wheel ships neither the tests nor the TLS
# certificates they load). Not a CI step, for the reason tests/ucxx_suite/run.sh gives; the
# Dask step runs python/tests_dask/test_comm.py, our own tests of the same contract.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SRC=$(cd "${1:?usage: $0 DISTRIBUTED_CHECKOUT}" && pwd)
export DISTRIBUTED_TEST_COMMS=$SRC/distributed/comm/tests/test_comms.py
[ -f "$DISTRIBUTED_TEST_COMMS" ] || { echo "distributed suite: no $DISTRIBUTED_TEST_COMMS" >&2; exit 2; }
bash scripts/dask_backend_test.sh --setup >/dev/null
PY=$ROOT/target/ucxx-venv/bin/python
echo "distributed suite: distributed $("$PY" -c 'import distributed; print(distributed.__version__)') installed; checks from $SRC$(git -C "$SRC" describe --tags 2>/dev/null | sed 's/^/ at /')"
export UCX_WARN_UNUSED_ENV_VARS=n
failed=0
for mode in loop thread blocking; do
  echo "distributed suite: the comm in progress mode $mode"
  (cd /tmp && DASK_DISTRIBUTED__COMM__UCXRS__PROGRESS_MODE=$mode timeout 600 "$PY" -m pytest -q \
    -p no:cacheprovider -o asyncio_mode=auto -o asyncio_default_fixture_loop_scope=function \
    --timeout 120 --timeout-method thread "$ROOT/tests/distributed_suite/test_comms_ucxrs.py") \
    || failed=1
done
exit $failed
