#!/usr/bin/env bash
# The GPU proof, run on a GPU machine that has no Rust toolchain and no network: unpacks what
# scripts/gpu/bundle.sh built here (.gpu/, carried there), runs each check with a time limit,
# prints one summary (what passed, what failed, the figures) and leaves its logs in $OUT
# (or .gpu/logs): summary.txt, prove.log (every step's output), compare-cuda.json.
#
#   bash scripts/gpu/prove.sh                 # every step, about 6 minutes on an H100
#   bash scripts/gpu/prove.sh --only python,interop
#
# Steps: info (the GPU, the UCX loaded, ucxrs.cuda_support()), rust (ucx-rs's `cuda` suite;
# rust:dask-comm, dask-comm's device-frame unit tests; rust:dask-collections, device blocks),
# array (device arrays on a two-worker cluster, checked against the host: the device tour),
# array-bench (device blocks fetched worker to worker over ucx:// and tcp://, per pair, beside
# ucx_perftest -m cuda: scripts/gpu/proof.py --part array),
# python (python/tests, device arrays included, in each progress mode), example (the seed's
# CuPy demo on ucxrs), interop (CuPy arrays with real UCXX, both ways), echo and bench
# (scripts/gpu/proof.py: ucx-rs device buffers across processes, every byte checked, and beside
# `ucx_perftest -m cuda`), dask (python/tests_dask/test_device.py: CuPy through the ucxrs://
# Dask comm, one comm and a two-worker cluster, RMM buffers; and the comm's contract),
# dask-cuda (LocalCUDACluster(protocol="ucxrs") moving CuPy values and RMM buffers, with an
# RMM pool: scripts/gpu/dask_cuda_check.py), dask-bench (CuPy
# values between two Dask workers over tcp:// and ucxrs://, beside ucx_perftest -m cuda:
# scripts/dask_comm_compare.py --memory cuda), compare (ucxrs, UCXX and ucx_perftest with CuPy
# arrays, scripts/python_compare.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
ONLY=${2:-}
[ "${1:-}" = "--only" ] || ONLY=""
LOGS=${OUT:-$ROOT/.gpu/logs}
mkdir -p "$LOGS"
LOG=$LOGS/prove.log
SUMMARY=$LOGS/summary.txt
: >"$LOG"
: >"$SUMMARY"
B=/tmp/ucxrs-gpu
PY=${GPU_PYTHON_BIN:-python3}

note() { echo "$*" | tee -a "$SUMMARY"; }
wanted() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
FAILED=0
step() { # step NAME SECONDS CMD...: runs CMD, its output into the log, its verdict into the summary
  local name=$1 limit=$2
  shift 2
  wanted "${name%%:*}" || return 0
  local start=$SECONDS rc
  echo "=== $name: $*" >>"$LOG"
  timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@" >>"$LOG" 2>&1
  rc=$?
  local verdict=PASS
  [ $rc = 0 ] || { verdict="FAIL (rc $rc$([ $rc = 124 ] && echo ", over ${limit}s"))"; FAILED=$((FAILED + 1)); }
  printf '%-34s %-22s %4ss\n' "$name" "$verdict" "$((SECONDS - start))" | tee -a "$SUMMARY"
}

if [ ! -f .gpu/bundle.tar.xz ]; then
  echo "prove: no .gpu/bundle.tar.xz: run scripts/gpu/bundle.sh on the build machine and carry .gpu" >&2
  exit 2
fi
rm -rf "$B" && mkdir -p "$B"
tar -C "$B" -xJf .gpu/bundle.tar.xz
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$B/wheels" .gpu/wheels/*.whl \
  >>"$LOG" 2>&1 || note "prove: installing the carried wheels failed (see prove.log)"
# What that machine may have already (pandas, cuda-bindings for dask-cuda): only where missing.
for whl in .gpu/wheels-if-missing/*.whl; do
  [ -f "$whl" ] || continue
  case $(basename "$whl") in
    pandas-*) mod=pandas ;; python_dateutil-*) mod=dateutil ;; tzdata-*) mod=tzdata ;;
    cuda_bindings-*) mod=cuda.bindings ;; *) mod="" ;;
  esac
  if [ -n "$mod" ] && "$PY" -c "import $mod" 2>/dev/null; then continue; fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$B/wheels" "$whl" \
    >>"$LOG" 2>&1 || note "prove: installing $(basename "$whl") failed (see prove.log)"
done
export PYTHONPATH=$B/site:$B/wheels PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export LD_LIBRARY_PATH=$B/site/libucx/lib:$B/site/libucx_cu13.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$B/site/libucx/lib/ucx
# cuBLAS for device matmul: the machine's Python wheels carry libcublas.so.<major> (CuPy's,
# PyTorch's); cudarc opens libcublas.so, which a link here names.
SITES=$("$PY" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
# shellcheck disable=SC2086
CUBLAS=$(find $SITES /usr/local/cuda*/lib64 /usr/lib/x86_64-linux-gnu -name 'libcublas.so.[0-9]*' \
  2>/dev/null | head -1)
