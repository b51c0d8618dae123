"""Where a comparison's images come from: datasets, archives, uploaded files, input pipelines.

Owns the built-in and uploaded datasets (:mod:`.datasets`), bounded reading of ``.npz``
archives (:mod:`.npz`) and image files (:mod:`.images`), each model's input pipeline
(:mod:`.preprocessing`) and the replayable batch sources the engine reads (:mod:`.sources`).
May import :mod:`analysis.errors` and :mod:`models` (archives, preprocessing configs), nothing
else of :mod:`analysis`: it knows nothing of kernels, HSIC or atlases.
"""
