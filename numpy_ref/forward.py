"""The vectorised float64 forward pass: the spec's executable form.

    k, v            = the key/value head of each query head     (HEAD-3)
    q, k            = qk_transform(q, k)                       (scheme hook 1)
    score[b,h,i,j]  = s * q_i . k_j  +  s_rel * key_term(i, j)  +  s_side * key_side_term(i, j)
    logits[b,h,i,j] = cap(score)  +  scheme_bias(i, j)  +  bias[b,h,i,j]      (cap: SOFTCAP-1, or none)
    w               = softmax_j over allowed keys          (zero elsewhere)
    o_i             = sum_j w'_ij v_j  +  value_term(w')_i           w' = dropout(w)
    out             = merge(o) @ wo + bo

The position scheme contributes only through its hooks (REL-3), found in
``numpy_ref.schemes`` by the scheme's name; this file never names a scheme.
Axis legend (AXES-1): B batch, H heads, Lq / Lk query / key length, D model
dim, d head dim. Implements PROJ-1, HEAD-1..HEAD-4, SCALE-1..SCALE-4, POS-1,
POS-2, CAUSAL-1, WINDOW-1, SOFTCAP-1, MASK-1..MASK-7, BIAS-1, BIAS-2, SOFTMAX-1, SOFTMAX-2,
DROP-1..DROP-4, REL-1..REL-3, OUT-1, PREC-1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from spec import AttentionSpec

from . import schemes
from ._inputs import Call, prepare
from .heads import merge_heads, repeat_kv_heads, split_heads
from .masking import allowed_keys, dead_keys, masked_softmax, relative_distance, softcap


@dataclass
class Trace:
    """Every intermediate of one forward pass (the backward pass reads them)."""

    call: Call
    hooks: schemes.Bound  # the scheme's hooks this call applied (REL-3)
    ctx: schemes.Context
    q: np.ndarray  # (B, H, Lq, d), after the q/k transform
    k: np.ndarray  # (B, H, Lk, d), each query head's key head (HEAD-3), after the q/k transform
    v: np.ndarray  # (B, H, Lk, dv), each query head's value head (HEAD-3, HEAD-4)
    capped: Optional[np.ndarray]  # (B, H, Lq, Lk) tanh(score / cap) under SOFTCAP-1, else None
    dead: Optional[np.ndarray]  # (B, Lk) keys zeroed before projection (MASK-7)
    allowed: np.ndarray  # (B, H, Lq, Lk) bool
    weights: np.ndarray  # (B, H, Lq, Lk), post-softmax, pre-dropout
    dropped: np.ndarray  # weights after dropout (DROP-1)
    merged: np.ndarray  # (B, Lq, H * dv)
    out: np.ndarray  # (B, Lq, D)
    saved: dict = field(default_factory=dict)  # hook kind -> what the hook saved for its VJP
    logits: Optional[np.ndarray] = None  # (B, H, Lq, Lk), every term, before the masks (blockwise: BLOCK-2)
    heads: Optional[np.ndarray] = None  # (B, H, Lq, dv), each head's output before the merge (BLOCK-2)


def project(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray]) -> np.ndarray:
    """PROJ-1 / OUT-1: x @ W + b with W stored (in, out)."""
    y = x @ w
    return y if b is None else y + b


def context(spec: AttentionSpec, call: Call, delta: np.ndarray) -> schemes.Context:
    """The positions and sizes a scheme's hooks see (REL-3, POS-1, POS-2)."""
    B, Lq, Lk = call.dims
    return schemes.Context(call.q_positions, call.k_positions, delta, B, spec.num_heads, spec.head_dim, Lq, Lk)


