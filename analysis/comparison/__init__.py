"""One comparison, planned once: plan → run → combine → baselines → decide.

Owns the plan (:mod:`.plan`: the members and their layers, the batches or shards, the seed
ceiling's siblings, the phases' weights), its execution with the caller's hooks
(:mod:`.run`: :func:`analysis.compare` and the service's job both run it), and the baselines
(:mod:`.baselines`: untrained twins, the stand-in rule; :mod:`.seed_ceiling`: siblings), which
receive the run function they need. The top of the library's run: may import
:mod:`analysis.shards`, :mod:`analysis.engine` and everything beneath them, never
:mod:`analysis.plot` or :mod:`analysis.studies`.
"""
