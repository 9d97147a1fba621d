"""Conversion to and from ``torch.nn.MultiheadAttention`` (batch_first): the one copy of its layout map.

``in_proj_weight`` stacks the (out, in) weights of q, k and v, so the
canonical ``wq = in_proj_weight[:D].T`` and so on; ``out_proj.weight`` is
``wo.T`` (spec/comparison.md, PARAM-3). Only the configurations both can
express convert: no relative positions, default scale, no mask_fill, no
grouped key/value heads (HEAD-3), no value head size of its own (HEAD-4), no
soft cap (SOFTCAP-1) and no window (WINDOW-1) on our side; no
``add_bias_kv``, ``add_zero_attn`` or separate ``kdim``/``vdim`` on theirs.
The conformance adapter ``torch-mha`` uses these functions too.
"""

from __future__ import annotations

import torch
from torch import nn

from spec import AttentionSpec
from spec.validation import fail_value, require_plain_attention

from .module import from_numpy, to_numpy


def unpack(in_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias) -> dict:
    """The canonical entries (PARAM-1) of nn.MultiheadAttention's packed layout, as views.

    Any arrays with slicing and ``.T`` (NumPy or torch): in_proj_weight
    (3D, D), in_proj_bias (3D,) or None, out_proj_weight (D, D),
    out_proj_bias (D,) or None. Biases come out iff in_proj_bias is given.
    """
    D = out_proj_weight.shape[0]
    w = in_proj_weight
    params = {"wq": w[:D].T, "wk": w[D : 2 * D].T, "wv": w[2 * D :].T, "wo": out_proj_weight.T}
    if in_proj_bias is not None:
        b = in_proj_bias
        params.update(bq=b[:D], bk=b[D : 2 * D], bv=b[2 * D :], bo=out_proj_bias)
    return params


def pack(params: dict) -> dict:
    """The inverse of ``unpack`` for tensors: nn.MultiheadAttention's parameter names -> tensors."""
    packed = {
        "in_proj_weight": torch.cat([params["wq"].T, params["wk"].T, params["wv"].T]),
        "out_proj.weight": params["wo"].T,
    }
    if "bq" in params:
        packed["in_proj_bias"] = torch.cat([params["bq"], params["bk"], params["bv"]])
        packed["out_proj.bias"] = params["bo"]
    return packed


def canonical_of(module: nn.MultiheadAttention, grad: bool = False) -> dict:
    """The canonical parameters of a module (with ``grad``: their gradients) as NumPy arrays, exactly."""

    def get(t):
        if t is None:
            return None
        return to_numpy(t.grad if grad else t)

    packed = unpack(
        get(module.in_proj_weight), get(module.in_proj_bias), get(module.out_proj.weight), get(module.out_proj.bias)
    )
    return {n: a.copy() for n, a in packed.items()}  # C-contiguous copies of the transposed views


def from_torch_mha(module: nn.MultiheadAttention):
    """(spec, canonical params as NumPy arrays) of an ``nn.MultiheadAttention``, exactly."""
    if not isinstance(module, nn.MultiheadAttention):
        raise TypeError(f"module: expected a torch.nn.MultiheadAttention, got {type(module).__name__}")
    if module.bias_k is not None or module.add_zero_attn:
        raise fail_value(
            "module", "no add_bias_kv / add_zero_attn (attnspec has no extra key/value rows)", "a module that uses them"
        )
    if not module._qkv_same_embed_dim:
        raise fail_value(
            "module", "kdim == vdim == embed_dim (one packed in_proj_weight)", f"kdim={module.kdim}, vdim={module.vdim}"
        )
    D, H = module.embed_dim, module.num_heads
    spec = AttentionSpec(num_heads=H, head_dim=D // H, bias=module.in_proj_bias is not None)
    return spec, canonical_of(module)


#: What nn.MultiheadAttention lacks for each peer option of AttentionSpec: field -> (rule, why), its own
#: reasons for ``require_plain_attention`` (relative positions, scale and mask_fill get the generic one).
MHA_LACKS = {
    "num_kv_heads": ("HEAD-3", "nn.MultiheadAttention has no grouped key/value heads"),
    "value_head_dim": (
        "HEAD-4",
        "nn.MultiheadAttention has no value head size of its own (its value heads have embed_dim // num_heads "
        "channels)",
    ),
    "softcap": ("SOFTCAP-1", "nn.MultiheadAttention has no logit soft-capping"),
    "window": (
        "WINDOW-1",
        "nn.MultiheadAttention has no window on the distance (pass the window as its attn_mask instead)",
    ),
}


_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def to_torch_mha(spec: AttentionSpec, params: dict, device=None) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention(batch_first=True)`` holding the canonical parameters, exactly.

    Its dtype is that of ``params`` (NumPy arrays or tensors). Remember its
    boolean masks are True = *ignore*.
    """
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"spec: expected an AttentionSpec, got {type(spec).__name__}")
    require_plain_attention(spec, "nn.MultiheadAttention", lacks=MHA_LACKS)  # HEAD-3, HEAD-4, SOFTCAP-1, WINDOW-1 first
    wq = params["wq"]
    dtype = wq.dtype if isinstance(wq, torch.Tensor) else _DTYPES[wq.dtype.name]
    D, H = spec.model_dim, spec.num_heads
    m = nn.MultiheadAttention(D, H, bias=spec.bias, batch_first=True, dropout=spec.dropout, device=device, dtype=dtype)
    t = {n: from_numpy(a, dtype, m.in_proj_weight.device) for n, a in params.items()}
    targets = dict(m.named_parameters())
    with torch.no_grad():
        for name, value in pack(t).items():
            targets[name].copy_(value)
    return m
