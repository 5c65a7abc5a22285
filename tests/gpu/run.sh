#!/usr/bin/env bash
# The GPU check, in stages sized for a lent GPU machine: each stage may be
# run as a command of its own (its own timeout), writes its log and its
# rows of OUT/gpu_summary.md as it goes, and says PASS or FAIL on its last
# line. Together under 10 minutes of GPU time.
#
#   tests/gpu/run.sh [--dry-run] [smoke|matrix|perf|nccl|faults|restart ...]   (default: all six)
#
#   smoke   (30 s)   nvidia-smi facts and the compute mode (EXCLUSIVE_PROCESS
#                    forbids ranks and the daemon sharing GPU 0), the daemon's
#                    GPU line (not host-only), one 2-rank all_reduce on device
#                    memory, checked
#   matrix  (5 min)  every collective x dtype x op x size, in and out of place,
#                    ccs_mem_alloc_device and cudaMalloc buffers, on a stream
#                    (through the stream flags) and on the NULL stream, with
#                    2 and 4 ranks on GPU 0, then cudaMalloc buffers by legacy
#                    IPC handle, then 3 ranks on two daemons (device buffers
#                    staged through host memory by libccs), checked element
#                    by element (test_collectives)
#   perf    (3 min)  ccs-perf --device 0 all_reduce, all_gather, reduce_scatter,
#                    1 MiB .. 1 GiB on 4 ranks, beside the GPU's own
#                    device-to-device copy bandwidth
#   nccl    (1 min)  an NCCL program on libccs-nccl, cudaMalloc and ncclMemAlloc
#                    buffers, every collective and a ring of sends on a stream
#                    and on the NULL stream, 2 and 3 ranks, checked
#   faults  (1 min)  a call on a stream out when its peer is killed, the daemon
#                    is killed or stopped, or the comm aborted: the stream goes
#                    on, the comm carries the error, the daemon serves on
#                    (stream_faults)
#   restart (1 min)  a job of device buffers (registered, cudaMalloc'ed) on
#                    the NULL stream rides through its daemon killed or
#                    stopped while a call waits, or dying as an op starts,
#                    and across two daemons the second killed or stopped:
#                    every call right or repeated after CCS_ERR_RETRY,
#                    checked element by element (gpu_restart)
#
# The binaries: $CCS_GPU_BUILD (a bundle made by scripts/gpu_bundle.sh on a
# CPU machine, for a GPU machine that cannot build), else build-gpu/, built
# here if missing. --dry-run runs the same stages on host memory with the
# normal build (CI runs it: the script itself is tested where no GPU is).
set -uo pipefail
cd "$(dirname "$0")/../.."
dry=0
stages=()
for a in "$@"; do
  case $a in
  --dry-run) dry=1 ;;
  smoke | matrix | perf | nccl | faults | restart) stages+=("$a") ;;
  *) echo "usage: tests/gpu/run.sh [--dry-run] [smoke|matrix|perf|nccl|faults|restart ...]" >&2; exit 2 ;;
  esac
