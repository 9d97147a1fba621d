"""Which keys a query may attend, and the softmax that honours it.

Rules CAUSAL-1, WINDOW-1, MASK-2, MASK-4..MASK-7, BIAS-2, SOFTMAX-1, SOFTCAP-1.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


def relative_distance(q_positions: np.ndarray, k_positions: np.ndarray) -> np.ndarray:
    """POS-2: delta[b, i, j] = k_pos[b, j] - q_pos[b, i].  (1 or B, Lq, Lk), int64."""
    return k_positions[:, None, :] - q_positions[:, :, None]


def allowed_keys(
    shape,
    delta: np.ndarray,
    *,
    causal: bool,
    mask: Optional[np.ndarray],
    bias: Optional[np.ndarray],
    window: Optional[tuple] = None,
) -> np.ndarray:
    """MASK-4: allowed[b, h, i, j] = mask AND (delta <= 0 if causal) AND in the window AND bias != -inf.

    The terms: CAUSAL-1, WINDOW-1, MASK-2 (the mask, combined by AND), BIAS-2 (a -inf bias); the keys no
    query may attend are MASK-7's dead keys.

    ``shape`` is (B, H, Lq, Lk); the result has exactly that shape.
    """
    allowed = np.ones(shape, dtype=bool)
    if causal:
        allowed &= (delta <= 0)[:, None]  # CAUSAL-1
    if window is not None:  # WINDOW-1: -left <= delta <= right, a None side unbounded
        left, right = window
        if left is not None:
            allowed &= (delta >= -left)[:, None]
        if right is not None:
            allowed &= (delta <= right)[:, None]
    if mask is not None:
        allowed &= mask  # MASK-2: combined by AND
    if bias is not None:
        allowed &= bias != -np.inf  # BIAS-2
    return allowed


def dead_keys(allowed: np.ndarray) -> np.ndarray:
    """MASK-7: key j of batch element b is dead when no head and no query may attend it.  (B, Lk)"""
    return ~allowed.any(axis=(1, 2))


def masked_softmax(logits: np.ndarray, allowed: np.ndarray, mask_fill: Optional[float]) -> np.ndarray:
    """SOFTMAX-1 over the key axis, with MASK-5 (mask_fill None) or MASK-6 (a float).

    MASK-5: a disallowed key gets weight exactly 0 and a row with no allowed
    key gets all-zero weights. ``where`` (not multiplication) keeps NaN and
    -inf in disallowed logits out of the arithmetic: 0 * inf would be NaN.
    MASK-6: disallowed logits are replaced by ``mask_fill`` and the softmax
    runs over every key, so a fully masked row averages uniformly.
    """
    if mask_fill is not None:
        z = np.where(allowed, logits, mask_fill)
        z = z - z.max(axis=-1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=-1, keepdims=True)
    z = np.where(allowed, logits, -np.inf)
    row_max = z.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # rows with no allowed key
    e = np.where(allowed, np.exp(z - row_max), 0.0)
    denom = e.sum(axis=-1, keepdims=True)
    return np.where(denom > 0, e / np.where(denom > 0, denom, 1.0), 0.0)


def masked_softmax_vjp(
    weights: np.ndarray, allowed: np.ndarray, grad_weights: np.ndarray, rows: Optional[np.ndarray] = None
) -> np.ndarray:
    """The gradient of the logits from the gradient of the weights.

    dz = w * (dw - sum_j w dw); a disallowed logit is a constant (MASK-5: -inf,
    MASK-6: mask_fill), so its gradient is 0 (GRAD-2). ``rows`` (the leading
    axes of ``weights``), when given, is the row sum to use instead of
    ``sum_j w dw`` (BLOCK-6: a block of keys takes its whole row's).
    """
    if rows is None:
        rows = (weights * grad_weights).sum(axis=-1)
    dz = weights * (grad_weights - rows[..., None])
    return np.where(allowed, dz, 0.0)


def softcap(score: np.ndarray, cap: float):
    """SOFTCAP-1: (cap * tanh(score / cap), tanh(score / cap)); the second is what the VJP needs."""
    t = np.tanh(score / cap)
    return cap * t, t


def softcap_vjp(t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """d/dscore of cap * tanh(score / cap) is 1 - tanh^2 (SOFTCAP-1, GRAD-1)."""
    return g * (1.0 - t * t)
