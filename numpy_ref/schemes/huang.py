"""Huang et al. 2018 (Music Transformer) in the reference: an unclipped key term and value term
(HUANG-1..HUANG-6).

Row ``delta + M - 1`` of ``rel_k`` holds distance delta; a distance beyond
the table adds nothing (HUANG-3). Two O(L d)-memory paths, nothing of shape
(Lq, Lk, d) (HUANG-4): with contiguous positions one matmul against the
reachable rows then the skew, otherwise ``q @ rel_k.T`` then a gather by
relative index. The value term (HUANG-6) sums the weights per table row, the
pairs beyond the table left out, then ``@ rel_v``. Axis legend (AXES-1): B, H, Lq, Lk, d; R = 2M - 1 rows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import relative as rel
from ._literal import dot, table_row


class Skewed(NamedTuple):
    q: np.ndarray  # (B, H, Lq, d)
    rows: np.ndarray  # the reachable rows (1|B, 1|H, W, d), W = Lq + Lk - 1
    row: np.ndarray  # (1|B, W) table row of each reachable distance
    row_valid: np.ndarray  # (1|B, W) whether that distance is in the table


class Gathered(NamedTuple):
    q: np.ndarray  # (B, H, Lq, d)
    table4: np.ndarray  # rel_k as (1, 1|H, R, d)
    index: np.ndarray  # (1|B, Lq, Lk) table row of each pair (0 where not valid)
    valid: np.ndarray  # (1|B, Lq, Lk) |delta| <= M - 1


class ValueSaved(NamedTuple):
    index: np.ndarray  # (1|B, Lq, Lk) table row of each pair (0 where not valid)
    valid: np.ndarray  # (1|B, Lq, Lk) |delta| <= M - 1
    buckets: np.ndarray  # (B, H, Lq, R): the weights of the valid pairs summed per table row


# ------------------------------------------------------------------ vectorised hooks
def key_term(scheme, params: dict, q: np.ndarray, ctx):
    """HUANG-2..HUANG-4: term[b, h, i, j] = q_i . rel_k[delta_ij + M - 1], 0 where |delta| > M - 1.

    q (B, H, Lq, d) -> (B, H, Lq, Lk). Contiguous positions: the reachable
    rows, one matmul, the skew; otherwise a gather by relative index.
    """
    table4 = rel.as_4d(params["rel_k"])
    offset = rel.contiguous_offset(ctx.q_positions, ctx.k_positions)
    if offset is not None:  # HUANG-4: reachable rows, one matmul, then the skew
        rows, row, row_valid = rel.reachable_rows(table4, offset, ctx.Lq, ctx.Lk, scheme.max_len)
        return np.array(rel.skew(rel.rows_logits(q, rows), ctx.Lk)), Skewed(q, rows, row, row_valid)
    index, valid = rel.huang_index(ctx.delta, scheme.max_len)  # HUANG-4: gather by relative index
    term = np.where(valid[:, None], rel.gather_logits(q, table4, index), 0.0)
    return term, Gathered(q, table4, index, valid)


def key_term_vjp(scheme, params: dict, saved, g_term: np.ndarray):
    """VJP of ``key_term`` (HUANG-2..HUANG-4, GRAD-1): (dq (B, H, Lq, d), {"rel_k": d rel_k})."""
    if isinstance(saved, Skewed):  # unskew to the reachable rows, then back into the table rows
        g_rows = rel.unskew(g_term, saved.rows.shape[-2])  # (B, H, Lq, W)
        dq, d_rows = rel.rows_logits_vjp(saved.q, saved.rows, g_rows)
        d_table4 = rel.scatter_rows(rel.as_4d(params["rel_k"]).shape, saved.row, saved.row_valid, d_rows)
    else:  # the gather, with the validity of HUANG-3
        g_term = np.where(saved.valid[:, None], g_term, 0.0)
        dq, d_table4 = rel.gather_logits_vjp(saved.q, saved.table4, saved.index, g_term)
    return dq, {"rel_k": d_table4.reshape(params["rel_k"].shape)}


def value_term(scheme, params: dict, w: np.ndarray, ctx):
    """HUANG-6 (after dropout, DROP-4): o_add[b, h, i] = sum_j w'_ij rel_v[delta_ij + M - 1] over the pairs
    with |delta| <= M - 1 = buckets(w') @ rel_v.  w' (B, H, Lq, Lk) -> (B, H, Lq, dv)."""
    index, valid = rel.huang_index(ctx.delta, scheme.max_len)
    buckets = rel.scatter_buckets(np.where(valid[:, None], w, 0.0), index, scheme.num_rows)
    return buckets @ rel.as_4d(params["rel_v"]), ValueSaved(index, valid, buckets)


def value_term_vjp(scheme, params: dict, saved: ValueSaved, g_o: np.ndarray):
    """VJP of ``value_term`` (HUANG-6, GRAD-1): (d w' (B, H, Lq, Lk), {"rel_v": d rel_v}); a pair beyond
    the table gets no gradient from this term."""
    rv4 = rel.as_4d(params["rel_v"])
    d_rv4 = rel.sum_to(saved.buckets.swapaxes(-1, -2) @ g_o, rv4.shape)
    d_w = np.where(saved.valid[:, None], rel.gather_buckets(g_o @ rv4.swapaxes(-1, -2), saved.index), 0.0)
    return d_w, {"rel_v": d_rv4.reshape(params["rel_v"].shape)}


# ------------------------------------------------------- literal forms (definition)
def literal_key_term(scheme, params: dict, h: int, q_vec, q_pos: int, k_pos: int) -> float:
    """HUANG-2/3 for one pair: q_vec . rel_k[delta + M - 1] if |delta| <= M - 1, else 0 (before s_rel)."""
    delta = k_pos - q_pos  # POS-2
    if abs(delta) > scheme.max_len - 1:  # HUANG-3: beyond the table, no term
        return 0.0
    return dot(q_vec, table_row(params["rel_k"], h, delta + scheme.max_len - 1))


def literal_value_row(scheme, params: dict, h: int, q_pos: int, k_pos: int) -> np.ndarray:
    """HUANG-6 for one pair: rel_v[delta + M - 1], or a zero row beyond the table (HUANG-3's rule)."""
    delta = k_pos - q_pos  # POS-2
    if abs(delta) > scheme.max_len - 1:
        return np.zeros(params["rel_v"].shape[-1])
    return table_row(params["rel_v"], h, delta + scheme.max_len - 1)
