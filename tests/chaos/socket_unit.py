#!/usr/bin/env python3
"""What systemd's ccsd.socket and ccsd.service do for a daemon restart, on
a path of the test's: hold the listening socket (clients that connect
while no daemon runs wait in its backlog), start ccsd on it the way
socket activation does (fd 3, LISTEN_FDS, LISTEN_PID), and start it
again whenever it exits (Restart=, after RESTART_SEC). Signals to this
process: SIGUSR1 kills the daemon (kill -9, as a crash), SIGUSR2 stops it
(SIGTERM, as systemctl restart), SIGTERM ends both.
    socket_unit.py SOCKET RESTART_SEC CCSD [ARGS...]"""
import os
import signal
import socket
import sys
import time

path, restart_sec, ccsd, args = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
os.chmod(path, 0o666)
listener.listen(128)
daemon = None
starts = 0
ending = False


def start():
    global daemon, starts
    pid = os.fork()
    if pid == 0:
        os.dup2(listener.fileno(), 3)
        os.set_inheritable(3, True)
        env = dict(os.environ, LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
        os.execve(ccsd, [ccsd] + args, env)
    daemon = pid
    starts += 1


def on_signal(signum, frame):
    global ending
    if signum == signal.SIGTERM:
        ending = True
    if daemon:  # none between its end and its restart: nothing to signal
        try:
            os.kill(daemon, {signal.SIGUSR1: signal.SIGKILL}.get(signum, signal.SIGTERM))
        except ProcessLookupError:  # ended on its own, not yet reaped
            pass


for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
    signal.signal(s, on_signal)
start()
while True:
    try:
        pid, status = os.waitpid(daemon, 0)
    except InterruptedError:
        continue
    daemon = None
    if ending:
        break
    print(f"socket_unit: ccsd (pid {pid}) ended ({status:#x}); starting it again", file=sys.stderr, flush=True)
    time.sleep(restart_sec)
    if ending:  # told to end while no daemon ran
        break
    start()
print(f"socket_unit: {starts} daemon start(s)", file=sys.stderr, flush=True)
sys.exit(0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else 1)
