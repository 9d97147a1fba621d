"""Shaw et al. 2018 in JAX: a key term, a key-side term and a value term by clipped distance (SHAW-1..SHAW-7).

Both terms look table rows up by ``idx = clip(delta, -k, k) + k`` (SHAW-2),
R = 2k + 1 rows. The key term is ``q @ rel_k.T`` (B, H, Lq, R) then a
gather (SHAW-3); the value term sums the weights per row, then ``@ rel_v``
(SHAW-4); the key-side term is ``k @ table.T`` (B, H, Lk, R) then a gather
per key (SHAW-6). Nothing of shape (Lq, Lk, d) is built.

Hooks (the protocol is in ``jax_impl.schemes``):

- plain, for the ``xla`` kernel: ``key_term`` (a gather) and ``value_term``
  (a scatter-add), both by the (1|B, Lq, Lk) index;
- tiled, for the ``tiles`` kernel: ``key_term_tiled`` is the same gather
  (``q @ rel_k.T`` is only (B, H, Lq, 2k + 1)); ``value_term_tiled`` with
  default positions sums the weights by band (``bucket_sums_banded``: a narrow
  gather and two masked row sums, no scatter), with explicit positions it
  scatters like ``value_term``.

Axis legend (AXES-1): B, H, Lq, Lk, d; dv the value head dim (HEAD-4): rel_v
has dv columns, rel_k d.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._tables import bucket_sums, gather_key_rows, gather_rows, key_rows, rows_logits, rows_sum


def shaw_index(delta, max_distance: int):
    """SHAW-2: clip(delta, -k, k) + k, in [0, 2k]; same shape as delta."""
    return jnp.clip(delta, -max_distance, max_distance) + max_distance


# ---------------------------------------------------------------- fused hooks (the pallas kernel)
def fused_unsupported(scheme):
    """Why the pallas kernel cannot fuse this Shaw scheme, or None: it has the key and value terms (SHAW-3,
    SHAW-4), not the key side (SHAW-6)."""
    return None if scheme.key_side is None else "pallas has no key-side term (SHAW-6)"


def fused_tables(scheme, params: dict) -> tuple:
    """(rel_k or None, rel_v or None, k): the tables the pallas kernel reads, (R, c) or (H, R, c) (REL-2)."""
    return params["rel_k"] if scheme.keys else None, params["rel_v"] if scheme.values else None, scheme.max_distance


# ---------------------------------------------------------------- plain hooks (xla)
def key_term(scheme, params: dict, q, delta):
    """SHAW-3: term[b, h, i, j] = q_i . rel_k[idx[b, i, j]], before s_rel (SCALE-3).

    q (B, H, Lq, d), delta (1|B, Lq, Lk) -> (B, H, Lq, Lk).
    """
    return gather_rows(rows_logits(q, params["rel_k"]), shaw_index(delta, scheme.max_distance))


def key_side_term(scheme, params: dict, k, delta, *, num_heads: int):
    """SHAW-6: term[b, h, i, j] = k_j . table[idx[b, i, j]] (table ``rel_k`` or ``rel_q``), before its
    factor (SHAW-7). k (B, Hkv, Lk, d) (HEAD-3), delta (1|B, Lq, Lk) -> (B, H, Lq, Lk), H = ``num_heads``."""
    table = params["rel_k" if scheme.key_side == "shared" else "rel_q"]
    return gather_key_rows(key_rows(k, table, num_heads), shaw_index(delta, scheme.max_distance))


def value_term(scheme, params: dict, w, delta):
    """SHAW-4: o_add[b, h, i] = sum_j w'_ij rel_v[idx_ij], from the weights after dropout (DROP-4).

    w' (B, H, Lq, Lk), delta (1|B, Lq, Lk) -> (B, H, Lq, dv) in the table's dtype; rel_v is (R, dv) or
    (H, R, dv), one table per query head (REL-2, HEAD-3, HEAD-4).
    """
    buckets = bucket_sums(w, shaw_index(delta, scheme.max_distance), scheme.num_rows)
    return rows_sum(buckets, params["rel_v"])


# ---------------------------------------------------------------- tiled hooks (tiles)
def key_term_tiled(scheme, params: dict, q, delta, tile):
    """SHAW-3 for a tile: the gather of ``key_term`` (already O(Lq (Lk + R)) work and memory)."""
    return key_term(scheme, params, q, delta)


def key_side_term_tiled(scheme, params: dict, k, delta, tile, *, num_heads: int):
    """SHAW-6 for a tile: the gather of ``key_side_term`` (its keys 0 .. Lk - 1, its own delta)."""
    return key_side_term(scheme, params, k, delta, num_heads=num_heads)


def value_term_tiled(scheme, params: dict, w, delta, tile):
    """SHAW-4 for the queries tile.q_start .. tile.q_start + Lq - 1 and keys 0 .. Lk - 1 (DROP-4).

    Default positions: ``bucket_sums_banded``; explicit positions: the scatter of ``value_term``.
    """
    if not tile.default_positions:
        return value_term(scheme, params, w, delta)
    return rows_sum(bucket_sums_banded(w, scheme.max_distance, tile.q_start), params["rel_v"])


def bucket_sums_banded(w, max_distance: int, q_start: int = 0):
    """SHAW-4 buckets for default positions (delta_ij = j - i), without a scatter: (B, H, Lq, Lk) -> (B, H, Lq, 2k + 1).

    w holds queries i = q_start .. q_start + Lq - 1 and keys j = 0 .. Lk - 1.
    Interior rows (|c| < k) are the entries w[i, i + c]: one small gather of
    (Lq, 2k - 1) columns, zero where i + c is not a key. The edge rows
    S[i, 0] (j - i <= -k) and S[i, 2k] (j - i >= k) are masked row sums,
    which XLA fuses into one read of w.
    """
    B, H, Lq, Lk = w.shape
    k = max_distance
    if k == 0:
        return jnp.sum(w, axis=-1, keepdims=True)
    i = jnp.arange(q_start, q_start + Lq)[:, None]
    cols = i + jnp.arange(-k + 1, k)  # (Lq, 2k - 1): the key of each interior bucket
    inside = (cols >= 0) & (cols < Lk)
    interior = jnp.take_along_axis(w, jnp.broadcast_to(jnp.clip(cols, 0, Lk - 1), (B, H, Lq, 2 * k - 1)), axis=-1)
    interior = jnp.where(inside, interior, 0)
    c = jnp.arange(Lk)[None, :] - i  # (Lq, Lk) distances
    left = jnp.sum(jnp.where(c <= -k, w, 0), axis=-1, keepdims=True)
    right = jnp.sum(jnp.where(c >= k, w, 0), axis=-1, keepdims=True)
    return jnp.concatenate([left, interior, right], axis=-1)
