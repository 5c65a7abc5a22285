#!/usr/bin/env bash
# Every example, run as docs/using.md says: the C program, the MPI program and
# the NCCL program under mpirun, the Python script; each checks its results.
#   run_examples.sh CCSD BUILD_DIR SOURCE_DIR
set -euo pipefail
ccsd=$1 build=$2 src=$3
dir=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
"$ccsd" --config /dev/null --socket="$dir/ccsd.sock" 2>"$dir/log" &
pid=$!
for _ in $(seq 100); do [ -S "$dir/ccsd.sock" ] && break; sleep 0.1; done
export CCS_SOCKET=$dir/ccsd.sock OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun_() { mpirun --oversubscribe --bind-to none -x CCS_SOCKET "$@"; }
mpirun_ -np 3 "$build/examples/first"
if [ -x "$build/examples/mpi_allreduce" ]; then mpirun_ -np 4 "$build/examples/mpi_allreduce"; fi
mpirun_ -np 2 -x LD_LIBRARY_PATH="$build/client/nccl/lib" "$build/examples/nccl_allreduce" "$dir/nccl.id"
mpirun_ -np 3 -x PYTHONPATH="$src/python" -x CCS_LIBRARY="$build/client/libccs.so.0" \
  /usr/bin/python3 "$src/examples/allreduce.py"
