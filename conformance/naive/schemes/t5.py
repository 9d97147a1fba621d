"""T5's bucketed bias in the naive emulation: the buckets by the float64 logarithm (T5-1..T5-5).

This is the formula as Hugging Face and Mesh TensorFlow write it, in
float64 (``numpy_ref`` uses exact integer thresholds instead): the two agree
wherever float64 rounding does not cross a bucket boundary, which is every
distance of the built-in cases.
"""

from __future__ import annotations

import numpy as np

from . import _tables
from .base import NaiveScheme, register


def log_buckets(scheme, delta: np.ndarray) -> np.ndarray:
    """T5-2, T5-3 through ``log(n / e) / log(M / e)`` in float64, truncated, saturated."""
    N, M = scheme.num_buckets, scheme.max_distance
    out = np.zeros(delta.shape, np.int64)
    if scheme.bidirectional:
        N //= 2
        out += (delta > 0) * N
        n = np.abs(delta)
    else:
        n = -np.minimum(delta, 0)
    exact = N // 2
    small = n < exact
    ratio = np.log(np.maximum(n, 1).astype(np.float64) / exact) / np.log(M / exact)
    large = exact + (ratio * (N - exact)).astype(np.int64)
    return out + np.where(small, n, np.minimum(large, N - 1))


@register
class T5Hooks(NaiveScheme):
    name = "t5"

    def bias(self, scheme, P, params, num_heads, q_positions, k_positions, delta):
        return _tables.read(P, params["rel_b"], log_buckets(scheme, delta))

    def bias_vjp(self, scheme, P, params, num_heads, q_positions, k_positions, delta, grad):
        return {"rel_b": _tables.read_vjp(P, params["rel_b"], log_buckets(scheme, delta), grad)}
