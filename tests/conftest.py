"""Suite-wide settings: deterministic, bounded CPU use."""

from __future__ import annotations

import torch

# Two cores on CI; more threads than cores only adds contention.
torch.set_num_threads(min(2, torch.get_num_threads()))