def run(spec: AttentionSpec, call: Call) -> Trace:
    """The forward pass over a validated call, keeping every intermediate; dead keys' rows zeroed first (MASK-7).

    The scheme's hooks are applied in the order of REL-3: q/k transform, key
    term (times s_rel, SCALE-3), key-side term (SHAW-7), bias (unscaled), value term (after dropout,
    DROP-4).
    """
    p = call.params
    B, Lq, Lk = call.dims
    H = spec.num_heads
    hooks = schemes.bind(spec.relative)
    delta = relative_distance(call.q_positions, call.k_positions)  # (1|B, Lq, Lk)
    ctx = context(spec, call, delta)
    allowed = allowed_keys(
        (B, H, Lq, Lk), delta, causal=spec.causal, mask=call.mask, bias=call.bias, window=spec.window
    )

    key, value, dead = call.key, call.value, None
    if spec.mask_fill is None:  # MASK-7: dead keys' rows cannot reach the result
        dead = dead_keys(allowed)
        key = np.where(dead[..., None], 0.0, key)
        value = np.where(dead[..., None], 0.0, value)

    q = split_heads(project(call.query, p["wq"], p.get("bq")), H)  # (B, H, Lq, d)
    Hkv, G = spec.kv_heads, spec.group_size  # HEAD-3: Hkv key/value heads, each read by G query heads
    k = repeat_kv_heads(split_heads(project(key, p["wk"], p.get("bk")), Hkv), G)  # (B, H, Lk, d)
    v = repeat_kv_heads(split_heads(project(value, p["wv"], p.get("bv")), Hkv), G)  # (B, H, Lk, dv), HEAD-4
    saved: dict = {}
    if hooks.uses("qk_transform"):  # REL-3 (1): after the head split, before any logit
        q, k, saved["qk_transform"] = hooks.call("qk_transform", p, q, k, ctx)

    logits = spec.effective_scale * (q @ k.swapaxes(-1, -2))  # SCALE-2, (B, H, Lq, Lk)
    if hooks.uses("key_term"):  # REL-3 (2), REL-1
        term, saved["key_term"] = hooks.call("key_term", p, q, ctx)
        logits = logits + spec.relative_scale * term  # SCALE-3
    if hooks.uses("key_side_term"):  # REL-3 (2b): from each query head's key head (SHAW-6)
        term, saved["key_side_term"] = hooks.call("key_side_term", p, k, ctx)
        logits = logits + spec.key_side_scale * term  # SHAW-7
    capped = None
    if spec.softcap is not None:  # SOFTCAP-1: the score, before every bias and mask
        logits, capped = softcap(logits, spec.softcap)
    if hooks.uses("bias"):  # REL-3 (3): unscaled, like the bias input
        scheme_bias, saved["bias"] = hooks.call("bias", p, ctx)
        logits = logits + scheme_bias
    if call.bias is not None:
        logits = logits + call.bias  # BIAS-1: never scaled (SCALE-4)

    weights = masked_softmax(logits, allowed, spec.mask_fill)  # SOFTMAX-1, MASK-5/6
    dropped = weights
    if call.dropout_keep is not None:  # DROP-1
        dropped = np.where(call.dropout_keep, weights / (1.0 - spec.dropout), 0.0)

    o = dropped @ v  # (B, H, Lq, dv)
    if hooks.uses("value_term"):  # REL-3 (4), REL-1: from the weights after dropout (DROP-4)
        o_add, saved["value_term"] = hooks.call("value_term", p, dropped, ctx)
        o = o + o_add
    merged = merge_heads(o)  # (B, Lq, H * dv)
    out = project(merged, p["wo"], p.get("bo"))  # OUT-1
    return Trace(
        call, hooks, ctx, q, k, v, capped, dead, allowed, weights, dropped, merged, out, saved, logits=logits, heads=o
    )


def attention(
    spec: AttentionSpec,
    params: dict,
    query,
    key=None,
    value=None,
    *,
    mask=None,
    bias=None,
    q_positions=None,
    k_positions=None,
    dropout_keep=None,
    return_weights: bool = False,
):
    """Multi-head attention with optional relative positions, in float64.

    Args:
      spec: the layer's ``AttentionSpec``.
      params: canonical parameters, ``spec.param_shapes()`` (PARAM-1).
      query: [B, Lq, D]; key: [B, Lk, D] or None (= query); value: [B, Lk, D]
        or None (= key) (SHAPE-1, SHAPE-2). Any floating dtype; converted to
        float64 exactly (PREC-1).
      mask: bool, True = attend, broadcastable to [B, H, Lq, Lk] (MASK-1).
      bias: float, broadcastable to [B, H, Lq, Lk], added after scaling; -inf
        disallows a key (BIAS-1, BIAS-2).
      q_positions: int [Lq] or [B, Lq]; k_positions: int [Lk] or [B, Lk];
        default arange (POS-1).
      dropout_keep: bool [B, H, Lq, Lk] keep mask; only with spec.dropout > 0;
        None applies no dropout (DROP-2, DROP-3).
      return_weights: also return the weights [B, H, Lq, Lk], post-softmax
        and pre-dropout (SOFTMAX-2).

    Returns:
      out [B, Lq, D] float64, or (out, weights).
    """
    call = prepare(
        spec,
        params,
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        q_positions=q_positions,
        k_positions=k_positions,
        dropout_keep=dropout_keep,
    )
    trace = run(spec, call)
    return (trace.out, trace.weights) if return_weights else trace.out
