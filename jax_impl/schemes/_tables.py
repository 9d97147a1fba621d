"""Table operations the scheme modules share: a table matmul, a gather by row, a sum per row.

Every relative term is ``q @ table.T`` (one logit per query and table row)
followed by an index operation on the last axis; a value term sums the
weights per table row first, then multiplies by the table. Nothing of shape
(Lq, Lk, d) is built (SHAW-3, SHAW-4, HUANG-4).

Shapes (AXES-1): q (B, H, Lq, d); a table (R, d) shared by heads or
(H, R, d) per head (REL-2); an index (1|B, Lq, Lk).
"""

from __future__ import annotations

import jax.numpy as jnp


def rows_logits(q, table):
    """q @ table.T per head (REL-2): (B, H, Lq, d) x (R, d) | (H, R, d) -> (B, H, Lq, R)."""
    if table.ndim == 2:
        return jnp.einsum("bhid,rd->bhir", q, table)
    return jnp.einsum("bhid,hrd->bhir", q, table)


def rows_sum(buckets, table):
    """S @ table per head (REL-2): (B, H, Lq, R) x (R, c) | (H, R, c) -> (B, H, Lq, c), in the table's dtype.

    c is the table's width: dv for a value table (HEAD-4).
    """
    buckets = buckets.astype(table.dtype)
    if table.ndim == 2:
        return jnp.einsum("bhir,rc->bhic", buckets, table)
    return jnp.einsum("bhir,hrc->bhic", buckets, table)


def gather_rows(r, index):
    """out[b, h, i, j] = r[b, h, i, index[b, i, j]]:  (B, H, Lq, R), (1|B, Lq, Lk) -> (B, H, Lq, Lk)."""
    B, H, Lq, _ = r.shape
    return jnp.take_along_axis(r, jnp.broadcast_to(index[:, None], (B, H, Lq, index.shape[-1])), axis=-1)


def bucket_sums(w, index, num_rows: int):
    """S[b, h, i, r] = sum over j with index[b, i, j] == r of w[b, h, i, j]: (B, H, Lq, Lk) -> (B, H, Lq, R).

    One scatter-add into a flat (B * H * Lq * R) vector.
    """
    B, H, Lq, Lk = w.shape
    rows = jnp.arange(B * H * Lq).reshape(B, H, Lq, 1) * num_rows
    flat = (rows + jnp.broadcast_to(index[:, None], (B, H, Lq, Lk))).reshape(-1)
    out = jnp.zeros(B * H * Lq * num_rows, w.dtype).at[flat].add(w.reshape(-1))
    return out.reshape(B, H, Lq, num_rows)


def key_rows(k, table, num_heads: int):
    """k @ table.T per query head (REL-2, HEAD-3): k (B, Hkv, Lk, d), table (R, d) | (H, R, d) ->
    (B, H, Lk, R); query head h reads key head h // (H / Hkv)."""
    group = num_heads // k.shape[1]
    if table.ndim == 2:
        return jnp.repeat(jnp.einsum("bgjd,rd->bgjr", k, table), group, axis=1)
    return jnp.einsum("bhjd,hrd->bhjr", jnp.repeat(k, group, axis=1), table)


def gather_key_rows(rk, index):
    """out[b, h, i, j] = rk[b, h, j, index[b, i, j]]: rk (B, H, Lk, R), index (1|B, Lq, Lk) -> (B, H, Lq, Lk)
    (a key-side term, SHAW-6)."""
    B, H = rk.shape[:2]
    full = jnp.broadcast_to(index[:, None], (B, H) + index.shape[-2:])
    return jnp.take_along_axis(jnp.swapaxes(rk, -1, -2), full, axis=-2)


def bucket_sums_valid(w, index, valid, num_rows: int):
    """``bucket_sums`` over the pairs where ``valid`` (1|B, Lq, Lk) holds: the others go to one extra bucket,
    dropped. (B, H, Lq, Lk) -> (B, H, Lq, R)."""
    return bucket_sums(w, jnp.where(valid, index, num_rows), num_rows + 1)[..., :num_rows]
