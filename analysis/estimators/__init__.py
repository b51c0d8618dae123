"""The numbers of one batch: kernels, HSIC estimators, CKA from HSIC, layer spectra, directions.

Owns the Gram of a batch (:mod:`.kernels`), the HSIC of every layer pair and CKA from it
(:mod:`.hsic`), the per-layer spectra and the top-component sensitivity (:mod:`.spectrum`,
:mod:`.directions`). Plain functions of tensors: may import :mod:`analysis.errors` only.
"""
