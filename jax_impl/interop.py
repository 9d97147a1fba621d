"""Flax ``nnx.MultiHeadAttention``'s parameter layout, and conversion to and from that module.

The layout map (spec/comparison.md; exact, contiguous heads HEAD-1, PARAM-3):
the query kernel is ``(D, H, d)``, the key kernel ``(D, Hkv, d)``, the value
kernel ``(D, Hkv, dv)`` with biases ``(H, d)``, ``(Hkv, d)``, ``(Hkv, dv)``,
the out kernel ``(H, dv, D)`` with bias ``(D,)``: each is the canonical
array reshaped (HEAD-3, HEAD-4; Hkv = H and dv = d by default).
``flax_layout`` / ``to_flax_layout`` / ``from_flax_layout`` are that map,
written once; ``MultiHeadAttention`` keeps its parameters in it, and the
conformance adapter of ``nnx.MultiHeadAttention`` uses it.

Only what both can express converts: no relative positions, default scale,
no mask_fill, no value head size of its own, no softcap and no window on our
side (``nnx.MultiHeadAttention`` has one head size for q, k and v, and no
logit cap or window); equal in, qkv and out features and no normalize_qk on
theirs. Grouped key/value heads (HEAD-3) convert both ways: Flax's
``num_kv_heads`` groups query heads over key/value head h // G as HEAD-3 does.
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
    """Canonical projection name -> its shape in Flax's layout (the names of ``spec.param_shapes()``, no tables).

    HEAD-1 with HEAD-3, HEAD-4: the output features of a projection split into (heads, channels).
    """
    D, H, Hkv, d, dv = spec.model_dim, spec.num_heads, spec.kv_heads, spec.head_dim, spec.v_head_dim
    shapes = {"wq": (D, H, d), "wk": (D, Hkv, d), "wv": (D, Hkv, dv), "wo": (H, dv, D)}
    if spec.bias:
        shapes.update({"bq": (H, d), "bk": (Hkv, d), "bv": (Hkv, dv), "bo": (D,)})
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
    kv_features = getattr(module, "in_kv_features", D)
    if not (module.qkv_features == D and module.out_features == D and kv_features == D):
        raise fail_value(
            "module",
            "in_features == qkv_features == out_features == in_kv_features",
            f"{module.in_features}, {module.qkv_features}, {module.out_features}, {kv_features}",
        )
    if module.normalize_qk:
        raise fail_value("module", "no normalize_qk (attnspec has no query/key normalisation)", "normalize_qk=True")
    H, Hkv = module.num_heads, getattr(module, "num_kv_heads", module.num_heads)
    spec = AttentionSpec(
        num_heads=H, head_dim=D // H, bias=module.use_bias, num_kv_heads=None if Hkv == H else Hkv
    )  # HEAD-3
    arrays = {
        n: np.array(getattr(getattr(module, attr), slot)[...])
        for n, (attr, slot) in FLAX_SLOTS.items()
        if n in flax_layout(spec)
    }
    return spec, from_flax_layout(spec, arrays)


#: What nnx.MultiHeadAttention lacks for each peer option of AttentionSpec: field -> (rule, why).
#: (num_kv_heads, HEAD-3, is its own num_kv_heads.)
FLAX_MHA_LACKS = {
    "value_head_dim": (
        "HEAD-4",
        "nnx.MultiHeadAttention has no value head size of its own (its query, key and value heads all have "
        "qkv_features // num_heads channels)",
    ),
    "softcap": ("SOFTCAP-1", "nnx.MultiHeadAttention has no logit soft-capping"),
    "window": (
        "WINDOW-1",
        "nnx.MultiHeadAttention has no window on the distance (pass the window as its mask instead)",
    ),
}


def to_flax_mha(spec: AttentionSpec, params: dict, *, rngs: nnx.Rngs = None) -> nnx.MultiHeadAttention:
    """An ``nnx.MultiHeadAttention`` (dtype of ``params``, full-precision matmuls) holding them exactly.

    ``spec.num_kv_heads`` (HEAD-3) becomes Flax's ``num_kv_heads``; what
    Flax cannot express is a ``ValueError`` (``FLAX_MHA_LACKS``, then ``require_plain_attention``).
    """
    require_plain_attention(spec, "nnx.MultiHeadAttention", lacks=FLAX_MHA_LACKS, has=("num_kv_heads",))
    dtype = np.dtype(params["wq"].dtype)
    m = nnx.MultiHeadAttention(
        num_heads=spec.num_heads,
        num_kv_heads=spec.kv_heads,
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
