#!/usr/bin/env bash
# The project's checks, in the two tiers of docs/testing.md:
#   bash scripts/test.sh           everything CI runs: fmt, clippy, the fast tier, the drills
#   bash scripts/test.sh --quick   fmt, clippy and the fast tier (what `cargo test` runs)
#   bash scripts/test.sh --drills  the drills only: the `#[ignore = "drill: .."]` tests
#                                  (`cargo test -- --ignored`) and the steps below that need
#                                  more than a hermetic test may (root, launchers, Slurm,
#                                  Chromium, PyPI, fuzzing, valgrind, the comparisons)
# Installs what is missing first. Prints each step's wall time, and a table of them at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=all
case "${1:-}" in
  --quick) tier=fast ;;
  --drills) tier=drills ;;
  "") ;;
  *) echo "usage: $0 [--quick | --drills]" >&2; exit 2 ;;
esac
source scripts/setup.sh
[ "$tier" = fast ] || source scripts/setup_test_tools.sh
# One build for everything: the tests, the examples and the scripts' binaries are the dev
# profile's, every feature of the workspace on (cudarc loads the driver at run time: device
# tests skip without a GPU, printing why), so no library is compiled twice. The scripts check
# that things run and agree, not how fast, so they run these builds too (scripts/lib.sh).
export STACK_PROFILE=dev STACK_ALL_FEATURES=1
source scripts/lib.sh
STEP_START=$SECONDS
STEPS=()
step_done() {
  local took=$((SECONDS - STEP_START))
  STEPS+=("$(printf '%6d s  %s' "$took" "$1")")
  echo "ci step: $1: $took s ($SECONDS s in all)"
  STEP_START=$SECONDS
}
# Tests that need a GPU and skipped without one (test_support::skip_without_gpu appends here).
export TEST_SKIPS_FILE=$PWD/target/gpu-skips.txt
mkdir -p target
rm -f "$TEST_SKIPS_FILE"
print_steps() {
  local rc=$?
  echo "ci steps, wall time each (exit $rc after $SECONDS s):"
  printf '  %s\n' "${STEPS[@]}"
  if [ -s "$TEST_SKIPS_FILE" ]; then
    echo "needs a GPU, skipped here (no GPU on this machine):"
    sort -u "$TEST_SKIPS_FILE" | sed 's/^/  /'
  fi
}
trap print_steps EXIT
step_done "set-up (system packages, test tools)"
# Disk: a clean build needs no incremental caches, and the test binaries carry symbols but no
# debug info (panics still name file and line). Local `cargo test` keeps debug info.
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_STRIP=debuginfo
ALL=(--workspace --all-features)
free_mb() { df -Pm . | awk 'NR == 2 {print $4}'; }
echo "disk: $(free_mb) MB free at the start"

if [ "$tier" != drills ]; then
  cargo fmt --all -- --check
  step_done "fmt"
  # One pass over every target with every feature (the cuda code included); transport without
  # UCX is other code (its tcp://-only cfg), checked apart.
  cargo clippy -j2 "${ALL[@]}" --all-targets -- -D warnings
  # dask-comm as a user builds it: its tests' self dev-dependency turns the `drills` feature
  # on above; its library and command without it (~15 s).
  cargo clippy -j2 -p dask-comm --lib --bins -- -D warnings
  step_done "clippy"
  cargo clippy -j2 -p ucxrs-transport --no-default-features --all-targets -- -D warnings
  step_done "clippy, transport without UCX"
  # The fast tier: unit, integration and doc tests; the drills are listed as ignored.
  cargo test -j2 "${ALL[@]}" --lib --bins --tests
  step_done "fast tier: tests (build and run)"
  cargo test -j2 "${ALL[@]}" --doc
  step_done "fast tier: doc tests"
  cargo test -j2 -p ucxrs-transport --no-default-features
  step_done "fast tier: transport without UCX"
fi
[ "$tier" = fast ] && exit 0

# The six library crates package as crates.io takes them (cargo package; five built from their
# .crate, with what the fast tier compiled), declare the rust-version they need, and document
# without UCX (DOCS_RS, pre-generated bindings).
bash scripts/crates_check.sh
step_done "crates: cargo package, rust-version, docs without UCX"

