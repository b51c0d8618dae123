"""Opening the store from a command, and saying where it is when the command had to create it.

The default store is ``./var`` under the folder a command runs in, so a command run from
another folder would otherwise silently start a new, empty one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sqlalchemy import Engine

from app.store.db import ensure_schema

__all__ = ["describe_store", "ensure_store"]


def describe_store(engine: Engine, data_dir: Path) -> str:
    """Where a store lives: its database (password hidden) and its artifact folder."""
    url = engine.url.render_as_string(hide_password=True)
    return f"database {url}, files under {data_dir.resolve()}"


def ensure_store(engine: Engine, data_dir: Path) -> None:
    """:func:`ensure_schema`, saying where a store was created (stderr)."""
    if ensure_schema(engine) == "created":
        print(
            f"cka-atlas: created a new, empty store ({describe_store(engine, data_dir)}); "
            "CKA_DATA_DIR or CKA_DATABASE_URL points a command at an existing one",
            file=sys.stderr,
        )
