"""Conversion to and from Flax ``nnx.MultiHeadAttention``.

Its q/k/v kernels are ``(D, H, d)`` and its out kernel ``(H, d, D)``: each is
the canonical weight reshaped (spec/comparison.md). Only what both can
express converts: no relative positions, default scale, no mask_fill on our
side; equal in, qkv and out features, no normalize_qk, no grouped kv heads
on theirs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spec import AttentionSpec
from spec.validation import fail_value, require_plain_attention

ATTRS = {"q": "query", "k": "key", "v": "value", "o": "out"}


def from_flax_mha(module: nnx.MultiHeadAttention):
    """(spec, canonical params as NumPy arrays) of an ``nnx.MultiHeadAttention``, exactly."""
    if not isinstance(module, nnx.MultiHeadAttention):
        raise TypeError(f"module: expected a flax.nnx.MultiHeadAttention, got {type(module).__name__}")
    D = module.in_features
    if not (module.qkv_features == D and module.out_features == D):
        raise fail_value("module", "in_features == qkv_features == out_features",
                         f"{module.in_features}, {module.qkv_features}, {module.out_features}")
    if module.normalize_qk or getattr(module, "num_kv_heads", module.num_heads) != module.num_heads:
        raise fail_value("module", "no normalize_qk and no grouped key/value heads", "a module that uses them")
    spec = AttentionSpec(num_heads=module.num_heads, head_dim=D // module.num_heads, bias=module.use_bias)
    params = {}
    for n, attr in ATTRS.items():
        lin = getattr(module, attr)
        params["w" + n] = np.array(lin.kernel[...]).reshape(D, D)
        if spec.bias:
            params["b" + n] = np.array(lin.bias[...]).reshape(D)
    return spec, params


def to_flax_mha(spec: AttentionSpec, params: dict, *, rngs: nnx.Rngs = None) -> nnx.MultiHeadAttention:
    """An ``nnx.MultiHeadAttention`` (dtype of ``params``, full-precision matmuls) holding them exactly."""
    require_plain_attention(spec, "nnx.MultiHeadAttention")
    D, H, d = spec.model_dim, spec.num_heads, spec.head_dim
    dtype = np.dtype(params["wq"].dtype)
    m = nnx.MultiHeadAttention(num_heads=H, in_features=D, qkv_features=D, out_features=D, use_bias=spec.bias,
                               dtype=dtype, param_dtype=dtype, dropout_rate=spec.dropout, decode=False,
                               precision=jax.lax.Precision.HIGHEST, rngs=rngs or nnx.Rngs(0))
    for n, attr in ATTRS.items():
        lin = getattr(m, attr)
        shape = (H, d, D) if n == "o" else (D, H, d)
        lin.kernel.set_value(jnp.asarray(params["w" + n]).reshape(shape))
        if spec.bias:
            lin.bias.set_value(jnp.asarray(params["b" + n]).reshape((D,) if n == "o" else (H, d)))
    return m
