#!/usr/bin/env bash
# Small ops, the fast path's targets, side by side with Open MPI (shared
# memory, btl vader) in one run, taking turns: rank 0's median time of an
# 8 B all_reduce and of a barrier with 2 and 4 ranks, for Open MPI, ccs
# (rings, the default) and ccs with CCS_RING=0 (every call over the
# socket); each cell the median of RUNS runs of ITERS calls. Then the same
# two ops with one rank on each of two daemons on loopback, against Open
# MPI over TCP on loopback, placed freely and with each daemon and its
# rank on a CPU of their own. Then one rank whose daemon has a CPU of its
# own (pinned apart with taskset): the rings' round trip where the poller
# need not share. Then what idle costs: the daemon's and the ranks' CPU
# time over the 2 s from 1 s after the last op.
#   scripts/compare_small.sh [ITERS] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-500}
runs=${2:-7}
scripts/setup.sh build >/dev/null
. scripts/daemon.sh
mpi_perf_build
mpicc -O2 tests/bench/mpi_latency.c -o build/mpi-latency
start_daemon
daemon_pid=$(pgrep -n -f "ccsd --socket $CCS_SOCKET")

median() { printf '%s\n' "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }
cpu_ns() { cat /proc/"$1"/task/*/schedstat | awk '{s += $1} END {print s}'; } # every thread's, in ns

echo "# $(date -u +%Y-%m-%d) $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo "# Open MPI $(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}') (btl vader); 8 B = one float64, sum"
echo "# rank 0's median of $iters calls, median of $runs runs, in us; poll_spin_us and CCS_SPIN_US at their defaults"
printf '%-16s %6s %10s %10s %10s %10s\n' op ranks OpenMPI ccs ccs_socket ccs/OMPI
for op in all_reduce barrier; do
  for np in 2 4; do
    m=(); c=(); s=()
    for _ in $(seq "$runs"); do
      m+=("$(mpirun_ "$np" build/mpi-latency "$op" "$iters")")
      c+=("$(build/tests/ccs-latency "$iters" "$op" "$np")")
      s+=("$(CCS_RING=0 build/tests/ccs-latency "$iters" "$op" "$np")")
    done
    mm=$(median "${m[@]}") cm=$(median "${c[@]}") sm=$(median "${s[@]}")
    printf '%-16s %6d %10s %10s %10s %10.1f\n' "$op" "$np" "$mm" "$cm" "$sm" \
      "$(echo "$cm $mm" | awk '{print ($2 > 0 ? $1 / $2 : 0)}')"
  done
done

echo
echo "# 8 B all_reduce back to back, asynchronous: ccs on a host stream (ccs_stream_create),"
echo "# Open MPI MPI_Iallreduce then MPI_Waitall; rank 0's calls per second, median of $runs runs of $((iters * 20))"
printf '%-16s %6s %10s %10s %10s\n' op ranks OpenMPI ccs ccs/OMPI
for np in 2 4; do
  m=(); c=()
  for _ in $(seq "$runs"); do
    m+=("$(mpirun_ "$np" build/mpi-latency stream $((iters * 20)))")
    c+=("$(build/tests/ccs-latency $((iters * 20)) stream "$np")")
  done
  mm=$(median "${m[@]}") cm=$(median "${c[@]}")
  printf '%-16s %6d %10s %10s %10.2f\n' stream "$np" "$mm" "$cm" "$(echo "$cm $mm" | awk '{print ($2 > 0 ? $1 / $2 : 0)}')"
done

echo
echo "# across 2 daemons on loopback (one rank each; ccs: a daemon per rank listening on 127.0.0.1,"
echo "# Open MPI: btl self,tcp over lo), 8 B all_reduce and barrier: rank 0's median, in us"
key_dir=$(mktemp -d /tmp/ccs-small.XXXXXX)
build/daemon/ccsd --generate-key "$key_dir/key" >/dev/null
two=()
for i in 0 1; do
  build/daemon/ccsd --socket "$key_dir/$i.sock" --listen "127.0.0.1:$((17700 + i))" \
    --cluster-key-file "$key_dir/key" 2>/dev/null &
  two+=($!)
done
# (this trap replaces start_daemon's: it stops that daemon too)
trap 'kill "${two[@]}" "$daemon_pid" 2>/dev/null; rm -rf "$key_dir" "$(dirname "$CCS_SOCKET")"' EXIT
for i in 0 1; do for _ in $(seq 200); do [ -S "$key_dir/$i.sock" ] && break; sleep 0.05; done; done
# Two layouts: free (the scheduler places every process), and each "node"
# on a CPU of its own (daemon i and rank i on CPU i; Open MPI's ranks bound
# to cores), as two machines would be: free, the two daemons' loops can
# share a CPU, and each hop between them then waits for the other's turn
# (docs/fast_path.md).
printf '%-16s %6s %-7s %10s %10s %10s\n' op ranks layout OpenMPI ccs ccs/OMPI
for layout in free pinned; do
  [ "$layout" = pinned ] && [ "$(nproc)" -lt 2 ] && continue
  if [ "$layout" = pinned ]; then
    for i in 0 1; do taskset -a -p -c "$i" "${two[$i]}" >/dev/null; done
    bind=core cpus=0:1
  else
    bind=none cpus=
  fi
  for op in all_reduce barrier; do
    m=(); c=()
    for _ in $(seq "$runs"); do
      m+=("$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to "$bind" \
             --mca btl self,tcp --mca btl_tcp_if_include lo -np 2 build/mpi-latency "$op" "$iters")")
      c+=("$(CCS_SOCKET=$key_dir/0.sock CCS_SOCKETS=$key_dir/0.sock:$key_dir/1.sock LATENCY_CPUS=$cpus \
             build/tests/ccs-latency "$iters" "$op" 2)")
    done
    mm=$(median "${m[@]}") cm=$(median "${c[@]}")
    printf '%-16s %6s %-7s %10s %10s %10.1f\n' "$op" 2x1 "$layout" "$mm" "$cm" "$(echo "$cm $mm" | awk '{print ($2 > 0 ? $1 / $2 : 0)}')"
  done
done
kill "${two[@]}" 2>/dev/null; wait "${two[@]}" 2>/dev/null || true

echo
echo "# one rank, the daemon's poller on a CPU of its own (daemon on the last CPU, the rank on"
echo "# the first, taskset): the rings' round trip alone; rank 0's median of $((iters * 4)) calls, median of $runs runs, us"
last_cpu=$(( $(nproc) - 1 ))
taskset -c "$last_cpu" build/daemon/ccsd --socket "$key_dir/pinned.sock" 2>/dev/null &
pinned=$!
for _ in $(seq 200); do [ -S "$key_dir/pinned.sock" ] && break; sleep 0.05; done
printf '%-16s %6s %10s\n' op ranks ccs
for op in all_reduce barrier; do
  c=()
  for _ in $(seq "$runs"); do
    c+=("$(CCS_SOCKET=$key_dir/pinned.sock taskset -c 0 build/tests/ccs-latency $((iters * 4)) "$op" 1)")
  done
  printf '%-16s %6s %10s\n' "$op" 1 "$(median "${c[@]}")"
done
kill "$pinned" 2>/dev/null; wait "$pinned" 2>/dev/null || true

echo
# the ranks sleep 1 s after their last op, then count their CPU time over
# 2 s (the comm open, every library thread counted); the daemon is sampled
# over about the same 2 s
for np in 2 4; do
  build/tests/ccs-latency "$iters" idle "$np" > "$key_dir/idle" &
  clients=$!
  sleep 1.1
  t0=$(cpu_ns "$daemon_pid")
  sleep 2
  t1=$(cpu_ns "$daemon_pid")
  wait "$clients"
  echo "idle, $np ranks: daemon $(echo "$t0 $t1" | awk '{printf "%.3f", ($2 - $1) / 2e9 * 100}')%," \
       "the ranks together $(cat "$key_dir/idle")% of a CPU over 2 s, from 1 s after the last op"
  rm -f "$key_dir/idle"
done
