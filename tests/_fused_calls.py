"""The calls both fused kernels (torch_impl "triton", jax_impl "pallas") are tested on, drawn once in NumPy with
the float64 reference's answer on inputs rounded to the tested dtype. Every term a fused program computes:
Shaw keys and values (k = 0, k past every distance, per-head tables, values only), grouped heads with their
own value size, masks with an empty row (MASK-5), bias with -inf (BIAS-2), causal rules, a window, Lq != Lk."""

from __future__ import annotations

import numpy as np

import numpy_ref
from spec import AttentionSpec, Shaw

CALLS = {
    "vanilla-cross": (AttentionSpec(2, 4), {}),
    "shaw-k2-cross-mask-bias": (AttentionSpec(2, 4, relative=Shaw(2)), {"mask": True, "bias": True}),
    "shaw-k0-causal": (AttentionSpec(2, 4, relative=Shaw(0), causal=True), {}),
    "shaw-k3-gqa-per-head-dv": (
        AttentionSpec(4, 4, num_kv_heads=2, value_head_dim=3, relative=Shaw(3, per_head=True)),
        {"mask": True},
    ),
    "shaw-k40-past-every-distance-window": (AttentionSpec(2, 4, relative=Shaw(40), window=(3, 2)), {}),
    "shaw-values-only-unscaled": (AttentionSpec(2, 4, relative=Shaw(2, keys=False), scale_relative=False), {}),
    "shaw-keys-only-causal-long": (AttentionSpec(2, 8, relative=Shaw(5, values=False), causal=True), {"L": 40}),
}


def draw(name: str, rounded):
    """(spec, params, query, key, keywords, expected): the call ``name`` with ``rounded(a)`` (an array in the
    tested dtype, as float64 NumPy) applied to every float input, and numpy_ref's output on those."""
    spec, extra = CALLS[name]
    rng = np.random.default_rng(4)
    params = numpy_ref.init_params(spec, 2)
    for n in ("rel_k", "rel_v"):
        if n in params:
            params[n] = rng.normal(size=params[n].shape)
    Lq, Lk = extra.get("L", 7), extra.get("L", 9)
    x, y = rng.normal(size=(2, Lq, spec.model_dim)), rng.normal(size=(2, Lk, spec.model_dim))
    kw = {}
    if extra.get("mask"):
        kw["mask"] = rng.random((2, 1, Lq, Lk)) < 0.7
        kw["mask"][0, :, 3] = False  # a row with no allowed key (MASK-5)
    if extra.get("bias"):
        kw["bias"] = rng.normal(size=(1, spec.num_heads, Lq, Lk))
        kw["bias"][0, 1, 2, :4] = -np.inf  # BIAS-2
        kw["bias"] = rounded(kw["bias"])
    params = {n: rounded(a) for n, a in params.items()}
    x, y = rounded(x), rounded(y)
    return spec, params, x, y, kw, numpy_ref.attention(spec, params, x, y, y, **kw)
