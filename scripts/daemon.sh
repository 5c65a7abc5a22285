# Sourced by the scripts and the tests' shell scripts: start_daemon starts
# $CCSD (default build/daemon/ccsd) on a private socket (exported as
# CCS_SOCKET; its pid is CCSD_PID), and stops it when the script exits,
# removing the socket's directory (daemon_stop stops it earlier). A
# daemon that does not exit 0 when
# stopped (it crashed, or a sanitizer reported: ThreadSanitizer exits 66)
# fails the script. mpi_perf_build installs Open MPI if missing and builds
# the MPI benchmark program into build/mpi-perf.
start_daemon() {
  CCSD_DIR=$(mktemp -d /tmp/ccs-script.XXXXXX)
  export CCS_SOCKET=$CCSD_DIR/ccsd.sock
  "${CCSD:-build/daemon/ccsd}" --socket "$CCS_SOCKET" "$@" &
  CCSD_PID=$!
  trap stop_daemon EXIT
  for _ in $(seq 200); do [ -S "$CCS_SOCKET" ] && return 0; sleep 0.05; done
  echo "ccsd did not start" >&2
  return 1
}

# Stops the daemon now (a script may start another after): 1, with a word
# on stderr, when it did not exit 0.
daemon_stop() {
  local rc=0
  [ -n "${CCSD_PID:-}" ] || return 0
  kill "$CCSD_PID" 2>/dev/null || true
  wait "$CCSD_PID" 2>/dev/null || rc=$?
  rm -rf "$CCSD_DIR"
  if [ "$rc" -ne 0 ]; then echo "ccsd (pid $CCSD_PID) exited with status $rc" >&2; fi
  CCSD_PID=
  [ "$rc" -eq 0 ]
}

# The EXIT trap: the script's own status, or 1 when the daemon's was not 0.
stop_daemon() {
  local status=$?
  daemon_stop || exit 1
  exit "$status"
}

mpi_perf_build() {
  if ! command -v mpicc >/dev/null; then
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
  fi
  mpicc -O2 -Iclient/tools -Iclient/include tests/bench/mpi_perf.c -o build/mpi-perf
}

# Open MPI on this machine's shared memory (as root too)
mpirun_() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe --bind-to none --mca btl self,vader -np "$@"
}
# ccs-perf's JSON rows (ccs_rows COLL FILE) -> "size busbw", out of place
# (in place for broadcast, which is what MPI_Bcast is: one buffer, no copy
# on the root)
ccs_rows() {
  local which=out_of_place
  [ "$1" = broadcast ] && which=in_place
  sed -n "s/.*\"size\": \([0-9]*\).*\"$which\": {[^}]*\"busbw\": \([0-9.]*\).*/\1 \2/p" "$2"
}
# "size value" rows of several runs -> "size median" per size
median_rows() {
  sort -k1,1n -k2,2g | awk '
    function flush() { if (n) print size, v[int((n + 1) / 2)]; n = 0 }
    $1 != size { flush(); size = $1 }
    { v[++n] = $2 }
    END { flush() }'
}
