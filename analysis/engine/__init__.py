"""The run: K models over a batch plan, one forward pass each per batch, terms summed.

Owns the work of each batch (:mod:`.streaming`: the layers' Grams, the HSIC terms of every
layer pair, the Gram store's reuse, what the batch statistics are fed), the store of per-batch
Grams (:mod:`.gram_cache`) and CKA of feature matrices a caller already has (:mod:`.features`).
Below :mod:`analysis.shards` (which runs a range of batches through it) and
:mod:`analysis.comparison`; may import :mod:`analysis.batch_statistics`, the atlas,
:mod:`analysis.inference`, the options, :mod:`analysis.layers`, :mod:`analysis.data`,
:mod:`analysis.estimators` and the errors.
"""
