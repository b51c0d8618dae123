"""The import contracts of DESIGN.md, checked on the source: layers point down, no cycles.

Every ``import`` counts, also one inside a function: a lazy import still couples two modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "analysis", "app")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (a package import counts as its ``__init__``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


MODULES = _modules()
GRAPH = {name: _imports(name, path, set(MODULES)) for name, path in MODULES.items()}

# (importer prefix, forbidden prefixes): the arrows of DESIGN.md that must never exist.
FORBIDDEN = [
    ("models", ("app",)),
    ("analysis", ("app",)),
    ("app.errors", ("app.store", "app.jobs", "app.http", "app.cli")),
    ("app.logs", ("app.store", "app.jobs", "app.http", "app.cli")),
    ("app.store", ("app.jobs", "app.http", "app.cli")),
    ("app.jobs", ("app.http", "app.cli")),
    ("app.http", ("app.cli",)),
]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize(("importer", "forbidden"), FORBIDDEN, ids=[f[0] for f in FORBIDDEN])
def test_layers_point_down(importer: str, forbidden: tuple[str, ...]) -> None:
    bad = sorted(
        f"{src} imports {dst}"
        for src, targets in GRAPH.items()
        if _under(src, importer)
        for dst in targets
        if any(_under(dst, f) for f in forbidden)
    )
    assert not bad, "\n".join(bad)


def test_every_app_module_is_in_a_layer() -> None:
    layers = ("app.store", "app.jobs", "app.http", "app.cli", "app.errors", "app.logs")
    stray = [
        m
        for m in GRAPH
        if _under(m, "app") and m != "app" and not any(_under(m, p) for p in layers)
    ]
    assert not stray, f"modules outside the layers: {stray}"


def _cycle() -> list[str] | None:
    """One import cycle among modules (packages importing their own submodules excepted)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def edges(src: str) -> list[str]:
        # ``pkg/__init__`` re-exporting ``pkg.sub`` while ``pkg.sub`` imports a sibling through
        # ``pkg`` is how Python packages work, not a design cycle: skip package → own child.
        return [d for d in sorted(GRAPH[src]) if not d.startswith(src + ".")]

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in edges(node):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(GRAPH):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_cycles() -> None:
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle or [])


def test_the_checker_sees_imports() -> None:
    """Guard against a checker that passes because it parses nothing."""
    assert "app.store.db" in GRAPH["app.store.services"]
    assert "analysis" in GRAPH["app.jobs.run"] or "analysis" in GRAPH["app.jobs.compare"]
