"""What a cell's CKA means: its p-value, its interval and its verdict, as plain math.

Owns the permutation null in closed form (:mod:`.null_moments`: a cell's exact moments and its
p-value) with its tail check (:mod:`.analytic_null`, :mod:`.null_draws`), the permutation null
drawn (:mod:`.permutation_null`), intervals with the image as the unit (:mod:`.image_intervals`)
or the batch (:mod:`.bootstrap`), and q-values and verdicts (:mod:`.verdicts`). Functions of
arrays: beneath the batch statistics, the options and the atlas, which read them; may import
:mod:`analysis.estimators` and the errors only, nothing that runs a network (the baselines that
do are :mod:`analysis.comparison`'s, ``cka_test`` is :mod:`analysis.engine.significance`).
"""
