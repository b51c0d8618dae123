"""``cka-atlas models`` and ``cka-atlas layers``: the store's models, and a model's layers.

A command that takes a model (``compare``, ``layers``) takes a checkpoint file, or a model of
the store by id or by name (or alias) when one model has it: :func:`checkpoint_path` finds its
file. Only a name that is not a file opens the store, so the library-only commands work with no
store and without the service extra.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from app.cli.commands import CommandError, command

__all__ = ["MODEL_HELP", "checkpoint_path", "register"]

# What a model argument is, for the commands' help.
MODEL_HELP = "a .safetensors checkpoint, or a model of the store by id or name (`cka-atlas models`)"


def register(subparsers: Any) -> None:
    p = command(
        subparsers,
        "models",
        run_models,
        "List the store's models: id, name, architecture, aliases",
        "The models of the store of CKA_DATA_DIR / CKA_DATABASE_URL (uploaded, imported or "
        "trained by the service), lowest id first. Every command that takes a model takes one "
        "of these by id or by name.",
    )
    p.add_argument("--arch", help="only models of this architecture")
    p = command(
        subparsers,
        "layers",
        run_layers,
        "List a model's layers, the default ones marked",
        "Every layer name a comparison's --layers can select of a model (names, globs such as "
        "blocks.* and indices into the default layers select them), in module order; the "
        "default layers (what a comparison reads without --layers) are marked with *.",
    )
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)


def checkpoint_path(ref: str) -> tuple[str, Path]:
    """(name, checkpoint file) of ``ref``: a checkpoint file (named by its stem), else a model
    of the store by id or name (named by its name); a :class:`CommandError` of one sentence
    when it is neither."""
    path = Path(ref)
    if path.exists() or path.suffix == ".safetensors":  # a missing file is told as missing
        return path.stem, path
    from app.cli.store import open_store
    from app.errors import ProblemError
    from app.jobs.submit import COMMAND_LISTING
    from app.store import repository
    from app.store.artifacts import ArtifactStore
    from app.store.settings import Settings

    settings = Settings()
    try:
        db = open_store(settings)
    except CommandError as exc:
        raise CommandError(f"{ref!r} is no checkpoint file, and {exc}") from None
    try:
        with db.session(readonly=True) as s:
            row = repository.model_by_reference(s, ref, listing=COMMAND_LISTING)
            name, sha = row.name, row.sha256
    except ProblemError as exc:
        raise CommandError(exc.detail) from None
    finally:
        db.dispose()
    return name, ArtifactStore(settings.data_dir).path(sha, ".safetensors")


def run_models(args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from app.cli.store import open_store
    from app.store.orm import Model
    from app.store.settings import Settings

    db = open_store(Settings())
    try:
        with db.session(readonly=True) as s:
            query = select(Model).order_by(Model.id)
            if args.arch:
                query = query.where(Model.arch == args.arch)
            rows = [(m.id, m.name, m.arch, ", ".join(m.aliases)) for m in s.scalars(query)]
    finally:
        db.dispose()
    if not rows:
        print("no models" + (f" of {args.arch}" if args.arch else "") + " in the store")
        return 0
    widths = [
        max(len(str(row[i])) for row in [("id", "name", "arch", ""), *rows]) for i in (0, 1, 2)
    ]
    print(f"{'id':>{widths[0]}}  {'name':<{widths[1]}}  {'arch':<{widths[2]}}  aliases")
    for model_id, name, arch, aliases in rows:
        print(f"{model_id:>{widths[0]}}  {name:<{widths[1]}}  {arch:<{widths[2]}}  {aliases}")
    return 0


def run_layers(args: argparse.Namespace) -> int:
    import models
    from analysis.layers import available_layers, default_layers

    name, path = checkpoint_path(args.model)
    net, _ = models.load(path)
    defaults = set(default_layers(net))
    names = available_layers(net)
    print(f"{name}: {len(names)} layers, {len(defaults)} by default (*)")
    for layer in names:
        print(f"{'*' if layer in defaults else ' '} {layer}")
    return 0
