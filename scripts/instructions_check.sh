#!/usr/bin/env bash
# Guards the cost of a small message: instructions per 8 B round trip on the client
# (scripts/count_instructions.sh: callgrind, exact counts, not timings) of release builds of
# `ucx-echo` (ucx-rs) and `transport-echo` (transport, ucx://), and of `ucx_perftest -t
# tag_lat -e` on the same UCX, against the counts recorded in scripts/instructions.txt.
# Fails when ours grow by more than 10 % over the record, or shrink by more than 10 % (then
# record the new counts: the guard follows the gains). The reference is printed for the
# ratio, not judged (it is UCX's, which the machine's packages decide).
#
#   bash scripts/instructions_check.sh            build, count, compare
#   bash scripts/instructions_check.sh --record   build, count, write scripts/instructions.txt
set -euo pipefail
cd "$(dirname "$0")/.."
record=${1:-}
N=${INSTRUCTIONS_ROUND_TRIPS:-20000}
# Release builds, as measured (CI's other steps use the dev profile; ~2 minutes here).
CARGO_TARGET_DIR=${INSTRUCTIONS_TARGET_DIR:-target} cargo build -q --release -j2 --bin ucx-echo --bin transport-echo
dir=${INSTRUCTIONS_TARGET_DIR:-target}/release
ref=$(bash scripts/count_instructions.sh ucx_perftest "$N" | grep -o '[0-9]* instructions' | grep -o '^[0-9]*')
echo "instructions: ucx_perftest -t tag_lat -e: $ref per 8 B round trip (UCX $(ucx_info -v | awk '/Version/ {print $3; exit}'))"
declare -A now
for b in ucx-echo transport-echo; do
  now[$b]=$(bash scripts/count_instructions.sh "$dir/$b" "$N" | grep -o '[0-9]* instructions' | grep -o '^[0-9]*')
  echo "instructions: $b: ${now[$b]} per 8 B round trip ($(python3 -c "print(f'{${now[$b]} / $ref:.2f}')")x ucx_perftest's)"
done
if [ "$record" = --record ]; then
  {
    echo "# Instructions per 8 B round trip on the client (scripts/instructions_check.sh --record),"
    echo "# release builds, polling, on UCX $(ucx_info -v | awk '/Version/ {print $3; exit}'); ucx_perftest -t tag_lat -e: $ref."
    for b in ucx-echo transport-echo; do echo "$b ${now[$b]}"; done
  } > scripts/instructions.txt
  echo "instructions: recorded in scripts/instructions.txt"
  exit 0
fi
bad=0
for b in ucx-echo transport-echo; do
  was=$(awk -v b="$b" '$1 == b {print $2}' scripts/instructions.txt)
  [ -n "$was" ] || { echo "instructions: no record for $b in scripts/instructions.txt" >&2; bad=1; continue; }
  change=$(python3 -c "print(f'{(${now[$b]} - $was) / $was * 100:+.1f}')")
  echo "instructions: $b: $change % against the record ($was)"
  if python3 -c "import sys; sys.exit(0 if abs(${now[$b]} - $was) <= 0.10 * $was else 1)"; then :; else
    if [ "${now[$b]}" -gt "$was" ]; then
      echo "instructions: $b costs $change % more per small message than recorded: find what added it (count_instructions.sh --layers)" >&2
    else
      echo "instructions: $b costs $change % less than recorded: record the gain (bash scripts/instructions_check.sh --record)" >&2
    fi
    bad=1
  fi
done
exit $bad