done
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
summary="$out/gpu_summary.md"
# stages run one by one add to one summary; all of them start it afresh
[ ${#stages[@]} -gt 0 ] || { stages=(smoke matrix perf nccl faults restart); rm -f "$summary"; }

if [ "$dry" = 1 ]; then
  build=${CCS_GPU_BUILD:-build}
  memory=host
else
  build=${CCS_GPU_BUILD:-build-gpu}
  memory=device
  if [ ! -x "$build/daemon/ccsd" ] && [ -z "${CCS_GPU_BUILD:-}" ]; then
    t0=$SECONDS
    if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCCS_WERROR=OFF >/dev/null &&
           cmake --build "$build" -j "$(nproc)" --target ccsd ccs-perf test_collectives nccl_device \
             stream_faults gpu_restart >/dev/null; }; then
      echo "BUILD FAILED (scripts/gpu_bundle.sh makes a build to bring along)"
      exit 1
    fi
    echo "# built in $((SECONDS - t0)) s"
  fi
fi
build=$(cd "$build" && pwd)
[ -d "$build/libs" ] && export LD_LIBRARY_PATH="$build/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CCSD_PATH="$build/daemon/ccsd"
if [ ! -s "$summary" ]; then
  {
    echo "## ccs GPU check, $(date -u +%Y-%m-%dT%H:%MZ)$([ "$dry" = 1 ] && echo ' (dry run: host memory)')"
    echo
    echo "| stage | check | result | seconds |"
    echo "|---|---|---|---|"
  } > "$summary"
fi

row() { echo "| $1 | $2 | $3 | $4 |" >> "$summary"; }

# start_daemon LOG: a daemon of its own for the stage, its socket in $sock
daemon_pid=
start_daemon() {
  dir=$(mktemp -d)
  sock="$dir/ccsd.sock"
  "$CCSD_PATH" --config /dev/null --socket "$sock" --log-level info 2>"$1" &
  daemon_pid=$!
  export CCS_SOCKET=$sock
  for _ in $(seq 100); do [ -S "$sock" ] && return 0; sleep 0.1; done
  return 1
}
# stop_daemon STAGE: stopped; a daemon that does not exit 0 (it crashed
# on the way out) fails the stage
stop_daemon() {
  if [ -n "$daemon_pid" ]; then
    local rc=0
    kill "$daemon_pid" 2>/dev/null
    wait "$daemon_pid" 2>/dev/null || rc=$?
    if [ "$rc" != 0 ]; then
      echo "${1:-?}: the daemon exited with status $rc"
      row "${1:-?}" "the daemon stops" "FAILED (status $rc)" 0
      status=1
    fi
  fi
  daemon_pid=
  if [ -n "${dir:-}" ]; then rm -rf "$dir"; fi
}
trap stop_daemon EXIT

# check NAME SECONDS COMMAND...: runs it under its deadline, logs, one row
status=0
check() {
  local stage=$1 name=$2 limit=$3
  shift 3
  local t0=$SECONDS log="$out/${stage}_${name//[^A-Za-z0-9]/_}.log" result=passed
  if ! timeout "$limit" "$@" > "$log" 2>&1; then
    result="FAILED (${log##*/})"
    status=1
    tail -20 "$log"
  fi
  echo "$stage: $name: $result ($((SECONDS - t0)) s)"
  row "$stage" "$name" "$result" "$((SECONDS - t0))"
}

smoke() {
  if [ "$dry" = 0 ]; then
    local facts mode
    facts=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader 2>&1 | head -1)
    echo "# GPU: $facts"
    row smoke "nvidia-smi" "$facts" 0
    mode=${facts##*, }
    if [ "$mode" = "Exclusive_Process" ] || [ "$mode" = "Prohibited" ]; then
      echo "smoke: GPU 0 is in compute mode $mode: ranks and the daemon cannot share it"
      row smoke "compute mode" "FAILED ($mode)" 0
      return 1
    fi
  fi
  start_daemon "$out/smoke_ccsd.log" || { row smoke "daemon starts" FAILED 0; return 1; }
  local line
  line=$(grep -m1 -E "GPUs?:|host-only" "$out/smoke_ccsd.log")
  echo "# daemon: $line"
  # (no line at all fails too: the daemon must say what it found)
  if [ -z "$line" ] || { [ "$dry" = 0 ] && [[ $line == *host-only* ]]; } ||
     { [ "$dry" = 1 ] && [[ $line != *host-only* ]]; }; then
    row smoke "the daemon's GPUs" "FAILED ($line)" 0
    status=1
  else
    row smoke "the daemon's GPUs" "${line#*: }" 0
  fi
  local dev=()
  [ "$dry" = 0 ] && dev=(--device 0)
  check smoke "all_reduce 2 ranks" 30 \
    "$build/client/ccs-perf" all_reduce --np 2 "${dev[@]}" -b 1M -e 1M -n 2 -w 1 -c 1
  stop_daemon smoke
}

matrix() {
  local legacy=(env CCS_CUDA_LEGACY_IPC=true CCS_TEST_MEMORY=device-legacy)
  if [ "$dry" = 1 ]; then
    check matrix "every collective, 2 ranks" 150 env -u CCS_TEST_MEMORY "$build/tests/test_collectives" 2
    return
  fi
  check matrix "every collective, 2 ranks" 80 env CCS_TEST_MEMORY=device "$build/tests/test_collectives" 2
  check matrix "every collective, 4 ranks" 100 env CCS_TEST_MEMORY=device "$build/tests/test_collectives" 4
  check matrix "cudaMalloc by legacy IPC, 2 ranks" 60 "${legacy[@]}" "$build/tests/test_collectives" 2
  check matrix "across 2 daemons through host memory, 3 ranks" 40 \
    env CCS_TEST_MEMORY=device CCS_TEST_DAEMONS=2 "$build/tests/test_collectives" 3
}

perf() {
  start_daemon "$out/perf_ccsd.log" || { row perf "daemon starts" FAILED 0; return 1; }
  local dev=(--device 0) top=1G
  [ "$dry" = 1 ] && dev=() top=4M
  {
    echo
    echo "| collective | ranks | size | busbw out of place (GB/s) | busbw in place (GB/s) | #wrong | GPU copy bw (GB/s) |"
    echo "|---|---|---|---|---|---|---|"
  } > "$out/perf_table.md"
  for coll in all_reduce all_gather reduce_scatter; do
    check perf "$coll" 55 "$build/client/ccs-perf" "$coll" --np 4 "${dev[@]}" \
      -b 1M -e "$top" -f 4 -n 5 -w 2 -c 1
    local log="$out/perf_$coll.log" copy
    cat "$log"
    copy=$(sed -n 's/.*copy bandwidth: \([0-9.]*\) GB.*/\1/p' "$log")
    awk -v c="$coll" -v bw="${copy:-?}" '$1 ~ /^[0-9]+$/ && NF >= 13 {
        printf "| %s | 4 | %s | %s | %s | %s | %s |\n", c, $1, $8, $12, $9 + ($13 == "N/A" ? 0 : $13), bw }' \
      "$log" >> "$out/perf_table.md"
  done
  stop_daemon perf
}

