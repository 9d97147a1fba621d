"""A per-head table read at one row per (query, key) pair, for the naive bias hooks (T5-1, SWIN-1)."""

from __future__ import annotations

import numpy as np


def read(P, table: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(1|B, H, Lq, Lk): table[h, rows[b, i, j]], the stored (t-valued) entries, exact."""
    return np.stack([table[h][rows] for h in range(table.shape[0])], axis=1).astype(P.acc)


def read_vjp(P, table: np.ndarray, rows: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """d table (H, R): every pair's logit gradient added into the row it read, in acc, rounded to t once."""
    H, R = table.shape
    out = np.zeros((H, R), P.acc)
    index = np.broadcast_to(rows[:, None], grad.shape)
    for h in range(H):
        np.add.at(out[h], index[:, h].reshape(-1), grad[:, h].reshape(-1).astype(P.acc))
    return P.rnd(out)
