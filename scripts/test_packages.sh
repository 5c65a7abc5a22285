#!/usr/bin/env bash
# The Debian packages as an operator gets them: built (cpack), installed
# with apt on this machine, the daemon started as the socket unit starts it
# (systemd-socket-activate hands it /run/ccs/ccsd.sock; it runs as the
# unit's user ccsd, group ccs), the installed tools and a program built with
# pkg-config run against it, then removed again, leaving nothing behind. Before that, a plain install under another prefix
# finds its library through RPATH. Needs root (or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
scripts/setup.sh --deps-only
build=build-pkg
lib=/usr/lib/$(gcc -print-multiarch)
cmake -S . -B "$build" -DCMAKE_INSTALL_PREFIX=/usr -DCCS_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
(cd "$build" && rm -f ./*.deb && cpack -G DEB >/dev/null)
scratch=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && $sudo kill "$pid" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT

echo "# another prefix: the tools find libccs by RPATH"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
env -u LD_LIBRARY_PATH "$scratch/prefix/bin/ccs-perf" --help >/dev/null

echo "# the packages: $(cd "$build" && ls ./*.deb | xargs)"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$PWD/$build"/*.deb >/dev/null
installed=(/usr/bin/ccsd /usr/bin/ccsctl /usr/bin/ccs-perf /usr/lib/systemd/system/ccsd.socket
           /usr/lib/systemd/system/ccsd.service /usr/lib/sysusers.d/ccs.conf /usr/lib/tmpfiles.d/ccs.conf
           /usr/include/ccs.h "$lib/libccs.so.0" "$lib/libccs-alloc.so" "$lib/pkgconfig/ccs.pc"
           "$lib/ccs-nccl/libnccl.so.2")
for f in "${installed[@]}"; do
  [ -e "$f" ] || { echo "missing after install: $f"; exit 1; }
done
getent passwd ccsd >/dev/null && getent group ccs >/dev/null || { echo "no ccsd user or ccs group"; exit 1; }

echo "# the daemon as its socket unit starts it"
$sudo rm -f /run/ccs/ccsd.sock
$sudo systemd-socket-activate -l /run/ccs/ccsd.sock \
  setpriv --reuid ccsd --regid ccs --init-groups /usr/bin/ccsd --config /dev/null 2>"$scratch/ccsd.log" &
pid=$!
for _ in $(seq 100); do [ -S /run/ccs/ccsd.sock ] && break; sleep 0.1; done
unset CCS_SOCKET # the default socket
/usr/bin/ccs-perf all_reduce --np 3 -b 8 -e 1M -f 32 -c 1 | tee "$scratch/perf.txt"
grep -q "# Out of bounds values : 0 OK" "$scratch/perf.txt"
# malloc'd buffers zero copy under the preload (staging too small for them)
if ! LD_PRELOAD="$lib/libccs-alloc.so" CCS_STAGING_MAX_BYTES=65536 /usr/bin/ccs-perf all_reduce \
       --np 2 --registered 0 -b 4M -e 4M -c 1 > "$scratch/alloc.txt" 2>&1 ||
   grep -q CCS_ERR "$scratch/alloc.txt" || ! grep -q "Out of bounds values : 0 OK" "$scratch/alloc.txt"; then
  cat "$scratch/alloc.txt"
  echo "ccs-perf on malloc'd buffers under libccs-alloc failed"
  exit 1
fi
cc examples/first.c $(pkg-config --cflags --libs ccs) -o "$scratch/first"
CCS_RANK=0 CCS_NRANKS=1 CCS_JOB=packages "$scratch/first"
cc -Iclient/nccl/include examples/nccl_allreduce.c -L"$lib/ccs-nccl" -l:libnccl.so.2 \
   -o "$scratch/nccl_allreduce"
LD_LIBRARY_PATH="$lib/ccs-nccl" CCS_RANK=0 CCS_NRANKS=1 "$scratch/nccl_allreduce" "$scratch/id"
# (systemd-socket-activate and setpriv exec: the daemon has their pid)
[ "$(ps -o user= -p "$pid")" = ccsd ] || { echo "the daemon does not run as ccsd"; exit 1; }
$sudo kill "$pid"
wait "$pid" || true
pid=

echo "# removed, nothing left"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq ccsd libccs-nccl libccs-dev libccs0 >/dev/null
for f in "${installed[@]}" "$lib/ccs-nccl"; do
  [ ! -e "$f" ] || { echo "left after removal: $f"; exit 1; }
done
echo "packages: installed, served, removed"
