"""Swin's 2-D bias in the naive emulation: timm's index construction, then reversed (SWIN-1..SWIN-4).

timm builds ``relative_position_index`` from a meshgrid of window
coordinates as query minus key; this spec indexes key minus query
(SWIN-3), which is the reversed row ``R0 - 1 - index``. Here positions are
turned into coordinates (POS-5), timm's index is built per pair and
reversed, and the three prefix rows are set as BEiT sets them (SWIN-4).
"""

from __future__ import annotations

import numpy as np

from . import _tables
from .base import NaiveScheme, register


def swin_rows(scheme, q_positions: np.ndarray, k_positions: np.ndarray) -> np.ndarray:
    """(1|B, Lq, Lk) table rows."""
    (Wh, Ww), P = scheme.window, scheme.prefix_tokens
    qp = q_positions.astype(np.int64)[:, :, None] - P
    kp = k_positions.astype(np.int64)[:, None, :] - P
    rel_h = np.clip(qp // Ww - kp // Ww, -(Wh - 1), Wh - 1) + Wh - 1  # timm: query minus key, shifted
    rel_w = np.clip(qp % Ww - kp % Ww, -(Ww - 1), Ww - 1) + Ww - 1
    timm_index = rel_h * (2 * Ww - 1) + rel_w
    R0 = (2 * Wh - 1) * (2 * Ww - 1)
    rows = R0 - 1 - timm_index
    if P:
        q_pre, k_pre = qp < 0, kp < 0
        rows = np.where(q_pre, R0, rows)  # BEiT: [0, :] = R - 3
        rows = np.where(k_pre & ~q_pre, R0 + 1, rows)  # [:, 0] = R - 2
        rows = np.where(q_pre & k_pre, R0 + 2, rows)  # [0, 0] = R - 1
    return rows


@register
class SwinHooks(NaiveScheme):
    name = "swin"

    def bias(self, scheme, P, params, num_heads, q_positions, k_positions, delta):
        return _tables.read(P, params["rel_b"], swin_rows(scheme, q_positions, k_positions))

    def bias_vjp(self, scheme, P, params, num_heads, q_positions, k_positions, delta, grad):
        rows = swin_rows(scheme, q_positions, k_positions)
        return {"rel_b": _tables.read_vjp(P, params["rel_b"], rows, grad)}
