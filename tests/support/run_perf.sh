#!/usr/bin/env bash
# Runs ccs-perf for one collective against a private ccsd: every type and
# reduction at tiny sizes, checked; fails unless #wrong is 0 everywhere.
#   run_perf.sh CCSD CCS_PERF COLLECTIVE
set -euo pipefail
ccsd=${CCSD_PATH:-$1} perf=$2 coll=$3
. "$(dirname "$0")/../../scripts/daemon.sh"
CCSD=$ccsd start_daemon
dir=$(dirname "$CCS_SOCKET")
status=0
for np in 1 3; do
  for reg in 1 0; do
    out=$("$perf" "$coll" --np $np --registered $reg -b 8 -e 64K -f 8 -n 2 -w 1 -c 2 -d all -o all \
          -J "$dir/rows.json") || status=1
    grep -q '^# Out of bounds values : 0 OK$' <<<"$out" || { echo "$out"; status=1; }
    grep -q '"collective"' "$dir/rows.json" || status=1
  done
done
# ranks started by someone else: CCS_RANK, CCS_NRANKS, CCS_UNIQUE_ID_FILE
if [ "$coll" = all_reduce ]; then
  pids=()
  for r in 0 1 2; do
    CCS_RANK=$r CCS_NRANKS=3 CCS_UNIQUE_ID_FILE=$dir/id "$perf" "$coll" -b 8 -e 4K -f 8 -n 2 -c 1 \
      >"$dir/env.$r" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  grep -q '^# Out of bounds values : 0 OK$' "$dir/env.0" || { cat "$dir/env.0"; status=1; }
  grep -q '3 ranks' "$dir/env.0" || status=1
  [ ! -s "$dir/env.1" ] || { echo "only rank 0 prints"; status=1; }
fi
exit $status
