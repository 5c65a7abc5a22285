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
# a run whose command sleeps, once its namespaces are made: the sleeper's
# pid in $dir/<name> when it started (set-up done)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sleeping_run() { # name D
  "$netns" "$2" bash -c "echo \$\$ > $dir/$1.tmp && mv $dir/$1.tmp $dir/$1 && exec sleep 600" &
}
wait_for_sleeper() { # name pid count
  for _ in $(seq 400); do
    [ -s "$dir/$1" ] && [ "$(left_by "$2")" = "$3" ] && return 0
    sleep 0.05
  done
  fail "run $2 never made its $3 namespaces and started its command"
  return 1
}

# SIGKILL: no trap runs; the next run sweeps
sleeping_run killed 2
killed=$!
wait_for_sleeper killed "$killed" 2
kill -KILL "$killed"
wait "$killed" 2>/dev/null || true
kill -KILL "$(cat "$dir/killed")" 2>/dev/null || true
[ "$(left_by "$killed")" = 2 ] || fail "the killed run's namespaces were gone before the sweep"
"$netns" 1 true
[ "$(left_by "$killed")" = 0 ] || fail "the next run left the killed run's namespaces"
[ "$(bridge_of "$killed")" = 0 ] || fail "the next run left the killed run's bridge"

# SIGTERM: the run cleans up after itself, at once
sleeping_run stopped 2
stopped=$!
wait_for_sleeper stopped "$stopped" 2
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
