# Sourced by the scripts: start_daemon starts build/daemon/ccsd on a private
# socket (exported as CCS_SOCKET) and stops it, and removes the socket's
# directory, when the script exits.
start_daemon() {
  local dir
  dir=$(mktemp -d /tmp/ccs-script.XXXXXX)
  export CCS_SOCKET=$dir/ccsd.sock
  build/daemon/ccsd --socket "$CCS_SOCKET" "$@" &
  local pid=$!
  trap "kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf '$dir'" EXIT
  for _ in $(seq 200); do [ -S "$CCS_SOCKET" ] && return 0; sleep 0.05; done
  echo "ccsd did not start" >&2
  return 1
}
