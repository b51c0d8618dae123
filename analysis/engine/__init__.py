"""The run: K models over a batch plan, one forward pass each per batch, terms summed.

Owns :func:`analysis.compare` and the baselines it adds (:mod:`.compare`), reading a model's
layers (:mod:`.layers`), the work of each batch (:mod:`.streaming`), the one loop over batches
(:mod:`.batches`), the features kept for the whole-sample sensitivity (:mod:`.kept`) and the
store of per-batch Grams (:mod:`.gram_cache`). May import :mod:`analysis.data`,
:mod:`analysis.estimators`, :mod:`analysis.inference` (what a batch adds to the nulls and
intervals), :mod:`analysis.shards` (a comparison is the combine of one shard), the atlas, the
options and the errors.
"""
