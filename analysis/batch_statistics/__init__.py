"""What a run accumulates over its batches, one module per statistic, under one protocol.

Owns :class:`~analysis.batch_statistics.protocol.BatchStatistic` (what a statistic adds per batch,
its state as named arrays, how the states of two ranges of batches join, how it finishes into the
:class:`analysis.Atlas`), the statistics a comparison accumulates besides its HSIC sums — the batch
bootstrap's terms, the image-level interval's moments, the permutation null drawn, the analytic
null, the layer spectra, the sensitivity's features, the whole-sample measures
(:mod:`analysis.measures`) — and their registry (:mod:`.registry`), which the engine, the shards,
their files and the combine read generically; the features a run keeps for them
(:mod:`.kept`) and the warnings about an atlas's cells (:mod:`.flags`). Each statistic wraps
the math that lives in :mod:`analysis.inference`, :mod:`analysis.estimators` or
:mod:`analysis.measures`, and declares what the rest derives (its outputs, its options). Beneath
the options and the atlas, which read the registry: may import those three and the errors, and
reads the options and the finished atlas through the protocols of :mod:`.protocol`.
"""
