#!/usr/bin/env bash
# Builds what tests/gpu/run.sh runs into gpu-bundle/ (binaries, plus the
# shared libraries they need beyond the C library) for a GPU machine that
# cannot build ccs itself; run there with CCS_GPU_BUILD=gpu-bundle.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --deps-only
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-gpu -j "$(nproc)" --target ccsd ccs-perf test_collectives nccl_device stream_faults \
  gpu_restart gpu-stream-costs ccs-latency
rm -rf gpu-bundle
mkdir -p gpu-bundle/daemon gpu-bundle/client gpu-bundle/tests gpu-bundle/libs
cp build-gpu/daemon/ccsd gpu-bundle/daemon/
cp build-gpu/client/ccs-perf gpu-bundle/client/
cp build-gpu/tests/test_collectives build-gpu/tests/nccl_device build-gpu/tests/stream_faults \
  build-gpu/tests/gpu_restart build-gpu/tests/gpu-stream-costs build-gpu/tests/ccs-latency gpu-bundle/tests/
for bin in gpu-bundle/daemon/ccsd gpu-bundle/client/ccs-perf gpu-bundle/tests/*; do
  ldd "$bin" | awk '$3 ~ /^\// {print $3}' | grep -Ev '/lib(c|m|pthread|dl|rt)\.so|ld-linux' |
    xargs -r cp -L -t gpu-bundle/libs/
done
du -sh gpu-bundle
