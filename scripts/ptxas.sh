#!/usr/bin/env bash
# Prints the path of NVIDIA's PTX assembler, fetching it first if it is not here: the
# `nvidia-cuda-nvcc-cu12` wheel from PyPI (40 MB; only `ptxas` is unpacked), into
# target/ptxas. The array device kernels' drill assembles every kernel with it, no GPU needed
# (dask-collections, `ptx::tests::ptxas_assembles_every_kernel`).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/ptxas
bin=$dir/nvidia/cuda_nvcc/bin/ptxas
if [ ! -x "$bin" ]; then
  mkdir -p "$dir"
  [ -x "$dir/venv/bin/pip" ] || python3 -m venv "$dir/venv" >&2
  "$dir/venv/bin/pip" download -q --no-deps -d "$dir/wheel" "nvidia-cuda-nvcc-cu12==12.9.86" >&2
  "$dir/venv/bin/python" - "$dir" <<'PY' >&2
import glob, os, sys, zipfile
d = sys.argv[1]
whl = glob.glob(os.path.join(d, "wheel", "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    z.extract("nvidia/cuda_nvcc/bin/ptxas", d)
os.chmod(os.path.join(d, "nvidia/cuda_nvcc/bin/ptxas"), 0o755)
PY
  rm -rf "$dir/wheel"
fi
echo "$PWD/$bin"
