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
# (NumPy and pytest from Debian's packages), then its tests.
rm -rf build/pyenv
/usr/bin/python3 -m venv --system-site-packages build/pyenv
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
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j "$jobs" -LE "algo|netns|python")

# ThreadSanitizer on the daemon (the multi-threaded party): the integration
# and fault tests again, against a TSan-built ccsd that exits on any race.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCCS_TSAN=ON -DCCS_TESTS=OFF >/dev/null
cmake --build build-tsan -j "$jobs" --target ccsd
(cd build && CCSD_PATH="$PWD/../build-tsan/daemon/ccsd" TSAN_OPTIONS="halt_on_error=1 exitcode=66" \
   ctest --output-on-failure -j "$jobs" -L "integration|fault|ops|nodes" -LE netns)

# The fuzzers, briefly, where clang can build them (the corpus replays above).
if command -v clang >/dev/null; then scripts/fuzz.sh 30; fi
