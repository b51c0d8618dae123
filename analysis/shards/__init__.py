"""Shards: one comparison's run split into ranges of batches, each run anywhere, combined.

Owns running a range of batches (:mod:`.shard`: ``run_partial``, ``Partial``, ``combine``,
``shard_ranges``, ``batch_count``) and a partial's safetensors file (:mod:`.file`). A whole run
is the combine of one range. Below :mod:`analysis.comparison` (which plans the ranges); may
import :mod:`analysis.engine` and everything beneath it.
"""
