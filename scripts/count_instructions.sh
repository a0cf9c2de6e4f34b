#!/usr/bin/env bash
# Instructions per 8 B round trip on the client of a ping-pong, counted by callgrind: exact
# where a timed A/B on this shared machine moves by more than the change. The client runs
# twice (N/10 and N round trips, plus the clients' own warm-up of a tenth); the difference
# divided by the extra round trips cancels start-up. The count includes the client's own
# waiting (progress calls until the echo is there), which under valgrind is short.
#
#   bash scripts/count_instructions.sh target/release/transport-echo [N]   # ucx://, polling
#   bash scripts/count_instructions.sh target/release/ucx-echo [N]         # ucx-rs, polling
set -euo pipefail
bin=${1:?usage: count_instructions.sh PATH/transport-echo|PATH/ucx-echo [N]}
n=${2:-20000}
command -v valgrind > /dev/null || { echo "valgrind not found"; exit 1; }
# Which tool it is: each names itself when run without arguments.
if { "$bin" 2>&1 || true; } | head -1 | grep -q 'transport-echo'; then kind=transport; else kind=ucx; fi
tmp=$(mktemp -d)
trap 'pkill -f "$bin server" 2> /dev/null || true; rm -rf "$tmp"' EXIT
count() { # count ITERS -> total instructions of one client run
  local iters=$1 addr
  if [ "$kind" = transport ]; then
    taskset -c 0 "$bin" server --listen ucx://127.0.0.1:0 --ucx-progress polling --once > "$tmp/srv" 2>&1 &
    for _ in $(seq 50); do addr=$(grep -o 'ucx://[^ ]*' "$tmp/srv" | head -1 || true); [ -n "$addr" ] && break; sleep 0.1; done
    set -- "$bin" client --connect "$addr" --sizes 8 --iters "$iters" --ucx-progress polling
  else
    taskset -c 0 "$bin" server --bind 127.0.0.1 --mode polling --once > "$tmp/srv" 2>&1 &
    for _ in $(seq 50); do addr=$(grep -o 'LISTENING [0-9]*' "$tmp/srv" | grep -o '[0-9]*$' || true); [ -n "$addr" ] && break; sleep 0.1; done
    set -- "$bin" client --connect "127.0.0.1:$addr" --sizes 8 --iters "$iters" --exact --mode polling --json
  fi
  [ -n "$addr" ] || { echo "the server did not start: $(cat "$tmp/srv")" >&2; exit 1; }
  taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" "$@" > /dev/null 2> "$tmp/vg"
  wait
  grep -o 'Collected : [0-9]*' "$tmp/vg" | grep -o '[0-9]*$'
}
small=$(count $((n / 10)))
large=$(count "$n")
# Both clients add a warm-up of a tenth of their round trips (at least 2).
extra=$(( (n + (n + 9) / 10) - (n / 10 + (n / 10 + 9) / 10) ))
echo "$(basename "$bin"): $(( (large - small) / extra )) instructions per round trip ($n and $((n / 10)) round trips)"
