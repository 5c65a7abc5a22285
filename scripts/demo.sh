#!/usr/bin/env bash
# The main job: build, start ccsd, run 4 client ranks through every
# collective (results checked element by element), print the tables, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build

. scripts/daemon.sh
start_daemon

status=0
for coll in all_reduce broadcast reduce all_gather reduce_scatter all_to_all gather scatter sendrecv; do
  build/client/ccs-perf "$coll" --np 4 -b 8 -e 16M -f 16 -n 10 -c 1 || status=1
done
echo "# all_reduce with every data type and reduction (4 ranks, 1 MiB):"
build/client/ccs-perf all_reduce --np 4 -b 1M -e 1M -n 5 -d all -o all | grep -v '^#  *[(s]' || status=1
exit $status
