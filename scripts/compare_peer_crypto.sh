#!/usr/bin/env bash
# What authenticating and encrypting the daemons' traffic costs, in one
# run: busbw of all_reduce and all_gather over 2 daemons on loopback ports
# (one rank each), 1 MiB .. 256 MiB, with every message authenticated
# (the default) and with the data encrypted too (peer_encrypt). With
# BASELINE=DIR (a build of a ccs from before daemons authenticated, e.g.
# `git worktree add /tmp/base 301417d && scripts/setup.sh /tmp/base/build`
# run there) its busbw is printed beside.
#   scripts/compare_peer_crypto.sh [ITERS [WARMUP]]
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-5} warmup=${2:-3}
scripts/setup.sh build >/dev/null
dir=$(mktemp -d)
pids=()
stop_daemons() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=(); }
trap 'stop_daemons; rm -rf "$dir"' EXIT
build/daemon/ccsd --generate-key "$dir/key" >/dev/null

# start BUILD_DIR [ccsd arguments...]: 2 daemons
start() {
  local b=$1 i
  shift
  for i in 0 1; do
    "$b/daemon/ccsd" --socket "$dir/$i.sock" --listen "127.0.0.1:$((17400 + i))" "$@" &
    pids+=($!)
  done
  for i in 0 1; do for _ in $(seq 200); do [ -S "$dir/$i.sock" ] && break; sleep 0.05; done; done
}

# run BUILD_DIR COLL: "size busbw" rows, out of place
run() {
  rm -f "$dir/id" "$dir/rows.json"
  local r ranks=()
  for r in 0 1; do
    CCS_SOCKET=$dir/$r.sock CCS_RANK=$r CCS_NRANKS=2 CCS_UNIQUE_ID_FILE=$dir/id \
      "$1/client/ccs-perf" "$2" -b 1M -e 256M -f 4 -n "$iters" -w "$warmup" -c 1 -J "$dir/rows.json" >/dev/null &
    ranks+=($!)
  done
  for r in "${ranks[@]}"; do wait "$r"; done
  sed -n 's/.*"size": \([0-9]*\).*"out_of_place": {[^}]*"busbw": \([0-9.]*\).*/\1 \2/p' "$dir/rows.json"
}

echo "# $(date -u +%Y-%m-%d) $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), 2 daemons on loopback, 1 rank each"
echo "# float sum, out of place, $iters iterations after $warmup, busbw in GB/s"
for coll in all_reduce all_gather; do
  start build --cluster-key-file "$dir/key"
  auth=$(run build "$coll")
  stop_daemons
  start build --cluster-key-file "$dir/key" --peer-encrypt true
  enc=$(run build "$coll")
  stop_daemons
  base=$(echo "$auth" | awk '{print $1, "-"}')
  if [ -n "${BASELINE:-}" ]; then
    start "$BASELINE"
    base=$(run "$BASELINE" "$coll")
    stop_daemons
  fi
  echo
  echo "## $coll"
  printf '%12s %12s %12s %12s %12s %12s\n' "size(B)" "before-auth" "authentic" "encrypted" "auth/before" "enc/auth"
  join <(echo "$base" | sort -k1,1) <(echo "$auth" | sort -k1,1) | join - <(echo "$enc" | sort -k1,1) | sort -n |
    awk '{a = $2 > 0 ? sprintf("%.2f", $3 / $2) : "-"; r = $3 > 0 ? $4 / $3 : 0
          printf "%12d %12s %12.3f %12.3f %12s %12.2f\n", $1, $2, $3, $4, a, r}'
done
