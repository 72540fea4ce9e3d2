#!/usr/bin/env python3
"""The module import graph of src/, from its `use crate::` lines (and `crate::x::` paths).

Prints each top-level module's imports with the number of lines that make them, then every
import that goes from a lower layer to a higher one and every loop between modules. `--check`
exits 1 when there is one that LAYERS and KNOWN do not account for (CI runs it).

    python3 scripts/dev/import_graph.py [--check] [--dot]
"""
import re
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# Bottom to top; a module may import from its own layer and the ones below.
LAYERS = [
    ["cpu", "metrics", "testing", "sse"],
    ["kv", "guided", "chat"],
    ["request", "spec"],
    ["sampler"],
    ["sequence"],
    ["scheduler"],
    ["parallel"],
    ["model"],
    ["loader"],
    ["runner"],
    ["engine"],
    ["llm", "config_file", "engine_flags"],
    ["server", "bench", "cli", "client", "default_model", "main", "lib"],
]

# Upward imports that are known and waiting on a split, with the reason. Keep this short.
KNOWN = {}


def module_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".rs")


def imports(text: str):
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))
    for m in re.finditer(r"\bcrate::([a-z_][a-z0-9_]*)", text):
        yield m.group(1)
    for m in re.finditer(r"use crate::\{([^}]*)\}", text):
        for name in re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", m.group(1)):
            yield name


def graph():
    edges = defaultdict(int)
    for path in SRC.rglob("*.rs"):
        if path.name == "tests.rs":
            continue
        src = module_of(path)
        for dst in imports(path.read_text()):
            if dst != src and dst != "self":
                edges[(src, dst)] += 1
    return edges


def layer_of(module: str) -> int:
    for i, names in enumerate(LAYERS):
        if module in names:
            return i
    return -1


def loops(edges):
    succ = defaultdict(set)
    for a, b in edges:
        succ[a].add(b)
    found = set()
    for a, b in edges:
        if a in succ[b]:
            found.add(tuple(sorted((a, b))))
    return sorted(found)


def main() -> int:
    edges = graph()
    check = "--check" in sys.argv
    if "--dot" in sys.argv:
        print("digraph imports {")
        for (a, b), n in sorted(edges.items()):
            print(f'  "{a}" -> "{b}" [label={n}];')
        print("}")
        return 0
    by_src = defaultdict(list)
    for (a, b), n in sorted(edges.items()):
        by_src[a].append(f"{b} ({n})")
    for a in sorted(by_src, key=lambda m: (layer_of(m), m)):
        print(f"{a} [layer {layer_of(a)}] -> {', '.join(by_src[a])}")
    problems = []
    for (a, b), n in sorted(edges.items()):
        la, lb = layer_of(a), layer_of(b)
        if la < 0 or lb < 0:
            problems.append(f"{a} -> {b}: a module LAYERS does not place")
        elif lb > la:
            why = KNOWN.get((a, b)) or KNOWN.get((b, a))
            if why:
                print(f"known upward import {a} -> {b} ({n} lines): {why}")
            else:
                problems.append(f"upward import {a} [layer {la}] -> {b} [layer {lb}] ({n} lines)")
    for a, b in loops(edges):
        if (a, b) in KNOWN or (b, a) in KNOWN:
            print(f"known loop between {a} and {b}")
        else:
            problems.append(f"loop between {a} and {b}")
    for p in problems:
        print(p)
    return 1 if check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
