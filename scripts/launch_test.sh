#!/usr/bin/env bash
# The launched cluster (dask_comm::initialize, `dask-comm mpi`) under the real launchers:
# Open MPI's mpirun and MPICH's mpiexec (from Debian's packages, which scripts/setup_test_tools.sh
# installs), 6 ranks running the mpi_tour example (the seed's primes and a chunked-array sum,
# checked against the same computation in the client), over tcp:// and ucx://; the CLI's mpi
# mode with a client started apart; the refusal of too few ranks. After each run no process
# of it may be left. Slurm: scripts/slurm_test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
# Both launchers, or (in CI) a failure: a launcher left out would pass unchecked.
command -v mpirun.openmpi > /dev/null || skip_or_fail launch "mpirun.openmpi not found (openmpi-bin not installed)"
command -v mpiexec.mpich > /dev/null || skip_or_fail launch "mpiexec.mpich not found (mpich not installed)"
stack_build dask-collections --example mpi_tour
stack_build dask-comm --bin dask-comm
tour="$STACK_DIR/examples/mpi_tour"
cli="$STACK_DIR/dask-comm"
work=$(mktemp -d)
# Also when a time limit ends this script: no launcher or rank of it outlives it.
# (`|| true`: under set -e a pkill that finds nothing would make this script fail.)
trap 'pkill -9 -f "$tour|$cli mpi" 2> /dev/null || true; rm -rf "$work"' EXIT
cd "$work"

ompi=(mpirun.openmpi --oversubscribe)
[ "$(id -u)" = 0 ] && ompi+=(--allow-run-as-root)
failures=0

# No process of the tour or the CLI may outlive its launcher.
leftovers() {
  sleep 0.5
  if pgrep -f "$tour|$cli mpi" > /dev/null; then
    echo "FAILED: processes left after $1:"; pgrep -fa "$tour|$cli mpi"
    pkill -9 -f "$tour|$cli mpi" || true
    failures=$((failures + 1))
  fi
}

# run NAME COMMAND...: the command must exit 0 and print "all answers right".
run() {
  local name=$1; shift
  echo "launch: $name"
  if timeout 180 "$@" > out.txt 2>&1 && grep -q "all answers right" out.txt; then
    grep -E "^(rank|primes|sum|connected)" out.txt | sed 's/^/  /'
  else
    echo "FAILED: $name"; cat out.txt
    failures=$((failures + 1))
  fi
  leftovers "$name"
}

if command -v mpirun.openmpi > /dev/null; then
  run "Open MPI, 6 ranks, tcp" "${ompi[@]}" -np 6 "$tour"
  run "Open MPI, 6 ranks, ucx" "${ompi[@]}" -np 6 "$tour" --protocol ucx
  # Too few ranks: every rank says why and the job fails.
  echo "launch: Open MPI, 2 ranks (refused)"
  if timeout 60 "${ompi[@]}" -np 2 "$tour" > out.txt 2>&1; then
    echo "FAILED: 2 ranks were accepted"; failures=$((failures + 1))
  elif grep -q "this needs at least 3" out.txt; then
    echo "  refused: $(grep -m1 'needs at least' out.txt)"
  else
    echo "FAILED: no reason given"; cat out.txt; failures=$((failures + 1))
  fi
  leftovers "the refusal"
  # The CLI's mpi mode: a scheduler and 3 workers, a client started apart shuts them down.
  # No dashboard asked: none is served (no DASHBOARD line).
  echo "launch: Open MPI, dask-comm mpi (4 ranks, --no-dashboard) and a separate client"
  rm -f cli.json
  timeout 180 "${ompi[@]}" -np 4 "$cli" mpi --scheduler-file cli.json --no-dashboard > cli.txt 2>&1 &
  launcher=$!
  if timeout 120 "$tour" --connect cli.json --workers 3 > out.txt 2>&1 && wait "$launcher" \
      && grep -q "^LISTENING" cli.txt && ! grep -q "^DASHBOARD" cli.txt; then
    grep -E "^(connected|cluster)" out.txt | sed 's/^/  /'
  else
    echo "FAILED: dask-comm mpi"; cat out.txt cli.txt; failures=$((failures + 1))
  fi
  leftovers "dask-comm mpi"
else
  echo "launch: Open MPI skipped: mpirun.openmpi not found (openmpi-bin not installed)"
fi

if command -v mpiexec.mpich > /dev/null; then
  run "MPICH, 6 ranks, tcp" mpiexec.mpich -n 6 "$tour"
else
  echo "launch: MPICH skipped: mpiexec.mpich not found (mpich not installed)"
fi

if [ "$failures" -gt 0 ]; then
  echo "launch: $failures failed"
  exit 1
fi
echo "launch: every launcher ran the cluster"
