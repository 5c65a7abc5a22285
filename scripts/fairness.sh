#!/usr/bin/env bash
# Tenants sharing one daemon, measured: two bulk tenants weighted 3:1
# running 64 MiB all_reduce and a latency tenant running 8 B all_reduce,
# each as its own user; then the same bulk pair with 4 ranks against 2.
# Prints per tenant its bus bandwidth, its share of executor time against
# its weight's, Jain's fairness index over share/weight, the latency
# tenant's p50/p99 alone and under the flood, and the two bulk tenants'
# total against one alone; plots bandwidth and latency over time (PNG,
# with gnuplot where installed: apt-get install gnuplot-nox).
#
#   sudo scripts/fairness.sh [BUILD_DIR] [SECONDS] [CCSD ARGS...]  (default build, 10)
#
# e.g. `sudo scripts/fairness.sh build 10 --executor-priority idle`.
# Needs root: it makes throwaway users (removed at the end) so that the
# daemon sees three tenants. Output in $OUT (default fairness-out/).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath "${1:-build}")
SECS=${2:-10}
shift $(($# < 2 ? $# : 2))
EXTRA=("$@")
OUT=$(realpath -m "${OUT:-fairness-out}")
PERF="$BUILD/client/ccs-perf"
CTL="$BUILD/client/ccsctl"
CCSD="$BUILD/daemon/ccsd"
[ "$(id -u)" = 0 ] || { echo "fairness.sh: run as root (it makes throwaway users)" >&2; exit 2; }
for f in "$PERF" "$CTL" "$CCSD"; do [ -x "$f" ] || { echo "fairness.sh: no $f (build first)" >&2; exit 2; }; done
mkdir -p "$OUT"

USERS=(ccsfair-a ccsfair-b ccsfair-l)
made=()
dir=$(mktemp -d /tmp/ccs-fairness.XXXXXX)
chmod 755 "$dir"
mkdir -m 1777 "$dir/t" # the tenants write their traces here
daemon=
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  for u in "${made[@]}"; do userdel "$u" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
for u in "${USERS[@]}"; do
  if ! id "$u" >/dev/null 2>&1; then useradd --system --no-create-home --shell /usr/sbin/nologin "$u"; made+=("$u"); fi
done

SOCK="$dir/ccsd.sock"
"$CCSD" --socket "$SOCK" --socket-mode 0666 --tenant-weights ccsfair-a:3,ccsfair-b:1 "${EXTRA[@]}" \
  >"$OUT/ccsd.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done

as() { # USER ARGS...: ccs-perf as that user
  local u=$1; shift
  setpriv --reuid "$u" --regid "$u" --clear-groups env CCS_SOCKET="$SOCK" "$PERF" "$@"
}
bulk() { as "$1" all_reduce --np "$2" -b 64M --duration "$SECS" --priority bulk --trace "$dir/t/$3"; }
latency() { as ccsfair-l all_reduce --np 2 -b 8 --duration "$SECS" --priority latency --trace "$dir/t/$1"; }
snapshot() { "$CTL" --socket "$SOCK" tenants raw >"$1"; }

echo "# $(date -u +%F) $(nproc) CPUs, $SECS s a phase, ccsd ${EXTRA[*]:-(defaults)}; output in $OUT"
latency "latency_alone.tr" >"$OUT/latency_alone.out"
bulk ccsfair-a 2 "alone.tr" >"$OUT/alone.out"
bulk ccsfair-a 4 "alone4.tr" >"$OUT/alone4.out"
for run in 2v2 4v2; do
  na=2; [ $run = 4v2 ] && na=4
  snapshot "$OUT/$run.before"
  bulk ccsfair-a $na "$run.a.tr" >"$OUT/$run.a.out" &
  pa=$!
  bulk ccsfair-b 2 "$run.b.tr" >"$OUT/$run.b.out" &
  pb=$!
  if [ $run = 2v2 ]; then latency "latency_flood.tr" >"$OUT/latency_flood.out"; fi
  wait $pa $pb
  snapshot "$OUT/$run.after"
done
cp "$dir"/t/*.tr "$OUT"/

python3 - "$OUT" <<'EOF'
import math, os, statistics, sys
out = sys.argv[1]
def trace(name):  # lines: end (s) latency (s) calls
    rows = []
    for line in open(os.path.join(out, name)):
        f = line.split()
        if len(f) == 3: rows.append((float(f[0]), float(f[1]), int(f[2])))
    return rows
def busbw(rows, ranks, size=64 << 20):  # GB/s, nccl-tests' all_reduce factor
    t = sum(r[1] for r in rows); n = sum(r[2] for r in rows)  # a line's latency covers its calls
    return 2 * (ranks - 1) / ranks * size * n / t / 1e9 if t else 0
def pct(rows, p):
    lat = sorted(r[1] / max(r[2], 1) for r in rows)
    return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1e6 if lat else float("nan")
def shares(run):  # uid -> (weight, executor seconds) over the run
    def read(f):
        d = {}
        for line in open(os.path.join(out, f)):
            x = line.split()
            if len(x) >= 4: d[int(x[0])] = (float(x[1]), float(x[3]))
        return d
    a, b = read(run + ".before"), read(run + ".after")
    return {u: (w, e - a.get(u, (w, 0))[1]) for u, (w, e) in b.items()}
import pwd
uid = {n: pwd.getpwnam(n).pw_uid for n in ("ccsfair-a", "ccsfair-b")}
alone = {2: busbw(trace("alone.tr"), 2), 4: busbw(trace("alone4.tr"), 4)}
print("\n| run | tenant | weight | ranks | busbw GB/s | share of executor | weight's share |")
print("|---|---|---|---|---|---|---|")
for run, na in (("2v2", 2), ("4v2", 4)):
    s = shares(run)
    tot = sum(s[uid[n]][1] for n in uid)
    wt = sum(s[uid[n]][0] for n in uid)
    x = []
    for n, ranks in (("ccsfair-a", na), ("ccsfair-b", 2)):
        w, e = s[uid[n]]
        bw = busbw(trace(f"{run}.{n[-1]}.tr"), ranks)
        print(f"| {run} | {n} | {w:g} | {ranks} | {bw:.2f} | {100 * e / tot:.1f}% | {100 * w / wt:.1f}% |")
        x.append((e / tot) / (w / wt))
    jain = sum(x) ** 2 / (len(x) * sum(v * v for v in x))
    total = sum(busbw(trace(f"{run}.{n[-1]}.tr"), r) for n, r in (("ccsfair-a", na), ("ccsfair-b", 2)))
    one = alone[na]
    print(f"| {run} | Jain's index over share/weight {jain:.3f} | | | total {total:.2f} = {100 * total / one:.0f}% of one {na}-rank tenant alone ({one:.2f}) | | |")
la, lf = trace("latency_alone.tr"), trace("latency_flood.tr")
print(f"\nlatency tenant, 8 B all_reduce: p50 {pct(la, 50):.1f} us / p99 {pct(la, 99):.1f} us alone; "
      f"p50 {pct(lf, 50):.1f} us / p99 {pct(lf, 99):.1f} us under the flood "
      f"(p99 {pct(lf, 99) / pct(la, 99):.1f}x)")
# series for the plots: per tenant busbw in 0.5 s bins, latency per line
t0 = min(r[0] - r[1] for r in trace("2v2.a.tr") + trace("2v2.b.tr"))
for n in "ab":
    bins = {}
    for end, lat, calls in trace(f"2v2.{n}.tr"):
        bins.setdefault(int((end - t0) / 0.5), []).append(calls * (64 << 20) * 1.0 / 0.5 / 1e9)
    with open(os.path.join(out, f"bw_{n}.dat"), "w") as f:
        for k in sorted(bins): f.write(f"{k * 0.5} {sum(bins[k]):.3f}\n")
with open(os.path.join(out, "latency.dat"), "w") as f:
    for end, lat, calls in lf: f.write(f"{end - t0:.4f} {lat / max(calls, 1) * 1e6:.2f}\n")
EOF

if command -v gnuplot >/dev/null; then
  gnuplot <<EOF
set terminal png size 900,420 noenhanced
set output "$OUT/bandwidth.png"
set xlabel "seconds"; set ylabel "algorithm GB/s (rank 0, 0.5 s bins)"
set title "two bulk tenants, weights 3:1, 64 MiB all_reduce"
plot "$OUT/bw_a.dat" with steps title "weight 3", "$OUT/bw_b.dat" with steps title "weight 1"
set output "$OUT/latency.png"
set ylabel "8 B all_reduce latency, us"; set logscale y
set title "the latency tenant under the flood"
plot "$OUT/latency.dat" with dots title "per call"
EOF
  echo "plots: $OUT/bandwidth.png $OUT/latency.png"
else
  echo "no gnuplot: apt-get install gnuplot-nox for the plots"
fi
