#!/usr/bin/env bash
# The verbs transport on a real RDMA device (or Soft-RoCE: `rdma link add
# rxe0 type rxe netdev IF`): the transport's own test, then the across-
# nodes suites with every daemon on transport=ib, over the system's
# libibverbs instead of the emulated NIC CI uses.
#   tests/rdma/run.sh [BUILD_DIR] [LIBIBVERBS]     (root: the namespace runs)
# Prints each stage's verdict; exits non-zero when one failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
lib=${2:-libibverbs.so.1}
export CCS_TEST_IB_LIBRARY=$lib
command -v ibv_devinfo >/dev/null && ibv_devinfo -l
failed=0
stage() {
  local name=$1
  shift
  if "$@"; then echo "# rdma stage $name: passed"; else echo "# rdma stage $name: FAILED"; failed=1; fi
}
stage transport "$build/tests/test_transport_ib"
stage nodes "$build/tests/test_nodes"
stage nodes_2per env CCS_TEST_RANKS_PER_DAEMON=2 "$build/tests/test_nodes"
for topo in "2 3" "3 5" "4 7"; do
  set -- $topo
  stage "collectives_${1}daemons_$2" env CCS_TEST_DAEMONS=$1 "$build/tests/test_collectives" "$2"
done
exit $failed
