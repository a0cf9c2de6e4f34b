#!/usr/bin/env bash
# Instructions per 8 B round trip on the client of a ping-pong, counted by callgrind: exact
# where a timed A/B on this shared machine moves by more than the change. The client runs
# twice (N/10 and N round trips, plus the clients' own warm-up of a tenth); the difference
# divided by the extra round trips cancels start-up. The count includes the client's own
# waiting (progress calls until the echo is there), which under valgrind is short.
#
#   bash scripts/count_instructions.sh target/release/transport-echo [N]   # ucx://, polling
#   bash scripts/count_instructions.sh target/release/ucx-echo [N]         # ucx-rs, polling
#   bash scripts/count_instructions.sh ucx_perftest [N]                    # the reference
#   ... --layers                       also the count per round trip by layer (docs/performance.md)
#
# The reference is `ucx_perftest -t tag_lat -e` on the same UCX (the `ucx_perftest` named:
# Debian's, or a path), configured as ucx-rs configures UCX (MM_ERROR_HANDLING=y,
# TCP_PUT_ENABLE=n: scripts/compare.py's UCX_RS_DEFAULTS), so both go over the same lanes.
set -euo pipefail
bin=${1:?usage: count_instructions.sh PATH/transport-echo|PATH/ucx-echo|ucx_perftest [N] [--layers]}
shift
n=20000
layers=""
for a in "$@"; do
  case $a in
    --layers) layers=1 ;;
    *) n=$a ;;
  esac
done
command -v valgrind > /dev/null || { echo "valgrind not found"; exit 1; }
# Which tool it is: each names itself when run without arguments (ucx_perftest by its name).
if [ "$(basename "$bin")" = ucx_perftest ]; then
  kind=perftest
elif { "$bin" 2>&1 || true; } | head -1 | grep -q 'transport-echo'; then
  kind=transport
else
  kind=ucx
fi
tmp=$(mktemp -d)
trap 'kill $(cat "$tmp/pids" 2> /dev/null) 2> /dev/null || true; rm -rf "$tmp"' EXIT
count() { # count ITERS OUT -> total instructions of one client run (its profile in OUT)
  local iters=$1 out=$2 addr="" port
  if [ "$kind" = perftest ]; then
    port=$((13000 + RANDOM % 2000))
    export UCX_MM_ERROR_HANDLING=y UCX_TCP_PUT_ENABLE=n  # this subshell's: server and client
    taskset -c 0 "$bin" -p "$port" -c 0 > "$tmp/srv" 2>&1 &
    echo $! >> "$tmp/pids"
    # Until it listens (bounded: 10 s).
    for _ in $(seq 100); do ss -ltn 2> /dev/null | grep -q ":$port " && { addr=$port; break; }; sleep 0.1; done
    set -- "$bin" 127.0.0.1 -p "$port" -c 1 -t tag_lat -s 8 \
      -n "$iters" -w $(((iters + 9) / 10)) -e
  elif [ "$kind" = transport ]; then
    taskset -c 0 "$bin" server --listen ucx://127.0.0.1:0 --ucx-progress polling --once > "$tmp/srv" 2>&1 &
    echo $! >> "$tmp/pids"
    for _ in $(seq 50); do addr=$(grep -o 'ucx://[^ ]*' "$tmp/srv" | head -1 || true); [ -n "$addr" ] && break; sleep 0.1; done
    set -- "$bin" client --connect "$addr" --sizes 8 --iters "$iters" --ucx-progress polling
  else
    taskset -c 0 "$bin" server --bind 127.0.0.1 --mode polling --once > "$tmp/srv" 2>&1 &
    echo $! >> "$tmp/pids"
    for _ in $(seq 50); do addr=$(grep -o 'LISTENING [0-9]*' "$tmp/srv" | grep -o '[0-9]*$' || true); [ -n "$addr" ] && break; sleep 0.1; done
    set -- "$bin" client --connect "127.0.0.1:$addr" --sizes 8 --iters "$iters" --exact --mode polling --json
  fi
  [ -n "$addr" ] || { echo "the server did not start: $(cat "$tmp/srv")" >&2; exit 1; }
  taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$out" "$@" > "$tmp/client" 2> "$tmp/vg" \
    || { echo "the client failed: $(tail -5 "$tmp/client" "$tmp/vg")" >&2; exit 1; }
  wait
  grep -o 'Collected : [0-9]*' "$tmp/vg" | grep -o '[0-9]*$' \
    || { echo "no count from callgrind: $(tail -5 "$tmp/vg")" >&2; exit 1; }
}
small=$(count $((n / 10)) "$tmp/small.cg")
large=$(count "$n" "$tmp/large.cg")
# Every client adds a warm-up of a tenth of its round trips (ucx_perftest's -w above).
extra=$(( (n + (n + 9) / 10) - (n / 10 + (n / 10 + 9) / 10) ))
echo "$(basename "$bin"): $(( (large - small) / extra )) instructions per round trip ($n and $((n / 10)) round trips)"
[ -n "$layers" ] || exit 0
# By layer: each function's own instructions (not its callees'), the difference of the two runs
# per extra round trip, summed by which code the function is (its symbol and object file).
for f in small large; do
  callgrind_annotate --auto=no --threshold=100 --inclusive=no "$tmp/$f.cg" > "$tmp/$f.txt" 2> /dev/null
