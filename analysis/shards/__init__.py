"""Shards: one comparison split into ranges of batches, each run anywhere, combined into the atlas.

Owns a shard's record and computing it (:mod:`.shard`: ``Partial``, ``compare_partial``,
``combine``, ``shard_ranges``) and its safetensors file (:mod:`.file`). May import
:mod:`analysis.engine` (the run of a range), :mod:`analysis.inference` (finishing the nulls and
intervals), :mod:`analysis.estimators`, :mod:`analysis.data`, the atlas, the options and the
errors.
"""
