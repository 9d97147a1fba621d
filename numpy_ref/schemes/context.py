"""What a scheme's hooks may know about one call besides q, k and its tables (REL-3)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Context:
    """Positions and sizes of one call, for the hooks of ``numpy_ref.schemes`` (REL-3, POS-1, POS-2).

    Axis legend (AXES-1): B batch, H heads, Lq / Lk query / key length, d head dim.
    """

    q_positions: np.ndarray  # (1|B, Lq) int64 (POS-1)
    k_positions: np.ndarray  # (1|B, Lk) int64
    delta: np.ndarray  # (1|B, Lq, Lk) int64, k_pos - q_pos (POS-2)
    batch: int  # B
    num_heads: int  # H
    head_dim: int  # d
    Lq: int
    Lk: int
