#!/usr/bin/env bash
# The GPU check, one script for a lent GPU machine (under 8 minutes):
#   1. builds ccs with CUDA (or uses the build in $CCS_GPU_BUILD, made by
#      scripts/gpu_bundle.sh where this machine cannot build);
#   2. starts ccsd and runs every collective x dtype x op with P = 2, 3, 4
#      ranks sharing GPU 0, on zero-copy (ccs_mem_alloc_device) and staged
#      (cudaMalloc) buffers, on a stream and on the NULL stream, checked
#      element by element against a host reference (test_collectives);
#      once more with cudaMalloc buffers registered by legacy IPC handle;
#   3. runs ccs-perf for all_reduce, all_gather and reduce_scatter at
#      1 MiB .. 1 GiB on 4 ranks and prints busbw beside the GPU's own
#      device-to-device copy bandwidth.
# Writes gpu_run.log and gpu_summary.md under $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
log="$out/gpu_run.log"
summary="$out/gpu_summary.md"
exec > >(tee -a "$log") 2>&1
started=$SECONDS
status=0

gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "# GPU: ${gpu:-none found by nvidia-smi}; $(date -u +%Y-%m-%dT%H:%MZ)"

build=${CCS_GPU_BUILD:-build-gpu}
if [ -z "${CCS_GPU_BUILD:-}" ]; then
  jobs=$(nproc)
  if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCCS_WERROR=OFF >/dev/null &&
         cmake --build "$build" -j "$jobs" --target ccsd ccs-perf test_collectives >/dev/null; }; then
    echo "BUILD FAILED (scripts/gpu_bundle.sh makes a build to bring along)"
    exit 1
  fi
fi
build=$(cd "$build" && pwd)
[ -d "$build/libs" ] && export LD_LIBRARY_PATH="$build/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "# built in $((SECONDS - started)) s"

{
  echo "## ccs on ${gpu:-an unnamed GPU}, $(date -u +%Y-%m-%d)"
  echo
  echo "| check | ranks on GPU 0 | result | seconds |"
  echo "|---|---|---|---|"
} > "$summary"

export CCSD_PATH="$build/daemon/ccsd"
for p in 2 3 4; do
  t0=$SECONDS
  if CCS_TEST_MEMORY=device timeout 150 "$build/tests/test_collectives" "$p" > "$out/collectives_$p.log" 2>&1; then
    result=passed
  else
    result="FAILED (collectives_$p.log)"
    status=1
    tail -20 "$out/collectives_$p.log"
  fi
  echo "collectives on GPU, $p ranks: $result"
  echo "| every collective x dtype x op, zero-copy and staged | $p | $result | $((SECONDS - t0)) |" >> "$summary"
done

# cudaMalloc buffers registered by legacy IPC handle, with the switch on
t0=$SECONDS
if CCS_CUDA_LEGACY_IPC=true CCS_TEST_MEMORY=device-legacy timeout 150 "$build/tests/test_collectives" 3 \
    > "$out/collectives_legacy.log" 2>&1; then
  result=passed
else
  result="FAILED (collectives_legacy.log)"
  status=1
  tail -20 "$out/collectives_legacy.log"
fi
echo "collectives on GPU, cudaMalloc buffers by legacy IPC: $result"
echo "| the same, cudaMalloc buffers registered by legacy IPC handle | 3 | $result | $((SECONDS - t0)) |" >> "$summary"

# the daemon for ccs-perf
dir=$(mktemp -d)
"$CCSD_PATH" --config /dev/null --socket="$dir/ccsd.sock" --log-level=info 2>"$out/ccsd.log" &
daemon=$!
trap 'kill $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -S "$dir/ccsd.sock" ] && break; sleep 0.1; done
grep -m1 "device memory\|host-only" "$out/ccsd.log"
export CCS_SOCKET="$dir/ccsd.sock"

{
  echo
  echo "| collective | ranks | size | busbw out of place (GB/s) | busbw in place (GB/s) | #wrong | GPU copy bw (GB/s) |"
  echo "|---|---|---|---|---|---|---|"
} >> "$summary"
for coll in all_reduce all_gather reduce_scatter; do
  t0=$SECONDS
  if ! timeout 100 "$build/client/ccs-perf" "$coll" --np 4 --device 0 -b 1M -e 1G -f 4 -n 5 -w 2 -c 1 \
      > "$out/perf_$coll.txt" 2>&1; then
    status=1
    echo "ccs-perf $coll FAILED"
  fi
  cat "$out/perf_$coll.txt"
  copy=$(sed -n 's/.*copy bandwidth: \([0-9.]*\) GB.*/\1/p' "$out/perf_$coll.txt")
  awk -v c="$coll" -v bw="${copy:-?}" '$1 ~ /^[0-9]+$/ && NF >= 13 {
      printf "| %s | 4 | %s | %s | %s | %s | %s |\n", c, $1, $8, $12, $9 + ($13 == "N/A" ? 0 : $13), bw }' \
    "$out/perf_$coll.txt" >> "$summary"
  echo "# $coll: $((SECONDS - t0)) s"
done
echo >> "$summary"
echo "total $((SECONDS - started)) s, status $status" >> "$summary"
cat "$summary"
exit $status
