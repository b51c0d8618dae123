"""``/v1/tokens``: admins list, create and revoke API tokens (the CLI does the same).

The secret is in the answer to the create request only; the database keeps its sha256.
A revoked token stays listed (with ``revoked_at``) and is answered 401 from then on.

The first token of a service is an operator's act: on a service without any token (open
mode, where every caller is an anonymous admin) ``POST /v1/tokens`` is refused, so nobody can
claim the service by creating one; ``cka-atlas token create`` on the host makes it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, Path, Response, status
from pydantic import BaseModel, Field, StringConstraints

from app.http.api.deps import Paging, Svc, api_router, not_found
from app.http.api.rows import each, listing
from app.http.problems import ProblemError
from app.http.schemas import ID_MAX, NO_NUL, Page
from app.http.security import ADMIN, Principal, require_admin
from app.store import tokens as token_store
from app.store.orm import ApiToken

__all__ = ["router"]

router = api_router("tokens")
TokenId = Annotated[int, Path(ge=1, le=ID_MAX, description="Token id")]


class TokenOut(BaseModel):
    id: int = Field(examples=[3])
    name: str = Field(examples=["ci"])
    scope: Literal["read", "write", "admin"] = Field(examples=["write"])
    prefix: str = Field(examples=["cka_Xb3k9Q"], description="The secret's first characters")
    created_at: datetime
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None


class TokenRevoked(TokenOut):
    notice: str | None = Field(
        default=None,
        description="Set when no active token is left: the service stays locked, and how to "
        "open it again",
    )


class TokenCreated(TokenOut):
    token: str = Field(description="The secret, shown this once only")


class TokenIn(BaseModel):
    name: Annotated[str, StringConstraints(min_length=1, max_length=100), NO_NUL] = Field(
        examples=["ci"]
    )
    scope: Literal["read", "write", "admin"] = "write"


def _out(row: ApiToken) -> dict[str, Any]:
    return TokenOut.model_validate(row, from_attributes=True).model_dump()


@router.get("", response_model=Page[TokenOut], **ADMIN)
def list_tokens(services: Svc, at: Paging) -> dict[str, Any]:
    return listing(services, at, token_store.list_tokens, each(_out))


@router.post("", response_model=TokenCreated, status_code=status.HTTP_201_CREATED, **ADMIN)
def create_token(
    services: Svc,
    body: TokenIn,
    response: Response,
    caller: Annotated[Principal, Depends(require_admin)],
) -> dict[str, Any]:
    """A new token; its secret is in this answer only. Refused (403) while the service has no
    token at all: the first one is made on the host."""
    if caller.anonymous:
        raise ProblemError(
            403,
            "forbidden",
            "this service has no token yet, and its first one is made by an operator on the "
            f"host: `{token_store.FIRST_TOKEN}`; then this endpoint takes that admin token",
        )
    with services.db.session() as s:
        row, secret = token_store.create_token(s, body.name, body.scope)
        out = _out(row) | {"token": secret}
    response.headers["Location"] = f"/v1/tokens/{out['id']}"
    response.headers["Cache-Control"] = "no-store"
    return out


@router.post("/{token_id}/revoke", response_model=TokenRevoked, **ADMIN)
def revoke_token(services: Svc, token_id: TokenId) -> dict[str, Any]:
    """Revoke at once (idempotent): the token is answered 401 from now on. When it was the
    last active one, ``notice`` says the service stays locked and how to open it again."""
    with services.db.session() as s:
        row = token_store.revoke_token(s, token_id)
        if row is None:
            raise not_found("token", token_id)
        s.flush()
        locked = not services.settings.tokens and not token_store.active_tokens_exist(s)
        return _out(row) | {"notice": token_store.LOCKED if locked else None}
