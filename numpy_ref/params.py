"""Canonical parameter sets (rules PARAM-1, PARAM-3)."""

from __future__ import annotations

import math

import numpy as np

from spec import AttentionSpec

#: Biases are drawn from U(-BIAS_RANGE, BIAS_RANGE) so that tests exercise them.
BIAS_RANGE = 0.1
#: Every position scheme's table name starts with this (REL-2, PARAM-1).
TABLE_PREFIX = "rel_"


def init_params(spec: AttentionSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """A random canonical parameter set, float64, reproducible from ``seed`` (PARAM-3).

    Weights ``(in, out)`` are Glorot-uniform, U(-a, a) with a = sqrt(6 / (D + D));
    biases U(-0.1, 0.1); relative tables (names ``rel_*``) N(0, 1/d). Drawn in
    canonical order (``spec.param_shapes()``) from ``numpy.random.default_rng(seed)``.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    rng = np.random.default_rng(seed)
    D, d = spec.model_dim, spec.head_dim
    limit = math.sqrt(6.0 / (D + D))
    params = {}
    for name, shape in spec.param_shapes().items():
        if name.startswith(TABLE_PREFIX):  # a scheme's table (rel_k, rel_v, ...)
            params[name] = rng.normal(0.0, 1.0 / math.sqrt(d), size=shape)
        elif name.startswith("w"):
            params[name] = rng.uniform(-limit, limit, size=shape)
        else:  # bq, bk, bv, bo
            params[name] = rng.uniform(-BIAS_RANGE, BIAS_RANGE, size=shape)
    return params


def identity_params(spec: AttentionSpec) -> dict[str, np.ndarray]:
    """Identity projections, zero biases and zero relative tables.

    With these the layer is plain attention on the raw inputs, which makes the
    worked examples of the spec checkable on paper; replace entries as needed.
    """
    params = {}
    for name, shape in spec.param_shapes().items():  # rectangular weights (HEAD-3, HEAD-4): the leading identity
        params[name] = np.eye(*shape) if name.startswith("w") else np.zeros(shape)
    return params