nccl() {
  start_daemon "$out/nccl_ccsd.log" || { row nccl "daemon starts" FAILED 0; return 1; }
  local mem=()
  [ "$dry" = 1 ] && mem=(CCS_TEST_MEMORY=host)
  for n in 2 3; do
    check nccl "NCCL program, $n ranks" 30 env "${mem[@]}" "$build/tests/nccl_device" "$n"
  done
  stop_daemon nccl
}

# gpu_program STAGE NAME LIMIT PROG WHAT: a program of the GPU alone
# (tests/gpu), its "# " lines shown; without a GPU it must say so (77)
gpu_program() {
  local stage=$1 prog="$build/tests/$4"
  if [ "$dry" = 1 ]; then # host memory: the program runs and finds no GPU
    if [ -x "$prog" ]; then
      check "$stage" "$4 without a GPU says so (77)" 30 bash -c '"$1"; [ $? = 77 ]' _ "$prog"
    else
      row "$stage" "$4" "not built (no CUDA toolkit)" 0
    fi
    return
  fi
  check "$stage" "$2" "$3" "$prog"
  grep '^# ' "$out/${stage}_${2//[^A-Za-z0-9]/_}.log"
}

faults() {
  gpu_program faults "a stream's call out: peer killed, daemon killed, stopped, comm aborted" 120 \
    stream_faults
}

restart() {
  gpu_program restart "device buffers through a restart: killed, stopped, died as an op started" 150 \
    gpu_restart
}

for s in "${stages[@]}"; do
  t0=$SECONDS
  "$s" || status=1
  echo "# stage $s: $((SECONDS - t0)) s"
done
[ -s "$out/perf_table.md" ] && [[ " ${stages[*]} " == *" perf "* ]] && cat "$out/perf_table.md" >> "$summary"
cat "$summary"
if [ "$status" = 0 ]; then echo PASS; else echo FAIL; fi
exit $status
