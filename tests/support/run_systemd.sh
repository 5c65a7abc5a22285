#!/usr/bin/env bash
# The systemd side of the daemon:
#   - the units pass systemd-analyze verify, and the service's exposure
#     score stays at or under 2.0 (docs/operations.md);
#   - socket activation: ccsd serves on a socket systemd-socket-activate made;
#   - readiness and the watchdog: READY=1, then WATCHDOG=1 pings, on the
#     notify socket.
#   run_systemd.sh BUILD_DIR
set -euo pipefail
build=$1
units=$build/systemd/test
systemd-analyze verify "$units/ccsd.service" "$units/ccsd.socket"
systemd-analyze security --offline=true --threshold=20 "$units/ccsd.service" | tail -1

dir=$(mktemp -d /tmp/ccs-systemd-test.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$dir"' EXIT

# socket activation: the daemon takes the socket it is given
systemd-socket-activate -l "$dir/act.sock" "$build/daemon/ccsd" --socket "$dir/unused.sock" \
  2>"$dir/act.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$dir/act.sock" ] && break; sleep 0.05; done
CCS_SOCKET=$dir/act.sock "$build/client/ccs-perf" all_reduce --np 2 -b 8 -e 1K -n 2 -c 1 | grep -q '0 OK'
[ ! -e "$dir/unused.sock" ]

# readiness and watchdog pings on a notify socket of our own
/usr/bin/python3 - "$build/daemon/ccsd" "$dir" <<'PY'
import os, socket, subprocess, sys, time
ccsd, d = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(d + "/notify")
s.settimeout(10)
env = dict(os.environ, NOTIFY_SOCKET=d + "/notify", WATCHDOG_USEC="200000")
p = subprocess.Popen([ccsd, "--socket", d + "/n.sock"], env=env)
try:
    got = []
    deadline = time.time() + 10
    while time.time() < deadline and got.count("WATCHDOG=1") < 3:
        got += s.recv(4096).decode().split("\n")
    assert any(m == "READY=1" for m in got), got
    assert got.count("WATCHDOG=1") >= 3, got
    print("notify:", [m for m in got if m][:4])
finally:
    p.terminate()
    assert p.wait(10) == 0
PY
echo "systemd integration OK"
