"""The vectorised float64 forward pass: the spec's executable form.

    logits[b,h,i,j] = s * q_i . k_j  +  s_rel * rel_k_term(i, j)  +  bias[b,h,i,j]
    w               = softmax_j over allowed keys          (zero elsewhere)
    o_i             = sum_j w'_ij v_j  +  sum_j w'_ij rel_v[idx_ij]     w' = dropout(w)
    out             = merge(o) @ wo + bo

Axis legend (AXES-1): B batch, H heads, Lq / Lk query / key length, D model
dim, d head dim. Implements PROJ-1, HEAD-1, HEAD-2, SCALE-1..SCALE-4, POS-1,
POS-2, CAUSAL-1, MASK-1..MASK-7, BIAS-1, BIAS-2, SOFTMAX-1, SOFTMAX-2,
DROP-1..DROP-4, REL-1, REL-2, SHAW-1..SHAW-4, HUANG-1..HUANG-4, OUT-1, PREC-1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from spec import AttentionSpec, Shaw

from . import relative as rel
from ._inputs import Call, prepare
from .heads import merge_heads, split_heads
from .masking import allowed_keys, dead_keys, masked_softmax, relative_distance


@dataclass
class RelativeKeyTerm:
    """What the relative key term needs again in the backward pass."""

    table4: np.ndarray  # the table (or its reachable rows) as (1|B, 1|H, R, d)
    index: Optional[np.ndarray]  # gather index (1|B, Lq, Lk), None for the skew
    valid: Optional[np.ndarray]  # where the gathered term counts (Huang), else None
    row: Optional[np.ndarray] = None  # skew: table row of each reachable distance
    row_valid: Optional[np.ndarray] = None


@dataclass
class Trace:
    """Every intermediate of one forward pass (the backward pass reads them)."""

    call: Call
    q: np.ndarray  # (B, H, Lq, d)
    k: np.ndarray  # (B, H, Lk, d)
    v: np.ndarray  # (B, H, Lk, d)
    dead: Optional[np.ndarray]  # (B, Lk) keys zeroed before projection (MASK-7)
    allowed: np.ndarray  # (B, H, Lq, Lk) bool
    weights: np.ndarray  # (B, H, Lq, Lk), post-softmax, pre-dropout
    dropped: np.ndarray  # weights after dropout (DROP-1)
    shaw_index: Optional[np.ndarray]  # (1|B, Lq, Lk)
    shaw_buckets: Optional[np.ndarray]  # (B, H, Lq, 2k+1) value-side bucket sums
    key_term: Optional[RelativeKeyTerm]
    merged: np.ndarray  # (B, Lq, D)
    out: np.ndarray  # (B, Lq, D)


def project(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray]) -> np.ndarray:
    """PROJ-1 / OUT-1: x @ W + b with W stored (in, out)."""
    y = x @ w
    return y if b is None else y + b


def relative_key_term(spec: AttentionSpec, p: dict, q: np.ndarray, call: Call,
                      delta: np.ndarray):
    """REL-1: the relative key logits (B, H, Lq, Lk), before the s_rel factor."""
    r = spec.relative
    Lq, Lk = call.dims.Lq, call.dims.Lk
    table4 = rel.as_4d(p["rel_k"])
    if isinstance(r, Shaw):  # SHAW-3: gather q @ rel_k.T by the clipped index (SHAW-2)
        index = rel.shaw_index(delta, r.max_distance)
        term = RelativeKeyTerm(table4, index, None)
        return rel.gather_buckets(rel.rows_logits(q, table4), index), term
    offset = rel.contiguous_offset(call.q_positions, call.k_positions)
    if offset is not None:  # HUANG-4: reachable rows, one matmul, then the skew
        rows, row, row_valid = rel.reachable_rows(table4, offset, Lq, Lk, r.max_len)
        term = RelativeKeyTerm(rows, None, None, row, row_valid)
        return np.array(rel.skew(rel.rows_logits(q, rows), Lk)), term
    index, valid = rel.huang_index(delta, r.max_len)  # HUANG-4: gather by relative index
    term = RelativeKeyTerm(table4, index, valid)
    return np.where(valid[:, None], rel.gather_buckets(rel.rows_logits(q, table4), index), 0.0), term


def run(spec: AttentionSpec, call: Call) -> Trace:
    """The forward pass over a validated call, keeping every intermediate."""
    p = call.params
    B, Lq, Lk = call.dims
    H = spec.num_heads
    delta = relative_distance(call.q_positions, call.k_positions)  # (1|B, Lq, Lk)
    allowed = allowed_keys((B, H, Lq, Lk), delta, causal=spec.causal, mask=call.mask, bias=call.bias)

    key, value, dead = call.key, call.value, None
    if spec.mask_fill is None:  # MASK-7: dead keys' rows cannot reach the result
        dead = dead_keys(allowed)
        key = np.where(dead[..., None], 0.0, key)
        value = np.where(dead[..., None], 0.0, value)

    q = split_heads(project(call.query, p["wq"], p.get("bq")), H)  # (B, H, Lq, d)
    k = split_heads(project(key, p["wk"], p.get("bk")), H)  # (B, H, Lk, d)
    v = split_heads(project(value, p["wv"], p.get("bv")), H)  # (B, H, Lk, d)

    logits = spec.effective_scale * (q @ k.swapaxes(-1, -2))  # SCALE-2, (B, H, Lq, Lk)
    key_term, shaw_idx = None, None
    if isinstance(spec.relative, Shaw):
        shaw_idx = rel.shaw_index(delta, spec.relative.max_distance)
    if spec.relative is not None and "rel_k" in p:
        term, key_term = relative_key_term(spec, p, q, call, delta)
        logits = logits + spec.relative_scale * term  # SCALE-3
    if call.bias is not None:
        logits = logits + call.bias  # BIAS-1: never scaled (SCALE-4)

    weights = masked_softmax(logits, allowed, spec.mask_fill)  # SOFTMAX-1, MASK-5/6
    dropped = weights
    if call.dropout_keep is not None:  # DROP-1
        dropped = np.where(call.dropout_keep, weights / (1.0 - spec.dropout), 0.0)

    o = dropped @ v  # (B, H, Lq, d)
    buckets = None
    if isinstance(spec.relative, Shaw) and spec.relative.values:  # SHAW-4
        buckets = rel.scatter_buckets(dropped, shaw_idx, spec.relative.num_rows)
        o = o + buckets @ rel.as_4d(p["rel_v"])
    merged = merge_heads(o)  # (B, Lq, D)
    out = project(merged, p["wo"], p.get("bo"))  # OUT-1
    return Trace(call, q, k, v, dead, allowed, weights, dropped, shaw_idx, buckets, key_term,
                 merged, out)


def attention(spec: AttentionSpec, params: dict, query, key=None, value=None, *, mask=None,
              bias=None, q_positions=None, k_positions=None, dropout_keep=None,
              return_weights: bool = False):
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
    call = prepare(spec, params, query, key, value, mask=mask, bias=bias, q_positions=q_positions,
                   k_positions=k_positions, dropout_keep=dropout_keep)
    trace = run(spec, call)
    return (trace.out, trace.weights) if return_weights else trace.out
