#!/usr/bin/env bash
# Interop with the real UCXX (PyPI ucxx-cu12 0.52), run by scripts/test.sh.
#
# 1. A virtual environment under target/ucxx-venv with ucxx-cu12 and numpy (installed once).
#    When PyPI cannot be reached, this prints why and exits 0 (skipped); in CI it fails.
# 2. `ucxx-peer` built against the UCX inside that environment (libucx-cu12): UCX's
#    client-server wire-up differs between Debian's 1.13 and the wheel's 1.21 ("no remote ep
#    address for lane", "Invalid parameter"), so both peers must run the same UCX.
# 3. Both directions: Rust listener <-> UCXX client and UCXX listener <-> Rust client, every
#    step of tests/interop/ucxx_peer.py (tags, forced tags, objects, multi-buffer, active
#    messages), each side closing once; and a UCXX client with a corrupted handshake, after
#    which our listener still serves a good client.
#
# On a GPU machine, UCXX_INTEROP_MEMORY=cuda runs the pairings with device memory on both sides:
# CuPy arrays in Python (cupy must import in the venv) and DeviceBuffers in Rust (ucxx-peer
# built with --features cuda). The default is host memory (numpy).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh
VENV=target/ucxx-venv
PY=$VENV/bin/python
if [ ! -x "$PY" ] || ! "$PY" -c "import ucxx, numpy" 2>/dev/null; then
  echo "interop: installing ucxx-cu12 and numpy into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  if ! timeout 900 "$VENV/bin/pip" install -q --disable-pip-version-check ucxx-cu12 numpy; then
    rm -rf "$VENV"
    skip_or_fail interop "could not install ucxx-cu12 from PyPI (no network?)"
  fi
