#!/usr/bin/env bash
# Open MPI (shared-memory path) against ccs on this machine, in one run,
# alternating per collective: busbw for 16 B .. 64 MiB with 2 and 4 ranks,
# then 8 B all_reduce latency (median of repeated runs), then the memcpy
# bandwidth of this machine for scale. Each cell is the median of ROUNDS
# runs, the two sides taking turns (on a shared VM one run's mean is often
# one preemption's).
#   scripts/compare_mpi.sh [ITERS [ROUNDS]]
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-20} rounds=${2:-3}
scripts/setup.sh build >/dev/null
. scripts/daemon.sh
mpi_perf_build
start_daemon
dir=$(dirname "$CCS_SOCKET")

echo "# $(date -u +%Y-%m-%d) $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo "# Open MPI $(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}') (btl vader), float sum, out of place (broadcast: in place), $iters iterations, busbw in GB/s, median of $rounds runs"
for np in 2 4; do
  for coll in all_reduce all_gather reduce_scatter broadcast all_to_all; do
    for reg in 1 0; do
      [ "$reg" = 0 ] && [ "$coll" != all_reduce ] && continue
      mpi="" ccs=""
      for _ in $(seq "$rounds"); do
        mpi+=$(mpirun_ "$np" build/mpi-perf "$coll" 16 67108864 4 "$iters" 2 | awk '{print $1, $2}')$'\n'
        build/client/ccs-perf "$coll" --np "$np" --registered "$reg" -b 16 -e 64M -f 4 \
          -n "$iters" -w 2 -c 0 -J "$dir/rows.json" >/dev/null
        ccs+=$(ccs_rows "$coll" "$dir/rows.json")$'\n'
      done
      mpi=$(echo -n "$mpi" | median_rows) ccs=$(echo -n "$ccs" | median_rows)
      label=$([ "$reg" = 1 ] && echo registered || echo staged)
      echo
      echo "## $coll, $np ranks, ccs $label buffers"
      printf '%12s %12s %12s %8s\n' "size(B)" "OpenMPI" "ccs" "ccs/OMPI"
      join <(echo "$mpi" | sort -k1,1) <(echo "$ccs" | sort -k1,1) | sort -n |
        awk '{r = $2 > 0 ? $3 / $2 : 0; printf "%12d %12.3f %12.3f %8.2f\n", $1, $2, $3, r}'
    done
  done
done

echo
echo "## 8 B all_reduce latency (us), median of 7 runs of 200 iterations"
printf '%6s %10s %10s\n' ranks OpenMPI ccs
for np in 2 4; do
  m=(); c=()
  for _ in $(seq 7); do
    m+=("$(mpirun_ "$np" build/mpi-perf all_reduce 8 8 2 200 20 | awk '{print $3}')")
    c+=("$(build/client/ccs-perf all_reduce --np "$np" -b 8 -e 8 -n 200 -w 20 -c 0 | grep -v '^#' | awk '{print $6}')")
  done
  med() { printf '%s\n' "$@" | sort -g | sed -n 4p; }
  printf '%6d %10s %10s\n' "$np" "$(med "${m[@]}")" "$(med "${c[@]}")"
done

echo
echo "## where the time of a small op goes"
build/tests/ccs-latency 2000

echo
echo "## memcpy bandwidth of this machine (one thread, GB/s)"
build/tests/memcpy-bw
