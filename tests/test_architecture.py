"""The layout holds its shape: the import graph of ``src/ppokit`` (every import, lazy ones
inside functions included) has no cycle, no arrow from a lower layer to a higher one, and
no private name (``_x``) imported from another module; inside ``llm/`` its parts keep an
order of their own (``LLM_LAYERS``). docs/architecture.md draws both orders, and the llm
one there is held to ``LLM_LAYERS``."""

import ast
import re
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
    {"selfplay"},
    {"algos", "diagnose"},
    {"llm"},
    {"checks", "demos"},
    {"api", "agent", "sb3"},
    {"commands", "cli", "<root>", "__main__"},
]

# the parts of ppokit.llm, lowest first, the same rule: the models and sampling, then the
# data and rewards, the labels of a rollout, the samplers, agents, the trainers, then
# evaluation; the entry points (api.py, cli.py, tools_cli.py, __init__.py) on top
LLM_LAYERS = [
    {"modeling"},
    {"inputs"},
    {"labelling"},
    {"engines"},
    {"agents"},
    {"training"},
    {"evaluation"},
    {"api", "cli", "tools_cli", "__init__"},
]
DOCS = SRC.parent / "docs" / "architecture.md"


def _modules(src: Path = SRC) -> dict[str, Path]:
    out = {}
    for path in (src / "ppokit").rglob("*.py"):
        name = ".".join(path.relative_to(src).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(mods: dict[str, Path]):
    """``(module, path, line, targets, private)`` for every import statement of every
    module, at any depth (inside functions too); ``targets``: the modules of ``mods`` it
    imports, ``private``: its ``_names`` taken from another module."""
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            private = []
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
                private = [f"{name}: from {base} import {a.name}" for a in node.names
                           if a.name.startswith("_") and not a.name.startswith("__")
                           and base in mods and base != name]
            else:
                continue
            targets = sorted({t for t in targets if t in mods and t != name})
            yield name, path, node.lineno, targets, private


def _graph():
    mods = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    private: list[str] = []
    for name, _path, _line, targets, names in _imports(mods):
        edges[name] |= set(targets)
        private += names
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


def _llm_part(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["ppokit", "llm"]:
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def _llm_layer(part: str) -> int:
    for i, layer in enumerate(LLM_LAYERS):
        if part in layer:
            return i
    raise AssertionError(f"ppokit.llm.{part}: no layer in LLM_LAYERS of this test")


def _llm_upward(src: Path = SRC) -> list[str]:
    """One line per import that climbs from a lower part of ``ppokit.llm`` to a higher one:
    the file and line, and both parts with their layers."""
    out = []
    for name, path, line, targets, _ in _imports(_modules(src)):
        a = _llm_part(name)
        for target in targets if a else ():
            b = _llm_part(target)
            if b and _llm_layer(a) < _llm_layer(b):
                out.append(f"{path.relative_to(src.parent)}:{line}: {a} (llm layer "
                           f"{_llm_layer(a)}) imports {target} ({b}, llm layer "
                           f"{_llm_layer(b)})")
    return sorted(out)


def test_llm_parts_import_only_lower_ones():
    mods = _modules()
    parts = {_llm_part(m) for m in mods} - {None}
    assert all(_llm_layer(p) >= 0 for p in parts)  # each part has its layer
    upward = _llm_upward()
    assert upward == [], "\n".join(upward)


def test_llm_upward_import_is_named(tmp_path):
    """A function-local upward import, written into a small tree of its own, fails the
    check with the file, its line and both layers."""
    llm = tmp_path / "src" / "ppokit" / "llm"
    for part in ("modeling", "training"):
        (llm / part).mkdir(parents=True)
        (llm / part / "__init__.py").write_text("")
    (tmp_path / "src" / "ppokit" / "__init__.py").write_text("")
    (llm / "__init__.py").write_text("")
    (llm / "training" / "config.py").write_text("LIMIT = 3\n")
    (llm / "modeling" / "models.py").write_text(
        "import os\n\n\ndef f():\n    from ..training.config import LIMIT\n"
        "    return LIMIT\n")
    (llm / "training" / "trainer.py").write_text("from ..modeling.models import f\n")
    assert _llm_upward(tmp_path / "src") == [
        "src/ppokit/llm/modeling/models.py:5: modeling (llm layer 0) imports "
        "ppokit.llm.training.config (training, llm layer 5)"]


def test_docs_state_the_llm_order():
    """docs/architecture.md's table of llm layers lists LLM_LAYERS, top first."""
    text = DOCS.read_text()
    table = text[text.index("| llm layer | parts |"):].split("\n\n")[0]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    documented = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", cells[1])
        documented.append((int(cells[0]), {n.removesuffix("/").removesuffix(".py")
                                            for n in names}))
    assert documented == list(reversed(list(enumerate(LLM_LAYERS))))
