"""``cka-atlas token create | list | revoke``: API tokens with a scope, kept hashed."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from app.cli.commands import command

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``token`` and its subcommands to the ``cka-atlas`` parser."""
    token = command(
        subparsers,
        "token",
        None,
        "create, list and revoke API tokens",
        "API tokens with a scope: read (GET), write (uploads, comparisons, "
        "trainings, cancels) or admin (also deletes and token management). The database "
        "keeps only each token's sha256; the secret is printed once, at creation.",
    )
    sub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    create = command(sub, "create", run_create, "create a token and print its secret once")
    create.add_argument("--name", required=True, help="who or what uses it, e.g. ci")
    create.add_argument("--scope", choices=("read", "write", "admin"), default="write")
    command(sub, "list", run_list, "list tokens (never their secrets)")
    revoke = command(sub, "revoke", run_revoke, "revoke a token by id; it is refused (401) at once")
    revoke.add_argument("id", type=int)
    command(
        sub,
        "purge",
        run_purge,
        "delete the revoked tokens; with none left the service is open again",
        "Delete every revoked token's record. A service none of whose tokens was ever created "
        "(and without CKA_API_TOKENS) is open: anyone may read and write. So once the last "
        "active token is revoked, purging the revoked ones opens the service again.",
    )


def _database() -> Any:
    """The existing store (tokens are made for a store that a service serves: a new, empty
    one in the wrong folder would hold them unseen)."""
    from app.cli.store import open_store
    from app.store.settings import Settings

    return open_store(Settings())


def run_create(args: argparse.Namespace) -> int:
    from app.store.tokens import create_token

    db = _database()
    try:
        with db.session() as s:
            row, secret = create_token(s, args.name, args.scope)
            ident, scope = row.id, row.scope
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        db.dispose()
    print(f"token {ident} ({scope}) created; it is shown this once:", file=sys.stderr)
    print(secret)
    return 0


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def run_list(args: argparse.Namespace) -> int:
    from app.store.tokens import list_tokens

    db = _database()
    try:
        with db.session(readonly=True) as s:
            rows, _ = list_tokens(s, limit=10_000, offset=0)
            lines = [
                f"{t.id}\t{t.name}\t{t.scope}\t{t.prefix}…\tcreated {_when(t.created_at)}\t"
                f"used {_when(t.last_used_at)}\t"
                + (f"revoked {_when(t.revoked_at)}" if t.revoked_at else "active")
                for t in rows
            ]
    finally:
        db.dispose()
    print("\n".join(lines) if lines else "no tokens")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    from app.store.settings import Settings
    from app.store.tokens import LOCKED, active_tokens_exist, revoke_token

    db = _database()
    try:
        with db.session() as s:
            row = revoke_token(s, args.id)
            found = row is not None
            locked = found and not active_tokens_exist(s) and not Settings().tokens
    finally:
        db.dispose()
    if not found:
        print(f"error: there is no token {args.id}", file=sys.stderr)
        return 1
    print(f"token {args.id} revoked")
    if locked:
        print(f"note: {LOCKED}")
    return 0


def run_purge(args: argparse.Namespace) -> int:
    from app.store.settings import Settings
    from app.store.tokens import FIRST_TOKEN, purge_revoked, tokens_exist

    db = _database()
    try:
        with db.session() as s:
            removed = purge_revoked(s)
            left = tokens_exist(s)
    finally:
        db.dispose()
    print(f"deleted {removed} revoked token{'' if removed == 1 else 's'}")
    if not left and not Settings().tokens:
        print(
            "note: no token is left, so the service is open: anyone who reaches it may read "
            f"and write (`{FIRST_TOKEN}` locks it again)"
        )
    return 0
