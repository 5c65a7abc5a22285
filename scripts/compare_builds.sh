#!/usr/bin/env bash
# This build against another, side by side: ccs-perf all_reduce (or the
# collectives COLLS names; float sum, out of place, registered buffers) at
# 8 B, 1 MiB and 64 MiB (or SIZES), with 2
# and 4 ranks on one daemon and 2 ranks across 2 daemons on loopback (one
# each). The two builds take turns, ROUNDS times; each cell is the median
# time over the rounds, and after/before is their ratio: a change that
# should not change speed shows ratios within the rounds' spread.
#   git worktree add /tmp/before REV && (cd /tmp/before && scripts/setup.sh build)
#   scripts/compare_builds.sh /tmp/before/build [ROUNDS] [SIZES] [COLLS]
#     (SIZES default "8 1M 64M", COLLS default all_reduce)
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:?usage: scripts/compare_builds.sh BEFORE_BUILD_DIR [ROUNDS]}
rounds=${2:-5}
sizes=${3:-8 1M 64M}
colls=${4:-all_reduce}
after=build
scripts/setup.sh "$after" >/dev/null
dir=$(mktemp -d)
pids=()
stop_daemons() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=(); }
trap 'stop_daemons; rm -rf "$dir"' EXIT
"$after/daemon/ccsd" --generate-key "$dir/key" >/dev/null

# start BUILD N: N daemons (with N > 1 they listen on loopback ports)
start() {
  local b=$1 n=$2 i
  for ((i = 0; i < n; i++)); do
    if ((n > 1)); then
      "$b/daemon/ccsd" --socket "$dir/$i.sock" --listen "127.0.0.1:$((17500 + i))" \
        --cluster-key-file "$dir/key" &
    else
      "$b/daemon/ccsd" --socket "$dir/$i.sock" &
    fi
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    for _ in $(seq 200); do [ -S "$dir/$i.sock" ] && break; sleep 0.05; done
  done
}

# one BUILD SETUP SIZE COLL: the time in us of one op (SETUP: np2, np4, 2daemons)
one() {
  local b=$1 setup=$2 size=$3 coll=$4 n w r
  case $size in 8) n=2000 w=200 ;; *K | 1M) n=200 w=20 ;; *) n=10 w=3 ;; esac
  rm -f "$dir"/rows*.json "$dir/id"
  local perf=("$b/client/ccs-perf" "$coll" -b "$size" -e "$size" -n "$n" -w "$w" -c 1)
  if [ "$setup" = 2daemons ]; then
    start "$b" 2
    local ranks=()
    for r in 0 1; do
      CCS_SOCKET=$dir/$r.sock CCS_RANK=$r CCS_NRANKS=2 CCS_UNIQUE_ID_FILE=$dir/id \
        "${perf[@]}" -J "$dir/rows$r.json" >/dev/null &
      ranks+=($!)
    done
    for r in "${ranks[@]}"; do wait "$r"; done
  else
    start "$b" 1
    CCS_SOCKET=$dir/0.sock "${perf[@]}" --np "${setup#np}" -J "$dir/rows0.json" >/dev/null
  fi
  stop_daemons
  sed -n 's/.*"out_of_place": {"time_us": \([0-9.]*\).*/\1/p' "$dir/rows0.json"
}

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
spread() { tr ' ' '\n' | grep . | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.0f%%", 100 * (hi - lo) / lo}'; }

echo "# $(date -u +%Y-%m-%d) $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo "# float sum, out of place; median us of $rounds rounds (builds alternating); spread: (max-min)/min"
echo "# before: $before ($(git -C "$before/.." log -1 --format=%h 2>/dev/null || echo '?')), after: $after ($(git log -1 --format=%h))"
printf '%-14s %-9s %6s %12s %8s %12s %8s %8s\n' coll setup size before spread after spread after/before
for coll in $colls; do
  for setup in np2 np4 2daemons; do
    for size in $sizes; do
      b_times="" a_times=""
      for ((k = 0; k < rounds; k++)); do
        b_times+=" $(one "$before" "$setup" "$size" "$coll")"
        a_times+=" $(one "$after" "$setup" "$size" "$coll")"
      done
      bm=$(echo "$b_times" | median) am=$(echo "$a_times" | median)
      printf '%-14s %-9s %6s %12.1f %8s %12.1f %8s %8.2f\n' "$coll" "$setup" "$size" "$bm" \
        "$(echo "$b_times" | spread)" "$am" "$(echo "$a_times" | spread)" "$(echo "$am $bm" | awk '{print $1 / $2}')"
    done
  done
done
