"""API tokens in the database: create (the secret is returned once), look up, list, revoke.

A token is ``cka_`` followed by 32 random bytes in URL-safe base64; the database keeps its
sha256 only, with a name, a scope (``read`` < ``write`` < ``admin``, each including the
ones before it), and the times it was created, last used and revoked.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from app.store.orm import SCOPES, ApiToken, utcnow
from app.store.repository import page

__all__ = [
    "FIRST_TOKEN",
    "LOCKED",
    "PREFIX",
    "active_tokens_exist",
    "create_token",
    "find_token",
    "list_tokens",
    "needs_touch",
    "purge_revoked",
    "revoke_token",
    "scope_allows",
    "token_hash",
    "tokens_exist",
    "touch_token",
]

PREFIX = "cka_"
# last_used_at is written at most this often per token, so reads do not each cost a write.
TOUCH_EVERY = timedelta(seconds=60)
# The first token of a service is an operator's act on its host, never a request's.
FIRST_TOKEN = "cka-atlas token create --scope admin --name NAME"
# What a service whose every token is revoked tells its operator: revoking never opens it.
LOCKED = (
    "no active token is left, so the service stays locked (revoking never opens it): create "
    f"a token on the host with `{FIRST_TOKEN}`, or open the service again (no token at all) "
    "by deleting the revoked tokens with `cka-atlas token purge`"
)


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def scope_allows(have: str, need: str) -> bool:
    """Whether a token of scope ``have`` may do what needs ``need``."""
    return SCOPES.index(have) >= SCOPES.index(need)


def create_token(session: Session, name: str, scope: str) -> tuple[ApiToken, str]:
    """Add a token; returns its row and the secret, which is never stored nor shown again."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    name = name.strip()
    if not name or len(name) > 100:
        raise ValueError("a token needs a name of 1 to 100 characters")
    secret = PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, scope=scope, token_sha256=token_hash(secret), prefix=secret[:10])
    session.add(row)
    session.flush()
    return row, secret


def find_token(session: Session, secret: str) -> ApiToken | None:
    """The row of ``secret`` (revoked or not); None if unknown.

    The lookup is by hash, an indexed equality on a value the caller cannot choose to match
    another token's, so it leaks nothing through timing.
    """
    return session.scalar(select(ApiToken).where(ApiToken.token_sha256 == token_hash(secret)))


def needs_touch(row: ApiToken) -> bool:
    """Whether ``last_used_at`` is old enough to be written again (see TOUCH_EVERY)."""
    return row.last_used_at is None or utcnow() - row.last_used_at > TOUCH_EVERY


def touch_token(session: Session, token_id: int) -> None:
    """Record that the token was used now."""
    session.execute(
        update(ApiToken)
        .where(ApiToken.id == token_id)
        .values(last_used_at=utcnow())
        .execution_options(synchronize_session=False)
    )


def tokens_exist(session: Session) -> bool:
    """Whether any token was ever created (revoked ones count: see app.http.security)."""
    return session.scalar(select(ApiToken.id).limit(1)) is not None


def active_tokens_exist(session: Session) -> bool:
    """Whether any token that is not revoked exists."""
    stmt = select(ApiToken.id).where(ApiToken.revoked_at.is_(None)).limit(1)
    return session.scalar(stmt) is not None


def purge_revoked(session: Session) -> int:
    """Delete the revoked tokens; how many. With none left (and no ``CKA_API_TOKENS``) the
    service is open again."""
    res = session.execute(delete(ApiToken).where(ApiToken.revoked_at.is_not(None)))
    return int(res.rowcount or 0)  # type: ignore[attr-defined]


def list_tokens(
    session: Session, *, limit: int, offset: int, include_revoked: bool = True
) -> tuple[list[ApiToken], int]:
    stmt = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        stmt = stmt.where(ApiToken.revoked_at.is_(None))
    return page(session, stmt, limit, offset)


def revoke_token(session: Session, token_id: int) -> ApiToken | None:
    """Mark the token revoked (idempotent); None if there is no such token."""
    row = session.get(ApiToken, token_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = utcnow()
    return row
