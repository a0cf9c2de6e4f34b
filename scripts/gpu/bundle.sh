#!/usr/bin/env bash
# Builds, on this machine, everything the GPU proof (scripts/gpu/prove.sh) needs on a GPU
# machine that has no Rust toolchain and no network, into .gpu/ (ignored by git; carry it):
#   .gpu/bundle.tar.xz  the libucx-cu13 wheel's UCX (its libraries, modules and ucx_perftest),
#                       the release binaries built against it with `--features cuda`
#                       (ucx-gpu-echo, the `cuda` test suite, dask-comm's unit tests with device
#                       frames, dask-collections' unit tests and its device tour), and the
#                       ucxrs package built with
#                       `--features cuda` for the GPU machine's Python (GPU_PYTHON, 3.12)
#   .gpu/wheels/        real UCXX (ucxx-cu13 and what it needs beyond that machine's packages),
#                       stock Dask (distributed and its dependencies), dask-cuda, pytest-asyncio
#                       and pytest-timeout, for the interop, the Dask comm and the Python tests
#                       there; .gpu/wheels-if-missing/: pandas and cuda-bindings, installed
#                       there only where they do not import
# Takes 10-15 minutes on 2 cores the first time (release builds), seconds after.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh
PYVER=${GPU_PYTHON:-3.12}
UCX_VERSION=1.22.0
UCXX_VERSION=0.52.0
RAPIDS_VERSION=26.10.0
W=$PWD/target/gpu
mkdir -p "$W/dl" .gpu
log() { echo "bundle: $*"; }

# 1. Wheels, for the GPU machine's Python.
download() {
  ls "$W/dl/$1"-*.whl >/dev/null 2>&1 && return
  timeout 600 python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$W/dl" "$2" || skip_or_fail gpu-bundle "could not download $2 from PyPI (no network?)"
}
download libucx_cu13 "libucx-cu13==$UCX_VERSION"
download ucxx_cu13 "ucxx-cu13==$UCXX_VERSION"
download libucxx_cu13 "libucxx-cu13==$UCXX_VERSION"
download rmm_cu13 "rmm-cu13==$RAPIDS_VERSION"
download librmm_cu13 "librmm-cu13==$RAPIDS_VERSION"
download rapids_logger "rapids-logger==0.3.0"
download pytest_asyncio "pytest-asyncio==1.5.0"
download pytest_timeout "pytest-timeout==2.4.0"
# Stock Dask for the Dask comm's device frames (python/tests_dask/test_device.py and
# scripts/dask_comm_compare.py --memory cuda there): distributed and what it needs, all pure
# Python or manylinux wheels (none of NumPy, CuPy or PyTorch, which that machine has).
DASK_VERSION=2026.7.1
if ! ls "$W/dl-dask"/distributed-"$DASK_VERSION"-*.whl >/dev/null 2>&1; then
  rm -rf "$W/dl-dask"
  timeout 600 python3 -m pip download -q --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$W/dl-dask" "distributed==$DASK_VERSION" \
    || skip_or_fail gpu-bundle "could not download distributed $DASK_VERSION from PyPI (no network?)"
fi

# dask-cuda, for LocalCUDACluster(protocol="ucxrs") there (scripts/gpu/dask_cuda_check.py), and
# what it needs beyond distributed: the required ones, and those that machine may already have
# (pandas, cuda-bindings; prove.sh installs these only where they do not import). Not its
# [cu13] extra: CUDA's runtime wheels (nvrtc, nvvm: 200 MB) are not needed to start workers.
DASK_CUDA_VERSION=26.10.0
if ! ls "$W/dl-dask-cuda"/dask_cuda-"$DASK_CUDA_VERSION"-*.whl >/dev/null 2>&1; then
  rm -rf "$W/dl-dask-cuda"
  timeout 600 python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$W/dl-dask-cuda" \
    "dask-cuda==$DASK_CUDA_VERSION" "rapids-dask-dependency==$DASK_CUDA_VERSION" "cuda-core==1.2.2" \
    "cuda-pathfinder==1.9.1" "nvidia-ml-py==13.615.71" \
    || skip_or_fail gpu-bundle "could not download dask-cuda $DASK_CUDA_VERSION from PyPI (no network?)"
  mkdir -p "$W/dl-dask-cuda/if-missing"
  timeout 600 python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$W/dl-dask-cuda/if-missing" \
    "pandas==3.1.1" "python-dateutil==4.0.0" "tzdata==2026.6" "cuda-bindings==13.5.0" \
    || skip_or_fail gpu-bundle "could not download pandas and cuda-bindings from PyPI (no network?)"
fi

# 2. The wheel's UCX, to build against (its headers) and to carry (its libraries).
if [ ! -f "$W/libucx-cu13/libucx/include/ucp/api/ucp.h" ]; then
  rm -rf "$W/libucx-cu13"
  python3 -m zipfile -e "$W"/dl/libucx_cu13-*.whl "$W/libucx-cu13"
  # The wheel stores libucp.so, .so.0 and .so.0.0.0 as three copies: the linker wants libucp.so.
