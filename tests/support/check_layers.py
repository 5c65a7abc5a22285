#!/usr/bin/env python3
"""The daemon's layers call only downward (docs/architecture.md):

    front  >  coll  >  run  >  plan  >  base      (and below them all:
                                                   transport, kernels, proto)

Checked two ways, each naming the offending file and symbol or header:
  - includes: a source of one layer includes no header of a higher one, and
    names the daemon's own headers with their folder ("run/op.h");
  - calls: from the built objects (nm), no function or object of a higher
    layer is used by a lower one.
Within a layer, files that call each other in a loop are listed (they are
allowed in coll and front, where the middle of the daemon is, and not in
base, plan or run).
    check_layers.py SOURCE_DIR BUILD_DIR
"""
import os
import re
import subprocess
import sys

LAYERS = ["base", "plan", "run", "coll", "front"]
RANK = {name: i for i, name in enumerate(LAYERS)}
NO_LOOPS = {"base", "plan", "run"}


def layer_of(path):
    top = path.split("/", 1)[0]
    return top if top in RANK else None


def check_includes(daemon_dir, errors):
    own = set()
    for root, _, files in os.walk(daemon_dir):
        for f in files:
            if f.endswith(".h"):
                own.add(f)
    for root, _, files in os.walk(daemon_dir):
        for f in sorted(files):
            if not f.endswith((".c", ".h", ".cu")):
                continue
            rel = os.path.relpath(os.path.join(root, f), daemon_dir)
            me = layer_of(rel)
            if me is None:
                errors.append(f"daemon/{rel}: outside every layer (base, plan, run, coll, front)")
                continue
            for n, line in enumerate(open(os.path.join(root, f), encoding="utf-8"), 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                inc = m.group(1)
                theirs = layer_of(inc)
                if theirs is None:
                    if os.path.basename(inc) in own and "/" not in inc:
                        errors.append(f"daemon/{rel}:{n}: includes \"{inc}\" without its layer's folder")
                    continue  # transport/, kernels/, proto/: below every layer
                if RANK[theirs] > RANK[me]:
                    errors.append(f"daemon/{rel}:{n}: a {me} file includes \"{inc}\" of {theirs}, a higher layer")


def objects(build_dir):
    base = os.path.join(build_dir, "daemon", "CMakeFiles")
    for root, _, files in os.walk(base):
        for f in files:
            if not f.endswith(".o"):
                continue
            path = os.path.join(root, f)
            # CMakeFiles/ccsd_run.dir/run/net.c.o -> run/net.c
            rel = os.path.relpath(path, base).split("/", 1)[1]
            yield rel[: -len(".o")], path


def check_calls(build_dir, errors):
    defs, uses = {}, {}
    for src, obj in objects(build_dir):
        if layer_of(src) is None:
            continue
        out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBR":
                defs[parts[2]] = src
            elif len(parts) == 2 and parts[0] == "U":
                uses.setdefault(src, set()).add(parts[1])
    if not defs:
        errors.append(f"no objects of the daemon under {build_dir}: build it first")
        return {}
    edges = {}
    for src, syms in sorted(uses.items()):
        for sym in sorted(syms):
            callee = defs.get(sym)
            if not callee or callee == src:
                continue
            edges.setdefault(src, {}).setdefault(callee, []).append(sym)
            a, b = layer_of(src), layer_of(callee)
            if RANK[b] > RANK[a]:
                errors.append(f"daemon/{src}: a {a} file calls {sym} of daemon/{callee} ({b}, a higher layer)")
    return edges


def loops(edges):
    """Strongly connected groups of two or more files (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if layer_of(w) != layer_of(v):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    src_dir, build_dir = sys.argv[1], sys.argv[2]
    errors = []
    check_includes(os.path.join(src_dir, "daemon"), errors)
    edges = check_calls(build_dir, errors)
    for group in loops(edges):
        layer = layer_of(group[0])
        line = f"{layer}: files that call each other in a loop: {', '.join(group)}"
        if layer in NO_LOOPS:
            errors.append(line)
        else:
            print("# " + line)
    calls = sum(len(v) for v in edges.values())
    print(f"# {calls} calls between files of the daemon checked, every include of daemon/")
    for e in errors:
        print("LAYER: " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
