#!/usr/bin/env bash
# Every check CI runs: formatting, clippy with warnings denied, the examples (they must run,
# not only compile), then all tests (unit, doc, in-process and multi-process integration
# tests) against the real UCX.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo fmt --all -- --check
cargo clippy -j2 --workspace --all-targets -- -D warnings
# With CUDA device buffers too (cudarc loads the driver at run time; device tests skip without
# a GPU, printing why).
cargo clippy -j2 --workspace --all-targets --all-features -- -D warnings
for ex in echo many_clients active_messages rma; do
  echo "example $ex:"
  timeout 300 cargo run -q -j2 --example "$ex"
done
echo "example over_every_backend (transport):"
timeout 300 cargo run -q -j2 -p transport --example over_every_backend
cargo test -j2 --workspace --all-features
# Whether this machine ran the device tests, and if not why (they return early without a GPU).
cargo run -q -j2 --features cuda --bin ucx-gpu-echo -- info
# Interop with the real UCXX from PyPI, both directions (installs it into target/ucxx-venv once).
bash tests/interop/run.sh
