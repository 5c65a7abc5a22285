#!/usr/bin/env bash
# Open MPI's mpirun starts ccs-perf with nothing but CCS_SOCKET set: the
# ranks find each other by the job's name (ccs_comm_init_from_env), check
# every element, and a second job at once has a comm of its own.
#   run_mpirun.sh CCSD CCS_PERF
set -euo pipefail
dir=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
"$1" --config /dev/null --socket="$dir/ccsd.sock" 2>"$dir/log" &
pid=$!
for _ in $(seq 100); do [ -S "$dir/ccsd.sock" ] && break; sleep 0.1; done
export CCS_SOCKET=$dir/ccsd.sock OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() {
  mpirun --oversubscribe --bind-to none -np "$1" -x CCS_SOCKET "$2" "${@:3}" -c 1 -n 3 -w 1 -J "$dir/$1.json"
}
run 4 "$2" all_reduce -b 8 -e 16M -f 16 > "$dir/a.txt" 2>&1 &
a=$!
sa=0 sb=0
run 3 "$2" all_gather -b 8 -e 1M -f 16 > "$dir/b.txt" 2>&1 || sb=$? # another job meanwhile: another comm
wait "$a" || sa=$?
cat "$dir/a.txt" "$dir/b.txt"
if ((sa || sb)); then
  echo "mpirun exited $sa (4 ranks) and $sb (3 ranks); the daemon's log:"
  tail -n 20 "$dir/log"
  exit 1
fi
for f in a b; do
  grep -q "# Out of bounds values : 0 OK" "$dir/$f.txt" || { echo "job $f: wrong elements"; exit 1; }
done
grep -q '"ranks": 4' "$dir/4.json" && grep -q '"ranks": 3' "$dir/3.json" ||
  { echo "ranks: expected jobs of 4 and 3"; exit 1; }
