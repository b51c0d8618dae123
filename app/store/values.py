"""Values that reach a database column: row ids, storable text, names taken from files.

Shared by the request bodies of :mod:`app.jobs.requests` and :mod:`app.http.schemas` and by
the store itself, so every path that writes a name or an id applies the same limits.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, StringConstraints

__all__ = ["ID_MAX", "NO_NUL", "Id", "Text", "clean_name"]

# Row ids are 32-bit INTEGER keys (PostgreSQL ``integer``): a larger number cannot name a row
# and would overflow the column, so ids outside 1..ID_MAX are refused as invalid input.
ID_MAX = 2**31 - 1
Id = Annotated[int, Field(ge=1, le=ID_MAX)]


def _no_nul(value: str | None) -> str | None:
    if value is not None and "\x00" in value:
        raise ValueError("must not contain NUL (\\x00) characters")
    return value


# Text that may reach a database column: PostgreSQL's text types cannot hold NUL, so it is
# refused here, naming the field (constrained strings also refuse unpaired surrogates).
NO_NUL = AfterValidator(_no_nul)
Text = Annotated[str, StringConstraints(max_length=200), NO_NUL]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def clean_name(value: str, limit: int = 200) -> str:
    """A name taken from a file (an upload's filename, a sidecar's "name") made storable.

    Control characters (NUL among them) are dropped and unpaired surrogates replaced, so the
    text fits any database's text column; it is cut to ``limit`` characters.
    """
    text = value.encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub("", text)[:limit]
