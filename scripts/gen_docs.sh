#!/usr/bin/env bash
# The tables in docs/*.md that the program itself knows (every configuration
# key, the tuner's choices) are not written by hand: each sits between
#   <!-- generated: ccsd ARGS -->
#   <!-- end generated -->
# and this script replaces what lies between with the output of
# `ccsd --config /dev/null ARGS` from a build (no config file, no CCS_*
# variables: the built-in defaults). ARGS is one of
#   --print-config-table        every configuration key, default and meaning
#   --tune-table N              the tuner's choice per collective and size,
#                               N daemons over TCP
#
#   scripts/gen_docs.sh [BUILD_DIR]           rewrite the docs (default: build)
#   scripts/gen_docs.sh --check [BUILD_DIR]   exit 1 if a doc differs from what
#                                             it would write (prints the diff)
# Exits 2 when the build's ccsd is missing or a marker is malformed.
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
build=build
for arg in "$@"; do
  case $arg in
    --check) check=1 ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "gen_docs.sh: unknown option $arg" >&2; exit 2 ;;
    *) build=$arg ;;
  esac
done

ccsd=$build/daemon/ccsd
if [ ! -x "$ccsd" ]; then
  echo "gen_docs.sh: no ccsd at $ccsd: build first (cmake --build $build --target ccsd)" >&2
  exit 2
fi

# The defaults only: nothing from the environment may change a table.
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep '^CCS_' || true)

begin_re='^<!-- generated: ccsd (.*) -->$'
end_line='<!-- end generated -->'

# Prints FILE with every generated block made afresh; 2 on a bad marker or
# a failing ccsd.
render() {
  local file=$1 line args inside=0 n=0
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    if ((inside)); then
      if [ "$line" = "$end_line" ]; then
        printf '%s\n' "$line"
        inside=0
      fi
      continue
    fi
    printf '%s\n' "$line"
    if [[ $line =~ $begin_re ]]; then
      args=${BASH_REMATCH[1]}
      if ! [[ $args =~ ^(--print-config-table|--tune-table\ [0-9]+)$ ]]; then
        echo "gen_docs.sh: $file:$n: unknown generator 'ccsd $args'" >&2
        return 2
      fi
      printf '\n'
      # shellcheck disable=SC2086 # ARGS is a flag and perhaps a number
      if ! "$ccsd" --config /dev/null $args; then
        echo "gen_docs.sh: $file:$n: 'ccsd $args' failed" >&2
        return 2
      fi
      printf '\n'
      inside=1
    elif [ "$line" = "$end_line" ]; then
      echo "gen_docs.sh: $file:$n: '$end_line' without its beginning" >&2
      return 2
    fi
  done <"$file"
  if ((inside)); then
    echo "gen_docs.sh: $file: a generated block never ends ('$end_line')" >&2
    return 2
  fi
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
found=0
for doc in docs/*.md; do
  grep -q '^<!-- generated: ccsd ' "$doc" || continue
  found=1
  out=$tmp/$(basename "$doc")
  render "$doc" >"$out" || exit 2
  if cmp -s "$doc" "$out"; then
    continue
  fi
  if ((check)); then
    echo "gen_docs.sh: $doc is not what $ccsd generates (run scripts/gen_docs.sh $build):" >&2
    diff -u "$doc" "$out" >&2 || true
    status=1
  else
    cat "$out" >"$doc"
    echo "gen_docs.sh: updated $doc"
  fi
done
if ((!found)); then
  echo "gen_docs.sh: no generated blocks in docs/*.md" >&2
  exit 2
fi
exit $status
