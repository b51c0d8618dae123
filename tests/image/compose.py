"""One service of docker-compose.yml as `docker compose` resolves it: its environment and command.

``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?message}``, ``${VAR?message}`` and
``$$`` are interpolated from an environment, as compose does; YAML anchors and ``<<`` merges are
PyYAML's. tests/test_deploy.py builds the API's settings from it; tests/image/run.sh runs it
inside the image (which has PyYAML) to start containers with the compose file's own
configuration::

    python compose.py docker-compose.yml api env CKA_DATABASE_URL=...   # KEY=VALUE lines
    python compose.py docker-compose.yml worker command                 # one argument a line
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["interpolate", "load", "service_command", "service_environment"]

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>\w+))"
)


def interpolate(text: str, environ: Mapping[str, str]) -> str:
    """``text`` with its variables replaced; ValueError with compose's message for a
    required variable that is missing."""

    def value(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["name"] or match["bare"]
        found = environ.get(name)
        op = match["op"] or ""
        missing = not found if op.startswith(":") else found is None
        if op.endswith("-") and missing:
            return match["arg"]
        if op.endswith("?") and missing:
            raise ValueError(f"required variable {name} is missing a value: {match['arg']}")
        return found or ""

    return _VARIABLE.sub(value, text)


def load(path: Path) -> dict[str, Any]:
    """The compose file, parsed (anchors and merges resolved, nothing interpolated)."""
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


def service_environment(
    compose: Mapping[str, Any], service: str, environ: Mapping[str, str]
) -> dict[str, str]:
    """The variables ``service`` runs with, interpolated from ``environ``."""
    listed = compose["services"][service].get("environment") or {}
    if isinstance(listed, list):
        listed = dict(item.partition("=")[::2] for item in listed)
    return {key: interpolate(str(raw), environ) for key, raw in listed.items()}


def service_command(
    compose: Mapping[str, Any], service: str, environ: Mapping[str, str]
) -> list[str]:
    """The command ``service`` runs (empty: the image's CMD), interpolated from ``environ``."""
    command = compose["services"][service].get("command") or []
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    return [interpolate(arg, environ) for arg in argv]


def main(argv: list[str]) -> int:
    path, service, what, *overrides = argv
    compose = load(Path(path))
    try:
        if what == "env":
            env = service_environment(compose, service, os.environ)
            env |= dict(item.partition("=")[::2] for item in overrides)
            lines = [f"{key}={value}" for key, value in env.items()]
        elif what == "command":
            lines = service_command(compose, service, os.environ)
        else:
            raise ValueError(f"{what!r}: say env or command")
    except ValueError as exc:
        print(f"compose.py: {exc}", file=sys.stderr)
        return 2
    if any("\n" in line for line in lines):
        print(f"compose.py: a value of {service} holds a newline: {json.dumps(lines)}")
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
