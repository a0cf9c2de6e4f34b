#!/usr/bin/env bash
# UCXX's own asyncio test-suite against ucxrs: its tests and pure-Python helpers unedited, run
# with `import ucxx` naming ucxrs (tests/ucxx_suite/shim: it renames, and maps the private
# hooks UCXX's helpers reach into).
#
#   bash tests/ucxx_suite/run.sh UCXX_CHECKOUT [MODE...]
#
# UCXX_CHECKOUT: a checkout of github.com/rapidsai/ucxx at the release of the UCXX wheel in
# target/ucxx-venv (its python/ucxx/ucxx/_lib_async/tests; the wheel ships its helpers, not its
# tests); this script prints the wheel's commit. MODE: UCXX's progress modes, thread, blocking
# and polling by default, each a run of pytest as UCXX's CI runs it (--runslow,
# --import-mode=append). Every test must pass, skip (the GPU tests skip without CuPy), or be
# listed in tests/ucxx_suite/not_passing.txt with the reason it does not; a listed test that
# passes fails the run too (the list is kept true). Prints the counts per mode.
#
# Not a CI step: CI reaches PyPI but not GitHub, and neither UCXX's wheel nor any PyPI
# distribution carries these tests (UCXX's sdists are stubs). docs/testing.md has the figures.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SRC=${1:?usage: $0 UCXX_CHECKOUT [MODE...]}
shift
MODES=("$@")
[ ${#MODES[@]} -gt 0 ] || MODES=(thread blocking polling)
SRC=$(cd "$SRC" && pwd)
TESTS=$SRC/python/ucxx/ucxx/_lib_async/tests
[ -f "$TESTS/conftest.py" ] || { echo "ucxx suite: no $TESTS/conftest.py: not a UCXX checkout" >&2; exit 2; }
source scripts/lib.sh
VENV=target/ucxx-venv
PY=$ROOT/$VENV/bin/python
# The Dask step's venv: UCXX (for its helpers), pytest-asyncio; and the ucxrs wheel.
bash scripts/dask_backend_test.sh --setup >/dev/null
"$PY" -c "import pytest_rerunfailures" 2>/dev/null \
  || timeout 300 "$VENV/bin/pip" install -q --disable-pip-version-check "pytest-rerunfailures!=16.0.0"
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export UCXX_PACKAGE_DIR=$SITE/ucxx
echo "ucxx suite: UCXX $(cat "$UCXX_PACKAGE_DIR/VERSION") helpers (wheel commit $(cat "$UCXX_PACKAGE_DIR/GIT_COMMIT")), tests from $SRC$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null | sed 's/^/ at /')"
OUT=$ROOT/target/ucxx-suite
rm -rf "$OUT" && mkdir -p "$OUT"
export PYTHONPATH=$ROOT/tests/ucxx_suite/shim UCX_WARN_UNUSED_ENV_VARS=n
failed=0
for mode in "${MODES[@]}"; do
  work=$OUT/$mode
  mkdir -p "$work"
  cp -r "$TESTS" "$work/tests"
  echo "ucxx suite: progress mode $mode"
  set +e
  (cd "$work" && UCXPY_PROGRESS_MODE=$mode timeout 2400 "$PY" -m pytest -p no:cacheprovider \
    --import-mode=append -o asyncio_mode=auto --runslow --timeout 180 -q -rfE \
    --continue-on-collection-errors --junitxml="$work/results.xml" tests > "$work/pytest.log" 2>&1)
  rc=$?
  set -e
  tail -3 "$work/pytest.log"
  [ -s "$work/results.xml" ] || { echo "ucxx suite: $mode: pytest wrote no results (exit $rc)" >&2; failed=1; continue; }
  "$PY" tests/ucxx_suite/verdict.py "$mode" "$work/results.xml" tests/ucxx_suite/not_passing.txt || failed=1
done
exit $failed
