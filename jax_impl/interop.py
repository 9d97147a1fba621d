"""Flax ``nnx.MultiHeadAttention``'s parameter layout, and conversion to and from that module.

The layout map (spec/comparison.md; exact, contiguous heads HEAD-1, PARAM-3):
the q/k/v kernels are ``(D, H, d)`` with biases ``(H, d)``, the out kernel
``(H, d, D)`` with bias ``(D,)``: each is the canonical ``(D, D)`` / ``(D,)``
array reshaped. ``flax_layout`` / ``to_flax_layout`` / ``from_flax_layout``
are that map, written once; ``MultiHeadAttention`` keeps its parameters in
it, and the conformance adapter of ``nnx.MultiHeadAttention`` uses it.

Only what both can express converts: no relative positions, default scale,
no mask_fill on our side; equal in, qkv and out features, no normalize_qk,
no grouped kv heads on theirs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spec import AttentionSpec
from spec.validation import fail_value, require_plain_attention

#: canonical projection name -> (attribute of nnx.MultiHeadAttention, parameter of its LinearGeneral)
FLAX_SLOTS = {
    "wq": ("query", "kernel"),
    "wk": ("key", "kernel"),
    "wv": ("value", "kernel"),
    "wo": ("out", "kernel"),
    "bq": ("query", "bias"),
    "bk": ("key", "bias"),
    "bv": ("value", "bias"),
    "bo": ("out", "bias"),
}


def flax_layout(spec: AttentionSpec) -> dict:
    """Canonical projection name -> its shape in Flax's layout (the names of ``spec.param_shapes()``, no tables)."""
    D, H, d = spec.model_dim, spec.num_heads, spec.head_dim
    shapes = {"wq": (D, H, d), "wk": (D, H, d), "wv": (D, H, d), "wo": (H, d, D)}
    if spec.bias:
        shapes.update({"bq": (H, d), "bk": (H, d), "bv": (H, d), "bo": (D,)})
    return shapes


def to_flax_layout(spec: AttentionSpec, params: dict) -> dict:
    """Canonical arrays (NumPy or JAX) -> the same arrays reshaped to Flax's layout, by canonical name."""
    return {n: params[n].reshape(shape) for n, shape in flax_layout(spec).items()}


def from_flax_layout(spec: AttentionSpec, arrays: dict) -> dict:
    """The inverse of ``to_flax_layout``: arrays in Flax's layout, by canonical name -> canonical shapes."""
    layout = flax_layout(spec)
    return {n: arrays[n].reshape(shape) for n, shape in spec.param_shapes().items() if n in layout}


def from_flax_mha(module: nnx.MultiHeadAttention):
    """(spec, canonical params as NumPy arrays) of an ``nnx.MultiHeadAttention``, exactly."""
    if not isinstance(module, nnx.MultiHeadAttention):
        raise TypeError(f"module: expected a flax.nnx.MultiHeadAttention, got {type(module).__name__}")
    D = module.in_features
    if not (module.qkv_features == D and module.out_features == D):
        raise fail_value(
            "module",
            "in_features == qkv_features == out_features",
            f"{module.in_features}, {module.qkv_features}, {module.out_features}",
        )
    if module.normalize_qk or getattr(module, "num_kv_heads", module.num_heads) != module.num_heads:
        raise fail_value("module", "no normalize_qk and no grouped key/value heads", "a module that uses them")
    spec = AttentionSpec(num_heads=module.num_heads, head_dim=D // module.num_heads, bias=module.use_bias)
    arrays = {
        n: np.array(getattr(getattr(module, attr), slot)[...])
        for n, (attr, slot) in FLAX_SLOTS.items()
        if n in flax_layout(spec)
    }
    return spec, from_flax_layout(spec, arrays)


def to_flax_mha(spec: AttentionSpec, params: dict, *, rngs: nnx.Rngs = None) -> nnx.MultiHeadAttention:
    """An ``nnx.MultiHeadAttention`` (dtype of ``params``, full-precision matmuls) holding them exactly."""
    require_plain_attention(spec, "nnx.MultiHeadAttention")
    dtype = np.dtype(params["wq"].dtype)
    m = nnx.MultiHeadAttention(
        num_heads=spec.num_heads,
        in_features=spec.model_dim,
        qkv_features=spec.model_dim,
        out_features=spec.model_dim,
        use_bias=spec.bias,
        dtype=dtype,
        param_dtype=dtype,
        dropout_rate=spec.dropout,
        decode=False,
        precision=jax.lax.Precision.HIGHEST,
        rngs=rngs or nnx.Rngs(0),
    )
    for n, a in to_flax_layout(spec, {n: np.asarray(params[n]) for n in flax_layout(spec)}).items():
        attr, slot = FLAX_SLOTS[n]
        getattr(getattr(m, attr), slot).set_value(jnp.asarray(a))
    return m
