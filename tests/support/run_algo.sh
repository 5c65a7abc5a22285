#!/usr/bin/env bash
# Algorithm choice end to end, against a private ccsd: CCS_ALGO forces an
# algorithm (CCS_DEBUG=INFO shows it was used, with the rule's reason),
# the model's choice is reported otherwise, a bad rule is refused with a
# clear error, and ranks that disagree on CCS_ALGO get a mismatch.
#   run_algo.sh CCSD CCS_PERF
set -euo pipefail
ccsd=${CCSD_PATH:-$1} perf=$2
. "$(dirname "$0")/../../scripts/daemon.sh"
CCSD=$ccsd start_daemon
dir=$(dirname "$CCS_SOCKET")
status=0
expect() { # what, file, pattern
  grep -qE "$3" "$2" || { echo "FAIL: $1: no '$3' in:"; head -20 "$2"; status=1; }
}
# run WANT COLLECTIVE: ccs-perf must exit 0 (ok) or not (fails)
run() {
  local want=$1 rc=0
  shift
  "$perf" "$@" --np 3 -b 3K -e 48K -f 16 -n 1 -w 0 -c 1 >"$dir/out" 2>&1 || rc=$?
  if [ "$want" = ok ] && [ "$rc" != 0 ]; then echo "FAIL: ccs-perf $* exited $rc"; head -20 "$dir/out"; status=1; fi
  if [ "$want" = fails ] && [ "$rc" = 0 ]; then echo "FAIL: ccs-perf $* succeeded"; status=1; fi
}

for algo in ring tree rhd direct; do
  CCS_ALGO="all_reduce:$algo" CCS_DEBUG=INFO run ok all_reduce
  expect "forced $algo" "$dir/out" "ccs INFO rank 0: comm [0-9]+: all_reduce #[0-9]+, 3072 bytes, 3 ranks: $algo \(rule 1 \(all_reduce:$algo\)\)"
  expect "forced $algo is correct" "$dir/out" '^# Out of bounds values : 0 OK$'
done
# a rule by size range; the rest of the sizes keep the model's choice
CCS_ALGO="all_gather:ring:0-8K" CCS_DEBUG=INFO run ok all_gather
expect "ranged rule" "$dir/out" "all_gather #[0-9]+, 3072 bytes, 3 ranks: ring \(rule 1"
expect "outside the range" "$dir/out" "all_gather #[0-9]+, 49152 bytes, 3 ranks: direct \(one node"
# a rule without a collective applies where the algorithm builds
CCS_ALGO=rhd CCS_DEBUG=INFO run ok broadcast
expect "rhd does not build broadcast" "$dir/out" "broadcast #[0-9]+, 3072 bytes, 3 ranks: direct"
# bad rules: a clear error, not a crash
CCS_ALGO="all_reduce:bogus" run fails all_reduce
expect "bad rule" "$dir/out" "CCS_ALGO: rule 'all_reduce:bogus': 'bogus' is not an algorithm"
CCS_ALGO="all_to_all:ring" run fails all_to_all
expect "unbuildable rule" "$dir/out" "ring does not implement all_to_all"
# ranks that disagree
pids=()
for r in 0 1; do
  CCS_ALGO=$([ $r = 0 ] && echo ring || echo tree) CCS_RANK=$r CCS_NRANKS=2 \
    CCS_UNIQUE_ID_FILE=$dir/id "$perf" all_reduce -b 8 -e 8 -n 1 -c 1 >"$dir/mm.$r" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do
  if wait "$p"; then echo "FAIL: a rank whose CCS_ALGO differs succeeded"; status=1; fi
done
cat "$dir/mm.0" "$dir/mm.1" >"$dir/mm"
expect "disagreeing ranks" "$dir/mm" "CCS_ALGO='(ring|tree)' but rank [01] has '(ring|tree)'"
# the daemon's algo key: the rules of every comm whose ranks give none;
# a rank's CCS_ALGO replaces them
daemon_stop || status=1
CCSD=$ccsd start_daemon --algo "all_reduce:tree;broadcast:ring"
dir=$(dirname "$CCS_SOCKET")
CCS_DEBUG=INFO run ok all_reduce
expect "the algo key" "$dir/out" "all_reduce #[0-9]+, 3072 bytes, 3 ranks: tree \(rule 1 \(all_reduce:tree\)\)"
! grep -qE "all_reduce #[0-9]+, [0-9]+ bytes, 3 ranks: (direct|ring|rhd)" "$dir/out" ||
  { echo "FAIL: the algo key: an all_reduce ran with another algorithm"; status=1; }
CCS_DEBUG=INFO run ok broadcast
expect "the algo key's second rule" "$dir/out" "broadcast #[0-9]+, 3072 bytes, 3 ranks: ring \(rule 2 \(broadcast:ring\)\)"
CCS_ALGO="all_reduce:rhd" CCS_DEBUG=INFO run ok all_reduce
expect "CCS_ALGO over the algo key" "$dir/out" "all_reduce #[0-9]+, 3072 bytes, 3 ranks: rhd \(rule 1 \(all_reduce:rhd\)\)"
exit $status
