#!/usr/bin/env bash
# Builds and runs every test: the normal build, then the same suite under
# AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/setup.sh build
if grep -q '^CMAKE_CUDA_COMPILER:[A-Z]*=/' build/CMakeCache.txt; then
  echo "# CUDA toolkit found: kernels and the device domain are compiled in every build below"
else
  echo "# no CUDA toolkit: host-only build (GPU code not compiled)"
fi
(cd build && ctest --output-on-failure -j "$jobs")

# The Python package as a user installs it: pip into a fresh environment
# (pytest from Debian's packages; ml_dtypes, with the NumPy it is built
# for, from PyPI: bfloat16 and float8 arrays), then its tests.
rm -rf build/pyenv
/usr/bin/python3 -m venv --system-site-packages build/pyenv
build/pyenv/bin/pip install -q ml_dtypes
build/pyenv/bin/pip install -q --no-build-isolation --no-deps ./python
(cd build && CCS_LIBRARY="$PWD/client/libccs.so.0" CCSD_PATH="$PWD/daemon/ccsd" \
   pyenv/bin/python -m pytest -q -p no:cacheprovider ../python/tests)

# The Debian packages: built, installed with apt, served, removed.
scripts/test_packages.sh

scripts/setup.sh build-asan -DCCS_SANITIZE=ON
# (the forced-algorithm runs of the integration suite, label algo, and the
# namespace topologies, label netns, only above: the engine is under the
# sanitizers through test_engine for every algorithm, the daemons' network
# code through the loopback runs across daemons and test_nodes)
# (Python loads libccs into an interpreter built without the sanitizers:
# its tests run above only.)
# (the collectives' matrix runs here with 1-4 ranks on the rings and with 3
# ranks over two daemons; 7 ranks and the socket submission path run above
# only: the daemon code they reach is the same, and they would double the
# time)
matrix_above_only='^test_collectives_(7|[0-9]+_socket|2daemons_3_socket)$'
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j "$jobs" -LE "algo|netns|python" \
   -E "$matrix_above_only")

# ThreadSanitizer on the daemon (the multi-threaded party): the integration
# and fault tests again (the matrix at 1-3 ranks), against a TSan-built
# ccsd that exits on any race.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCCS_TSAN=ON -DCCS_TESTS=ON >/dev/null
cmake --build build-tsan -j "$jobs" --target ccsd test_streams test_restart chaos_ranks test-free-ports \
  $(cmake --build build-tsan --target help | grep -o 'test_gpu_standin$' | head -1)
(cd build && CCSD_PATH="$PWD/../build-tsan/daemon/ccsd" TSAN_OPTIONS="halt_on_error=1 exitcode=66" \
   ctest --output-on-failure -j "$jobs" -L "integration|fault|ops|nodes" -LE netns \
     -E "$matrix_above_only|^test_collectives_4$|^gpu_check_dry_run$")
# ... and on the client's threads: its rings, host streams and the keeper
# that rejoins comms after a restart (the restart tests and the chaos run),
# in ranks built with TSan themselves; and the daemon's GPU threads against
# the CUDA stand-in where the toolkit is
(cd build-tsan && TSAN_OPTIONS="halt_on_error=1 exitcode=66" \
   ctest --output-on-failure -j "$jobs" -R "^(test_streams|test_restart|chaos|test_gpu_standin)$")

# The fuzzers, briefly, where clang can build them (the corpus replays above).
if command -v clang >/dev/null; then scripts/fuzz.sh 30; fi
