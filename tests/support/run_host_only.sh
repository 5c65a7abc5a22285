#!/usr/bin/env bash
# A daemon on a machine without a usable GPU starts host-only and says why
# in one INFO line.   run_host_only.sh CCSD
set -euo pipefail
dir=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
"$1" --config /dev/null --socket="$dir/ccsd.sock" --log-level=info 2>"$dir/log" &
pid=$!
for _ in $(seq 100); do [ -S "$dir/ccsd.sock" ] && break; sleep 0.1; done
kill "$pid"
wait "$pid" || { echo "ccsd did not stop cleanly"; cat "$dir/log"; exit 1; }
pid=
cat "$dir/log"
lines=$(grep -c "INFO: host-only: " "$dir/log" || true)
[ "$lines" = 1 ] || { echo "expected one 'host-only' INFO line, got $lines"; exit 1; }
