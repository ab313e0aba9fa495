"""The package's layers import downward only (#28): every `from .x import y` of every module,
at the top or inside a function, goes to a module of its own layer or a lower one, and the
import graph has no cycle. The layers, bottom up, are the README's layout table."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Bottom up; a module belongs to the first layer with a prefix of its dotted name.
LAYERS = [
    ("base", ["", "configs", "export", "export.config", "export.artifact", "export.runtime_log"]),
    ("SPEC.md's rules", ["export.rng", "export.sampling", "export.owners", "export.heads", "export.boundary",
                         "export.legal", "export.cases"]),
    ("models", ["export.models"]),
    ("programs", ["export.methods", "export.dflash_program", "export.builder"]),
    ("lowering and kernels", ["lowering", "kernels"]),
    ("exporting", ["export.exporter"]),
    ("checking and driving", ["export.driver", "export.check", "export.distilling"]),
    ("command line", ["cli"]),
]
PACKAGES = ("export", "lowering", "kernels", "configs")


def _modules() -> dict[str, Path]:
    out = {"": ROOT / "__init__.py", "cli": ROOT / "cli.py"}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _layer(module: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    if best is None:
        raise AssertionError(f"module {module!r} is in no layer of tests/test_layers.py: add it to LAYERS")
    return best[0]


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `module` imports (relative imports: the package's own)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = [p for p in package if p]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = package[:len(package) - (node.level - 1)]
        target = base + (node.module.split(".") if node.module else [])
        for alias in node.names:
            name = ".".join(target + [alias.name])
            found.add(name if name in known else ".".join(target))  # a submodule, or a name in one
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: _imports(m, p, known) & known - {m} for m, p in modules.items()}


def _upward(graph) -> list[str]:
    return [f"{m} (layer {LAYERS[_layer(m)][0]}) imports {t} (layer {LAYERS[_layer(t)][0]})"
            for m, targets in graph.items() for t in sorted(targets) if _layer(t) > _layer(m)]


def _cycles(graph) -> list[str]:
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                cycles.append(" -> ".join(path[path.index(t):] + [t]))
            elif t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_every_import_goes_down_or_sideways():
    assert _upward(_graph()) == []


def test_the_imports_have_no_cycle():
    assert _cycles(_graph()) == []


def test_the_checks_see_an_import_inside_a_function(tmp_path):
    """Not vacuous: an import inside a function is found, an upward one is reported, and
    two modules importing each other are a cycle."""
    path = tmp_path / "heads.py"
    path.write_text("def f():\n    from . import driver\n    from .owners import pack_pairs\n")
    found = _imports("export.heads", path, set(_modules()))
    assert found == {"export.driver", "export.owners"}
    graph = {**_graph(), "export.heads": found}
    assert _upward(graph) == ["export.heads (layer SPEC.md's rules) imports export.driver (layer checking and driving)"]
    graph["export.driver"] = graph["export.driver"] | {"export.heads"}
    assert "export.heads -> export.driver -> export.heads" in _cycles(graph)
