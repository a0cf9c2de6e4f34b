#!/usr/bin/env bash
# A/B of two ucx-echo builds, interleaved rounds: 8 B one-way latency (client-server and direct
# endpoints) and 8 B message rate (64 in flight). Server on CPU 0, client on CPU 1, polling.
#   git stash; CARGO_TARGET_DIR=target/abtest cargo build --release --bin ucx-echo; git stash pop
#   cargo build --release --bin ucx-echo
#   bash scripts/ab-ucx-echo.sh target/abtest/release/ucx-echo target/release/ucx-echo [rounds]
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=${3:-3}
run() { # binary, client flags...: prints "median_us msgs_per_s_millions"
  local b=$1 out port
  shift
  out=$(mktemp)
  taskset -c 0 "$b" server --bind 127.0.0.1 --mode polling --once > "$out" &
  local pid=$!
  for _ in $(seq 50); do port=$(awk '/LISTENING/{print $2}' "$out"); [ -n "$port" ] && break; sleep 0.1; done
  taskset -c 1 "$b" client --connect "127.0.0.1:$port" --mode polling --sizes 8 --json "$@" |
    python3 -c "import sys,json; r=json.loads([l for l in sys.stdin if l.startswith('{')][0]); print(r['median_us'], round(r.get('stream_MBps', 0) / 8, 3))"
  wait $pid
  rm -f "$out"
}
for round in $(seq "$ROUNDS"); do
  for v in "old:$OLD" "new:$NEW"; do
    b=${v#*:}
    echo "${v%%:*} round $round: latency client-server $(run "$b" --iters 30000 | cut -d' ' -f1) us," \
      "direct $(run "$b" --iters 30000 --direct | cut -d' ' -f1) us;" \
      "rate client-server $(run "$b" --iters 250000 --bw --window 64 | cut -d' ' -f2) M/s," \
      "direct $(run "$b" --iters 250000 --bw --window 64 --direct | cut -d' ' -f2) M/s"
  done
done
