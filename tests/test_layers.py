"""The import contracts of docs/layers.md, checked on the source: a one-way stack, layers
point down.

Every ``import`` counts, also one inside a function or under ``if TYPE_CHECKING``: a lazy
import still couples two modules. Importing ``a.b.c`` runs the ``__init__`` of ``a`` and
``a.b`` first, so it counts as importing them too. Two graphs are checked, with no exemption:

- the top-level packages: ``models`` ← ``analysis`` ← ``app`` → ``migrations`` (an arrow from
  importer to imported points right to left here: app imports the three, analysis imports
  models, models and migrations import none of the others);
- the layers of ``app``: cli → http → jobs → store → {errors, logs}, never upward or sideways;
- the parts of ``analysis``, in the order its ``__init__`` docstring gives (each imports only
  the parts before it; the package's own ``__init__``, its public face, stands above them all).

The checker is run on a deliberately cyclic pair of throwaway packages too, which it must reject.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "analysis", "app", "migrations")

# What each top-level package may import of the others (docs/layers.md; models and analysis
# say so in their __init__ docstrings, app.store.db hands migrations its metadata).
ALLOWED = {
    "models": set(),
    "analysis": {"models"},
    "migrations": set(),
    "app": {"models", "analysis", "migrations"},
}
# app's layers, highest first; a layer may import only layers of a lower rank. ``app`` itself
# (the package's docstring-only __init__) is beneath every layer.
APP_RANKS = {
    "app.cli": 4,
    "app.http": 3,
    "app.jobs": 2,
    "app.store": 1,
    "app.errors": 0,
    "app.logs": 0,
    "app": -1,
}


# analysis's parts, lowest first (analysis/__init__.py's docstring); a part may import only
# parts of a lower rank, or its own modules. ``analysis`` itself is the face, above every part:
# importing ``analysis.x.y`` runs it first, which is no import of it (``_part`` skips it).
ANALYSIS_ORDER = (
    ("analysis.errors", "analysis._lazy"),
    ("analysis.estimators",),
    ("analysis.measures",),
    ("analysis.data",),
    ("analysis.layers",),
    ("analysis.inference",),
    ("analysis.batch_statistics",),
    ("analysis.options",),
    ("analysis.atlas",),
    ("analysis.engine",),
    ("analysis.shards",),
    ("analysis.comparison",),
    ("analysis.plot",),
    ("analysis.studies",),
)
ANALYSIS_RANKS = {part: rank for rank, parts in enumerate(ANALYSIS_ORDER) for part in parts}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    return {
        _module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))
    }


def _with_ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules that importing ``name`` runs (ancestor packages included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from a import b`` imports the module a.b when there is one, else a name of a.
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target:
                found |= _with_ancestors(target)
    return found - {name}


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module → the project modules it imports, anywhere in its source."""
    modules = _modules(root, packages)
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def collapse(graph: dict[str, set[str]], group: Callable[[str], str | None]) -> dict[str, set[str]]:
    """The graph between groups of modules (edges inside a group dropped, ungrouped skipped)."""
    out: dict[str, set[str]] = {}
    for src, targets in graph.items():
        a = group(src)
        if a is None:
            continue
        out.setdefault(a, set())
        out[a] |= {b for dst in targets if (b := group(dst)) is not None and b != a}
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a closed path, or None; every edge counts."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _top(module: str) -> str:
    return module.split(".")[0]


def _app_layer(module: str) -> str | None:
    if _top(module) != "app":
        return None
    return module if module == "app" else ".".join(module.split(".")[:2])


def _part(module: str) -> str | None:
    """The part of ``analysis`` a module belongs to (None: outside it, or the face itself)."""
    if _top(module) != "analysis" or module == "analysis":
        return None
    return ".".join(module.split(".")[:2])


GRAPH = import_graph(ROOT, PACKAGES)
TOP = collapse(GRAPH, _top)
LAYERS = collapse(GRAPH, _app_layer)


def _offenders(group: Callable[[str], str | None], edges: set[tuple[str, str]]) -> list[str]:
    """The module imports behind forbidden edges between groups, for the failure message."""
    return sorted(
        f"{m} imports {t}" for m in GRAPH for t in GRAPH[m] if (group(m), group(t)) in edges
    )


