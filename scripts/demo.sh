#!/usr/bin/env bash
# The main job: an echo server and a client in two processes over UCX, printing latency and
# bandwidth (ping-pong and streamed). Extra arguments go to `ucx-echo demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build -j2 --release --bin ucx-echo
./target/release/ucx-echo demo "$@"
