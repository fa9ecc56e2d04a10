"""The layout holds its shape: the import graph of ``src/ppokit`` (every import, lazy ones
inside functions included) has no cycle, no arrow from a lower layer to a higher one, and
no private name (``_x``) imported from another module. docs/architecture.md draws the
layers."""

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# lowest first; a module may import its own layer and the layers below it
LAYERS = [
    {"errors", "io", "core", "cliutil", "plugins", "supervise", "settings", "threads",
     "kernels"},
    {"policies", "envs"},
    {"engine", "rollout"},
    {"distributed"},
    {"algos", "diagnose"},
    {"llm"},
    {"checks", "demos"},
    {"api", "agent", "sb3"},
    {"commands", "cli", "<root>", "__main__"},
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "ppokit").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _graph():
    mods = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    private: list[str] = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[:len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                # `from . import x` of a submodule imports x, not its package's other parts
                targets = subs if len(subs) == len(node.names) else [base, *subs]
                private += [f"{name}: from {base} import {a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")
                            and base in mods and base != name]
            else:
                continue
            edges[name] |= {t for t in targets if t in mods and t != name}
    return mods, edges, private


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "<root>"
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"{module}: its package {top!r} has no layer in this test")


def test_no_import_cycle():
    mods, edges, _ = _graph()
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

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
                cycles.append(sorted(comp))

    for m in sorted(mods):
        if m not in index:
            visit(m)
    assert cycles == []


def test_no_upward_import():
    mods, edges, _ = _graph()
    upward = sorted(f"{a} -> {b}" for a, bs in edges.items() for b in bs
                    if _layer(a) < _layer(b))
    assert upward == []


def test_no_private_name_crosses_modules():
    assert _graph()[2] == []
