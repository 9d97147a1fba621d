"""A bias read from a per-head table by an integer row per (query, key) pair (T5-1, SWIN-1).

``rel_b`` is (H, R); ``rows`` (1|B, Lq, Lk) holds the row of every pair.
The bias is ``rel_b[h, rows[b, i, j]]``, (1|B, H, Lq, Lk). Its gradient is
autodiff's: the gradient of every pair summed into the row it read (a
scatter-add), as numpy_ref's ``table_bias_vjp`` states it.
"""

from __future__ import annotations

import jax.numpy as jnp


def table_bias(rel_b, rows, dtype):
    """(1|B, H, Lq, Lk) = rel_b[h, rows[b, i, j]] in ``dtype`` (the softmax dtype, PREC-4).

    The table is converted before the gather, so the gradient's scatter-add
    sums in ``dtype`` too and is rounded to the table's dtype once: a
    float32 sum of every pair of a bucket, not a bfloat16 one.
    """
    return jnp.moveaxis(rel_b.astype(dtype)[:, rows], 0, 1)  # (H, 1|B, Lq, Lk) -> (1|B, H, Lq, Lk)