if [ -n "$CUBLAS" ]; then
  mkdir -p "$B/cublas" && ln -sf "$CUBLAS" "$B/cublas/libcublas.so"
  # After the bundle's UCX: a system folder here must not shadow its libraries.
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$B/cublas:$(dirname "$CUBLAS")
else
  note "prove: no libcublas.so.* on this machine: device matmul will say so"
fi
PERFTEST=$B/site/libucx/bin/ucx_perftest

info() {
  nvidia-smi -L
  "$PY" - <<'EOF'
import cupy, ucxrs
print("ucxrs on UCX %d.%d.%d" % ucxrs.get_ucx_version(), "from", ucxrs.ucx_library())
print("cuda_support:", ucxrs.cuda_support(), "| CuPy", cupy.__version__, "|", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
assert ucxrs.cuda_support() == "zero-copy", "the libucx-cu13 wheel's UCX has cuda_copy/cuda_ipc"
EOF
}

interop() { # interop SERVER_MODULE CLIENT_MODULE: the UCXX interop script, CuPy arrays
  local out port srv rc
  out=$(mktemp)
  "$PY" tests/interop/ucxx_peer.py server --module "$1" --memory cuda >"$out" 2>&1 &
  srv=$!
  for _ in $(seq 1 300); do grep -q '^LISTENING' "$out" && break; sleep 0.1; done
  port=$(awk '/^LISTENING/ {print $2; exit}' "$out")
  [ -n "$port" ] || { cat "$out"; kill $srv; return 1; }
  "$PY" tests/interop/ucxx_peer.py client --module "$2" --memory cuda --port "$port"
  rc=$?
  wait $srv || rc=1
  sed 's/^/  server: /' "$out"
  return $rc
}

pytests() { # pytests MODE
  UCXPY_PROGRESS_MODE=$1 "$PY" -m pytest -q -p no:cacheprovider python/tests/test_device.py python/tests/test_arrays.py \
    $([ "$1" = thread ] && [ -z "${PROVE_QUICK:-}" ] && echo python/tests/test_core.py)
}

dasktests() { # the Dask comm with device frames (CuPy), and its contract, on the GPU
  (cd /tmp && "$PY" -m pytest -q -p no:cacheprovider -o asyncio_mode=auto \
    -o asyncio_default_fixture_loop_scope=function --timeout 120 --timeout-method thread \
    "$ROOT/python/tests_dask/test_device.py" "$ROOT/python/tests_dask/test_comm.py")
}

export -f info interop pytests dasktests
export ROOT
export PY
export GPU_ECHO_BIN=$B/bin/ucx-gpu-echo
step info 60 info
step rust 180 "$B/bin/cuda-tests" --test-threads 1
step rust:dask-comm 120 "$B/bin/dask-comm-tests" device
step rust:dask-collections 120 "$B/bin/dask-collections-tests" device
step array 240 "$B/bin/device-tour" --require-gpu
step array-bench 300 "$PY" scripts/gpu/proof.py --echo "$B/bin/ucx-gpu-echo" --perftest "$PERFTEST" \
  --part array --tour "$B/bin/device-tour" --rounds 8 --out "$LOGS"
step python:thread 240 pytests thread
step python:polling 120 pytests polling
step python:blocking 120 pytests blocking
step example 60 "$PY" python/examples/send_recv.py --cupy
step interop:ucxx-server,ucxrs-client 120 interop ucxx ucxrs
step interop:ucxrs-server,ucxx-client 120 interop ucxrs ucxx
step echo 240 "$PY" scripts/gpu/proof.py --echo "$B/bin/ucx-gpu-echo" --perftest "$PERFTEST" --part echo --out "$LOGS"
step bench 180 "$PY" scripts/gpu/proof.py --echo "$B/bin/ucx-gpu-echo" --perftest "$PERFTEST" --part bench --rounds 1 --out "$LOGS"
step dask 300 dasktests
step dask-cuda 300 "$PY" scripts/gpu/dask_cuda_check.py
step dask-bench 300 "$PY" scripts/dask_comm_compare.py --python "$PY" --memory cuda --protocols tcp,ucxrs \
  --perftest "$PERFTEST" --rounds 1 --reps 6 --json "$LOGS/dask-cuda.json"
step compare 300 "$PY" scripts/python_compare.py --python "$PY" --memory cuda --perftest "$PERFTEST" \
  --sizes 8,1m,64m --modes thread,polling --rounds 1 --json "$LOGS/compare-cuda.json"

echo >>"$SUMMARY"
grep -E '^\| ' "$LOG" >>"$SUMMARY" || true
echo
note "prove: $FAILED step(s) failed; figures above; logs in $LOGS"
grep -E '^\| ' "$LOG" || true
[ "$FAILED" = 0 ]
