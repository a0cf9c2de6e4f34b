#!/usr/bin/env bash
# The launched cluster under a real Slurm: a one-node cluster (slurmctld, slurmd, munge from
# Debian's packages, which scripts/setup_test_tools.sh installs) configured and started here, stopped
# afterwards; `srun -n 6` runs the mpi_tour example, and an sbatch job script like the
# seed's (--nodes, --ntasks, --cpus-per-task, read back from SLURM_*) completes. Needs root
# (slurmd runs the job steps); skips, saying why, where Slurm is not installed (or another Slurm
# already runs here, which it never touches), except in CI, where that fails; daemons that do
# not start are a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
skip() { skip_or_fail slurm "$*"; }
fail() { echo "slurm: FAILED: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "the one-node cluster needs root"
for c in slurmctld slurmd srun sbatch sinfo scontrol scancel munged; do
  command -v "$c" > /dev/null || skip "$c not found (slurm-wlm and munge not installed)"
done
# Never touch a Slurm this machine already runs.
pgrep -x slurmctld > /dev/null && skip "a slurmctld already runs here"
pgrep -x slurmd > /dev/null && skip "a slurmd already runs here"
# Two free ports for the controller and the node daemon.
read -r ctld_port node_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
stack_build dask-collections --example mpi_tour
tour="$STACK_DIR/examples/mpi_tour"
dir=$(mktemp -d /tmp/slurm-test.XXXXXX)
chmod 755 "$dir"
host=$(hostname -s)
started_munge=""
# Stops only what this script started: its jobs, its daemons (by their pid files), its munged.
cleanup() {
  if [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2> /dev/null; then
    scancel --full -u root > /dev/null 2>&1 || true
  fi
  local pids="" pid
  for p in slurmd slurmctld; do
    if [ -f "$dir/$p.pid" ]; then
      pid=$(cat "$dir/$p.pid")
      kill "$pid" 2> /dev/null && pids="$pids $pid"
    fi
  done
  if [ -n "$started_munge" ] && [ -f /run/munge/munged.pid ]; then
    kill "$(cat /run/munge/munged.pid)" 2> /dev/null || true
  fi
  pkill -9 -f "$tour" 2> /dev/null || true
  # slurmctld writes its state into $dir/state as it stops: removing the directory before it
  # has exited races with those writes. Wait for both daemons (at most 15 s), then kill.
  for pid in $pids; do
    for _ in $(seq 150); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2> /dev/null; then kill -9 "$pid" 2> /dev/null || true; fi
  done
  rm -rf "$dir" 2> /dev/null || { sleep 1; rm -rf "$dir" || echo "slurm: could not remove $dir"; }
}
trap cleanup EXIT
mkdir -p "$dir/state" "$dir/spool"
cat > "$dir/slurm.conf" <<CONF
ClusterName=dasktest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=$ctld_port
SlurmdPort=$node_port
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$dir/slurm.conf"
if ! pgrep -x munged > /dev/null; then
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- munged || fail "munged does not start"
  started_munge=1
fi
slurmctld || fail "slurmctld does not start: $(tail -3 "$dir/slurmctld.log" 2>/dev/null)"
slurmd || fail "slurmd does not start: $(tail -3 "$dir/slurmd.log" 2>/dev/null)"
for _ in $(seq 60); do
  state=$(sinfo -h -o %T 2> /dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.5
done
[ "$state" = idle ] || { echo "slurm: the node is '$state', not idle"; tail -20 "$dir/slurmd.log" "$dir/slurmctld.log"; exit 1; }
echo "slurm: one-node cluster up ($(sinfo -h -o '%N %c CPUs %T'))"
cd "$dir"
failures=0

echo "slurm: srun -n 6"
if timeout 180 srun -n 6 --overcommit "$tour" > out.txt 2>&1 && grep -q "all answers right" out.txt; then
  grep -E "^(rank|primes|sum)" out.txt | sed 's/^/  /'
else
  echo "FAILED: srun"; cat out.txt; failures=$((failures + 1))
fi

echo "slurm: sbatch (the seed's job script)"
cat > job.sh <<JOB
#!/bin/bash
#SBATCH --job-name=dask-comm
#SBATCH --nodes=1
#SBATCH --ntasks=4
#SBATCH --cpus-per-task=2
#SBATCH --output=$dir/job.out
echo "job \$SLURM_JOB_ID: \$SLURM_JOB_NUM_NODES node(s), \$SLURM_NTASKS tasks, \$SLURM_CPUS_PER_TASK CPU(s) each"
srun "$tour" --nthreads "\$SLURM_CPUS_PER_TASK"
JOB
# The job's 4 tasks of 2 CPUs fill the node's 8: 2 workers of 2 threads each, read back from
# SLURM_CPUS_PER_TASK.
if timeout 240 sbatch --wait job.sh > sbatch.txt 2>&1 && grep -q "all answers right" job.out \
    && grep -q "2 CPU(s) each" job.out && grep -q "a client of 2 workers, threads \[2, 2\]" job.out; then
  grep -E "^(job|rank|primes|sum)" job.out | sed 's/^/  /'
else
  echo "FAILED: sbatch"; cat sbatch.txt job.out 2> /dev/null; failures=$((failures + 1))
fi
sleep 0.5
if pgrep -f "$tour" > /dev/null; then
  echo "FAILED: processes left:"; pgrep -fa "$tour"; failures=$((failures + 1))
fi
[ "$failures" -eq 0 ] || { echo "slurm: $failures failed"; exit 1; }
echo "slurm: srun and sbatch ran the cluster"
