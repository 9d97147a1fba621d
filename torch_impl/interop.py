"""Conversion to and from ``torch.nn.MultiheadAttention`` (batch_first).

``in_proj_weight`` stacks the (out, in) weights of q, k and v, so the
canonical ``wq = in_proj_weight[:D].T`` and so on (spec/comparison.md).
Only the configurations both can express convert: no relative positions,
default scale, no mask_fill on our side; no ``add_bias_kv``,
``add_zero_attn`` or separate ``kdim``/``vdim`` on theirs.
"""

from __future__ import annotations

import torch
from torch import nn

from spec import AttentionSpec
from spec.validation import fail_value, require_plain_attention

from .module import from_numpy, to_numpy


def from_torch_mha(module: nn.MultiheadAttention):
    """(spec, canonical params as NumPy arrays) of an ``nn.MultiheadAttention``, exactly."""
    if not isinstance(module, nn.MultiheadAttention):
        raise TypeError(f"module: expected a torch.nn.MultiheadAttention, got {type(module).__name__}")
    if module.bias_k is not None or module.add_zero_attn:
        raise fail_value("module", "no add_bias_kv / add_zero_attn (attnspec has no extra key/value rows)",
                         "a module that uses them")
    if not module._qkv_same_embed_dim:
        raise fail_value("module", "kdim == vdim == embed_dim (one packed in_proj_weight)",
                         f"kdim={module.kdim}, vdim={module.vdim}")
    D, H = module.embed_dim, module.num_heads
    spec = AttentionSpec(num_heads=H, head_dim=D // H, bias=module.in_proj_bias is not None)
    w = to_numpy(module.in_proj_weight)
    params = {"wq": w[:D].T.copy(), "wk": w[D:2 * D].T.copy(), "wv": w[2 * D:].T.copy(),
              "wo": to_numpy(module.out_proj.weight).T.copy()}
    if spec.bias:
        b = to_numpy(module.in_proj_bias)
        params.update(bq=b[:D].copy(), bk=b[D:2 * D].copy(), bv=b[2 * D:].copy(), bo=to_numpy(module.out_proj.bias))
    return spec, params


def to_torch_mha(spec: AttentionSpec, params: dict, device=None) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention(batch_first=True)`` holding the canonical parameters, exactly.

    Its dtype is that of ``params``. Remember its boolean masks are True = *ignore*.
    """
    require_plain_attention(spec, "nn.MultiheadAttention")
    wq = params["wq"]
    dtype = wq.dtype if isinstance(wq, torch.Tensor) else {"float64": torch.float64, "float32": torch.float32,
                                                           "float16": torch.float16,
                                                           "bfloat16": torch.bfloat16}[wq.dtype.name]
    D, H = spec.model_dim, spec.num_heads
    m = nn.MultiheadAttention(D, H, bias=spec.bias, batch_first=True, dropout=spec.dropout, device=device,
                              dtype=dtype)
    t = {n: from_numpy(a, dtype, m.in_proj_weight.device) for n, a in params.items()}
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.cat([t["wq"].T, t["wk"].T, t["wv"].T]))
        m.out_proj.weight.copy_(t["wo"].T)
        if spec.bias:
            m.in_proj_bias.copy_(torch.cat([t["bq"], t["bk"], t["bv"]]))
            m.out_proj.bias.copy_(t["bo"])
    return m
