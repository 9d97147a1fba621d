"""Projections, the head split, and query heads grouped over shared key/value heads.

Rules PROJ-1, HEAD-1..HEAD-4, OUT-1. Axis legend (AXES-1): B batch, H query
heads, Hkv key/value heads, G = H / Hkv query heads per key/value head, L a
sequence length, D = H * d model dim, d query/key head dim, dv value head dim,
c a channel axis of either size.
"""

from __future__ import annotations

import jax.numpy as jnp


def project(x, w, b):
    """PROJ-1 / OUT-1: x @ W + b, W stored (in, out): (B, L, in) -> (B, L, out)."""
    y = x @ w
    return y if b is None else y + b


def split(x, heads: int):
    """HEAD-1: (B, L, heads * c) -> (B, heads, L, c); feature f belongs to head f // c, channel f % c.

    Queries split into H heads of d, keys into Hkv heads of d, values into Hkv heads of dv (HEAD-3, HEAD-4).
    """
    B, L, F = x.shape
    return x.reshape(B, L, heads, F // heads).transpose(0, 2, 1, 3)


def merge(x):
    """HEAD-2, the inverse of ``split``: (B, H, L, dv) -> (B, L, H * dv)."""
    B, H, L, c = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, L, H * c)


def scores(q, k):
    """SCALE-2's products q_i . k_j, query head h against key head h // G (HEAD-3).

    q (B, H, Lq, d), k (B, Hkv, Lk, d) -> (B, H, Lq, Lk). The query heads are
    grouped as (B, Hkv, G, Lq, d), so a key head is never copied G times; the
    groups are contiguous (query head h = kv * G + g), as ``jnp.repeat`` would
    make them. With Hkv = H, G = 1 and this is the plain per-head product.
    """
    B, H, Lq, d = q.shape
    Hkv = k.shape[1]
    if Hkv == H:  # G = 1: the plain per-head product (XLA lowers no grouping reshapes)
        return jnp.einsum("bhid,bhjd->bhij", q, k)
    grouped = q.reshape(B, Hkv, H // Hkv, Lq, d)  # (B, Hkv, G, Lq, d)
    return jnp.einsum("bkgid,bkjd->bkgij", grouped, k).reshape(B, H, Lq, k.shape[2])


def weighted_values(w, v):
    """sum_j w_ij v_j, query head h reading value head h // G (HEAD-3, HEAD-4).

    w (B, H, Lq, Lk), v (B, Hkv, Lk, dv) -> (B, H, Lq, dv); grouped like ``scores``.
    """
    B, H, Lq, Lk = w.shape
    Hkv = v.shape[1]
    if Hkv == H:  # G = 1
        return jnp.einsum("bhij,bhjc->bhic", w, v)
    grouped = w.reshape(B, Hkv, H // Hkv, Lq, Lk)  # (B, Hkv, G, Lq, Lk)
    return jnp.einsum("bkgij,bkjc->bkgic", grouped, v).reshape(B, H, Lq, v.shape[-1])
