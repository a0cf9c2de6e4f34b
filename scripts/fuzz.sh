#!/usr/bin/env bash
# Fuzzes every decoder of bytes from the wire (fuzz/fuzz_targets/, see docs/fuzzing.md) with
# cargo-fuzz on the stable toolchain (libFuzzer, no sanitizer: the decoders are safe Rust).
#   bash scripts/fuzz.sh                 10M executions per target (the long run)
#   bash scripts/fuzz.sh --seconds 60    about a minute per target
#   bash scripts/fuzz.sh --total 120     about two minutes in all, shared out between the targets
#                                        run side by side, one per core (CI)
#   bash scripts/fuzz.sh --replay        only replay fuzz/regressions/ (kept crash inputs)
# Inputs that once crashed a target live in fuzz/regressions/<target>/ and are replayed first;
# a new crash's input is left in fuzz/artifacts/<target>/ and the script fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
mode=runs
limit=10000000
case "${1:-}" in
  --seconds) mode=seconds; limit=${2:?--seconds needs a number} ;;
  --total) mode=total; limit=${2:?--total needs a number} ;;
  --replay) mode=replay ;;
  "") ;;
  *) echo "usage: $0 [--seconds N | --total N | --replay]" >&2; exit 2 ;;
esac
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install -q --locked cargo-fuzz@0.13.2 -j2
fi
export CARGO_BUILD_JOBS=2
cargo fuzz build -s none -O
bin=fuzz/target/x86_64-unknown-linux-gnu/release
targets=$(cargo fuzz list)
slots=$(nproc 2>/dev/null || echo 1)
if [ "$mode" = total ]; then
  # The targets run `slots` at a time: each gets its share of the wall-clock total (at least
  # 5 s, so that each runs some thousands of inputs).
  n=$(echo "$targets" | wc -w)
  limit=$(( limit * slots / n ))
  [ "$limit" -ge 5 ] || limit=5
  mode=seconds
  echo "fuzz: $n targets, $slots at a time, $limit s each"
fi
# One target: its kept regression inputs, then the run; prints its row, or fails with the
# crash's log. (Called as `run_one T || ...`, where set -e does not apply: every step checks.)
run_one() {
  local t=$1 stop start log runs cov
  if [ -d "fuzz/regressions/$t" ] && [ -n "$(ls -A "fuzz/regressions/$t")" ]; then
    "$bin/$t" -runs=1 "fuzz/regressions/$t"/* >/dev/null 2>&1 ||
      { echo "$t: a kept regression input fails again"; return 1; }
  fi
  [ "$mode" = replay ] && return 0
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t" || return 1
  if [ "$mode" = seconds ]; then stop="-max_total_time=$limit"; else stop="-runs=$limit"; fi
  start=$(date +%s)
  log=$(mktemp) || return 1
  if ! "$bin/$t" "$stop" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="fuzz/artifacts/$t/" "fuzz/corpus/$t" >"$log" 2>&1; then
    tail -30 "$log"
    echo "$t: crash; its input is in fuzz/artifacts/$t/ (fix it, then keep it in fuzz/regressions/$t/)"
    rm -f "$log"
    return 1
  fi
  runs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$log" || echo '?')
  cov=$(grep -oP 'cov: \K[0-9]+' "$log" | tail -1 || echo '?')
  printf '%-20s %12s %8s %10s\n' "$t" "$runs" "$(($(date +%s) - start))" "$cov"
  rm -f "$log"
}
# libFuzzer runs one thread per process: the targets run side by side, one per core (CI's
# two cores halve the wall time of `--seconds`; each target still gets its full time). Each
# target's output is kept apart and printed in order once all have ended.
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
running=0
for t in $targets; do
  if [ "$running" -ge "$slots" ]; then
    wait -n
    running=$((running - 1))
  fi
  (run_one "$t" >"$out/$t.log" 2>&1 || touch "$out/$t.failed") &
  running=$((running + 1))
done
wait
printf '%-20s %12s %8s %10s\n' target executions seconds coverage
failed=0
for t in $targets; do
  if [ -e "$out/$t.failed" ]; then
    cat "$out/$t.log" >&2
    failed=1
  else
    cat "$out/$t.log"
  fi
done
[ "$failed" = 0 ] || exit 1
echo "fuzz: no crash"
