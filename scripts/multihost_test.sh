#!/usr/bin/env bash
# Three "hosts": network namespaces joined by veth pairs to a bridge, built here and removed
# afterwards. The scheduler runs in one (`dask-comm scheduler`), a worker in each of the
# others (`dask-comm worker`), and a client next to the scheduler (`mpi_tour --connect`)
# spreads `inc` tasks over both workers and sums them in one task, so values cross from one
# host to the other; then it shuts the cluster down and every process must exit. Then the same
# hosts as a launched job (`dask_comm::initialize` in the mpi_tour example, its ranks started
# with MPICH's variables PMI_RANK/PMI_SIZE, one per `ip netns exec`): the scheduler's and the
# client's ranks on the first host, a worker's on each of the others, every rank told
# `--interface dcnet0` (each host's link has that name, as `ib0` on a real cluster); the tour's
# answers must be right and every rank must exit 0. Over tcp:// and ucx:// (UCX limited to its
# TCP transport, as across real hosts: namespaces do not isolate shared memory). Needs root and
# `ip netns`; otherwise says why and skips (in CI: fails).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
skip() { skip_or_fail multihost "$*"; }
[ "$(id -u)" = 0 ] || skip "needs root"
ip netns list > /dev/null 2>&1 || skip "ip netns does not work here"
stack_build dask-collections --example mpi_tour
stack_build dask-comm --bin dask-comm
tour="$STACK_DIR/examples/mpi_tour"
cli="$STACK_DIR/dask-comm"
id=$(( $$ % 10000 ))
br="dcbr$id"
hosts=("dcs$id" "dca$id" "dcb$id")
addrs=(10.78.0.1 10.78.0.2 10.78.0.3)
dir=$(mktemp -d)
bridge_nf=/proc/sys/net/bridge/bridge-nf-call-iptables
bridge_nf_was=$(cat "$bridge_nf" 2> /dev/null || true)
cleanup() {
  pkill -9 -f "$cli (scheduler|worker) .*$dir" 2> /dev/null || true
  pkill -9 -f "$tour .*$dir" 2> /dev/null || true
  # The host's bridge filtering as it was.
  if [ -n "$bridge_nf_was" ]; then echo "$bridge_nf_was" > "$bridge_nf" 2> /dev/null || true; fi
  for h in "${hosts[@]}"; do ip netns del "$h" 2> /dev/null || true; done
  ip link del "$br" 2> /dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
ip link add "$br" type bridge
ip link set "$br" up
for i in 0 1 2; do
  h=${hosts[$i]}
  ip netns add "$h"
  ip link add "v$id$i" type veth peer name "v$id${i}b"
  ip link set "v$id$i" netns "$h"
  ip -n "$h" link set "v$id$i" name dcnet0
  ip link set "v$id${i}b" master "$br" up
  ip -n "$h" addr add "${addrs[$i]}/24" dev dcnet0
  ip -n "$h" link set dcnet0 up
  ip -n "$h" link set lo up
done
# The bridge forwards between the namespaces (iptables may drop bridged traffic otherwise).
sysctl -q -w net.bridge.bridge-nf-call-iptables=0 2> /dev/null || true
failures=0
for proto in tcp ucx; do
  echo "multihost: $proto:// across 3 hosts"
  file="$dir/$proto.json"
  export UCX_TLS=self,tcp
  ip netns exec "${hosts[0]}" timeout 120 "$cli" scheduler --listen "$proto://${addrs[0]}:0" \
    --scheduler-file "$file" > "$dir/sched.txt" 2>&1 &
  sched=$!
  pids=()
  for i in 1 2; do
    ip netns exec "${hosts[$i]}" timeout 120 "$cli" worker --scheduler-file "$file" --no-nanny \
      --listen "$proto://${addrs[$i]}:0" --name "host-$i" --local-directory "$dir/w$i" \
      > "$dir/w$i.txt" 2>&1 &
    pids+=($!)
  done
  ok=1
  if ip netns exec "${hosts[0]}" timeout 120 "$tour" --connect "$file" --workers 2 > "$dir/out.txt" 2>&1 \
     && grep -q "all answers right" "$dir/out.txt" \
     && grep -q "${addrs[1]}" "$dir/out.txt" && grep -q "${addrs[2]}" "$dir/out.txt"; then
    grep -E "^(connected|cluster)" "$dir/out.txt" | sed 's/^/  /'
  else
    ok=0
  fi
  # Every process ends by itself after the shutdown.
  for p in "$sched" "${pids[@]}"; do
    wait "$p" || { echo "  process $p exited with $?"; ok=0; }
  done
  if [ "$ok" = 0 ]; then
    echo "multihost: FAILED over $proto"
    cat "$dir/out.txt" "$dir/sched.txt" "$dir/w1.txt" "$dir/w2.txt"
    failures=$((failures + 1))
  fi

  echo "multihost: $proto:// across 3 hosts, launched (PMI ranks, --interface dcnet0)"
  file="$dir/launched-$proto.json"
  ranks=()
  for r in 0 1 2 3; do
    h=${hosts[0]}
    [ "$r" -ge 2 ] && h=${hosts[$((r - 1))]}
    ip netns exec "$h" env PMI_RANK="$r" PMI_SIZE=4 timeout 180 "$tour" --interface dcnet0 \
      --protocol "$proto" --scheduler-file "$file" > "$dir/rank$r.txt" 2>&1 &
    ranks+=($!)
  done
  ok=1
  for r in 0 1 2 3; do
    wait "${ranks[$r]}" || { echo "  rank $r exited with $?"; ok=0; }
  done
  if [ "$ok" = 1 ] && grep -q "all answers right" "$dir/rank1.txt" \
     && grep -q "a client of 2 workers" "$dir/rank1.txt"; then
    grep -E "^(rank|primes|sum)" "$dir/rank1.txt" | sed 's/^/  /'
  else
    echo "multihost: FAILED launched over $proto"
    for r in 0 1 2 3; do echo "--- rank $r"; cat "$dir/rank$r.txt"; done
    failures=$((failures + 1))
  fi
done
[ "$failures" -eq 0 ] || exit 1
echo "multihost: the cluster spans the three hosts over tcp:// and ucx://, by hand and launched"