# The drills: the ignored tests (chaos, soak, storm, peer death at scale, namespaces, ...),
# with NVIDIA's PTX assembler for the array device kernels' drill (fetched once, ~10 s).
PTXAS=$(bash scripts/ptxas.sh) || { echo "drills: NVIDIA's ptxas could not be fetched (PyPI)" >&2; exit 1; }
export PTXAS
cargo test -j2 "${ALL[@]}" --lib --bins --tests -- --ignored
step_done "drills: ignored tests"
# The examples run, not only compile.
cargo build -q -j2 "${ALL[@]}" --examples --bins
for ex in echo many_clients active_messages rma over_every_backend delayed; do
  echo "example $ex:"
  timeout 300 "$STACK_DIR/examples/$ex"
done
for proto in tcp ucx; do
  echo "example primes (dask-comm, $proto):"
  timeout 300 "$STACK_DIR/examples/primes" 100000000 100001000 --protocol "$proto"
done
# Whether this machine ran the device tests, and if not why (they return early without a GPU).
"$STACK_DIR/ucx-gpu-echo" info
echo "example gpu_echo (device buffers; says why it skips without a GPU):"
timeout 300 "$STACK_DIR/examples/gpu_echo" | tee target/gpu_echo.txt
if grep -q "^skipped" target/gpu_echo.txt; then
  echo "examples/gpu_echo: $(grep -m1 '^skipped' target/gpu_echo.txt)" >> "$TEST_SKIPS_FILE"
fi
echo "example device_tour (device arrays on two worker processes; says why it skips without a GPU):"
timeout 300 "$STACK_DIR/examples/device_tour" | tee target/device_tour.txt
if grep -q "^skipped" target/device_tour.txt; then
  echo "examples/device_tour: $(grep -m1 '^skipped' target/device_tour.txt)" >> "$TEST_SKIPS_FILE"
fi
echo "example array_tour (dask-collections, small sizes):"
timeout 300 "$STACK_DIR/examples/array_tour" --small
echo "example bag_tour (dask-collections; threaded and a cluster of processes must agree):"
timeout 300 "$STACK_DIR/examples/bag_tour"
echo "example dataframe_tour (dask-collections; threaded and a cluster of processes must agree):"
timeout 300 "$STACK_DIR/examples/dataframe_tour"
echo "example million (dask-graph, 100,000 tasks here):"
timeout 300 "$STACK_DIR/examples/million" 100000
step_done "examples (run)"
# The Python package as users install it: the ucxrs-cu12 and -cu13 wheels (manylinux_2_28, on
# the libucx wheels), ucxrs-cu12 pip-installed into a new venv from the index, its tests in
# every progress mode against it. The interop and Dask steps below install the same wheel (one
# build of ucxrs for all three). The build from source on Debian's UCX and its tests (the same
# tests, on UCX 1.13) are `bash scripts/python_test.sh` by hand: 60-90 s that CI's budget
# spends elsewhere (docs/testing.md).
bash scripts/python_test.sh --wheel
step_done "drills: Python package (wheels, pip install, pytest)"
# Every decoder of bytes from the wire, fuzzed for a bounded total (kept crash inputs replayed
# first; scripts/fuzz.sh with no argument is the long run).
echo "disk: $(free_mb) MB free before the fuzzers' build (about 1 GB, fuzz/target)"
bash scripts/fuzz.sh --total "${FUZZ_TOTAL_SECONDS:-60}"
step_done "drills: fuzzers (install, build, run)"
if [ "$(free_mb)" -lt 16000 ]; then
  echo "disk: $(free_mb) MB free: removing the fuzzers' build (fuzz/target)"
  rm -rf fuzz/target
