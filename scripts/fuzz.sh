#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for
# SECONDS (default 60) from the committed corpus. New inputs go to a
# scratch copy; add the interesting ones to tests/fuzz/corpus/ by hand.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
scripts/setup.sh --deps-only
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCCS_FUZZ=ON \
  -DCCS_SANITIZE=ON -DCCS_WITH_CUDA=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target fuzz_frame fuzz_session >/dev/null
work=$(mktemp -d /tmp/ccs-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
for target in fuzz_frame fuzz_session; do
  mkdir -p "$work/$target"
  cp tests/fuzz/corpus/* "$work/$target/"
  echo "# $target: $seconds s"
  build-fuzz/tests/$target -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 \
    "$work/$target" 2>&1 | grep -E '^(stat::number_of_executed_runs|stat::new_units_added|#[0-9]+.*DONE)|ERROR|SUMMARY' || true
  # libFuzzer exits non-zero on a crash; the grep above must not hide it
  build-fuzz/tests/$target -runs=0 "$work/$target" >/dev/null 2>&1
done
