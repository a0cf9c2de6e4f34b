#!/usr/bin/env bash
# The main job: an echo server and a client in two processes over UCX, printing latency and
# bandwidth (ping-pong and streamed); then the task scheduler: `is_prime` mapped over 1,000
# numbers on a LocalCluster (a scheduler and two worker processes). Extra arguments go to
# `ucx-echo demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build -j2 --release --bin ucx-echo
./target/release/ucx-echo demo "$@"
echo
echo "dask-comm: client.map(is_prime, range) + gather on a LocalCluster (2 worker processes):"
cargo build -j2 --release -p dask-comm --example primes
./target/release/examples/primes 100000000 100001000
