"""Alembic migrations for the cka-atlas database, run from code (see app.store.db)."""
