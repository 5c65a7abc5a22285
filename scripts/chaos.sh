#!/usr/bin/env bash
# Chaos: a job of RANKS ranks calling every collective, every element
# checked (tests/chaos/chaos_ranks.c), while its daemon is killed (kill -9,
# as a crash) or stopped (SIGTERM, as systemctl restart) at random moments,
# ROUNDS times, and started again by a stand-in for the socket unit that
# holds the listening socket meanwhile (tests/chaos/socket_unit.py). With
# DAEMONS > 1 the ranks take turns among that many daemons on this machine
# (rank r on daemon r % DAEMONS, talking over loopback TCP), and each death
# strikes one of them at random while the others hold the job's comms for
# it (peer_restart_grace), at least 1.2 s after the one before. With one
# daemon, a quarter of the deaths come as the ranks rejoin after the last.
# Reports the calls that ended right, were repeated after CCS_ERR_RETRY or
# failed (and why), the wrong elements (must be 0), the hangs (must be 0)
# and any sanitizer's report (must be none); exits 1 otherwise.
#   scripts/chaos.sh [ROUNDS] [RANKS] [BUILD_DIR] [DAEMONS]   (default 10, 4, build, 1)
# CCSD_PATH runs another daemon (the ThreadSanitizer one); CHAOS_DEATHS=kill
# or term deals only one kind of death; CHAOS_TOGETHER=1 strikes every
# daemon at once each time (a cluster's daemons restarted together).
set -euo pipefail
rounds=${1:-10}
nranks=${2:-4}
build=$(realpath "${3:-$(dirname "$0")/../build}")
cd "$(dirname "$0")/.."
ccsd=${CCSD_PATH:-$build/daemon/ccsd}
ndaemons=${4:-1}
dir=$(mktemp -d /tmp/ccs-chaos.XXXXXX)
units=() job=
cleanup() {
  [ -n "$job" ] && kill -9 -- "-$job" 2>/dev/null
  for u in "${units[@]}"; do kill "$u" 2>/dev/null && wait "$u" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT

peer_args=()
if ((ndaemons > 1)); then
  "$ccsd" --generate-key "$dir/cluster.key" >/dev/null
  # below the kernel's ephemeral range: a daemon that comes back finds its
  # port free, which one of that range may meanwhile be any connection's
  mapfile -t port < <("$build/tests/test-free-ports" "$ndaemons")
  ((${#port[@]} == ndaemons)) || { echo "chaos: no $ndaemons free ports" >&2; exit 1; }
fi
sockets=
for k in $(seq 0 $((ndaemons - 1))); do
  if ((ndaemons > 1)); then
    peer_args=(--listen "127.0.0.1:${port[$k]}" --cluster-key-file "$dir/cluster.key")
  fi
  # (an op that waits 20 s for a rank is a hang here: the deadline says whose)
  python3 tests/chaos/socket_unit.py "$dir/ccsd$k.sock" 0.3 "$ccsd" --config /dev/null \
    --socket "$dir/unused$k.sock" --id-key-file "$dir/id$k.key" --op-timeout 20 "${peer_args[@]}" \
    2>"$dir/unit$k.log" &
  units+=($!)
  for _ in $(seq 100); do [ -S "$dir/ccsd$k.sock" ] && break; sleep 0.05; done
  sockets+="${sockets:+:}$dir/ccsd$k.sock"
done
# the job, in a process group of its own (killed whole if it hangs); its
# comms meet at the first daemon
root=()
((ndaemons > 1)) && root=(CCS_ROOT="127.0.0.1:${port[0]}")
setsid env CCS_CHAOS_SOCKETS="$sockets" "${root[@]}" "$build/tests/chaos_ranks" "$nranks" "$dir/stop" \
  >"$dir/report" 2>"$dir/ranks.log" &
job=$!
kills=0 terms=0
for _ in $(seq "$rounds"); do
  # across daemons, one at a time: the last one back and its comms settled
  # first (every daemon at once: made again 2.5 s after the ranks are
  # back, coll/refound.c); one daemon, a quarter of the deaths soon after
  # the last (0.3 s: the unit's restart), as its ranks rejoin and resubmit
  sleep "$(awk -v r=$RANDOM -v q=$((RANDOM % 4)) -v n="$ndaemons" -v all="${CHAOS_TOGETHER:-0}" 'BEGIN {
    s = n > 1 && all == 1 ? 5 + r / 32767 * 2 : n > 1 ? 1.2 + r / 32767 * 1.2 : q ? 0.3 + r / 32767 * 1.2 : 0.3 + r / 32767 * 0.2
    printf "%.2f", s }')"
  struck=("${units[$((RANDOM % ndaemons))]}")
  [ "${CHAOS_TOGETHER:-0}" = 1 ] && struck=("${units[@]}")
  deaths=${CHAOS_DEATHS:-both}
  if [ "$deaths" = kill ] || { [ "$deaths" != term ] && ((RANDOM % 2)); }; then kill -USR1 "${struck[@]}"; kills=$((kills + 1)); else kill -USR2 "${struck[@]}"; terms=$((terms + 1)); fi
done
sleep 1
touch "$dir/stop"
hangs=0
for _ in $(seq 600); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  hangs=1
  echo "chaos: the job did not finish within 60 s of being told to stop" >&2
  for sock in ${sockets//:/ }; do # what each daemon holds, and who waits for what
    echo "== $sock" >&2
    "$build/client/ccsctl" --socket "$sock" comms >&2 || true
    "$build/client/ccsctl" --socket "$sock" stuck >&2 || true
  done
  if command -v gdb >/dev/null; then # where each rank waits
    for pid in $(pgrep -g "$job" -f chaos_ranks); do
      echo "== rank process $pid" >&2
      gdb -p "$pid" -batch -ex "thread apply all bt 12" 2>/dev/null | grep -E "^(Thread|#)" >&2 || true
    done
  fi
  kill -9 -- "-$job" 2>/dev/null # whole, so the report and the logs below come now
fi
status=0
wait "$job" || status=$?
job=
read -r _ calls _ ok _ retried _ failed _ wrong _ comms <"$dir/report" || true
together=
[ "${CHAOS_TOGETHER:-0}" = 1 ] && ((ndaemons > 1)) && together=", every daemon at once"
echo "chaos: $rounds daemon deaths ($kills kill -9, $terms SIGTERM$together), $nranks ranks on $ndaemons daemon(s):" \
     "${calls:-?} calls, ${ok:-?} right, ${retried:-?} repeated after CCS_ERR_RETRY," \
     "${failed:-?} failed (${comms:-?} comms), ${wrong:-?} wrong elements, $hangs hangs"
if [ "${failed:-0}" != 0 ]; then # why, each reason once with its count
  grep '^rank [0-9]* round' "$dir/ranks.log" | sed -E 's/^rank [0-9]+ round [0-9]+: //; s/[0-9]+/N/g' |
    sort | uniq -c | sort -rn | head -8 | sed 's/^/chaos: failed: /' || true
fi
# a sanitizer's report from a daemon (CCSD_PATH, a sanitized build) or a rank
sanitized=$(grep -h -E "ERROR: [A-Za-z]+Sanitizer|WARNING: ThreadSanitizer|runtime error:" "$dir"/unit*.log "$dir/ranks.log" | head -5 || true)
[ -n "$sanitized" ] && echo "chaos: sanitizer reports, the first: $sanitized" >&2
if [ -n "$sanitized" ] || [ "$status" -ne 0 ] || [ "$hangs" -ne 0 ] || [ "${wrong:-1}" -ne 0 ] || [ "${ok:-0}" -eq 0 ]; then
  tail -20 "$dir/ranks.log" >&2
  tail -n 5 "$dir"/unit*.log >&2
  exit 1
fi
