#!/usr/bin/env bash
# run_netns.sh leaves nothing behind: a run killed outright (SIGKILL, as
# ctest kills a test past its timeout) has its namespaces and bridge
# removed by the next run, and a run stopped with SIGTERM removes its own.
#   run_netns_sweep.sh
set -euo pipefail
netns=$(dirname "$0")/run_netns.sh
status=0
fail() { echo "FAIL: $*"; status=1; }
# ours: namespaces ccs<pid>n<i> and the bridge cb<pid>
left_by() { ip netns list | grep -c "^ccs$1n" || true; }
bridge_of() { ip -o link show type bridge | grep -c ": cb$1[:@]" || true; }
wait_for_namespaces() { # pid count
  for _ in $(seq 200); do [ "$(left_by "$1")" = "$2" ] && return 0; sleep 0.05; done
  fail "run $1 never made its $2 namespaces"
  return 1
}

# SIGKILL: no trap runs; the next run sweeps
"$netns" 2 sleep 600 &
killed=$!
wait_for_namespaces "$killed" 2
sleeper=$(cat /proc/"$killed"/task/*/children 2>/dev/null || true)
kill -KILL "$killed"
wait "$killed" 2>/dev/null || true
for p in $sleeper; do kill -KILL "$p" 2>/dev/null || true; done
[ "$(left_by "$killed")" = 2 ] || fail "the killed run's namespaces were gone before the sweep"
"$netns" 1 true
[ "$(left_by "$killed")" = 0 ] || fail "the next run left the killed run's namespaces"
[ "$(bridge_of "$killed")" = 0 ] || fail "the next run left the killed run's bridge"

# SIGTERM: the run cleans up after itself, at once
"$netns" 2 sleep 600 &
stopped=$!
wait_for_namespaces "$stopped" 2
kill -TERM "$stopped"
rc=0
wait "$stopped" || rc=$?
[ "$rc" = 143 ] || fail "a stopped run exited $rc, not 143"
[ "$(left_by "$stopped")" = 0 ] || fail "a stopped run left its namespaces"
[ "$(bridge_of "$stopped")" = 0 ] || fail "a stopped run left its bridge"

# a run's own failure is its status
rc=0
"$netns" 1 false || rc=$?
[ "$rc" = 1 ] || fail "a failing command's status came back as $rc"
exit $status
