"""``cka-atlas serve | worker | db | demo``: running the service and managing its database."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING, Any

from app.cli.commands import command
from app.logs import configure_logging, resolved_format, uvicorn_log_config

if TYPE_CHECKING:  # the service stack is imported by the commands that run it
    from app.store.db import SchemaError

__all__ = ["register"]


def _settings(args: argparse.Namespace) -> Any:
    from app.store.settings import Settings

    overrides = {
        k: v
        for k, v in (("host", getattr(args, "host", None)), ("port", getattr(args, "port", None)))
        if v is not None
    }
    return Settings(**overrides)


def _refuse(exc: SchemaError) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 2


def _logging(settings: Any) -> None:
    configure_logging(settings.log_level, fmt=settings.log_format)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.cli.store import ensure_store
    from app.http.main import create_app
    from app.store.db import Database, SchemaError
    from app.store.tokens import FIRST_TOKEN, tokens_exist

    settings = _settings(args)
    if settings.unnamed_wildcard:
        print(
            f"error: serving on every interface ({settings.host or 'all addresses'}) needs "
            "CKA_ALLOWED_HOSTS, the comma-separated host names clients use to reach this "
            "service (any other Host header is refused, against DNS rebinding; `*` answers "
            "any name)",
            file=sys.stderr,
        )
        return 2
    _logging(settings)
    db = Database(settings.resolved_database_url)
    try:
        # Refuse here, with the command, not in a lifespan traceback.
        ensure_store(db.engine, settings.data_dir)
        if settings.read_requires_token and not settings.tokens:
            with db.session(readonly=True) as s:
                tokens = tokens_exist(s)
            if not tokens:
                print(
                    "error: CKA_READ_REQUIRES_TOKEN is true but this service has no token, so "
                    "it would let anyone read (and write); create one with "
                    f"`{FIRST_TOKEN}` (this store exists now), or set CKA_API_TOKENS, and start "
                    "again",
                    file=sys.stderr,
                )
                return 2
    except SchemaError as exc:
        return _refuse(exc)
    finally:
        db.dispose()
    url = f"http://{settings.host}:{settings.port}"
    print(f"cka-atlas: serving on {url}", file=sys.stderr)
    if args.demo:
        from app.cli.demo import setup_demo

        job_id, queued = setup_demo(settings, args.zoo)
        print(
            f"cka-atlas: demo {'queued' if queued else 'found'} (job {job_id}): the zoo's "
            f"trainings one by one, then its atlas; progress on {url}/ and {url}/jobs",
            file=sys.stderr,
        )
    json_lines = resolved_format(settings.log_format) == "json"
    log_config = uvicorn_log_config(settings.log_level) if json_lines else None
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=log_config,
        access_log=settings.access_log,
    )
    return 0


def run_worker(args: argparse.Namespace) -> int:
    import os

    from pydantic import ValidationError

    from app.store.db import SchemaError
    from app.store.settings import Settings

    if args.name == "":
        print("cka-atlas: error: --name: must not be empty", file=sys.stderr)
        return 2
    if args.name is not None:
        os.environ["CKA_WORKER_NAME"] = args.name  # read again by the Celery task's services
    try:
        settings = Settings()  # validates the name, as it does CKA_WORKER_NAME
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        setting = f"CKA_{str(first['loc'][0]).upper()}"
        if setting == "CKA_WORKER_NAME" and args.name is not None:
            setting = "--name"
        reason = first.get("ctx", {}).get("error") or first["msg"]  # our sentence, if ours
        print(f"cka-atlas: error: {setting}: {reason}", file=sys.stderr)
        return 2
    _logging(settings)
    try:
        if settings.broker_url:
            from app.jobs.celery_app import run_worker as celery_worker

            celery_worker(loglevel=settings.log_level.upper())  # settings: the environment
        else:
            _embedded_forever(settings, args.threads)
    except SchemaError as exc:
        return _refuse(exc)
    return 0


def _embedded_forever(settings: Any, threads: int | None) -> None:
    """Without a broker, poll the database for queued jobs in this process.

    SIGTERM (``docker stop``, systemd) and Ctrl-C stop it cleanly: a running job stops at its
    next batch and goes back to the queue for the next worker.
    """
    import signal
    import threading

    from app.cli.store import ensure_store
    from app.jobs.runtime import running

    def prepare(services: Any) -> None:
        ensure_store(services.db.engine, settings.data_dir)
        print(f"cka-atlas: worker polling {services.db.engine.url!r}", file=sys.stderr)

    with running(settings, threads=threads or max(settings.worker_threads, 1), prepare=prepare):
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        while not stop.wait(1.0):
            pass


def run_db(args: argparse.Namespace) -> int:
    from app.cli.store import open_store
    from app.store.db import (
        Database,
        SchemaError,
        backup_sqlite,
        current_revision,
        head_revision,
        upgrade,
    )

    settings = _settings(args)
    # `current` reads the store (and creates none); `upgrade` creates it where there is none.
    if args.db_command == "current":
        db = open_store(settings, schema=False)
    else:
        db = Database(settings.resolved_database_url)
    try:
        current, head = current_revision(db.engine), head_revision()
        if args.db_command == "upgrade":
            if current == head:
                print(f"database at {head} (head), nothing to upgrade")
                return 0
            backup = backup_sqlite(db.engine)
            if backup is not None:
                print(f"copied the database to {backup} before upgrading")
            try:
                upgrade(db.engine)
            except SchemaError as exc:  # a failed revision, or one this code does not know
                kept = f"; the copy made before the upgrade is {backup}" if backup else ""
                print(f"error: {exc}{kept}", file=sys.stderr)
                return 2
            print(f"database at {head} (head)")
            return 0
        state = "up to date" if current == head else "outdated: run `cka-atlas db upgrade`"
        print(f"current: {current or 'none'}\nhead: {head}\n{state}")
        return 0 if current == head else 1
    finally:
        db.dispose()


def run_demo(args: argparse.Namespace) -> int:
    from app.cli.demo import setup_demo
    from app.store.db import SchemaError

    settings = _settings(args)
    _logging(settings)
    try:
        job_id, queued = setup_demo(settings, args.zoo)
    except SchemaError as exc:
        return _refuse(exc)
    if not args.quiet:
        print(_orientation(settings, job_id, queued), file=sys.stderr)
    return 0


def _orientation(settings: Any, job_id: int, queued: bool) -> str:
    """What a newcomer needs once the demo is queued: the page, the store, the command."""
    from pathlib import Path

    from app.cli.store import describe_store
    from app.store.db import Database

    db = Database(settings.resolved_database_url)
    try:
        store = describe_store(db.engine, settings.data_dir)
    finally:
        db.dispose()
    activate = Path(sys.prefix) / "bin" / "activate"
    if sys.prefix != sys.base_prefix:  # in a virtual environment, as `make` makes one
        with contextlib.suppress(ValueError):  # outside this folder: the absolute path
            activate = activate.relative_to(Path.cwd())
        command = f"`source {activate}`, then `cka-atlas --help`"
    else:
        command = "`cka-atlas --help`"
    url = f"http://{settings.host}:{settings.port}"
    return (
        f"\nThe demo is {'queued' if queued else 'already queued'} (job {job_id}): the zoo's "
        "trainings, then its atlas. `cka-atlas serve` (or `cka-atlas worker`) runs them:\n"
        f"  page   {url}/  (the demo's progress, then the atlas; {url}/jobs lists the jobs)\n"
        f"  store  {store}\n"
        f"  CLI    {command} in another terminal, from this folder\n"
    )


def register(subparsers: Any) -> None:
    p = command(subparsers, "serve", run_serve, "Run the REST API (and the in-process worker).")
    p.add_argument(
        "--host",
        default=None,
        help="Bind address (default CKA_HOST, 127.0.0.1); 0.0.0.0 needs CKA_ALLOWED_HOSTS.",
    )
    p.add_argument("--port", type=int, default=None, help="Port (default CKA_PORT, 8000).")
    p.add_argument(
        "--demo",
        action="store_true",
        help="Queue the demo (the zoo's trainings, then its atlas) unless it is queued already, "
        "then serve at once; the in-process worker runs it.",
    )
    p.add_argument("--zoo", default="zoo", help="With --demo: zoo checkpoints to reuse (./zoo).")

    p = command(
        subparsers,
        "worker",
        run_worker,
        "Run jobs: a Celery worker when CKA_BROKER_URL is set, else a database poller.",
    )
    p.add_argument("--threads", type=int, default=None, help="Poller threads (no broker).")
    p.add_argument(
        "--name",
        default=None,
        help="Worker name (CKA_WORKER_NAME): the Celery node name NAME@host, so several "
        "workers can run on one host, and part of the worker id jobs record.",
    )

    p = command(subparsers, "db", run_db, "Database schema: upgrade or show the revision.")
    p.add_argument("db_command", choices=("upgrade", "current"))

    p = command(
        subparsers,
        "demo",
        run_demo,
        "Queue the demo as jobs: the zoo's trainings (checkpoints in --zoo are reused), "
        "then its atlas over digits; a worker or the server runs them.",
    )
    p.add_argument("--zoo", default="zoo", help="Zoo checkpoints to reuse (default ./zoo).")
    p.add_argument("--quiet", action="store_true", help="Print nothing but errors.")
