#!/usr/bin/env bash
# The cluster key: ccsd --generate-key writes one readable by its owner
# only and never overwrites; a daemon that listens for other daemons
# refuses to start without a valid key of its own (missing, readable by
# others, not 64 hex digits), and starts with one.   run_cluster_key.sh CCSD
set -euo pipefail
ccsd=$1
dir=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$ccsd" --generate-key "$dir/key" >/dev/null
[ "$(stat -c %a "$dir/key")" = 600 ] || fail "key mode $(stat -c %a "$dir/key")"
grep -qE '^[0-9a-f]{64}$' "$dir/key" || fail "key is not 64 hex digits"
cp "$dir/key" "$dir/key.before"
if "$ccsd" --generate-key "$dir/key" 2>"$dir/err"; then fail "overwrote a key"; fi
grep -q "remove it first" "$dir/err" || fail "no reason given: $(cat "$dir/err")"
cmp -s "$dir/key" "$dir/key.before" || fail "the key changed"

# refuses: missing, readable by others, malformed; each says why
refused() { # KEYFILE WORDS
  if "$ccsd" --config /dev/null --socket "$dir/s.sock" --listen 127.0.0.1:0 \
       --cluster-key-file "$1" 2>"$dir/err"; then fail "started with key $1"; fi
  grep -q "$2" "$dir/err" || fail "refusal of $1 does not say '$2': $(cat "$dir/err")"
}
refused "$dir/none" "generate-key"
cp "$dir/key" "$dir/open" && chmod 644 "$dir/open"
refused "$dir/open" "mode 0600"
printf 'not a key\n' >"$dir/bad" && chmod 600 "$dir/bad"
refused "$dir/bad" "not 64 hex digits"

# starts with its key, and stops cleanly
"$ccsd" --config /dev/null --socket "$dir/s.sock" --listen 127.0.0.1:0 \
  --cluster-key-file "$dir/key" 2>"$dir/log" &
pid=$!
for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
[ -S "$dir/s.sock" ] || fail "did not start: $(cat "$dir/log")"
kill "$pid"
wait "$pid" || fail "did not stop cleanly"
pid=
echo "cluster key OK"
