#!/usr/bin/env bash
# The long fault runs of transport (its drills at full size; CI runs them at their default
# sizes through `cargo test -- --ignored`):
# - peer death: a peer process SIGKILLed at a random moment of a random-size echo, 250 trials
#   for each of tcp://, ucx:// polling, blocking and thread (1,000 in all), detection times;
#   then as many at 8-64 KiB only (over ucx://, eager messages of several fragments);
# - a connection storm: 1,000 clients at once on one listener, per backend;
# - hostile peers: 200 connections announcing 3 GiB each while a good client is served;
# - a soak of 10M mixed-size messages per backend, and a leak check under valgrind.
# PEER_DEATH_TRIALS sets the trials per configuration.
# `--leak-only` runs just the valgrind check (LEAK_MESSAGES messages; CI uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
leak_check() {
  # As the tests were built where STACK_ALL_FEATURES=1 (CI), so nothing is built again.
  local which=(-p ucxrs-transport)
  [ "${STACK_ALL_FEATURES:-}" = 1 ] && which=(--workspace --all-features)
  SOAK=$(cargo test -q -j2 "${which[@]}" --test soak --no-run --message-format=json |
    python3 -c 'import sys, json; print([j["executable"] for j in map(json.loads, sys.stdin) if j.get("executable") and j["target"]["name"] == "soak"][0])')
  SOAK_RSS_CHECK=0 SOAK_MESSAGES=${LEAK_MESSAGES:-20000} valgrind -q --num-callers=40 --leak-check=full \
    --show-leak-kinds=definite --errors-for-leak-kinds=definite --error-exitcode=3 \
    --suppressions=scripts/valgrind-ucx.supp "$SOAK" --ignored --nocapture 2>&1 | grep -E "messages in|test result|lost"
  echo "valgrind: no definite leak"
}
if [ "${1:-}" = --leak-only ]; then
  leak_check
  exit 0
fi
PEER_DEATH_TRIALS=${PEER_DEATH_TRIALS:-250} cargo test -q -j2 -p ucxrs-transport --test peer_death -- --ignored
PEER_DEATH_SIZES=13..16 PEER_DEATH_TRIALS=${PEER_DEATH_TRIALS:-250} cargo test -q -j2 -p ucxrs-transport --test peer_death -- --ignored
cargo test -q -j2 -p ucxrs-transport --test storm -- --ignored --nocapture 2>&1 | grep -E "clients|test result"
cargo test -q -j2 -p ucxrs-transport --test hostile -- --nocapture 2>&1 | grep -E "peers|test result"
# The 10M-message soak (RSS sampled every 1M, flat within 10%), then a short one under valgrind
# (no definite leak; UCX's process-wide setup suppressed, see scripts/valgrind-ucx.supp).
SOAK_MESSAGES=${SOAK_MESSAGES:-10000000} cargo test -q -j2 -p ucxrs-transport --test soak -- --ignored --nocapture 2>&1 | grep -E "messages in|test result"
leak_check
