"""Relative-position terms in JAX: table matmuls, gathers, bucket sums, the skew.

Rules SHAW-2..SHAW-4, HUANG-2..HUANG-4, written with ``jnp`` so that XLA
fuses them. Nothing of shape (Lq, Lk, d); no Python loop over positions.
Shapes (AXES-1): q (B, H, Lq, d); a table (R, d) or (H, R, d); an index (1|B, Lq, Lk).
"""

from __future__ import annotations

import jax.numpy as jnp


def rows_logits(q, table):
    """q @ table.T per head: (B, H, Lq, d) x (R, d) | (H, R, d) -> (B, H, Lq, R)."""
    if table.ndim == 2:
        return jnp.einsum("bhid,rd->bhir", q, table)
    return jnp.einsum("bhid,hrd->bhir", q, table)


def gather_rows(r, index):
    """out[b, h, i, j] = r[b, h, i, index[b, i, j]]."""
    B, H, Lq, _ = r.shape
    return jnp.take_along_axis(r, jnp.broadcast_to(index[:, None], (B, H, Lq, index.shape[-1])), axis=-1)


def bucket_sums(w, index, num_rows: int):
    """SHAW-4: S[b, h, i, r] = sum over j with index[b, i, j] == r of w[b, h, i, j] (one scatter-add)."""
    B, H, Lq, Lk = w.shape
    rows = jnp.arange(B * H * Lq).reshape(B, H, Lq, 1) * num_rows
    flat = (rows + jnp.broadcast_to(index[:, None], (B, H, Lq, Lk))).reshape(-1)
    out = jnp.zeros(B * H * Lq * num_rows, w.dtype).at[flat].add(w.reshape(-1))
    return out.reshape(B, H, Lq, num_rows)


def bucket_sums_banded(w, max_distance: int, q_start: int = 0):
    """SHAW-4 for default positions (delta = j - i), without a scatter.

    Interior rows (|c| < k) are the entries w[i, i + c]: one small gather of
    (Lq, 2k - 1) columns. The edge rows S[i, 0] (j - i <= -k) and S[i, 2k]
    (j - i >= k) are masked row sums, which XLA fuses into one read of w.
    w holds queries q_start .. q_start + Lq - 1.
    """
    B, H, Lq, Lk = w.shape
    k = max_distance
    if k == 0:
        return jnp.sum(w, axis=-1, keepdims=True)
    i = jnp.arange(q_start, q_start + Lq)[:, None]
    cols = i + jnp.arange(-k + 1, k)  # (Lq, 2k - 1) key of each interior bucket
    inside = (cols >= 0) & (cols < Lk)
    interior = jnp.take_along_axis(w, jnp.broadcast_to(jnp.clip(cols, 0, Lk - 1), (B, H, Lq, 2 * k - 1)), axis=-1)
    interior = jnp.where(inside, interior, 0)
    c = jnp.arange(Lk)[None, :] - i  # (Lq, Lk) distances
    left = jnp.sum(jnp.where(c <= -k, w, 0), axis=-1, keepdims=True)
    right = jnp.sum(jnp.where(c >= k, w, 0), axis=-1, keepdims=True)
    return jnp.concatenate([left, interior, right], axis=-1)


def shaw_index(delta, max_distance: int):
    """SHAW-2: clip(delta, -k, k) + k."""
    return jnp.clip(delta, -max_distance, max_distance) + max_distance


def huang_index(delta, max_len: int):
    """HUANG-2/3: (row, valid) with row = delta + M - 1 where |delta| <= M - 1."""
    valid = jnp.abs(delta) <= max_len - 1
    return jnp.where(valid, delta + max_len - 1, 0), valid


def distance_rows(table, first: int, count: int, max_len: int):
    """HUANG-2/3: the table rows of distances first .. first + count - 1, zero rows beyond the table.

    Static slicing and zero padding: (R, d) -> (count, d), (H, R, d) -> (H, count, d).
    """
    R = 2 * max_len - 1
    lo, hi = first + max_len - 1, first + count - 1 + max_len - 1  # wanted table rows, may overhang
    a, b = max(lo, 0), min(hi, R - 1)
    if a > b:  # no distance of the range is in the table
        return jnp.zeros(table.shape[:-2] + (count, table.shape[-1]), table.dtype)
    pad = [(0, 0)] * (table.ndim - 2) + [(a - lo, hi - b), (0, 0)]
    return jnp.pad(table[..., a: b + 1, :], pad)


def huang_skew_term(q, table, Lk: int, max_len: int, causal: bool, q_start: int = 0):
    """HUANG-4 with default positions for queries q_start .. q_start + Lq - 1 and keys 0 .. Lk - 1.

    One matmul with the rows of every reachable distance, then the skew.
    Column m of the product holds distance m - (q_start + Lq - 1).
    ``causal``: only distances <= 0 are multiplied; the columns of positive
    distances are -inf, so the term carries CAUSAL-1.
    """
    Lq = q.shape[-2]
    first = -(q_start + Lq - 1)  # the distance of column 0
    width = Lq + Lk - 1
    if not causal:
        return skew(rows_logits(q, distance_rows(table, first, width, max_len)), Lk)
    n = min(width, 1 - first)  # distances first .. 0
    r = rows_logits(q, distance_rows(table, first, n, max_len))
    if width > n:
        r = jnp.concatenate([r, jnp.full(r.shape[:-1] + (width - n,), -jnp.inf, r.dtype)], axis=-1)
    return skew(r, Lk)


def skew(r, Lk: int):
    """HUANG-4: out[..., i, j] = r[..., i, j - i + Lq - 1] by reshape and slice (see torch_impl)."""
    B, H, Lq, W = r.shape
    if Lq == 1:
        return r[..., :Lk]
    flat = r.reshape(B, H, Lq * W)[..., Lq - 1: Lq - 1 + Lq * (W - 1)]
    return flat.reshape(B, H, Lq, W - 1)[..., :Lk]
