#!/usr/bin/env bash
# The long fault runs of transport (CI runs short versions of each through `cargo test`):
# - peer death: a peer process SIGKILLed at a random moment of a random-size echo, 250 trials
#   for each of tcp://, ucx:// polling, blocking and thread (1,000 in all), detection times;
# - a connection storm: 1,000 clients at once on one listener, per backend;
# - hostile peers: 200 connections announcing 3 GiB each while a good client is served.
# PEER_DEATH_TRIALS sets the trials per configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
PEER_DEATH_TRIALS=${PEER_DEATH_TRIALS:-250} cargo test -q -j2 -p transport --test peer_death
cargo test -q -j2 -p transport --test storm -- --nocapture 2>&1 | grep -E "clients|test result"
cargo test -q -j2 -p transport --test hostile -- --nocapture 2>&1 | grep -E "peers|test result"
