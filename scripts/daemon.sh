# Sourced by the scripts and the tests' shell scripts: start_daemon starts
# $CCSD (default build/daemon/ccsd) on a private socket (exported as
# CCS_SOCKET) and stops it, and removes the socket's directory, when the
# script exits. mpi_perf_build installs Open MPI if missing and builds the
# MPI benchmark program into build/mpi-perf.
start_daemon() {
  local dir
  dir=$(mktemp -d /tmp/ccs-script.XXXXXX)
  export CCS_SOCKET=$dir/ccsd.sock
  "${CCSD:-build/daemon/ccsd}" --socket "$CCS_SOCKET" "$@" &
  local pid=$!
  trap "kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf '$dir'" EXIT
  for _ in $(seq 200); do [ -S "$CCS_SOCKET" ] && return 0; sleep 0.05; done
  echo "ccsd did not start" >&2
  return 1
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
