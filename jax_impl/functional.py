"""The functional core: multi-head attention with relative positions in JAX.

    score[b,h,i,j]  = s * q_i . k_j  +  s_rel * rel_key(i, j)           (k of key/value head h // G)
    logits[b,h,i,j] = cap(score)  +  pos_bias(h, i, j)  +  bias[b,h,i,j]  (cap: c tanh(score / c), SOFTCAP-1;
                                                                          pos_bias: ALiBi, T5, Swin, unscaled)
    w               = softmax over allowed keys (exact zeros elsewhere)  (causal, window, mask, bias)
    o_i             = sum_j w'_ij v_j  +  sum_j w'_ij rel_v[idx_ij]        w' = dropout(w)
    out             = merge(o) @ wo + bo

Pure and jit-able with ``spec`` and ``implementation`` static (both hashable):
``jax.jit(attention, static_argnums=0, static_argnames=("return_weights", "implementation"))``.
Differentiable in every array argument. Axis legend AXES-1: B, H, Lq, Lk, D, d;
Hkv key/value heads and G = H / Hkv (HEAD-3), dv the value head dim (HEAD-4).

This file checks the call (INPUT-1), picks the kernel (KERN-1), projects,
splits the heads and merges them back; *how* the attention itself is
computed is the kernel's (``jax_impl.kernels``), and what a position scheme
adds is its module's (``jax_impl.schemes``).
"""

from __future__ import annotations

import jax.numpy as jnp

from spec import AttentionSpec

from . import _checks, kernels, schemes
from .heads import merge, project, split
from .masking import allowed_keys, dead_keys, distance, positions


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
    implementation=None,
):
    """Multi-head attention (spec/attention.md) over jax arrays.

    Implements INPUT-1, PROJ-1, HEAD-1..HEAD-4, POS-1, POS-2, MASK-4, MASK-7, OUT-1, KERN-1 here; the
    rest through ``masking`` and the kernel.

    Args:
      spec: the layer's ``AttentionSpec`` (static under jit).
      params: canonical arrays, ``spec.param_shapes()``, in the query's dtype (wk [D, Hkv * d],
        wv [D, Hkv * dv], wo [H * dv, D] with grouped heads or a value head size, HEAD-3, HEAD-4).
      query: [B, Lq, D]; key: [B, Lk, D] or None (= query); value: [B, Lk, D] or None (= key).
      mask: bool, True = attend, broadcastable to [B, H, Lq, Lk] (MASK-1).
      bias: float, broadcastable to [B, H, Lq, Lk], unscaled; -inf disallows (BIAS-1, BIAS-2).
      q_positions / k_positions: int [L] or [B, L] (POS-1).
      dropout_keep: bool [B, H, Lq, Lk], only with spec.dropout > 0 (DROP-1..3).
      return_weights: also return the post-softmax, pre-dropout weights [B, H, Lq, Lk].
      implementation: None (chosen automatically), a kernel name (``"xla"``,
        ``"tiles"``, ``"pallas"``: one fused Pallas program, forward calls, interpret mode on a CPU) or a
        kernel object (``jax_impl.kernels.Tiles(query_rows=128)``);
        static under jit. An unknown name or a kernel that does not support
        the call is a ``ValueError`` (KERN-1).

    Returns:
      out [B, Lq, D] in the query's dtype, or (out, weights).
    """
    B, Lq, Lk = _checks.check(spec, params, query, key, value, mask, bias, q_positions, k_positions, dropout_keep)
    if spec.relative is not None:
        schemes.module_for(spec.relative)  # REL-4: a scheme jax_impl does not implement is a ValueError
    call = kernels.Call.of(
        query,
        key,
        mask=mask,
        bias=bias,
        q_positions=q_positions,
        k_positions=k_positions,
        dropout_keep=dropout_keep,
        return_weights=return_weights,
    )
    kernel = kernels.resolve(implementation, spec, call)  # KERN-1
    key = query if key is None else key
    value = key if value is None else value
    H, Hkv, p = spec.num_heads, spec.kv_heads, params
    dtype = query.dtype
    q_pos = k_pos = delta = None
    if spec.causal or spec.window is not None or spec.relative is not None:
        q_pos, k_pos = positions(q_positions, Lq), positions(k_positions, Lk)  # POS-1
        delta = distance(q_pos, k_pos)  # POS-2, (1|B, Lq, Lk)
    allowed = allowed_keys(spec, delta, mask, bias)  # MASK-4
    if allowed is not None and spec.mask_fill is None:  # MASK-7: dead keys become zero rows
        dead = dead_keys(allowed, B, Lk)[..., None]
        key, value = jnp.where(dead, 0, key).astype(dtype), jnp.where(dead, 0, value).astype(dtype)

    q = split(project(query, p["wq"], p.get("bq")), H)  # (B, H, Lq, d)
    k = split(project(key, p["wk"], p.get("bk")), Hkv)  # (B, Hkv, Lk, d), HEAD-3
    v = split(project(value, p["wv"], p.get("bv")), Hkv)  # (B, Hkv, Lk, dv), HEAD-3, HEAD-4
    o, weights = kernel(spec, p, kernels.Inputs(q, k, v, q_pos, k_pos, delta, allowed, bias, dropout_keep), call)
    out = project(merge(o), p["wo"], p.get("bo"))  # (B, Lq, H * dv) @ (H * dv, D) -> (B, Lq, D), OUT-1
    return (out, weights.astype(dtype)) if return_weights else out
