"""Every selected layer's features over a run's batches, for the whole-sample sensitivity.

The whole-sample top direction (:mod:`analysis.estimators.spectrum`) needs each layer's features
over all the samples, n × d. They are copied batch by batch into one buffer per layer, sized at
its first batch for the whole plan (the planned batches × that batch's size, grown by
doubling if more come), so that:

* the batches' activations go back to the allocator (holding them made every later forward
  pass take fresh memory, whose pages the kernel zeroes), and
* no copy joins the batches at the end (on the timm pair of ``bench/bench_company.py`` that
  join took 1.5 s of a 6-8 s run, as long as the rest of the sensitivity twice over).

A CUDA run keeps the buffers on the GPU, where the whole-sample step then runs, while they
take at most :data:`KEEP_SHARE` of the memory that was free at the first batch; past it every
buffer moves to the host, and the rest of the run keeps them there.
"""

from __future__ import annotations

import torch

__all__ = ["KEEP_SHARE", "KeptFeatures"]

# The rest of the GPU's free memory is left to the forward passes of the batches to come and
# to the whole-sample step (its float64 slabs and formed Grams).
KEEP_SHARE = 1 / 2


class KeptFeatures:
    """Each of ``layers`` layers' features (rows: samples, in batch order), kept on ``device``
    where it is a GPU with room, else on the host. ``batches``: how many the run plans (None
    when unknown), to size each buffer once."""

    def __init__(self, layers: int, batches: int | None, device: torch.device) -> None:
        self.buffers: list[torch.Tensor | None] = [None] * layers
        self.rows = [0] * layers
        self.sizes: list[int] = []  # samples of each batch kept, in order
        self.batches = batches
        self.device = device if device.type == "cuda" else torch.device("cpu")
        self.room: int | None = None  # bytes the GPU may still give the buffers

    def add(self, layer: int, features: torch.Tensor) -> None:
        """One batch's features of ``layer`` ((b, …): flattened to (b, d)); the batches of
        every layer come in the same order, layer 0's marking each new one."""
        b = features.shape[0]
        flat = features.reshape(b, -1)
        if layer == 0:
            self.sizes.append(b)
        start, buffer = self.rows[layer], self.buffers[layer]
        if buffer is None or start + b > buffer.shape[0]:
            buffer = self._grow(layer, flat, start + b)
        buffer[start : start + b].copy_(flat)
        self.rows[layer] = start + b

    def last(self, layer: int, b: int) -> torch.Tensor:
        """The features of ``layer``'s last ``b`` samples (its batch just kept)."""
        buffer = self.buffers[layer]
        assert buffer is not None
        return buffer[self.rows[layer] - b : self.rows[layer]]

    def layers(self) -> list[torch.Tensor]:
        """Each layer's features over the kept batches (n, d), views of the buffers."""
        return [
            torch.zeros(0, 0) if buffer is None else buffer[:rows]
            for buffer, rows in zip(self.buffers, self.rows, strict=True)
        ]

    def keep_whole(self, layers: list[torch.Tensor]) -> None:
        """Hold each layer's features (n, d) over the whole sample as they are (full mode, which
        joins them itself), as one batch."""
        self.buffers = list(layers)
        self.rows = [int(x.shape[0]) for x in layers]
        self.sizes = [self.rows[0]] if layers else []

    def _grow(self, layer: int, flat: torch.Tensor, need: int) -> torch.Tensor:
        old = self.buffers[layer]
        rows = max(need, (self.batches or 1) * flat.shape[0] if old is None else 2 * old.shape[0])
        size = rows * flat[0].numel() * flat.element_size()
        if self.device.type == "cuda":
            if self.room is None:
                self.room = int(torch.cuda.mem_get_info(self.device)[0] * KEEP_SHARE)
            self.room -= size - (0 if old is None else old.numel() * old.element_size())
            if self.room < 0:
                self._to_host()
                old = self.buffers[layer]
        buffer = torch.empty(rows, flat.shape[1], dtype=flat.dtype, device=self.device)
        if old is not None:
            buffer[: self.rows[layer]].copy_(old[: self.rows[layer]])
        self.buffers[layer] = buffer
        return buffer

    def _to_host(self) -> None:
        self.device = torch.device("cpu")
        for k, (buffer, rows) in enumerate(zip(self.buffers, self.rows, strict=True)):
            if buffer is not None:
                host = torch.empty(buffer.shape, dtype=buffer.dtype)
                host[:rows].copy_(buffer[:rows])
                self.buffers[k] = host
