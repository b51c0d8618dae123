"""Public names of a package loaded on first use (PEP 562), so importing it costs nothing.

A package's ``__init__`` names each public object and the module that defines it; the module
is imported the first time the name is read (``analysis.compare``, ``from analysis import
Atlas``), and the object is then kept in the package like an ordinary import. A service that
needs one light submodule (``analysis.options``) thus never loads the rest of the library —
the plotting, the studies, :mod:`models` with timm — until a request or a job needs it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each module (relative
    to the package, e.g. ``".atlas"``) to the public names it defines."""
    origin = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = origin.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(importlib.import_module(package), name, value)  # later reads skip this
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(origin))

    return __getattr__, __dir__