fi
UCX=$W/libucx-cu13/libucx

# 3. Release binaries against it.
log "release build of ucx-gpu-echo and the cuda test suite (UCX $UCX_VERSION headers)"
export UCX_PREFIX=$UCX CARGO_BUILD_JOBS=2
CARGO_TARGET_DIR=$PWD/target/gpu-build cargo build -q --release --features cuda --bin ucx-gpu-echo
# test_binary TARGET_NAME CARGO_TEST_ARGS...: builds a test target (release, `cuda`) and prints
# the path of its executable.
test_binary() {
  local name=$1
  shift
  CARGO_TARGET_DIR=$PWD/target/gpu-build cargo test -q --release --features cuda "$@" \
    --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$name"
}
CUDA_TEST=$(test_binary cuda --test cuda)
[ -x "$CUDA_TEST" ] || { echo "bundle: the cuda test suite did not build" >&2; exit 1; }
# dask-comm's unit tests with device frames (the batch codec's device slots, spill's device
# mark); the GPU machine runs those whose names say device.
DASK_TEST=$(test_binary dask_comm -p dask-comm --lib)
[ -x "$DASK_TEST" ] || { echo "bundle: dask-comm's unit tests did not build" >&2; exit 1; }
# Device arrays: dask-collections' unit tests (its device tests compute on the GPU there) and
# the device tour (a two-worker cluster's device arrays checked against the host, and the
# device-block transfer benchmark).
ARRAY_TEST=$(test_binary dask_collections -p dask-collections --lib)
[ -x "$ARRAY_TEST" ] || { echo "bundle: dask-collections' unit tests did not build" >&2; exit 1; }
CARGO_TARGET_DIR=$PWD/target/gpu-build cargo build -q --release --features cuda -p dask-collections \
  --example device_tour

# 4. ucxrs as users install it: the ucxrs-cu13 wheel (scripts/wheel.sh: cp311-abi3, so the GPU
#    machine's CPython 3.12 takes it; device arrays built in), unpacked into site/ below.
log "the ucxrs-cu13 wheel (scripts/wheel.sh)"
bash scripts/wheel.sh cu13
WHEEL=$(ls dist/ucxrs_cu13-*.whl)

# 5. Stage and pack: site/ is a site-packages folder, with the libucx wheel's package as the
#    wheel lays it out (UCXX's `libucx.load_library()` opens site/libucx/lib/libucp.so), less
#    its static libraries and its duplicate copies of each shared one (symbolic links here).
S=$W/stage
rm -rf "$S" && mkdir -p "$S/bin" "$S/site/libucx/lib/ucx" "$S/site/libucx/bin"
cp "$UCX"/*.py "$UCX"/*.txt "$S/site/libucx/" 2>/dev/null || true
cp "$UCX"/GIT_COMMIT "$S/site/libucx/" 2>/dev/null || true
for dir in lib lib/ucx; do
  for f in "$UCX/$dir"/lib*.so.0; do
    base=$(basename "$f" .so.0)
    cp "$f" "$S/site/libucx/$dir/"
    ln -s "$base.so.0" "$S/site/libucx/$dir/$base.so"
  done
done
cp "$UCX/bin/ucx_perftest" "$S/site/libucx/bin/"
chmod +x "$S/site/libucx/bin/"*  # a wheel keeps no file modes
cp -r "$W/libucx-cu13/libucx_cu13.libs" "$S/site/"
cp target/gpu-build/release/ucx-gpu-echo "$S/bin/"
cp "$CUDA_TEST" "$S/bin/cuda-tests"
cp "$DASK_TEST" "$S/bin/dask-comm-tests"
cp "$ARRAY_TEST" "$S/bin/dask-collections-tests"
cp target/gpu-build/release/examples/device_tour "$S/bin/device-tour"
# The wheel's files (the package and its dist-info, whose entry point is how Dask, and the
# worker processes it spawns, find the ucxrs:// comm), as pip would lay them out.
python3 -m zipfile -e "$WHEEL" "$S/site"
strip "$S"/bin/*
tar -C "$S" -cJf .gpu/bundle.tar.xz .
rm -rf .gpu/wheels && mkdir -p .gpu/wheels
cp "$W"/dl/{ucxx_cu13,libucxx_cu13,rmm_cu13,librmm_cu13,rapids_logger,pytest_asyncio,pytest_timeout}-*.whl .gpu/wheels/
cp "$W"/dl-dask/*.whl "$W"/dl-dask-cuda/*.whl .gpu/wheels/
rm -rf .gpu/wheels-if-missing && mkdir -p .gpu/wheels-if-missing
cp "$W"/dl-dask-cuda/if-missing/*.whl .gpu/wheels-if-missing/
du -sh .gpu/bundle.tar.xz .gpu/wheels .gpu/wheels-if-missing | sed 's/^/bundle: /'
log "done: carry .gpu and run scripts/gpu/prove.sh there (docs/gpu.md)"
