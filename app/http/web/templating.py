"""The Jinja2 environment of the web page: templates, filters and cache-busted static URLs.

Templates and static files ship inside the package (``app/web/templates``,
``app/web/static``), so an installed wheel serves the page offline; nothing is loaded from
a CDN. A static URL carries a hash of the file's content, so browsers may cache it forever.
"""

from __future__ import annotations

import hashlib
import math
import re
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape

from app.store.cells import probability_text
from app.store.orm import JobState

__all__ = [
    "FOLD_AT",
    "STATIC_DIR",
    "TEMPLATE_DIR",
    "code_spans",
    "fold",
    "static_digest",
    "static_url",
    "templates",
]

HERE = Path(__file__).parent
TEMPLATE_DIR = HERE / "templates"
STATIC_DIR = HERE / "static"
# A text longer than this is folded: its first words shown, the rest on a click.
FOLD_AT = 160


@cache
def static_digest(name: str) -> str:
    """The start of the sha256 of the static file ``name``: its URL's version."""
    return hashlib.sha256((STATIC_DIR / name).read_bytes()).hexdigest()[:12]


def static_url(name: str) -> str:
    """``/static/<name>?v=<content hash>``."""
    return f"/static/{name}?v={static_digest(name)}"


def fmt_number(value: Any) -> str:
    """Thousands separators for integers, four significant decimals for floats."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def fmt_percent(value: Any) -> str:
    """A share as a percentage. Values come from uploaded sidecars, so anything else is shown
    as it is (text) or as a dash (not a finite number), never an error."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    try:
        share = float(value)
    except OverflowError:  # an integer beyond any float
        return "—"
    return f"{share:.1%}" if math.isfinite(share) else "—"


def fmt_bytes(value: Any) -> str:
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover - loop always returns


def fmt_time(value: datetime | None) -> str:
    """UTC, to the minute: ``2025-01-31 14:05 UTC``."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def fold(text: str, at: int = FOLD_AT) -> dict[str, str]:
    """``full``: the text; ``short``: its first words, cut at a space outside any code span
    and ending in " …", when it is longer than ``at`` characters (else the text itself)."""
    cut = text.rfind(" ", 0, at - 40) if len(text) > at else -1
    if cut > 0 and text.count("`", 0, cut) % 2:  # inside a code span: cut before it
        cut = text.rfind(" ", 0, text.rfind("`", 0, cut))
    return {"short": text[:cut] + " …" if cut > 0 else text, "full": text}


def code_spans(text: str) -> Markup:
    """``text`` escaped, with its Markdown code spans (a name between backticks) as ``<code>``
    elements: how the options' descriptions, written for the docs and the CLI too, read on a
    page. A backtick without its pair (a folded text's cut) stays as it is."""
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text))))


def _option_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def option_chips(options: dict[str, Any], skip: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """A comparison's differing options (its view's ``options``) as the list shows them: each
    its ``text`` (``baselines=random_init,seed_ceiling``) and the ``filter`` that selects the
    comparisons with it (``baselines=random_init baselines=seed_ceiling``), ``skip`` aside."""
    chips = []
    for name, value in options.items():
        if name in skip:
            continue
        values = value if isinstance(value, list | tuple) else [value]
        shown = [_option_value(v) for v in values]
        chips.append(
            {
                "text": f"{name}={','.join(shown)}",
                "filter": " ".join(f"{name}={v}" for v in shown),
            }
        )
    return chips


def job_states() -> dict[str, Any]:
    """The job states for the page's scripts (``window.cka.states``): each by its enum name,
    and ``LIVE``, those that may still change."""
    return {**{s.name: s.value for s in JobState}, "LIVE": [s.value for s in JobState if s.live]}


def _make() -> Jinja2Templates:
    t = Jinja2Templates(directory=str(TEMPLATE_DIR))
    env = t.env
    env.trim_blocks = True
    env.lstrip_blocks = True
    env.globals["static_url"] = static_url
    # The state names come from the enum, never retyped: ``JobState.CANCELLED`` in a template,
    # ``status in LIVE_STATES``, and the same in the scripts through base.html's JSON.
    env.globals["JobState"] = JobState
    env.globals["LIVE_STATES"] = tuple(s for s in JobState if s.live)
    env.globals["job_states"] = job_states()
    env.filters["num"] = fmt_number
    env.filters["p"] = probability_text
    env.filters["pct"] = fmt_percent
    env.filters["bytes"] = fmt_bytes
    env.filters["when"] = fmt_time
    env.filters["duration"] = fmt_duration
    env.filters["fold"] = fold
    env.filters["code_spans"] = code_spans
    env.globals["option_chips"] = option_chips
    return t


templates = _make()
