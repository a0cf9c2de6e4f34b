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
