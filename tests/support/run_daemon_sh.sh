#!/usr/bin/env bash
# scripts/daemon.sh, which the shell checks start their daemon with,
# hands on the daemon's exit status: a daemon that exits 0 when stopped
# leaves the script's status as it was; one that does not (a crash, or a
# race ThreadSanitizer reports: exit 66) fails the script.
#   run_daemon_sh.sh CCSD
set -uo pipefail
ccsd=$1
lib=$(dirname "$0")/../../scripts/daemon.sh
work=$(mktemp -d /tmp/ccs-daemon-sh.XXXXXX)
trap 'rm -rf "$work"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }
# a daemon that listens, then exits 66 when told to stop
cat >"$work/racy-ccsd" <<'PY'
#!/usr/bin/python3
import os, signal, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[sys.argv.index("--socket") + 1])
s.listen()
signal.signal(signal.SIGTERM, lambda *_: os._exit(66))
while True:
    time.sleep(1)
PY
chmod +x "$work/racy-ccsd"
run() { # CCSD, the script's own exit status
  CCSD=$1 bash -c ". '$lib'; start_daemon || exit 9; exit $2" 2>"$work/err"
}
run "$ccsd" 0 || fail "a clean daemon and a clean script: status $?"
run "$ccsd" 3
rc=$?
[ "$rc" = 3 ] || fail "a failing script with a clean daemon: status $rc, not 3"
run "$work/racy-ccsd" 0
rc=$?
[ "$rc" != 0 ] || fail "a daemon that exited 66 went unnoticed"
grep -q "exited with status 66" "$work/err" || fail "no word of the daemon's status: $(cat "$work/err")"
exit $status
