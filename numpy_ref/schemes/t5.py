"""T5's bucketed relative position bias in the reference (T5-1..T5-5).

bias[h, i, j] = rel_b[h, bucket(delta_ij)] with the exact integer buckets of
T5-2 / T5-3: the distances below ``max_exact`` are their own bucket, the
others count the thresholds ``scheme.thresholds()`` they reach (integers,
no logarithm). Axis legend (AXES-1): B, H, Lq, Lk; N = num_buckets.
"""

from __future__ import annotations

import numpy as np

from ._rows import table_bias, table_bias_vjp


def buckets(scheme, delta: np.ndarray) -> np.ndarray:
    """T5-2, T5-3: the bucket of every distance of the int64 array delta, an array of its shape."""
    S, e = scheme.side_buckets, scheme.max_exact
    if scheme.bidirectional:
        base, n = np.where(delta > 0, S, 0), np.abs(delta)
    else:
        base, n = np.zeros_like(delta), np.maximum(-delta, 0)
    far = e + np.searchsorted(np.asarray(scheme.thresholds(), dtype=np.int64), n, side="right")
    return base + np.where(n < e, n, far)


def t5_buckets(delta, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True) -> np.ndarray:
    """``spec.t5_bucket`` over an integer array of distances delta = k_pos - q_pos (T5-2, T5-3)."""
    from spec import T5Bias

    scheme = T5Bias(num_buckets, max_distance, bidirectional)
    delta = np.asarray(delta)
    if not np.issubdtype(delta.dtype, np.integer):
        raise TypeError(f"t5_buckets: expected delta to be an integer array, got dtype {delta.dtype}")
    return buckets(scheme, delta.astype(np.int64))


def bias(scheme, params: dict, ctx):
    """T5-1: (1|B, H, Lq, Lk) = rel_b[h, bucket(delta)]; saves the buckets."""
    rows = buckets(scheme, ctx.delta)
    return table_bias(params["rel_b"], rows), rows


def bias_vjp(scheme, params: dict, rows, g):
    """T5-5: d rel_b[h, r] = the sum of g over the pairs of head h in bucket r."""
    return {"rel_b": table_bias_vjp(rows, scheme.num_buckets, g)}


def literal_bias(scheme, params: dict, h: int, num_heads: int, q_pos: int, k_pos: int) -> float:
    """T5-1 for one pair: rel_b[h, t5_bucket(k_pos - q_pos)] (POS-2)."""
    return float(params["rel_b"][h, scheme.bucket(k_pos - q_pos)])
