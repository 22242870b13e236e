#!/usr/bin/env python3
"""Fails when the modules under src/ include each other in a circle.

A module is a directory under src/ (src/backend/<name> counts as backend/<name>); an edge
A -> B is a `#include "B/..."` in a file of A. Public headers (flashdllm/...) are the API
every module may use and are not edges. Prints every cycle with one include that makes each
of its edges, and exits 1; exits 0 when the module graph is one-way.

  python3 scripts/check_module_cycles.py [--root SRC_DIR]
"""
import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module_of(rel: Path) -> str:
    parts = rel.parts
    if parts[0] == "backend" and len(parts) > 2:
        return "backend/" + parts[1]
    return parts[0]


def module_graph(src: Path):
    edges, example = defaultdict(set), {}
    for f in sorted(src.rglob("*")):
        if f.suffix not in {".h", ".hpp", ".cuh", ".cpp", ".cu", ".cc"} or not f.is_file():
            continue
        rel = f.relative_to(src)
        if len(rel.parts) < 2:
            continue  # a file directly under src/ belongs to no module
        a = module_of(rel)
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m or "/" not in m.group(1) or m.group(1).startswith("flashdllm/"):
                continue
            target = Path(m.group(1))
            if not (src / target).exists():
                continue  # not one of ours (a system or third-party header)
            b = module_of(target)
            if b != a:
                edges[a].add(b)
                example.setdefault((a, b), f"src/{rel}:{n}: #include \"{m.group(1)}\"")
    return edges, example


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent / "src"))
    src = Path(ap.parse_args().root)
    if not src.is_dir():
        print(f"check_module_cycles: {src} is not a directory", file=sys.stderr)
        return 2
    edges, example = module_graph(src)
    found = cycles(edges)
    for comp in found:
        print("check_module_cycles: modules include each other: " + ", ".join(comp), file=sys.stderr)
        for a in comp:
            for b in comp:
                if (a, b) in example:
                    print(f"  {a} -> {b}  ({example[(a, b)]})", file=sys.stderr)
    if found:
        return 1
    print(f"check_module_cycles: {len(edges)} modules with includes, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
