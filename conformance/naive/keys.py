"""Relative distances and which keys a query may attend, for the naive emulation.

Rules POS-2, CAUSAL-1, WINDOW-1, MASK-2, MASK-4, MASK-7, BIAS-2. Axis legend: B batch,
H heads, Lq query length, Lk key length.

Independent of ``numpy_ref.masking`` on purpose: the naive emulation is the
unit of the tolerance budgets and the second implementation the reference is
checked against, so a bug in the reference's helpers must not move it the
same way. Each function here is written from the rule text, by a different
route (``np.subtract.outer`` per batch row, strict ``broadcast_to`` of each
condition, a count of allowed entries).
"""

from __future__ import annotations

from typing import Optional

import numpy as np


def positions(p: Optional[np.ndarray], length: int) -> np.ndarray:
    """POS-1, POS-3: positions as (1|B, L) integers; None means ``arange(L)``."""
    if p is None:
        return np.arange(length).reshape(1, length)
    return np.asarray(p).astype(np.int64).reshape(-1, length)  # any integer dtype; k - q must not wrap


def relative_distance(q_positions: np.ndarray, k_positions: np.ndarray) -> np.ndarray:
    """POS-2: delta[b, i, j] = k_pos[b, j] - q_pos[b, i].  (1|B, Lq), (1|B, Lk) -> (1|B, Lq, Lk)."""
    rows = max(len(q_positions), len(k_positions))  # 1, or B
    qs = np.broadcast_to(q_positions, (rows, q_positions.shape[-1]))
    ks = np.broadcast_to(k_positions, (rows, k_positions.shape[-1]))
    # subtract.outer(k, q)[j, i] = k_j - q_i: key minus query, transposed to (Lq, Lk)
    return np.stack([np.subtract.outer(k_row, q_row).T for q_row, k_row in zip(qs, ks)])


def allowed_keys(
    shape: tuple,
    delta: np.ndarray,
    *,
    causal: bool,
    mask: Optional[np.ndarray],
    bias: Optional[np.ndarray],
    window: Optional[tuple] = None,
) -> np.ndarray:
    """MASK-4: key j is allowed for query i iff mask AND (delta <= 0 if causal) AND in the window AND bias != -inf.

    ``shape`` is (B, H, Lq, Lk) and so is the result. Each condition must
    broadcast to it (``broadcast_to`` never grows ``shape``).
    """
    conditions = [np.ones(shape, dtype=bool)]
    if causal:
        conditions.append(np.less_equal(delta, 0)[:, np.newaxis])  # CAUSAL-1: (1|B, 1, Lq, Lk)
    if window is not None:  # WINDOW-1: the distance to each bound, not below 0
        left, right = window
        if left is not None:
            conditions.append(np.greater_equal(delta + left, 0)[:, np.newaxis])
        if right is not None:
            conditions.append(np.greater_equal(right - delta, 0)[:, np.newaxis])
    if mask is not None:
        mask = np.asarray(mask)
        assert mask.dtype == np.bool_, f"mask must be boolean (MASK-3), got {mask.dtype}"
        conditions.append(mask)  # MASK-2: combined by AND
    if bias is not None:
        conditions.append(~np.isneginf(np.asarray(bias)))  # BIAS-2: -inf disallows, NaN does not
    return np.all(np.stack([np.broadcast_to(c, shape) for c in conditions]), axis=0)


def dead_keys(allowed: np.ndarray) -> np.ndarray:
    """MASK-7: key j of batch element b is dead when no head and no query may attend it.

    (B, H, Lq, Lk) -> (B, Lk): the keys with zero allowed entries.
    """
    return np.count_nonzero(allowed, axis=(1, 2)) == 0
