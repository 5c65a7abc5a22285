#!/usr/bin/env bash
# Runs a command with D network namespaces that stand for D nodes: namespace
# <prefix><i> has 10.231.0.<i+1>/24 on a veth whose other end, <link><i>,
# sits on a private bridge. The command sees CCS_TEST_NETNS=<prefix> and
# CCS_TEST_NETNS_LINK=<link> (test_daemons_start starts daemon i in
# namespace i). Everything is removed when it exits, also on failure or a
# signal; what a run killed outright left (ctest's SIGKILL at a timeout)
# is removed by the next run: the names carry the pid of the run that
# made them, and those of runs no longer alive are swept first.
#   run_netns.sh D COMMAND [ARGS...]
set -euo pipefail
n=$1; shift
[ "$(id -u)" = 0 ] || { echo "run_netns.sh: network namespaces need root" >&2; exit 1; }
tag=$$
prefix=ccs${tag}n link=cv${tag}l bridge=cb${tag}
cleanup() {
  for i in $(seq 0 $((n - 1))); do ip netns del "$prefix$i" 2>/dev/null || true; done
  ip link del "$bridge" 2>/dev/null || true
}
trap cleanup EXIT
# a signal at any moment, during the set-up too, ends the command and
# cleans up (bash runs traps only between commands, so the command runs in
# the background and is waited for)
stop() { pkill -P $$ 2>/dev/null || true; exit "$1"; }
trap 'stop 130' INT
trap 'stop 143' TERM
# namespaces ccs<pid>n<i> and bridges cb<pid> of runs that are gone
sweep() {
  local name pid
  for name in $(ip netns list | sed -n 's/^\(ccs[0-9]*n[0-9]*\).*/\1/p'); do
    pid=${name#ccs}; pid=${pid%%n*}
    [ "$pid" != "$tag" ] && ! kill -0 "$pid" 2>/dev/null && ip netns del "$name" 2>/dev/null || true
  done
  for name in $(ip -o link show type bridge | sed -n 's/^[0-9]*: \(cb[0-9]*\)[:@].*/\1/p'); do
    pid=${name#cb}
    [ "$pid" != "$tag" ] && ! kill -0 "$pid" 2>/dev/null && ip link del "$name" 2>/dev/null || true
  done
}
sweep
ip link add "$bridge" type bridge
ip link set "$bridge" up
for i in $(seq 0 $((n - 1))); do
  ns=$prefix$i
  ip netns add "$ns"
  ip link add "$link$i" type veth peer name eth0 netns "$ns"
  ip link set "$link$i" master "$bridge" up
  ip -n "$ns" addr add "10.231.0.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done
CCS_TEST_NETNS=$prefix CCS_TEST_NETNS_LINK=$link "$@" &
wait "$!"
