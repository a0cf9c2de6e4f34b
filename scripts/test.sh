#!/usr/bin/env bash
# Every check CI runs: formatting, clippy with warnings denied, and all tests (unit, doc,
# in-process and multi-process integration tests) against the real UCX.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo fmt --all -- --check
cargo clippy -j2 --workspace --all-targets -- -D warnings
cargo test -j2 --workspace
