"""A bias read from a per-head table by an integer row per (query, key) pair (T5-1, SWIN-1).

``rel_b`` is (H, R); ``rows`` (1|B, Lq, Lk) int64 holds the row of every
pair. The bias is ``rel_b[h, rows[b, i, j]]``, (1|B, H, Lq, Lk); its VJP
sums the gradient of every pair into the row it read (a scatter-add).
"""

from __future__ import annotations

import numpy as np


def table_bias(rel_b: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(1|B, H, Lq, Lk) = rel_b[h, rows[b, i, j]]."""
    return np.moveaxis(rel_b[:, rows], 0, 1)


def table_bias_vjp(rows: np.ndarray, num_rows: int, g: np.ndarray) -> np.ndarray:
    """T5-5 (GRAD-1): d rel_b (H, R), g (B, H, Lq, Lk) summed over every pair that reads row r, per head."""
    H = g.shape[1]
    index = np.broadcast_to(rows[:, None], g.shape)  # (B, H, Lq, Lk)
    out = np.zeros((H, num_rows), dtype=np.float64)
    heads = np.broadcast_to(np.arange(H)[None, :, None, None], g.shape)
    np.add.at(out, (heads.ravel(), index.ravel()), g.ravel())
    return out
