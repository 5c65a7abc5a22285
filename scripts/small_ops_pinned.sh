#!/usr/bin/env bash
# Small ops where CPUs are plenty (docs/fast_path.md: "<= 2 us where the
# poller has a CPU of its own"): the daemon on the last CPU, its ranks on
# the first ones (taskset), none sharing. 8 B all_reduce and barrier with
# 1, 2 and 4 ranks, a host stream's 8 B all_reduce back to back (calls per
# second) with 2 and 4, then one rank on each of two daemons on loopback
# (the daemons on the last two CPUs). Rank 0's median of ITERS calls,
# median of RUNS runs. Needs 8 CPUs or more.
#   scripts/small_ops_pinned.sh [BIN] [ITERS] [RUNS]
# BIN: a build folder, or a bundle of scripts/gpu_bundle.sh (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}
iters=${2:-2000}
runs=${3:-5}
[ -d "$bin/libs" ] && export LD_LIBRARY_PATH="$bin/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cpus=$(nproc)
if [ "$cpus" -lt 8 ]; then
  echo "small_ops_pinned: $cpus CPUs; this needs 8 (ranks and daemons each on their own)" >&2
  exit 2
fi
dir=$(mktemp -d /tmp/ccs-pinned.XXXXXX)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
# daemon NAME CPU [ARGS...]: a daemon on that CPU, its socket $dir/NAME.sock
daemon() {
  local name=$1 cpu=$2
  shift 2
  taskset -c "$cpu" "$bin/daemon/ccsd" --config /dev/null --socket "$dir/$name.sock" "$@" 2>/dev/null &
  pids+=($!)
  for _ in $(seq 200); do [ -S "$dir/$name.sock" ] && return 0; sleep 0.05; done
  echo "ccsd did not start" >&2
  return 1
}
median() { printf '%s\n' "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }
# row OP RANKS NP ARGS...: ccs-latency ARGS on CPUs 0..NP-1, RUNS times
row() {
  local op=$1 ranks=$2 np=$3 v=()
  shift 3
  for _ in $(seq "$runs"); do v+=("$(taskset -c "0-$((np - 1))" "$bin/tests/ccs-latency" "$@")"); done
  printf '%-12s %6s %10s\n' "$op" "$ranks" "$(median "${v[@]}")"
}

echo "# $(date -u +%Y-%m-%d) $cpus CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo "# the daemon on CPU $((cpus - 1)), the ranks on CPUs 0..n-1; rank 0's median of $iters calls,"
echo "# median of $runs runs: us a call (stream: calls per second)"
daemon one $((cpus - 1))
export CCS_SOCKET=$dir/one.sock
printf '%-12s %6s %10s\n' op ranks ccs
for op in all_reduce barrier; do
  for np in 1 2 4; do row "$op" "$np" "$np" "$iters" "$op" "$np"; done
done
for np in 2 4; do row stream "$np" "$np" $((iters * 20)) stream "$np"; done

"$bin/daemon/ccsd" --generate-key "$dir/key" >/dev/null
for i in 0 1; do
  daemon "n$i" $((cpus - 2 + i)) --listen "127.0.0.1:$((17800 + i))" --cluster-key-file "$dir/key"
done
echo "# across 2 daemons on loopback (CPUs $((cpus - 2)), $((cpus - 1))), one rank each on CPUs 0, 1"
export CCS_SOCKET=$dir/n0.sock CCS_SOCKETS=$dir/n0.sock:$dir/n1.sock
for op in all_reduce barrier; do row "$op" 2x1 2 "$iters" "$op" 2; done
