"""The calls both fused kernels (torch_impl "triton", jax_impl "pallas") are tested on, drawn once in NumPy with
the float64 reference's answer on inputs rounded to the tested dtype. Every term a fused program computes:
Shaw keys and values (k = 0, k past every distance, per-head tables, values only), grouped heads with their
own value size, masks with an empty row (MASK-5), bias with -inf (BIAS-2), causal rules, a window, Lq != Lk.
``MORE_CALLS``: what the triton kernel fuses besides (RoPE, ALiBi, T5, Huang with distances past its table,
Swin with prefix tokens and coordinates past its window, positions that are consecutive runs, a broadcast bias
whose gradient sums over its broadcast axes)."""

from __future__ import annotations

import numpy as np

import numpy_ref
from spec import Alibi, AttentionSpec, Huang, Rope, Shaw, Swin, T5Bias

CALLS = {
    "vanilla-cross": (AttentionSpec(2, 4), {}),
    "shaw-k2-cross-mask-bias": (AttentionSpec(2, 4, relative=Shaw(2)), {"mask": True, "bias": True}),
    "shaw-k0-causal": (AttentionSpec(2, 4, relative=Shaw(0), causal=True), {}),
    "shaw-k3-gqa-per-head-dv": (
        AttentionSpec(4, 4, num_kv_heads=2, value_head_dim=3, relative=Shaw(3, per_head=True)),
        {"mask": True},
    ),
    "shaw-k30-past-every-distance-window": (AttentionSpec(2, 4, relative=Shaw(30), window=(3, 2)), {}),
    "shaw-values-only-unscaled": (AttentionSpec(2, 4, relative=Shaw(2, keys=False), scale_relative=False), {}),
    "shaw-keys-only-causal-long": (AttentionSpec(2, 8, relative=Shaw(5, values=False), causal=True), {"L": 40}),
}
#: Per batch element a run of 5 consecutive query positions with its own key-minus-query offset (POS-1).
RUNS = {"q_positions": np.array([[35, 36, 37, 38, 39], [10, 11, 12, 13, 14]]), "k_positions": np.arange(40)}
MORE_CALLS = {
    "rope-causal-gqa": (AttentionSpec(4, 4, num_kv_heads=2, relative=Rope(), causal=True), {}),
    "alibi-symmetric-mask": (AttentionSpec(3, 4, relative=Alibi()), {"mask": True}),
    "alibi-linear-causal-cache": (
        AttentionSpec(2, 4, relative=Alibi(symmetric=False), causal=True),
        {"L": (3, 40), "q_positions": np.arange(37, 40)},
    ),
    "t5-bidirectional-long": (AttentionSpec(2, 4, relative=T5Bias(8, 12)), {"L": (20, 40)}),
    "t5-causal-runs": (
        AttentionSpec(2, 4, relative=T5Bias(8, 12, bidirectional=False), causal=True),
        {"L": (5, 40), **RUNS},
    ),
    "shaw-k3-causal-runs-broadcast-bias": (
        AttentionSpec(2, 4, relative=Shaw(3, per_head=True), causal=True),
        {"L": (5, 40), **RUNS, "bias": (1, 1, 1, 40)},
    ),
    "huang-values-causal-long": (AttentionSpec(2, 4, relative=Huang(6, values=True), causal=True), {"L": 24}),
    "huang-m1-values-mask": (AttentionSpec(2, 4, relative=Huang(1, values=True)), {"mask": True}),
    "huang-shared-gqa-runs": (
        AttentionSpec(4, 4, num_kv_heads=2, relative=Huang(4, per_head=False)),
        {"L": (5, 40), **RUNS},
    ),
    "swin-3x4-prefix-mask": (AttentionSpec(2, 4, relative=Swin((3, 4), prefix_tokens=1)), {"L": 13, "mask": True}),
    "swin-4x1-runs-past-the-window": (AttentionSpec(2, 4, relative=Swin((4, 1))), {"L": (5, 40), **RUNS}),
    "swin-2x3-causal-gqa-prefix-runs": (
        AttentionSpec(4, 4, num_kv_heads=2, relative=Swin((2, 3), prefix_tokens=2), causal=True),
        {"L": (5, 40), **RUNS},
    ),
}
ALL_CALLS = {**CALLS, **MORE_CALLS}


def draw(name: str, rounded, grad: bool = False):
    """(spec, params, query, key, keywords, expected): the call ``name`` with ``rounded(a)`` (an array in the
    tested dtype, as float64 NumPy) applied to every float input, and numpy_ref's output on those; with
    ``grad`` also (grad_out, numpy_ref's gradients of <out, grad_out>)."""
    spec, extra = ALL_CALLS[name]
    rng = np.random.default_rng(4)
    params = numpy_ref.init_params(spec, 2)
    for n in ("rel_k", "rel_v", "rel_b"):
        if n in params:
            params[n] = rng.normal(size=params[n].shape)
    L = extra.get("L", (7, 9))
    Lq, Lk = (L, L) if isinstance(L, int) else L
    x, y = rng.normal(size=(2, Lq, spec.model_dim)), rng.normal(size=(2, Lk, spec.model_dim))
    kw = {}
    if extra.get("mask"):
        kw["mask"] = rng.random((2, 1, Lq, Lk)) < 0.7
        kw["mask"][0, :, 3] = False  # a row with no allowed key (MASK-5)
    if extra.get("bias") is True:
        kw["bias"] = rng.normal(size=(1, spec.num_heads, Lq, Lk))
        kw["bias"][0, 1, 2, :4] = -np.inf  # BIAS-2
        kw["bias"] = rounded(kw["bias"])
    elif extra.get("bias"):
        kw["bias"] = rounded(rng.normal(size=extra["bias"]))
    kw.update({n: extra[n] for n in ("q_positions", "k_positions") if n in extra})
    params = {n: rounded(a) for n, a in params.items()}
    x, y = rounded(x), rounded(y)
    want = numpy_ref.attention(spec, params, x, y, y, **kw)
    if not grad:
        return spec, params, x, y, kw, want
    grad_out = rounded(rng.normal(size=want.shape))
    return spec, params, x, y, kw, want, grad_out, numpy_ref.attention_vjp(spec, params, x, y, y, grad_out, **kw)
