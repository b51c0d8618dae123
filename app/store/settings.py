"""Service configuration, read from ``CKA_``-prefixed environment variables.

Every setting has a default that lets the service run with nothing configured: a SQLite
file and the artifact store under ``./var``, and an in-process worker. Production sets
``CKA_DATABASE_URL`` (PostgreSQL) and ``CKA_BROKER_URL`` (Redis, Celery workers).
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["WILDCARD_HOSTS", "Settings"]

# Bind addresses that listen on every interface: any name may reach the service.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


class Settings(BaseSettings):
    """All knobs of the service; the field name in upper case with ``CKA_`` is the variable."""

    model_config = SettingsConfigDict(env_prefix="CKA_", extra="ignore", frozen=True)

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL. Default: sqlite file `cka-atlas.db` under CKA_DATA_DIR; "
        "PostgreSQL as `postgresql+psycopg://user:pass@host:5432/db`.",
    )
    data_dir: Path = Field(
        default=Path("var"), description="Artifact store: checkpoints, datasets, Grams, heatmaps."
    )
    broker_url: str | None = Field(
        default=None,
        description="Celery broker (Redis). When set the API only enqueues and "
        "`cka-atlas worker` runs the jobs; when unset an in-process thread pool does.",
    )
    celery_queue: str = Field(default="cka-atlas", description="Celery queue name.")
    api_tokens: str = Field(
        default="",
        description="Comma-separated bearer tokens with full access (write and admin); "
        "scoped tokens come from `cka-atlas token create`. With no token anywhere, writes "
        "are open.",
    )
    write_rate: str = Field(
        default="",
        description="Writes and uploads allowed per token (per client address without one), "
        "e.g. `60/minute` or `10/second;500/hour`; beyond it 429 with Retry-After. Counted "
        "in Redis when CKA_BROKER_URL is one, in memory otherwise. Empty: no limit.",
    )
    read_requires_token: bool = Field(
        default=False, description="Require a token for reads as well."
    )
    max_upload_bytes: int = Field(
        default=512 * 1024 * 1024, gt=0, description="Largest accepted upload body; larger is 413."
    )
    max_dataset_bytes: int = Field(
        default=4 << 30,
        gt=0,
        description="Largest dataset accepted, as a comparison holds it: its images as float32 "
        "(N×C×H×W×4 bytes; the default is 1 GiB of 8-bit pixels). An upload is checked "
        "against it from its headers before anything is decoded, and the API checks and "
        "hashes an upload a slice at a time, never holding its images.",
    )
    max_model_bytes: int = Field(
        default=16 << 30,
        gt=0,
        description="Most memory one model may need (weights, optimizer state, a batch's "
        "activations: models.estimate) for a training, study or comparison to be queued.",
    )
    worker_threads: int = Field(default=1, ge=0, description="Threads of the in-process worker.")
    cpu_threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="CPU threads (torch's intra-op pool, BLAS) per job thread, pinned; default: "
        "as each job starts, the CPUs of its share (this process's affinity divided among its "
        "worker threads) that other processes left idle (app.jobs.threads).",
    )
    device: str = Field(
        default="auto",
        description="Torch device for jobs, trainings included: auto, cpu, cuda, cuda:1…",
    )
    host: str = Field(default="127.0.0.1", description="Address `cka-atlas serve` binds.")
    allowed_hosts: str = Field(
        default="",
        description="Comma-separated host names (the Host header without its port) the "
        "service answers to besides localhost, 127.0.0.1, [::1] and CKA_HOST; `*` answers "
        "any. Other names get 400, so a page that rebinds its own name to this address "
        "(DNS rebinding) reads nothing. Required when CKA_HOST is a wildcard (0.0.0.0, ::): "
        "`cka-atlas serve` refuses to start without it (an app made otherwise answers only "
        "the localhost names).",
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Port `cka-atlas serve` binds.")
    log_level: str = Field(default="info", description="Log level: debug, info, warning, error.")
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto",
        description="Log lines as JSON objects (with the job id) or plain text; auto: plain "
        "text on a terminal, JSON otherwise (a container, a file, a log pipeline).",
    )
    access_log: bool = Field(
        default=False,
        description="One log line per HTTP request (uvicorn's access log); off by default, "
        "since an open page polls its jobs every second or two.",
    )
    heartbeat_s: float = Field(default=5.0, gt=0, description="Seconds between job heartbeats.")
    stale_after_s: float = Field(
        default=120.0, gt=0, description="A running job without heartbeat this long is re-queued."
    )
    queued_grace_s: float = Field(
        default=60.0,
        gt=0,
        description="A job queued this long that no worker has taken is published to the "
        "Celery workers again by an idle worker's reaper, at most once per this interval (a "
        "broker that lost its message, or could not be reached when the job was queued).",
    )
    max_attempts: int = Field(
        default=5,
        ge=1,
        description="A stale job that has already been started this many times is failed "
        "instead of re-queued (its worker keeps dying: out of memory, say).",
    )
    job_timeout_s: int = Field(
        default=6 * 3600,
        gt=0,
        description="Longest run of a job, in seconds: past it the job stops at its next "
        "check and its runner ends it failed (job_timeout) even if it reaches none; the "
        "broker's visibility timeout exceeds it.",
    )
    job_memory_gb: float | None = Field(
        default=None,
        gt=0,
        le=1 << 20,
        allow_inf_nan=False,
        description="Most memory, in GiB, one comparison may hold at its peak (its images, a "
        "batch's features and Grams, the features the measures keep, the bootstrap's and the "
        "null's arrays: analysis.comparison_bytes), checked before it is queued (422 "
        "`job_too_large`, naming its largest parts). Default: three quarters of this machine's "
        "memory.",
    )
    shard_batches: int = Field(
        default=0,
        ge=0,
        description="Split a minibatch comparison of more batches than this into shards of at "
        "most this many batches, run by any free worker and combined exactly (0: only when "
        "a request asks, with `shards`).",
    )
    worker_name: str = Field(
        default="",
        description="Name of this worker process (`cka-atlas worker --name`): the Celery node "
        "name, and part of the worker id that jobs and shard diagnostics record.",
    )
    model_cache_size: int = Field(
        default=8, ge=1, description="Checkpoints kept loaded per process."
    )
    pretrained_dir: Path | None = Field(
        default=None,
        description="Operator-provided published weights: `<timm name>.safetensors` files "
        "and/or a Hugging Face cache, read offline. Only through it does a timm model with "
        "`pretrained: true` get weights; nothing is ever downloaded.",
    )
    poll_s: float = Field(
        default=1.0, gt=0, description="Idle poll interval of the in-process worker."
    )

    @property
    def host_names(self) -> frozenset[str] | None:
        """Host names requests may name (lower case, IPv6 without brackets); None: any.

        Not cached: ``model_copy(update=...)`` would carry a cached value over."""
        configured = {h.strip().lower().strip("[]") for h in self.allowed_hosts.split(",")}
        configured.discard("")
        if "*" in configured:
            return None
        bind = self.host.strip().lower().strip("[]")
        return frozenset(configured | {"localhost", "127.0.0.1", "::1", bind} - WILDCARD_HOSTS)

    @property
    def unnamed_wildcard(self) -> bool:
        """Bound to every interface with no CKA_ALLOWED_HOSTS: what `serve` refuses, since
        the names clients use are unknown (only the localhost names would be answered)."""
        bind = self.host.strip().lower().strip("[]")
        return bind in WILDCARD_HOSTS and not self.allowed_hosts.strip(", ")

    @cached_property
    def tokens(self) -> frozenset[str]:
        """The accepted bearer tokens (empty set: writes need no token)."""
        return frozenset(t.strip() for t in self.api_tokens.split(",") if t.strip())

    @field_validator("write_rate")
    @classmethod
    def _rate_parses(cls, value: str) -> str:
        if value.strip():
            from limits import parse_many

            parse_many(value)  # ValueError: not a rate string
        return value

    @field_validator("worker_name")
    @classmethod
    def _name_is_a_node_name(cls, value: str) -> str:
        # part of a Celery node name (NAME@host) and of worker ids split on ":"
        if not re.fullmatch(r"[A-Za-z0-9_.-]{0,64}", value):
            raise ValueError(f"{value!r} must be at most 64 letters, digits, '.', '_' or '-'")
        return value

    @property
    def job_memory_bytes(self) -> int:
        """:attr:`job_memory_gb` in bytes (default: three quarters of this machine's memory)."""
        if self.job_memory_gb is not None:
            return int(self.job_memory_gb * 2**30)
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 3 // 4

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to a SQLite file inside the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'cka-atlas.db').as_posix()}"
