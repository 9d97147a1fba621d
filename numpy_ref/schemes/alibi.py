"""ALiBi in the reference: a bias of slope times distance, no tables (ALIBI-1..ALIBI-5).

bias[h, i, j] = -m_h * |delta_ij| (symmetric, ALIBI-3) or m_h * delta_ij
(linear, ALIBI-4), m_h the slope of query head h (ALIBI-2), in float64
from the exact integer distances (PREC-1). Axis legend (AXES-1): B, H, Lq, Lk.
"""

from __future__ import annotations

import numpy as np


def _form(scheme, delta):
    """ALIBI-3 / ALIBI-4: the distance factor, -|delta| or delta."""
    return -np.abs(delta) if scheme.symmetric else delta


def bias(scheme, params: dict, ctx):
    """ALIBI-1: (1|B, H, Lq, Lk) float64; nothing saved (no tables)."""
    slopes = np.asarray(scheme.slopes_for(ctx.num_heads), dtype=np.float64)
    return slopes[None, :, None, None] * _form(scheme, ctx.delta)[:, None], None  # int64 distances: exact


def bias_vjp(scheme, params: dict, saved, g):
    """No tables, no gradients (ALIBI-1)."""
    return {}


def literal_bias(scheme, params: dict, h: int, num_heads: int, q_pos: int, k_pos: int) -> float:
    """ALIBI-3 / ALIBI-4 for one pair of head h of num_heads (POS-2)."""
    delta = k_pos - q_pos
    return scheme.slopes_for(num_heads)[h] * (-abs(delta) if scheme.symmetric else delta)
