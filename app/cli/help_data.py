"""What the commands' parsers quote from modules too heavy to load for ``--help``, kept as data.

`cka-atlas --help` and every subcommand's ``--help`` answer in a fraction of a second because
building the parsers imports neither torch and timm (:mod:`models`, :mod:`analysis.options`)
nor SQLAlchemy (:mod:`app.store`). What the parsers need of them — the comparison options
(:func:`analysis.option_specs`: ``compare``'s flags, their choices and descriptions), the
presets and precisions (``train``) and the collector's grace (``gc``) — is read from
``help_data.json`` beside this module. The file is derived, never edited by hand:
``python -m app.cli.help_data`` writes it from the libraries, and ``tests/app/test_cli_help.py``
fails (saying that command) when it differs from what they say now. A command that runs still
validates everything with the libraries themselves (``CompareOptions.build``, ...).
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["PATH", "current", "load", "main"]

PATH = Path(__file__).with_name("help_data.json")


@cache
def load() -> dict[str, Any]:
    """The stored values: ``options`` (each option spec as a mapping, in field order),
    ``presets``, ``precisions`` and ``gc_grace_s``."""
    data: dict[str, Any] = json.loads(PATH.read_text(encoding="utf-8"))
    return data


def current() -> dict[str, Any]:
    """The same values, from the libraries (seconds of imports)."""
    from analysis import option_specs
    from app.store.gc import DEFAULT_GRACE_S
    from models import list_presets
    from models.devices import PRECISIONS

    options = [dataclasses.asdict(spec) for spec in option_specs().values()]
    # as JSON has them: tuples are lists
    return json.loads(
        json.dumps(
            {
                "options": options,
                "presets": list(list_presets()),
                "precisions": list(PRECISIONS),
                "gc_grace_s": DEFAULT_GRACE_S,
            }
        )
    )


def main() -> None:
    """Write ``help_data.json`` from the libraries."""
    PATH.write_text(json.dumps(current(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()
