#!/usr/bin/env python3
"""Checks that the library's calls run one way, from the built objects.

A file calls into another when it uses a symbol only the other defines (nm
reads both ends, so a namesake or a struct member is never taken for a
call). Two rules: no cycle between modules (folders), and none between the
files of interpose/ (docs/DESIGN.md, "interpose/ in layers").

Usage: mk/layers.py BUILD_DIR   (exit 1, naming each cycle, if one exists)
"""
import collections
import glob
import os
import subprocess
import sys

MODULES = ("interpose", "engine", "pool", "transfer", "policy", "config", "telemetry", "node", "clean", "map")
LAYERED = "interpose"  # whose files, one by one, must form layers


def symbols(obj, *flags):
    out = subprocess.run(["nm", *flags, obj], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def arrows(objs):
    """{(a, b): names}: object a uses names that object b alone defines."""
    owner = collections.defaultdict(set)
    for name, obj in objs.items():
        for s in symbols(obj, "-g", "--defined-only"):
            owner[s].add(name)
    calls = collections.defaultdict(set)
    for name, obj in objs.items():
        for s in symbols(obj, "-u"):
            if len(owner.get(s, ())) == 1 and name not in owner[s]:
                calls[(name, next(iter(owner[s])))].add(s)
    return calls


def cycles(calls):
    """The strongly connected parts of more than one node (Tarjan)."""
    succ = collections.defaultdict(set)
    for a, b in calls:
        succ[a].add(b)
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while not part or v not in part:
                part.add(stack.pop())
            on.difference_update(part)
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(set(succ) | {b for _, b in calls}):
        if v not in index:
            visit(v)
    return found


def report(what, calls):
    bad = cycles(calls)
    for part in bad:
        print("%s: a cycle: %s" % (what, ", ".join(part)))
        for (a, b), names in sorted(calls.items()):
            if a in part and b in part:
                print("  %s -> %s: %s" % (a, b, ", ".join(sorted(names))))
    return not bad


def main(build):
    objs = {}
    for m in MODULES:
        for o in sorted(glob.glob(os.path.join(build, "obj", m, "*.o"))):
            objs["%s/%s.c" % (m, os.path.basename(o)[:-2])] = o
    if not objs:
        sys.exit("layers: no objects under %s/obj: build first" % build)
    calls = arrows(objs)
    by_module = collections.defaultdict(set)
    for (a, b), names in calls.items():
        if a.split("/")[0] != b.split("/")[0]:
            by_module[(a.split("/")[0], b.split("/")[0])] |= names
    inside = {k: v for k, v in calls.items() if k[0].startswith(LAYERED + "/") and k[1].startswith(LAYERED + "/")}
    ok = report("modules", by_module) & report(LAYERED + "/", inside)
    print("layers: %s" % ("no cycle" if ok else "cycles found"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build"))
