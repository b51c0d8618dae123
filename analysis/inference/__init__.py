"""What a cell's CKA means: its p-value, its interval, its baselines and its verdict.

Owns the permutation null in closed form (:mod:`.null_moments`: a cell's exact moments and its
p-value) with its tail check (:mod:`.analytic_null`, :mod:`.null_draws`), the permutation null
drawn (:mod:`.permutation_null`, and :mod:`.significance` for two feature matrices), intervals
with the image as the unit (:mod:`.image_intervals`) or the batch (:mod:`.bootstrap`), the
random-init and seed baselines (:mod:`.baselines`, :mod:`.seed_ceiling`), q-values and verdicts
(:mod:`.verdicts`) and the warnings about cells (:mod:`.flags`). May import
:mod:`analysis.estimators`, :mod:`analysis.engine` (the batch loop, and ``compare`` to run a
baseline), the atlas, the options, the errors and :mod:`models`.
"""
