#!/usr/bin/env bash
# ccs across daemons against Open MPI over TCP, in one run: busbw of
# all_reduce and all_gather, 1 MiB .. 256 MiB, with 2 and 4 "nodes" of one
# rank each and 2 nodes of 2 ranks (Open MPI: 4 ranks over TCP). Open MPI: its TCP transport on loopback (btl self,tcp). ccs:
# one daemon per node on loopback ports, and one daemon per node in its own
# network namespace (veth + bridge; needs root). The daemons authenticate
# every message; CCS_PEER_ENCRYPT=1 in the environment encrypts the data too.
# Beside them the loopback stream bound: one TCP connection between two
# processes (build/tests/tcp-stream), what one link between daemons here
# carries at most; lo/stream is ccs-lo's busbw over it. The two-way bound
# (both ends sending at once, as two daemons do) is printed beside it.
#   scripts/compare_mpi_nodes.sh [ITERS [WARMUP]]
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-5} warmup=${2:-3} # first large ops fault their scratch in: both sides warm up alike
if [ -z "${CCS_TEST_NETNS:-}" ]; then
  scripts/setup.sh build >/dev/null
  . scripts/daemon.sh
  mpi_perf_build
  exec tests/support/run_netns.sh 4 "$0" "$@"
fi

dir=$(mktemp -d)
build/daemon/ccsd --generate-key "$dir/key" >/dev/null # the daemons' cluster key
pids=()
stop_daemons() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=(); }
trap 'stop_daemons; rm -rf "$dir"' EXIT

# start_daemons D netns|lo
start_daemons() {
  for i in $(seq 0 $(($1 - 1))); do
    if [ "$2" = netns ]; then
      ip netns exec "$CCS_TEST_NETNS$i" build/daemon/ccsd --socket "$dir/$i.sock" --listen "10.231.0.$((i + 1)):7000" \
        --cluster-key-file "$dir/key" &
    else
      build/daemon/ccsd --socket "$dir/$i.sock" --listen "127.0.0.1:$((17300 + i))" --cluster-key-file "$dir/key" &
    fi
    pids+=($!)
  done
  for i in $(seq 0 $(($1 - 1))); do
    for _ in $(seq 200); do [ -S "$dir/$i.sock" ] && break; sleep 0.05; done
  done
}

# ccs_run D N COLL: "size busbw" rows, out of place; rank r on daemon r % D
ccs_run() {
  rm -f "$dir/id" "$dir/rows.json"
  local r ranks=()
  for r in $(seq 0 $(($2 - 1))); do
    CCS_SOCKET=$dir/$((r % $1)).sock CCS_RANK=$r CCS_NRANKS=$2 CCS_UNIQUE_ID_FILE=$dir/id \
      build/client/ccs-perf "$3" -b 1M -e 256M -f 4 -n "$iters" -w "$warmup" -c 0 -J "$dir/rows.json" >/dev/null &
    ranks+=($!)
  done
  for r in "${ranks[@]}"; do wait "$r"; done
  sed -n 's/.*"size": \([0-9]*\).*"out_of_place": {[^}]*"busbw": \([0-9.]*\).*/\1 \2/p' "$dir/rows.json"
}

echo "# $(date -u +%Y-%m-%d) $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
bound=$(build/tests/tcp-stream 2048)
echo "# loopback stream bound (one TCP connection, 1 MiB writes): $bound GB/s one way, $(build/tests/tcp-stream 2048 2) GB/s each way when both ends send"
echo "# Open MPI $(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}') (btl self,tcp on lo), float sum, out of place, $iters iterations after $warmup, busbw in GB/s"
for shape in 2x1 4x1 2x2; do
  nodes=${shape%x*} per=${shape#*x}
  for coll in all_reduce all_gather; do
    mpi=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
          mpirun --oversubscribe --bind-to none --mca btl self,tcp --mca btl_tcp_if_include lo \
          -np $((nodes * per)) build/mpi-perf "$coll" 1048576 268435456 4 "$iters" "$warmup" | awk '{print $1, $2}')
    start_daemons "$nodes" lo
    lo=$(ccs_run "$nodes" $((nodes * per)) "$coll")
    stop_daemons
    start_daemons "$nodes" netns
    ns=$(ccs_run "$nodes" $((nodes * per)) "$coll")
    stop_daemons
    echo
    echo "## $coll, $nodes nodes of $per rank(s)"
    printf '%12s %12s %12s %12s %10s %10s\n' "size(B)" "OpenMPI-tcp" "ccs-lo" "ccs-netns" "lo/OMPI" "lo/stream"
    join <(echo "$mpi" | sort -k1,1) <(echo "$lo" | sort -k1,1) | join - <(echo "$ns" | sort -k1,1) | sort -n |
      awk -v bound="$bound" '{r = $2 > 0 ? $3 / $2 : 0; printf "%12d %12.3f %12.3f %12.3f %10.2f %10.2f\n", $1, $2, $3, $4, r, $3 / bound}'
  done
done
