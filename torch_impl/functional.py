"""The functional core: multi-head attention with relative positions in PyTorch.

    score[b,h,i,j]  = s * q_i . k_j  +  s_rel * rel_key(i, j)      k_j of key/value head h // G (HEAD-3)
    logits[b,h,i,j] = cap(score)  +  bias[b,h,i,j]                 (cap: SOFTCAP-1, or none)
    w               = softmax over allowed keys (exact zeros elsewhere; causal, window, mask, bias -inf)
    o_i             = sum_j w'_ij v_j  +  sum_j w'_ij rel_v[idx_ij]        w' = dropout(w)
    out             = merge(o) @ wo + bo

Axis legend (AXES-1): B, H, Lq, Lk, D, d; Hkv key/value heads, G = H / Hkv
(HEAD-3), dv value head dim (HEAD-4). Device-agnostic: every tensor is
created on the query's device. This module checks the arguments, projects
and splits the heads, and hands the per-head core to one kernel
(``torch_impl.kernels``, KERN-1): ``"eager"``, the readable baseline;
``"sdpa"``, PyTorch's fused kernel for vanilla and RoPE calls; ``"tiles"``, the
cache-sized tiles for everything else.
"""

from __future__ import annotations

from typing import Optional

import torch

from spec import AttentionSpec

from . import _checks, _core, kernels, schemes
from .kernels import eager, flex, fused, sdpa, tiles


def attention(
    spec: AttentionSpec,
    params: dict,
    query: torch.Tensor,
    key: Optional[torch.Tensor] = None,
    value: Optional[torch.Tensor] = None,
    *,
    mask=None,
    bias=None,
    q_positions=None,
    k_positions=None,
    dropout_keep=None,
    return_weights: bool = False,
    implementation=None,
):
    """Multi-head attention (spec/attention.md) over tensors; autograd through everything.

    Checks the arguments (INPUT-1), zeroes the key and value rows of dead keys
    before the projections (MASK-7), projects and splits the heads (PROJ-1,
    HEAD-1, HEAD-3, HEAD-4), hands the per-head core to one kernel (KERN-1),
    merges the heads and projects the output (HEAD-2, OUT-1).

    Args:
      spec: the layer's ``AttentionSpec``.
      params: canonical tensors, ``spec.param_shapes()`` (wk (D, Hkv * d), wv (D, Hkv * dv),
        wo (H * dv, D), PARAM-1), in the query's dtype and device.
      query: [B, Lq, D]; key: [B, Lk, D] or None (= query); value: [B, Lk, D] or None (= key).
      mask: bool, True = attend, broadcastable to [B, H, Lq, Lk] (MASK-1).
      bias: float, broadcastable to [B, H, Lq, Lk], unscaled; -inf disallows (BIAS-1, BIAS-2).
      q_positions / k_positions: int [Lq] / [Lk] or [B, Lq] / [B, Lk] (POS-1).
      dropout_keep: bool [B, H, Lq, Lk] keep mask, only with spec.dropout > 0 (DROP-1..3).
      return_weights: also return the post-softmax, pre-dropout weights [B, H, Lq, Lk].
      implementation: the kernel (KERN-1): None picks (``"sdpa"`` when it
        supports the call, else ``"tiles"``; sdpa has no softcap, SOFTCAP-1); ``"eager"``, ``"sdpa"``,
        ``"tiles"``, ``"flex"`` (FlexAttention, compiled), ``"triton"`` (one fused Triton program: forward
        calls; through Triton's interpreter where no CUDA device is present); or a kernel object such as
        ``torch_impl.kernels.Tiles(query_rows=64)`` or ``torch_impl.kernels.Flex(compiled=False)``.
        A kernel that cannot run the call is a ``ValueError`` saying why.

    Returns:
      out [B, Lq, D] in the query's dtype, or (out, weights).
    """
    B, Lq, Lk = _checks.check(spec, params, query, key, value, mask, bias, q_positions, k_positions, dropout_keep)
    if spec.relative is not None:
        schemes.module_for(spec.relative)  # REL-4: a scheme without a torch_impl module is an error here
    call = _core.Call(
        B,
        Lq,
        Lk,
        query.device,
        mask=mask,
        bias=bias,
        q_positions=q_positions,
        k_positions=k_positions,
        dropout_keep=dropout_keep,
        return_weights=return_weights,
        causal=spec.causal,
        window=spec.window,
        dtype=query.dtype,
        requires_grad=torch.is_grad_enabled()
        and any(t is not None and t.requires_grad for t in (query, key, value, bias, *params.values())),
    )
    kernel = kernels.resolve(implementation, spec, call)  # KERN-1
    key = query if key is None else key
    value = key if value is None else value
    H, Hkv, p = spec.num_heads, spec.kv_heads, params

    if call.allowed is not None and spec.mask_fill is None:  # MASK-7: dead keys contribute nothing, not even NaN
        dead = _core.dead_keys(call.allowed, B, Lk).unsqueeze(-1)  # (B, Lk, 1)
        key, value = key.masked_fill(dead, 0.0), value.masked_fill(dead, 0.0)
    q = _core.split_heads(_core.project(query, p["wq"], p.get("bq")), H)  # (B, H, Lq, d)
    k = _core.split_heads(_core.project(key, p["wk"], p.get("bk")), Hkv)  # (B, Hkv, Lk, d), HEAD-3
    v = _core.split_heads(_core.project(value, p["wv"], p.get("bv")), Hkv)  # (B, Hkv, Lk, dv), HEAD-4

    match kernel.name:  # KERN-1: a closed choice
        case "eager":
            o, weights = eager.attention(spec, p, q, k, v, call)
        case "sdpa":
            o, weights = sdpa.attention(spec, p, q, k, v, call), None
        case "tiles":
            o, weights = tiles.attention(kernel, spec, p, q, k, v, call)
        case "flex":
            o, weights = flex.attention(kernel, spec, p, q, k, v, call), None
        case "triton":
            o, weights = fused.attention(kernel, spec, p, q, k, v, call), None
        case name:
            raise ValueError(f"implementation: expected one of {sorted(kernels.KERNELS)}, got {name!r}")
    out = _core.project(_core.merge_heads(o), p["wo"], p.get("bo"))  # (B, Lq, H * dv) -> (B, Lq, D), OUT-1
    return (out, weights) if return_weights else out
