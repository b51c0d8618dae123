"""What a cell's CKA means: its p-value, its interval and its verdict, as plain math.

Owns the permutation null in closed form (:mod:`.null_moments`: a cell's exact moments and its
p-value) with its tail check (:mod:`.analytic_null`, :mod:`.null_draws`), the permutation null
drawn (:mod:`.permutation_null`, and :mod:`.significance` for two feature matrices), intervals
with the image as the unit (:mod:`.image_intervals`) or the batch (:mod:`.bootstrap`), and
q-values and verdicts (:mod:`.verdicts`). Functions of arrays: beneath the atlas, which reads
them; may import :mod:`analysis.options`, :mod:`analysis.estimators` and the errors, nothing
that runs a network (the baselines that do are :mod:`analysis.comparison`'s).
"""
