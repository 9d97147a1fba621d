"""Huang et al. 2018 (Music Transformer) in JAX: an unclipped key term and value term (HUANG-1..HUANG-6).

Row ``delta + M - 1`` of ``rel_k`` holds distance delta; a distance beyond
the table adds nothing (HUANG-3). Two O(L d)-memory algorithms, nothing of
shape (Lq, Lk, d) (HUANG-4):

- plain (``key_term``, for the ``xla`` kernel): ``q @ rel_k.T`` then a gather
  by relative index, zero where the distance is beyond the table;
- tiled (``key_term_tiled``, for the ``tiles`` kernel): with default
  positions one matmul against only the rows the tile's distances reach,
  then the skew (``huang_skew_term``); with explicit positions the plain gather.

The value term (HUANG-6, both kernels) sums the weights per table row, the
pairs beyond the table left out, then ``@ rel_v``.

Axis legend (AXES-1): B, H, Lq, Lk, d; R = 2M - 1 table rows.
"""

from __future__ import annotations

import jax.numpy as jnp

from spec.index import distance_row_span

from ._tables import bucket_sums_valid, gather_rows, rows_logits, rows_sum


def huang_index(delta, max_len: int):
    """HUANG-2/3: (row, valid) with row = delta + M - 1 where |delta| <= M - 1 (row 0 elsewhere)."""
    valid = jnp.abs(delta) <= max_len - 1
    return jnp.where(valid, delta + max_len - 1, 0), valid


# ---------------------------------------------------------------- plain hook (xla)
def key_term(scheme, params: dict, q, delta):
    """HUANG-2..HUANG-4: term[b, h, i, j] = q_i . rel_k[delta_ij + M - 1], 0 where |delta| > M - 1.

    Before s_rel (SCALE-3). q (B, H, Lq, d), delta (1|B, Lq, Lk) -> (B, H, Lq, Lk).
    """
    row, valid = huang_index(delta, scheme.max_len)
    return jnp.where(valid[:, None], gather_rows(rows_logits(q, params["rel_k"]), row), 0.0)


def value_term(scheme, params: dict, w, delta):
    """HUANG-6: o_add[b, h, i] = sum_j w'_ij rel_v[delta_ij + M - 1] over |delta| <= M - 1, from the
    weights after dropout (DROP-4): w' (B, H, Lq, Lk) -> (B, H, Lq, dv) in the table's dtype."""
    row, valid = huang_index(delta, scheme.max_len)
    return rows_sum(bucket_sums_valid(w, row, valid, scheme.num_rows), params["rel_v"])


# ---------------------------------------------------------------- tiled hooks (tiles)
def key_term_tiled(scheme, params: dict, q, delta, tile):
    """HUANG-4 for the queries tile.q_start .. tile.q_start + Lq - 1: the skew, or the gather of ``key_term``.

    With ``tile.causal`` the values at keys after the diagonal are
    unspecified finite numbers: the caller masks them (CAUSAL-1).
    """
    if not tile.default_positions:
        return key_term(scheme, params, q, delta)
    return huang_skew_term(q, params["rel_k"], tile.q_start, delta.shape[-1], scheme.max_len, tile.causal)


def value_term_tiled(scheme, params: dict, w, delta, tile):
    """HUANG-6 for a tile: the scatter of ``value_term`` over its own delta."""
    return value_term(scheme, params, w, delta)


def distance_rows(table, first: int, count: int, max_len: int):
    """HUANG-2/3: the table rows of distances first .. first + count - 1, zero rows beyond the table.

    Static slicing and zero padding (``spec.index.distance_row_span``): (R, d) -> (count, d),
    (H, R, d) -> (H, count, d).
    """
    span = distance_row_span(first, count, max_len)
    if span is None:  # no distance of the range is in the table
        return jnp.zeros(table.shape[:-2] + (count, table.shape[-1]), table.dtype)
    rows = table[..., span.first_row : span.last_row + 1, :]
    return jnp.pad(rows, [(0, 0)] * (table.ndim - 2) + [(span.pad_before, span.pad_after), (0, 0)])


def huang_skew_term(q, table, q_start: int, Lk: int, max_len: int, causal: bool):
    """HUANG-4 with default positions: the (B, H, Lq, Lk) term of queries q_start .. q_start + Lq - 1, keys 0 .. Lk - 1.

    One matmul of the queries with the table rows of every distance they
    can meet, then the skew. Column m of that product holds distance
    m - (q_start + Lq - 1).

    ``causal``: only the distances <= 0 are multiplied, and the values at
    keys after the diagonal (j > q_start + i) are **unspecified finite
    numbers** (here: zeros): the caller masks them (CAUSAL-1). torch_impl's
    ``huang_skew_term`` has the same contract. Without ``causal`` every
    entry is the term.
    """
    Lq = q.shape[-2]
    first = -(q_start + Lq - 1)  # the distance of column 0
    width = Lq + Lk - 1
    if not causal:
        return skew(rows_logits(q, distance_rows(table, first, width, max_len)), Lk)
    n = min(width, 1 - first)  # distances first .. 0
    r = rows_logits(q, distance_rows(table, first, n, max_len))
    return skew(jnp.pad(r, [(0, 0)] * 3 + [(0, width - n)]), Lk)


def skew(r, Lk: int):
    """HUANG-4: out[..., i, j] = r[..., i, j - i + Lq - 1], by reshape and slice: (B, H, Lq, W) -> (B, H, Lq, Lk).

    W >= Lq + Lk - 1. Element (i, j - i + Lq - 1) sits at flat offset
    (Lq - 1) + i (W - 1) + j of each (Lq, W) block: drop the first Lq - 1
    entries, read the rest as rows of W - 1, keep the first Lk columns.
    """
    B, H, Lq, W = r.shape
    if Lq == 1:
        return r[..., :Lk]
    flat = r.reshape(B, H, Lq * W)[..., Lq - 1 : Lq - 1 + Lq * (W - 1)]
    return flat.reshape(B, H, Lq, W - 1)[..., :Lk]
