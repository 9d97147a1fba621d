"""Swin's 2-D relative position bias in the reference (SWIN-1..SWIN-6, POS-5).

A position p < P is a prefix token; p >= P is the window token at row
(p - P) // Ww, column (p - P) % Ww (POS-5). A pair of window tokens reads
row (dh + Wh - 1)(2Ww - 1) + (dw + Ww - 1) of rel_b, (dh, dw) the key's
coordinates minus the query's, clipped to the window (SWIN-3); a pair with
a prefix token one of the three prefix rows (SWIN-4). Axis legend (AXES-1):
B, H, Lq, Lk; R the table rows.
"""

from __future__ import annotations

import numpy as np

from ._rows import table_bias, table_bias_vjp


def rows(scheme, q_positions: np.ndarray, k_positions: np.ndarray) -> np.ndarray:
    """SWIN-3, SWIN-4: the table row of every pair, (1|B, Lq, Lk) from positions (1|B, Lq), (1|B, Lk)."""
    (Wh, Ww), P = scheme.window, scheme.prefix_tokens
    qh, qw = np.divmod(q_positions - P, Ww)  # POS-5, floor division of the int64 positions (Context)
    kh, kw = np.divmod(k_positions - P, Ww)
    dh = np.clip(kh[:, None, :] - qh[:, :, None], 1 - Wh, Wh - 1)
    dw = kw[:, None, :] - qw[:, :, None]  # columns are residues mod Ww: |dw| <= Ww - 1 needs no clip
    row = (dh + Wh - 1) * (2 * Ww - 1) + (dw + Ww - 1)
    if not P:
        return row
    q_prefix = (q_positions < P)[:, :, None]
    k_prefix = (k_positions < P)[:, None, :]
    base = scheme.offset_rows
    prefix_row = np.where(q_prefix & k_prefix, base + 2, np.where(q_prefix, base, base + 1))
    return np.where(q_prefix | k_prefix, prefix_row, row)


def bias(scheme, params: dict, ctx):
    """SWIN-1: (1|B, H, Lq, Lk) = rel_b[h, row(q_pos_i, k_pos_j)]; saves the rows."""
    r = rows(scheme, ctx.q_positions, ctx.k_positions)
    return table_bias(params["rel_b"], r), r


def bias_vjp(scheme, params: dict, saved, g):
    """SWIN-1: d rel_b[h, r] = the sum of g over the pairs of head h that read row r."""
    return {"rel_b": table_bias_vjp(saved, scheme.num_rows, g)}


def literal_bias(scheme, params: dict, h: int, num_heads: int, q_pos: int, k_pos: int) -> float:
    """SWIN-3 / SWIN-4 for one pair: rel_b[h, scheme.row(q_pos, k_pos)]."""
    return float(params["rel_b"][h, scheme.row(q_pos, k_pos)])