def test_top_level_packages_form_a_one_way_stack() -> None:
    assert find_cycle(TOP) is None, " -> ".join(find_cycle(TOP) or [])
    bad = {(src, dst) for src, targets in TOP.items() for dst in targets - ALLOWED[src]}
    assert not bad, "\n".join(_offenders(_top, bad))


def test_app_layers_point_down() -> None:
    stray = set(LAYERS) - set(APP_RANKS)
    assert not stray, f"modules outside the layers: {sorted(stray)}"
    bad = {
        (src, dst)
        for src, targets in LAYERS.items()
        for dst in targets
        if APP_RANKS[dst] >= APP_RANKS[src]
    }
    assert not bad, "\n".join(_offenders(_app_layer, bad))
    assert find_cycle(LAYERS) is None


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` from a part of ``analysis`` to a part at or above its rank."""
    return sorted(
        f"{m} imports {t}"
        for m, targets in graph.items()
        if (a := _part(m)) is not None
        for t in targets
        if (b := _part(t)) is not None and a != b and ANALYSIS_RANKS[b] >= ANALYSIS_RANKS[a]
    )


def test_analysis_parts_point_down() -> None:
    """Each part imports only the parts beneath it, in functions and for type checkers too."""
    parts = {p for m in GRAPH if (p := _part(m)) is not None}
    assert parts == set(ANALYSIS_RANKS), (
        f"parts not in the order: {sorted(parts - set(ANALYSIS_RANKS))}; "
        f"in the order but gone: {sorted(set(ANALYSIS_RANKS) - parts)}"
    )
    assert not _upward(GRAPH), "\n".join(_upward(GRAPH))


def test_an_upward_import_inside_analysis_is_found() -> None:
    """The check above would fail on the cycle this release removed: the baselines calling
    back into the run that computes them, through an import inside a function."""
    graph = {**GRAPH, "analysis.inference.verdicts": {"analysis.comparison.run"}}
    assert _upward(graph) == ["analysis.inference.verdicts imports analysis.comparison.run"]


def test_the_order_is_the_documented_one() -> None:
    """analysis/__init__.py's docstring lists the parts in this order."""
    import analysis

    numbered = re.findall(r"^\d+\. (.*)$", analysis.__doc__ or "", re.MULTILINE)
    listed = [tuple(re.findall(r":mod:`(analysis[\w.]*)`", line)) for line in numbered]
    assert listed == list(ANALYSIS_ORDER)


def test_the_checker_sees_imports() -> None:
    """Guard against a checker that passes because it parses nothing."""
    assert "app.store.db" in GRAPH["app.store.services"]
    assert "models" in TOP["analysis"] and "analysis" in TOP["app"]
    assert "migrations" in TOP["app"]  # app.store.db finds the scripts
    assert {"app.store", "app.jobs"} <= LAYERS["app.http"]
    # an import inside a function counts: `cka-atlas serve` imports the demo lazily
    assert "app.cli.demo" in GRAPH["app.cli.service"]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# Two throwaway packages that import each other back, the way models and analysis once did:
# through a package's own submodule and a lazy import, the edges an exemption would hide.
CYCLIC = {
    "lower/__init__.py": "from lower.training import train\n",
    "lower/training.py": "def train():\n    from upper import load_dataset\n",
    "upper/__init__.py": "from .datasets import load_dataset\nfrom .baselines import twin\n",
    "upper/datasets.py": "def load_dataset():\n    return []\n",
    "upper/baselines.py": "def twin():\n    import lower\n    return lower.train\n",
}


def test_a_cyclic_pair_of_packages_is_rejected(tmp_path: Path) -> None:
    _write(tmp_path, CYCLIC)
    graph = import_graph(tmp_path, ("lower", "upper"))
    cycle = find_cycle(collapse(graph, _top))
    assert cycle is not None and set(cycle) == {"lower", "upper"}
    # the modules that close it: a package importing its own child, and two lazy imports
    assert "lower.training" in graph["lower"] and "upper" in graph["lower.training"]
    assert "lower" in graph["upper.baselines"] and "upper.baselines" in graph["upper"]


def test_one_way_pair_of_packages_is_accepted(tmp_path: Path) -> None:
    _write(tmp_path, {**CYCLIC, "upper/baselines.py": "def twin():\n    return None\n"})
    assert find_cycle(collapse(import_graph(tmp_path, ("lower", "upper")), _top)) is None
