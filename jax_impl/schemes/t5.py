"""T5's bucketed relative position bias in JAX (T5-1..T5-5).

bias[h, i, j] = rel_b[h, bucket(delta_ij)] with the exact integer buckets of
T5-2 / T5-3: a distance n below ``max_exact`` is its own bucket, a larger one
is ``max_exact`` plus the number of ``scheme.thresholds()`` it reaches. The
thresholds are static Python ints (one comparison each, fused by XLA), so
no logarithm decides a boundary and new position values never recompile.

The table is converted to the softmax dtype before the gather (PREC-4,
``table_bias``); d rel_b is autodiff's scatter-add (T5-5). One hook, the
same for the ``xla`` and the ``tiles`` kernel. Axis legend (AXES-1): B, H,
Lq, Lk; N = num_buckets.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._bias_tables import table_bias


def buckets(scheme, delta):
    """T5-2, T5-3: the bucket of every distance delta = k_pos - q_pos, integers of delta's shape.

    Bidirectional: base S (the side's buckets) for delta > 0, else 0, and
    n = |delta|; causal: base 0 and n = max(-delta, 0). Then bucket = base + n
    for n < e (``max_exact``), else base + e + #{t in thresholds : t <= n}.
    """
    delta = delta.astype(jnp.promote_types(delta.dtype, jnp.int32))  # room for thresholds up to max_distance
    S, e = scheme.side_buckets, scheme.max_exact
    if scheme.bidirectional:
        base, n = jnp.where(delta > 0, S, 0), jnp.abs(delta)
    else:
        base, n = 0, jnp.maximum(-delta, 0)
    far = e + sum((n >= t).astype(n.dtype) for t in scheme.thresholds())  # T5-3, saturates at S - 1
    return base + jnp.where(n < e, n, far)


# ------------------------------------------------------- the hooks (xla and tiles)
def bias(scheme, params: dict, q_positions, k_positions, delta, *, num_heads: int, dtype):
    """T5-1: (1|B, H, Lq, Lk) = rel_b[h, bucket(delta)] in ``dtype``, rel_b (H, N), delta (1|B, Lq, Lk)."""
    return table_bias(params["rel_b"], buckets(scheme, delta), dtype)


def bias_tiled(scheme, params: dict, q_positions, k_positions, delta, *, num_heads: int, dtype, tile):
    """T5-1 for a block of queries: the gather of ``bias`` (O(Lq Lk) work and memory)."""
    return bias(scheme, params, q_positions, k_positions, delta, num_heads=num_heads, dtype=dtype)
