#!/usr/bin/env bash
# What the shell scripts share (sourced, after `cd` to the repository's root): the build their
# binaries come from, and how a step that lacks a tool ends.
#
# STACK_PROFILE: the cargo profile the scripts build and run (default `release`). CI sets `dev`,
# the profile its tests are built in, so that nothing is compiled twice: the scripts check
# that things run and agree, not how fast (no figure is judged in CI).
STACK_PROFILE=${STACK_PROFILE:-release}
# Where that profile's binaries are (cargo names the dev profile's folder `debug`).
if [ "$STACK_PROFILE" = dev ]; then
  STACK_DIR=$PWD/target/debug
else
  STACK_DIR=$PWD/target/$STACK_PROFILE
fi

# stack_build PACKAGE TARGET-OPTIONS...: builds those targets (`--example mpi_tour`, `--bin
# dask-comm`) of PACKAGE in STACK_PROFILE. With STACK_ALL_FEATURES=1 (CI) it builds them as the
# tests were built, every feature of the workspace on, so the libraries already built are used
# as they are instead of being built again with other features.
stack_build() {
  local pkg=$1
  shift
  if [ "${STACK_ALL_FEATURES:-}" = 1 ]; then
    cargo build -q -j2 --profile "$STACK_PROFILE" --workspace --all-features "$@"
  else
    cargo build -q -j2 --profile "$STACK_PROFILE" -p "$pkg" "$@"
  fi
}

# skip_or_fail STEP WHY: a step that cannot run here for want of something CI is expected to
# have (root, `ip netns`, a launcher, Slurm, Chromium, PyPI). Outside CI it says why and the
# script exits 0 (skipped); in CI (`CI` set) it fails, since a skip there would pass a check
# that did not run.
skip_or_fail() {
  if [ -n "${CI:-}" ]; then
    echo "$1: FAILED: $2 (CI is expected to have it)" >&2
    exit 1
  fi
  echo "$1: skipped: $2"
  exit 0
}

# The oldest UCX the project supports, and builds its wheels and its pre-generated bindings
# against (docs/python.md, "Which UCX"): the first release of the CUDA 13 libucx wheel
# (libucx-cu13 starts at 1.19.0), and inside the range UCXX 0.52 accepts (libucx-cu12
# >=1.19.0,<1.22), so one native module serves both variants and ucxrs and UCXX share one
# libucx in one environment.
UCX_OLDEST=1.19.0

# libucx_prefix VERSION: unpacks the libucx-cu12 wheel of that UCX version (from PyPI, once)
# under target/libucx/VERSION and prints the folder that holds its include/ and lib/ (what
# UCX_PREFIX takes).
libucx_prefix() {
  local v=$1 dir=$PWD/target/libucx/$1
  if [ ! -f "$dir/libucx/include/ucp/api/ucp.h" ]; then
    rm -rf "$dir" && mkdir -p "$dir/dl"
    timeout 600 python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --platform manylinux_2_28_x86_64 -d "$dir/dl" "libucx-cu12==$v" >&2 \
      || skip_or_fail libucx "could not download libucx-cu12==$v from PyPI (no network?)"
    python3 -m zipfile -e "$dir"/dl/libucx_cu12-*.whl "$dir"
    rm -rf "$dir/dl"
  fi
  echo "$dir/libucx"
}

# install_ucxrs_wheel VENV: the ucxrs-cu12 wheel (scripts/wheel.sh's, built first if dist/ has
# none) into VENV as users install it, in place of any earlier ucxrs there; its libucx must be
# there already (UCXX's venv has it). Unsets LD_LIBRARY_PATH and UCX_MODULE_DIR: ucxrs finds the
# libucx wheel's UCX itself.
install_ucxrs_wheel() {
  local venv=$1
  ls dist/ucxrs_cu12-*.whl >/dev/null 2>&1 || bash scripts/wheel.sh cu12
  "$venv/bin/pip" uninstall -q -y ucxrs ucxrs-cu13 2>/dev/null || true  # an older from-source build
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall dist/ucxrs_cu12-*.whl
  unset LD_LIBRARY_PATH UCX_MODULE_DIR
}
