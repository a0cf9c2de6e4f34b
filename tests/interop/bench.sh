#!/usr/bin/env bash
# UCXX's own send_recv benchmark client against a UCXX listener and against our Rust listener
# (`ucxx-peer bench-server`), interleaved in one run. Needs the environment that
# tests/interop/run.sh creates. Usage: bash tests/interop/bench.sh [rounds] [our progress mode]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
MODE=${2:-blocking}   # our server's progress mode
VENV=target/ucxx-venv
PY=$VENV/bin/python
"$PY" -c "import ucxx" 2>/dev/null || { echo "run tests/interop/run.sh first (it installs UCXX)"; exit 1; }
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
LIBUCX=$SITE/libucx
UCX_PREFIX=$LIBUCX CARGO_TARGET_DIR=target/ucx-ucxx cargo build -q -j2 --release --bin ucxx-peer
PEER=target/ucx-ucxx/release/ucxx-peer
export LD_LIBRARY_PATH=$LIBUCX/lib:$SITE/libucx_cu12.libs
export UCX_MODULE_DIR=$LIBUCX/lib/ucx UCX_WARN_UNUSED_ENV_VARS=n
LOG=target/ucx-ucxx/bench-logs
mkdir -p "$LOG"
WARM=100

# One client run against the given server kind; prints "latency_ns bandwidth".
one() { # $1: ucxx|rust, $2: bytes, $3: iterations
  local kind=$1 bytes=$2 iters=$3
  local port=$((40000 + RANDOM % 20000))
  if [ "$kind" = rust ]; then
    "$PEER" bench-server --mode "$MODE" --port $port --bytes "$bytes" --iters $((iters + WARM)) > "$LOG/server.out" 2>&1 &
  else
    "$PY" -m ucxx.benchmarks.send_recv --server-only -p $port -n "$bytes" \
      --n-iter "$iters" --n-warmup-iter $WARM > "$LOG/server.out" 2>&1 &
  fi
  local spid=$!
  sleep 2
  timeout 300 "$PY" -m ucxx.benchmarks.send_recv --client-only -s 127.0.0.1 -p $port -n "$bytes" \
    --n-iter "$iters" --n-warmup-iter $WARM --no-detailed-report > "$LOG/client.out" 2>&1 || true
  for _ in $(seq 100); do kill -0 $spid 2>/dev/null || break; sleep 0.1; done
  kill -9 $spid 2>/dev/null || true
  wait $spid 2>/dev/null || true
  local lat bw
  lat=$(awk -F'|' '/Latency \(median\)/{gsub(/[^0-9]/,"",$2); print $2}' "$LOG/client.out")
  bw=$(awk -F'|' '/Bandwidth \(median\)/{print $2}' "$LOG/client.out" | xargs)
  [ -n "$lat" ] || { echo "no result from the $kind server run:" >&2; tail -5 "$LOG/client.out" >&2; exit 1; }
  echo "$lat $bw"
}

echo "UCXX send_recv client (TAG API, numpy, thread progress) against each listener, $ROUNDS rounds"
printf "%-10s %-6s %16s %22s\n" size server "latency median" "bandwidth median"
for round in $(seq "$ROUNDS"); do
  for spec in "8 2000" "1048576 300" "67108864 30"; do
    set -- $spec
    for kind in ucxx rust; do
      read -r lat bw < <(one $kind "$1" "$2")
      printf "%-10s %-6s %13s ns %22s   (round %d)\n" "$1" "$kind" "$lat" "$bw" "$round"
    done
  done
done