fi
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
LIBUCX=$SITE/libucx
[ -d "$LIBUCX/include" ] || { echo "interop: $LIBUCX has no headers" >&2; exit 1; }
UCX_VERSION=$(cat "$LIBUCX/VERSION.txt" 2>/dev/null || echo "?")
UCXX_VERSION=$("$PY" -c "import ucxx; print(ucxx.__version__)")
echo "interop: UCXX $UCXX_VERSION, UCX $UCX_VERSION (from the wheel, for both sides)"
MEMORY=${UCXX_INTEROP_MEMORY:-host}
FEATURES=()
[ "$MEMORY" = cuda ] && FEATURES=(--features cuda)
echo "interop: $MEMORY memory on both sides"
# In STACK_PROFILE, as scripts/compare.py --interop builds it (CI runs both: one build serves
# the two).
UCX_PREFIX=$LIBUCX CARGO_TARGET_DIR=target/ucx-ucxx cargo build -q -j2 --profile "$STACK_PROFILE" "${FEATURES[@]}" -p ucxx-peer
PEER=target/ucx-ucxx/${STACK_DIR##*/}/ucxx-peer
export LD_LIBRARY_PATH=$LIBUCX/lib:$SITE/libucx_cu12.libs
export UCX_MODULE_DIR=$LIBUCX/lib/ucx UCX_WARN_UNUSED_ENV_VARS=n
SCRIPT=tests/interop/ucxx_peer.py
LOG=target/ucx-ucxx/interop-logs
mkdir -p "$LOG"
failed=0

# Starts a server ($1: rust|python, $2...: its arguments); sets SERVER_PID and PORT.
start_server() {
  local kind=$1 out=$LOG/server.out
  shift
  : > "$out"
  if [ "$kind" = rust ]; then
    "$PEER" server "$@" > "$out" 2> "$LOG/server.err" &
  elif [ "$kind" = ucxrs ]; then
    "$PY" "$SCRIPT" server --module ucxrs "$@" > "$out" 2> "$LOG/server.err" &
  else
    "$PY" "$SCRIPT" server "$@" > "$out" 2> "$LOG/server.err" &
  fi
  SERVER_PID=$!
  PORT=""
  for _ in $(seq 300); do
    PORT=$(awk '/LISTENING/{print $2}' "$out")
    [ -n "$PORT" ] && return 0
    sleep 0.1
  done
  echo "interop: $kind server did not start" >&2
  cat "$LOG/server.err" >&2
  return 1
}

# Waits for the server with a limit; its status in SERVER_RC.
wait_server() {
  for _ in $(seq 600); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$SERVER_PID" 2>/dev/null || true
  SERVER_RC=0
  wait "$SERVER_PID" || SERVER_RC=$?
}

run_pair() { # $1: server kind, $2: client kind, $3: closer
  local s=$1 c=$2 closer=$3 rc=0
  # PAIR_STEPS: the steps both sides run (default: all of them).
  local steps_arg=()
  [ -n "${PAIR_STEPS:-}" ] && steps_arg=(--steps "$PAIR_STEPS")
  start_server "$s" --closer "$closer" --memory "$MEMORY" "${steps_arg[@]}"
  if [ "$c" = rust ]; then
    timeout 300 "$PEER" client --port "$PORT" --closer "$closer" --memory "$MEMORY" "${steps_arg[@]}" > "$LOG/client.out" 2> "$LOG/client.err" || rc=$?
  elif [ "$c" = ucxrs ]; then
    timeout 300 "$PY" "$SCRIPT" client --module ucxrs --port "$PORT" --closer "$closer" --memory "$MEMORY" "${steps_arg[@]}" > "$LOG/client.out" 2> "$LOG/client.err" || rc=$?
  else
    timeout 300 "$PY" "$SCRIPT" client --port "$PORT" --closer "$closer" --memory "$MEMORY" "${steps_arg[@]}" > "$LOG/client.out" 2> "$LOG/client.err" || rc=$?
  fi
  wait_server
  local steps
  steps=$(grep -c '^OK' "$LOG/client.out" || true)
  if [ "$rc" -eq 0 ] && [ "$SERVER_RC" -eq 0 ] && grep -q '^DONE' "$LOG/client.out" && grep -q '^DONE' "$LOG/server.out"; then
    echo "interop: PASS $s listener <-> $c client, $closer closes: $steps steps ($(grep '^OK' "$LOG/client.out" | cut -c4- | tr '\n' ';'))"
  else
    echo "interop: FAIL $s listener <-> $c client, $closer closes (client $rc, server $SERVER_RC)"
    sed 's/^/  client: /' "$LOG/client.out" "$LOG/client.err" | tail -20
    sed 's/^/  server: /' "$LOG/server.out" "$LOG/server.err" | tail -20
    failed=1
  fi
}

run_pair rust python client
run_pair rust python server
run_pair python rust client
run_pair python rust server

# A corrupted handshake from a UCXX client is rejected and logged; the listener keeps serving.
start_server rust --closer client --steps tagless
rc=0
timeout 60 "$PY" "$SCRIPT" bad-handshake --port "$PORT" > "$LOG/bad.out" 2> "$LOG/bad.err" || rc=$?
timeout 300 "$PY" "$SCRIPT" client --port "$PORT" --steps tagless > "$LOG/client.out" 2> "$LOG/client.err" || rc=$?
wait_server
if [ "$rc" -eq 0 ] && [ "$SERVER_RC" -eq 0 ] && grep -q "handshake" "$LOG/server.err" && grep -q '^DONE' "$LOG/client.out"; then
  echo "interop: PASS corrupted handshake from UCXX rejected ($(grep -m1 -o 'handshake[^[:cntrl:]]*' "$LOG/server.err" | head -c 160)), next UCXX client served"
else
  echo "interop: FAIL corrupted handshake (client $rc, server $SERVER_RC)"
  sed 's/^/  bad: /' "$LOG/bad.out" "$LOG/bad.err" | tail -10
  sed 's/^/  server: /' "$LOG/server.out" "$LOG/server.err" | tail -10
  failed=1
fi

# The Python package (python/, UCXX's API over ucx-rs) against real UCXX, both directions, the
# steps of the script: the ucxrs-cu12 wheel (scripts/wheel.sh; scripts/python_test.sh built it
# before this in CI), installed into this venv beside UCXX, so both run the libucx wheel's UCX,
# found without LD_LIBRARY_PATH or UCX_MODULE_DIR (ucxrs loads it as UCXX does), with host memory.
if [ "$MEMORY" = host ]; then
  install_ucxrs_wheel "$VENV"
  echo "interop: ucxrs on UCX $("$PY" -c 'import ucxrs; print(ucxrs.__ucx_version__, "from", ucxrs.ucx_library())')"
  PAIR_STEPS=tagless,tags,forced,obj,multi,am
  run_pair python ucxrs client
  run_pair python ucxrs server
  run_pair ucxrs python client
  run_pair ucxrs python server
  PAIR_STEPS=
  # Both packages in one process, imported either way round (as users mix them): one UCX.
  for order in ucxrs,ucxx ucxx,ucxrs; do
    rc=0
    out=$(env -u LD_LIBRARY_PATH -u UCX_MODULE_DIR timeout 120 "$PY" tests/interop/together.py "$order" 2>&1) || rc=$?
    if [ "$rc" -eq 0 ]; then
      echo "interop: PASS in one process: $(echo "$out" | grep '^OK' | cut -c4-)"
    else
      echo "interop: FAIL ucxrs and UCXX in one process, imported $order (exit $rc)"
      echo "$out" | tail -20 | sed 's/^/  /'
      failed=1
    fi
  done
fi
exit $failed
