#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian machine (only what is missing).
set -euo pipefail

# install_missing [apt-get install options...] -- PACKAGE...: installs those not installed.
install_missing() {
  local opts=() need=() pkg
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
  done
  [ ${#need[@]} -gt 0 ] || return 0
  echo "setup: installing ${need[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  # A dpkg run that was interrupted (a killed install) makes every apt-get install fail until
  # it is finished; finish it first.
  if [ -n "$(ls -A /var/lib/dpkg/updates 2>/dev/null)" ] || [ -n "$(dpkg --audit 2>/dev/null)" ]; then
    echo "setup: dpkg was interrupted: running dpkg --configure -a"
    DEBIAN_FRONTEND=noninteractive $sudo dpkg --configure -a >/dev/null
  fi
  $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${opts[@]}" "${need[@]}" >/dev/null
}

install_missing -- libucx-dev ucx-utils libclang-dev pkg-config gcc python3 python3-venv \
  libhwloc-dev libudev-dev valgrind
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || {
  echo "setup: cargo not found: install a Rust toolchain (https://rustup.rs) and re-run" >&2
  exit 1
}
