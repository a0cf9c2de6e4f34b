#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian machine (only what is missing).
set -euo pipefail

need=()
for pkg in libucx-dev ucx-utils libclang-dev pkg-config gcc python3 python3-venv libhwloc-dev libudev-dev valgrind; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The job launchers the launch tests run under (scripts/launch_test.sh, slurm_test.sh):
# Open MPI, MPICH, Slurm and munge, without their recommended extras.
launchers=()
for pkg in openmpi-bin mpich slurm-wlm munge; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || launchers+=("$pkg")
done
if [ ${#launchers[@]} -gt 0 ]; then
  echo "setup: installing ${launchers[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  [ ${#need[@]} -gt 0 ] || $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${launchers[@]}" >/dev/null \
    || echo "setup: the launchers could not be installed: the launch tests will say so and skip"
fi
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || {
  echo "setup: cargo not found: install a Rust toolchain (https://rustup.rs) and re-run" >&2
  exit 1
}
