"""Alembic environment: runs on the connection handed over by :func:`app.store.db.upgrade`.

The caller puts the open ``connection`` and the ORM's ``target_metadata`` in
``config.attributes``: this package imports nothing from :mod:`app` (app imports it, to find the
scripts), so the two never import each other. Run by the ``alembic`` command instead, it
connects to the configuration's ``sqlalchemy.url``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

target_metadata = context.config.attributes.get("target_metadata")


def run() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError(
            "migrations need a connection in config.attributes (app.store.db.upgrade hands "
            "one over) or a sqlalchemy.url in the alembic configuration"
        )
    engine = create_engine(url)
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run()
