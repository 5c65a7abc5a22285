#!/usr/bin/env bash
# Chaos: a job of RANKS ranks calling every collective, every element
# checked (tests/chaos/chaos_ranks.c), while its daemon is killed (kill -9,
# as a crash) or stopped (SIGTERM, as systemctl restart) at random moments,
# ROUNDS times, and started again by a stand-in for the socket unit that
# holds the listening socket meanwhile (tests/chaos/socket_unit.py).
# Reports the calls that ended right, were repeated after CCS_ERR_RETRY or
# failed, the wrong elements (must be 0) and the hangs (must be 0); exits 1
# otherwise.
#   scripts/chaos.sh [ROUNDS] [RANKS] [BUILD_DIR]     (default 10, 4, build)
# CCSD_PATH runs another daemon (the ThreadSanitizer one).
set -euo pipefail
rounds=${1:-10}
nranks=${2:-4}
build=$(realpath "${3:-$(dirname "$0")/../build}")
cd "$(dirname "$0")/.."
ccsd=${CCSD_PATH:-$build/daemon/ccsd}
dir=$(mktemp -d /tmp/ccs-chaos.XXXXXX)
unit= job=
cleanup() {
  [ -n "$job" ] && kill -9 -- "-$job" 2>/dev/null
  [ -n "$unit" ] && kill "$unit" 2>/dev/null && wait "$unit" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

# (an op that waits 20 s for a rank is a hang here: the deadline says whose)
python3 tests/chaos/socket_unit.py "$dir/ccsd.sock" 0.3 "$ccsd" --config /dev/null \
  --socket "$dir/unused.sock" --id-key-file "$dir/id.key" --op-timeout 20 2>"$dir/unit.log" &
unit=$!
for _ in $(seq 100); do [ -S "$dir/ccsd.sock" ] && break; sleep 0.05; done
# the job, in a process group of its own (killed whole if it hangs)
setsid env CCS_SOCKET="$dir/ccsd.sock" "$build/tests/chaos_ranks" "$nranks" "$dir/stop" \
  >"$dir/report" 2>"$dir/ranks.log" &
job=$!
kills=0 terms=0
for _ in $(seq "$rounds"); do
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.3 + r / 32767 * 1.2 }')"
  if ((RANDOM % 2)); then kill -USR1 "$unit"; kills=$((kills + 1)); else kill -USR2 "$unit"; terms=$((terms + 1)); fi
done
sleep 1
touch "$dir/stop"
hangs=0
for _ in $(seq 600); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  hangs=1
  echo "chaos: the job did not finish within 60 s of being told to stop" >&2
fi
status=0
wait "$job" || status=$?
job=
read -r _ calls _ ok _ retried _ failed _ wrong _ comms <"$dir/report" || true
echo "chaos: $rounds daemon deaths ($kills kill -9, $terms SIGTERM), $nranks ranks:" \
     "${calls:-?} calls, ${ok:-?} right, ${retried:-?} repeated after CCS_ERR_RETRY," \
     "${failed:-?} failed (${comms:-?} comms), ${wrong:-?} wrong elements, $hangs hangs"
if [ "$status" -ne 0 ] || [ "$hangs" -ne 0 ] || [ "${wrong:-1}" -ne 0 ] || [ "${ok:-0}" -eq 0 ]; then
  tail -20 "$dir/ranks.log" >&2
  tail -5 "$dir/unit.log" >&2
  exit 1
fi
