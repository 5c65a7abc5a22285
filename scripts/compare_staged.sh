#!/usr/bin/env bash
# Unregistered (staged) buffers against registered ones and Open MPI, in
# one run: every collective, 2 and 4 ranks, 1-64 MiB, busbw in GB/s (out of
# place; broadcast in place), each cell the median of ROUNDS runs, the
# sides taking turns. "parts" is a staged call as libccs makes it (cut in
# parts whose copies overlap the op, client/parts.c), "whole" the same
# with CCS_STAGED_PART_BYTES=0 (copied in whole, run, copied out).
#   scripts/compare_staged.sh [ITERS [ROUNDS [COLLECTIVES]]]
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-10} rounds=${2:-3}
colls=${3:-"all_reduce all_gather reduce_scatter broadcast all_to_all"}
scripts/setup.sh build >/dev/null
. scripts/daemon.sh
mpi_perf_build
start_daemon
dir=$(dirname "$CCS_SOCKET")

med() { echo -n "$1" | median_rows | sort -k1,1; } # join's order
ccs_run() { # COLL NP REGISTERED PART_BYTES
  CCS_STAGED_PART_BYTES=$4 build/client/ccs-perf "$1" --np "$2" --registered "$3" -b 1M -e 64M -f 4 \
    -n "$iters" -w 2 -c 0 -J "$dir/rows.json" >/dev/null
  ccs_rows "$1" "$dir/rows.json"
}

echo "# $(date -u +%Y-%m-%d) $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo "# Open MPI $(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}') (btl vader), float sum, $iters iterations, busbw in GB/s, median of $rounds runs"
for np in 2 4; do
  for coll in $colls; do
    mpi="" reg="" parts="" whole=""
    for _ in $(seq "$rounds"); do
      mpi+=$(mpirun_ "$np" build/mpi-perf "$coll" 1048576 67108864 4 "$iters" 2 | awk '{print $1, $2}')$'\n'
      reg+=$(ccs_run "$coll" "$np" 1 "")$'\n'
      parts+=$(ccs_run "$coll" "$np" 0 "")$'\n'
      whole+=$(ccs_run "$coll" "$np" 0 0)$'\n'
    done
    echo
    echo "## $coll, $np ranks"
    printf '%10s %9s %11s %9s %9s %12s %10s\n' "size(B)" OpenMPI registered parts whole parts/OMPI reg/parts
    join <(med "$mpi") <(med "$reg") | join - <(med "$parts") | join - <(med "$whole") | sort -n |
      awk '{printf "%10d %9.3f %11.3f %9.3f %9.3f %12.2f %10.2f\n", $1, $2, $3, $4, $5,
            ($2 > 0 ? $4 / $2 : 0), ($4 > 0 ? $3 / $4 : 0)}'
  done
done
