#!/bin/bash
# The ~150 us floor of small device messages: ucx_perftest -m cuda variants and ucx-gpu-echo
# with one or both sides in device memory, staged or not (see the README, "Small device messages").
# Usage (on the GPU machine, the wheel unpacked at $W, the release ucx-gpu-echo at $E):
#   W=... E=... bash scripts/gpu/floor.sh
set -u

export LD_LIBRARY_PATH=$W/libucx/lib:$W/libucx_cu13.libs UCX_MODULE_DIR=$W/libucx/lib/ucx

PT=$W/libucx/bin/ucx_perftest
port=25000
pt() { port=$((port+1)); local lab="$1"; shift; local args="$1"; shift
  timeout 30 env "$@" taskset -c 2 $PT -p $port >/dev/null 2>&1 & local s=$!; sleep 0.7
  printf "%-50s " "$lab"; timeout 30 env "$@" taskset -c 4 $PT 127.0.0.1 -p $port $args 2>&1 | awk '/Final/{print "lat_us", $3, "bw_MBps", $6}'; wait $s; }
pt "cuda 8B" "-t tag_lat -m cuda -s 8 -n 1000"
pt "host,cuda 8B (recv into cuda)" "-t tag_lat -m host,cuda -s 8 -n 1000"
pt "cuda,host 8B (send from cuda)" "-t tag_lat -m cuda,host -s 8 -n 1000"
pt "cuda 8B MEMTYPE_CACHE=n" "-t tag_lat -m cuda -s 8 -n 1000" UCX_MEMTYPE_CACHE=n
pt "cuda 8B RNDV_THRESH=0" "-t tag_lat -m cuda -s 8 -n 1000" UCX_RNDV_THRESH=0
pt "cuda 8B TLS=sm,cuda_copy" "-t tag_lat -m cuda -s 8 -n 1000" UCX_TLS=sm,cuda_copy
pt "cuda 8B TLS=sm,cuda_ipc,cuda_copy" "-t tag_lat -m cuda -s 8 -n 1000" UCX_TLS=sm,cuda_ipc,cuda_copy
pt "cuda 8B TLS=posix,cuda_copy" "-t tag_lat -m cuda -s 8 -n 1000" UCX_TLS=posix,cuda_copy
pt "cuda 8B TLS=tcp,cuda_copy" "-t tag_lat -m cuda -s 8 -n 1000" UCX_TLS=tcp,cuda_copy
pt "cuda 64KiB" "-t tag_lat -m cuda -s 65536 -n 1000"
pt "cuda 64KiB TLS=^cuda_ipc" "-t tag_lat -m cuda -s 65536 -n 1000" UCX_TLS=^cuda_ipc
pt "cuda 1MiB TLS=^cuda_ipc" "-t tag_lat -m cuda -s 1048576 -n 500" UCX_TLS=^cuda_ipc
ours() { local lab=$1 smem=$2 cmem=$3; shift 3
  taskset -c 2 $E server --bind 127.0.0.1 --once --memory $smem "$@" > /tmp/srv.out 2>/tmp/srv.err & local s=$!
  for i in $(seq 50); do grep -q LISTENING /tmp/srv.out && break; sleep 0.1; done
  local p=$(awk '/LISTENING/{print $2}' /tmp/srv.out)
  printf "%-50s " "ours $lab"; timeout 30 taskset -c 4 $E client --connect 127.0.0.1:$p --memory $cmem --sizes 8,65536 --iters 500 --json "$@" 2>&1 | python3 -c "import sys,json; print([(r['size'], r['median_us']) for r in map(json.loads, [l for l in sys.stdin if l.startswith('{')])])"
  kill $s 2>/dev/null; wait $s 2>/dev/null; }
ours "staged: server host, client cuda" host cuda --stage-below max
ours "staged: server cuda, client host" cuda host --stage-below max
ours "ucx: server host, client cuda" host cuda --stage-below 0
ours "staged both, blocking mode" cuda cuda --stage-below max --mode blocking