done
python3 - "$tmp/small.txt" "$tmp/large.txt" "$extra" <<'EOF'
import re, sys
from collections import defaultdict

def own(path):
    """{function (with its object file): own instructions} from callgrind_annotate."""
    got = {}
    for line in open(path):
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(.+?)\s*$", line)
        if m and ":" in m.group(2) and not m.group(2).startswith(("Ir", "--", "=>")):
            got[m.group(2)] = got.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return got

# What each layer's functions look like: callgrind names a function by the source file its
# code is in (after inlining: the crate whose code ran), its symbol and its object file; the
# file decides first, then the symbol or object (first match wins).
LAYERS = [
    # The echo clients: their binaries, the facade's src/echo.rs, and the sort of their samples.
    ("the echo client itself (timing, loop)", r"core::slice::sort::|src/bin/|^src/|/work/[^/]+/src/"),
    ("allocation (malloc, free)", r"malloc\.c:|/malloc/|alloc::alloc|__rust_(alloc|dealloc)|\b(malloc|free|realloc|cfree)\b"),
    ("memcpy, memset (moves of futures and buffers)", r"memmove|memcpy|memset"),
    ("locks and atomics (pthread, parking_lot)", r"nptl/|pthread_|parking_lot|lock_api|__lll_|futex"),
    ("UCX: uct (transports: shm, tcp)", r"libuct"),
    ("UCX: ucp (the API: requests, protocols, progress)", r"libucp"),
    ("UCX: ucs (lists, timers, async, memory hooks)", r"libucs|libucm"),
    ("tokio (tasks, wakers, scheduling, timers)", r"tokio-[0-9]"),
    ("futures-util, std::task (join, poll_fn, wakers)", r"futures-util-|futures-core-|/library/core/src/task|/library/std/src/task"),
    ("transport (framing, budget, channels)", r"^transport/src|/transport/src/"),
    ("ucx-rs (requests, futures, endpoint, worker lock)", r"^ucx-rs/src|/ucx-rs/src/"),
    ("the echo client itself (timing, loop)", r"^src/|/work/[^/]+/src/|ucx_echo|transport_echo|ucx_perftest\]"),
    ("std, core (the rest of the standard library)", r"/library/(std|core|alloc)/"),
    ("libc (clock, system calls)", r"clock_gettime|syscall|__vdso|libc\.so|ld-linux"),
]

# Functions callgrind knows no file for: by their symbol.
SYMBOLS = [
    ("tokio (tasks, wakers, scheduling, timers)", r"\btokio::"),
    ("transport (framing, budget, channels)", r"\btransport::"),
    ("ucx-rs (requests, futures, endpoint, worker lock)", r"\bucx::"),
    ("futures-util, std::task (join, poll_fn, wakers)", r"futures_util|futures_core"),
    ("the echo client itself (timing, loop)", r"ucx_echo::|transport_echo::|ucx_stack::"),
]

small, large, extra = own(sys.argv[1]), own(sys.argv[2]), int(sys.argv[3])
per = defaultdict(float)
top = []
for fn in set(small) | set(large):
    d = (large.get(fn, 0) - small.get(fn, 0)) / extra
    if abs(d) < 0.5:
        continue
    layer = next((name for name, pat in LAYERS if re.search(pat, fn)), None) or next(
        (name for name, pat in SYMBOLS if re.search(pat, fn)), "other")
    per[layer] += d
    top.append((d, layer, fn))
total = sum(per.values())
print(f"by layer (own instructions per round trip, {total:.0f} in functions over the threshold),")
print("each with its costliest functions:")
for layer, d in sorted(per.items(), key=lambda kv: -kv[1]):
    print(f"  {d:8.0f}  {100 * d / total:5.1f} %  {layer}")
    for fd, _, fn in sorted((t for t in top if t[1] == layer), reverse=True)[:3]:
        if fd >= 10:
            print(f"  {fd:18.0f}  {fn[:120]}")
EOF
