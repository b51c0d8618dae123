"""Subcommands of the ``cka-atlas`` CLI, one module each; each exposes ``register``."""