fi
# No definite leak in a short soak of every backend under valgrind.
LEAK_MESSAGES=5000 bash scripts/faults.sh --leak-only
step_done "drills: leak soak (valgrind)"
# The cluster under the real launchers: mpirun (Open MPI), mpiexec (MPICH), Slurm's srun and
# sbatch on a one-node Slurm started and stopped here.
timeout 1200 bash scripts/launch_test.sh
step_done "drills: launchers (mpirun, mpiexec)"
timeout 600 bash scripts/slurm_test.sh
step_done "drills: Slurm"
# A scheduler and two workers on three "hosts" (network namespaces), over tcp:// and ucx://.
timeout 600 bash scripts/multihost_test.sh
step_done "drills: three hosts (namespaces)"
# The dashboard in headless Chromium during a computation (DOM, screenshot, status, /metrics).
timeout 600 bash scripts/dashboard_test.sh
step_done "drills: dashboard (Chromium)"
python3 -m py_compile scripts/*.py scripts/gpu/proof.py scripts/gpu/dask_cuda_check.py
bash -n scripts/gpu/bundle.sh scripts/gpu/prove.sh
# Interop with the real UCXX from PyPI, both directions (installs it into target/ucxx-venv once).
bash tests/interop/run.sh
step_done "drills: UCXX interop"
# Stock Dask on our transport: the ucxrs:// comm's tests (Dask's comm contract, real clusters,
# a killed worker, strangers, the CLI, mpirun and dask-mpi) and one short round of the
# comparison with Dask's tcp and distributed-ucxx, answers checked (docs/dask.md). Reuses the
# venv and the build above.
timeout 1200 bash scripts/dask_backend_test.sh
step_done "drills: Dask on ucxrs:// (tests, a benchmark round)"
# The comparison commands work end to end (one short round at 8 B; figures are not judged here:
# these are debug builds on a shared, noisy machine).
timeout 600 python3 scripts/compare.py --rounds 1 --sizes 8 --ops stream,am --msgrate --window 16
step_done "drills: compare.py"
# The cost of a small message, counted (callgrind: exact instructions, not timings) against
# the record in scripts/instructions.txt, beside ucx_perftest's count: release builds of
# ucx-echo and transport-echo (about 2 minutes from clean), then about 15 s of counting.
timeout 900 bash scripts/instructions_check.sh
step_done "drills: instructions per 8 B round trip (callgrind)"
# Across two network namespaces (root and ip netns, as the netns test).
if [ "$(id -u)" != 0 ] || ! ip netns list > /dev/null 2>&1; then
  (skip_or_fail netns_compare.py "needs root and ip netns")
else
  # With cubic where the kernel has it (--cc adds it to the host's allowed list for the run
  # and restores the list after).
  cc=()
  if grep -qw cubic /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null; then
    cc=(--cc cubic)
  fi
  allowed_before=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)
  rc=0
  timeout 300 python3 scripts/netns_compare.py --rounds 1 --sizes 8 --modes polling "${cc[@]}" || rc=$?
  if [ "$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)" != "$allowed_before" ]; then
    echo "netns_compare.py left the allowed congestion controls changed" >&2
    exit 1
  fi
  [ "$rc" = 0 ] || exit "$rc"
fi
step_done "drills: netns_compare.py"
# UCXX's own client against its listener and ours.
timeout 900 python3 scripts/compare.py --rounds 1 --sizes 8 --interop
step_done "drills: compare.py --interop"
# The Python package beside UCXX's send_recv and ucx_perftest on the same UCX, every progress
# mode, 8 B and 1 MiB, one short round (the UCXX venv above has both packages).
timeout 600 python3 scripts/python_compare.py --short
step_done "drills: python_compare.py"
# The scheduler against Dask distributed from PyPI (into target/dask-venv), small workloads,
# one round: the command works and both give the same answers.
timeout 900 python3 scripts/dask_compare.py --quick
step_done "drills: dask_compare.py"
# The collections against Dask and NumPy / plain Python / pandas, small sizes, one round:
# every answer agrees with the reference's.
timeout 900 python3 scripts/array_compare.py --small
step_done "drills: array_compare.py"
timeout 900 python3 scripts/bag_compare.py --small
step_done "drills: bag_compare.py"
timeout 900 python3 scripts/frame_compare.py --small
step_done "drills: frame_compare.py"
