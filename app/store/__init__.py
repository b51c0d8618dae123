"""Storage: settings access, the engine and its one session context manager, the ORM, the
repository of queries, the content-addressed artifact store, checkpoints and datasets in it,
and the process-wide :class:`~app.store.services.Services` that bundles them.

May import :mod:`app.errors`, :mod:`app.logs`, :mod:`models` and :mod:`analysis`; never
:mod:`app.jobs`, :mod:`app.http` or :mod:`app.cli`.
"""
