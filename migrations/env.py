"""Alembic environment: runs on the connection handed over by :func:`app.store.db.upgrade`."""

from __future__ import annotations

from alembic import context

from app.store.db import make_engine
from app.store.orm import Base
from app.store.settings import Settings

target_metadata = Base.metadata


def run() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(Settings().resolved_database_url)
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run()
