#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for
# SECONDS (default 60) from the committed corpus. New inputs go to a
# scratch copy; add the interesting ones to the target's corpus by hand
# (tests/fuzz/corpus, corpus_requests, corpus_peer).
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
scripts/setup.sh --deps-only
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCCS_FUZZ=ON \
  -DCCS_SANITIZE=ON -DCCS_WITH_CUDA=OFF >/dev/null
targets=(fuzz_frame fuzz_session fuzz_requests fuzz_peer)
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}" >/dev/null
work=$(mktemp -d /tmp/ccs-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
corpus_of() { # the committed corpus a target starts from
  case $1 in
    fuzz_requests) echo tests/fuzz/corpus_requests ;;
    fuzz_peer) echo tests/fuzz/corpus_peer ;;
    *) echo tests/fuzz/corpus ;;
  esac
}
for target in "${targets[@]}"; do
  mkdir -p "$work/$target"
  cp "$(corpus_of "$target")"/* "$work/$target/"
  echo "# $target: $seconds s"
  status=0
  (cd "$work" && "$OLDPWD/build-fuzz/tests/$target" -max_total_time="$seconds" -max_len=65536 \
     -print_final_stats=1 "$work/$target" >"$work/$target.log" 2>&1) || status=$?
  grep -E '^(stat::new_units_added|#[0-9]+.*DONE)|ERROR|SUMMARY' "$work/$target.log" || true
  if [ "$status" -ne 0 ]; then
    # the input that broke it, to reproduce: build-fuzz/tests/$target FILE
    ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* 2>/dev/null | head -3
    cp "$work"/crash-* "$work"/leak-* "$work"/timeout-* . 2>/dev/null || true
    tail -40 "$work/$target.log"
    exit 1
  fi
done
