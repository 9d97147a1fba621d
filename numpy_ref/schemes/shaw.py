"""Shaw et al. 2018 in the reference: a key term, a key-side term and a value term by clipped distance
(SHAW-1..SHAW-7).

Every hook looks table rows up by ``idx = clip(delta, -k, k) + k`` (SHAW-2).
None builds an (Lq, Lk, d) array: the key term is ``q @ rel_k.T`` then a
gather (SHAW-3), the key-side term ``k @ table.T`` then a gather per key
(SHAW-6), the value term sums the weights per row then ``@ rel_v``
(SHAW-4). Axis legend (AXES-1): B, H, Lq, Lk, d; R = 2k + 1 rows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import relative as rel
from ._literal import dot, table_row


class KeySaved(NamedTuple):
    q: np.ndarray  # (B, H, Lq, d)
    table4: np.ndarray  # rel_k as (1, 1|H, R, d)
    index: np.ndarray  # (1|B, Lq, Lk), SHAW-2


class KeySideSaved(NamedTuple):
    k: np.ndarray  # (B, H, Lk, d), each query head's key head
    table4: np.ndarray  # rel_k or rel_q as (1, 1|H, R, d)
    index: np.ndarray  # (1|B, Lq, Lk), SHAW-2


class ValueSaved(NamedTuple):
    index: np.ndarray  # (1|B, Lq, Lk), SHAW-2
    buckets: np.ndarray  # (B, H, Lq, R): weights summed per table row


# ------------------------------------------------------------------ vectorised hooks
def key_term(scheme, params: dict, q: np.ndarray, ctx):
    """SHAW-3: term[b, h, i, j] = q_i . rel_k[idx[b, i, j]] (SHAW-2 index, REL-2 tables).  (B, H, Lq, Lk)"""
    table4 = rel.as_4d(params["rel_k"])
    index = rel.shaw_index(ctx.delta, scheme.max_distance)
    return rel.gather_logits(q, table4, index), KeySaved(q, table4, index)


def key_term_vjp(scheme, params: dict, saved: KeySaved, g_term: np.ndarray):
    """VJP of ``key_term`` (SHAW-3, GRAD-1): (dq (B, H, Lq, d), {"rel_k": d rel_k})."""
    dq, d_table4 = rel.gather_logits_vjp(saved.q, saved.table4, saved.index, g_term)
    return dq, {"rel_k": d_table4.reshape(params["rel_k"].shape)}


def key_side_table(scheme) -> str:
    """SHAW-6: the table the key-side term reads: ``rel_k`` (``key_side="shared"``) or ``rel_q`` (``"own"``)."""
    return "rel_k" if scheme.key_side == "shared" else "rel_q"


def key_side_term(scheme, params: dict, k: np.ndarray, ctx):
    """SHAW-6: term[b, h, i, j] = k_j . table[idx[b, i, j]], before its factor (SHAW-7).  (B, H, Lq, Lk)"""
    table4 = rel.as_4d(params[key_side_table(scheme)])
    index = rel.shaw_index(ctx.delta, scheme.max_distance)
    return rel.gather_key_side(k, table4, index), KeySideSaved(k, table4, index)


def key_side_term_vjp(scheme, params: dict, saved: KeySideSaved, g_term: np.ndarray):
    """VJP of ``key_side_term`` (SHAW-6, GRAD-1): (dk (B, H, Lk, d), {table: d table})."""
    dk, d_table4 = rel.gather_key_side_vjp(saved.k, saved.table4, saved.index, g_term)
    name = key_side_table(scheme)
    return dk, {name: d_table4.reshape(params[name].shape)}


def value_term(scheme, params: dict, w: np.ndarray, ctx):
    """SHAW-4 (after dropout, DROP-4): o_add[b, h, i] = sum_j w'_ij rel_v[idx_ij] = buckets(w') @ rel_v.

    w' (B, H, Lq, Lk) -> (B, H, Lq, d); buckets (B, H, Lq, R) hold the
    weights summed per table row.
    """
    index = rel.shaw_index(ctx.delta, scheme.max_distance)
    buckets = rel.scatter_buckets(w, index, scheme.num_rows)
    return buckets @ rel.as_4d(params["rel_v"]), ValueSaved(index, buckets)


def value_term_vjp(scheme, params: dict, saved: ValueSaved, g_o: np.ndarray):
    """VJP of ``value_term`` (SHAW-4, GRAD-1): (d w' (B, H, Lq, Lk), {"rel_v": d rel_v}).

    o_add = buckets @ rel_v: d rel_v = buckets.T @ g_o, d buckets = g_o @ rel_v.T;
    buckets scatter w' by index, so the adjoint is the gather.
    """
    rv4 = rel.as_4d(params["rel_v"])
    d_rv4 = rel.sum_to(saved.buckets.swapaxes(-1, -2) @ g_o, rv4.shape)
    d_w = rel.gather_buckets(g_o @ rv4.swapaxes(-1, -2), saved.index)
    return d_w, {"rel_v": d_rv4.reshape(params["rel_v"].shape)}


# ------------------------------------------------------- literal forms (definition)
def _row(scheme, q_pos: int, k_pos: int) -> int:
    """SHAW-2: clip(k_pos - q_pos, -k, k) + k (POS-2)."""
    k = scheme.max_distance
    return min(max(k_pos - q_pos, -k), k) + k


def literal_key_term(scheme, params: dict, h: int, q_vec, q_pos: int, k_pos: int) -> float:
    """SHAW-3 for one pair: q_vec . rel_k[idx] (before s_rel, SCALE-3)."""
    return dot(q_vec, table_row(params["rel_k"], h, _row(scheme, q_pos, k_pos)))


def literal_key_side_term(scheme, params: dict, h: int, k_vec, q_pos: int, k_pos: int) -> float:
    """SHAW-6 for one pair: k_vec . table[idx] (before its factor, SHAW-7)."""
    return dot(k_vec, table_row(params[key_side_table(scheme)], h, _row(scheme, q_pos, k_pos)))


def literal_value_row(scheme, params: dict, h: int, q_pos: int, k_pos: int) -> np.ndarray:
    """SHAW-4 for one pair: rel_v[idx], added to the output with the pair's weight w'."""
    return table_row(params["rel_v"], h, _row(scheme, q_pos, k_pos))
