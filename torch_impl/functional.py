"""The functional core: multi-head attention with relative positions in PyTorch.

    logits[b,h,i,j] = s * q_i . k_j  +  s_rel * rel_key(i, j)  +  bias[b,h,i,j]
    w               = softmax over allowed keys (exact zeros elsewhere)
    o_i             = sum_j w'_ij v_j  +  sum_j w'_ij rel_v[idx_ij]        w' = dropout(w)
    out             = merge(o) @ wo + bo

Axis legend (AXES-1): B, H, Lq, Lk, D, d. Device-agnostic: every tensor is
created on the query's device. Two paths:

- fused: ``F.scaled_dot_product_attention`` when there is no relative term,
  no ``mask_fill``, no keep mask and no weights to return; the spec's masks,
  bias and positions become its ``attn_mask`` (it returns exact zeros for
  rows with no allowed key, MASK-5);
- explicit: everything else, with the softmax statistics in float32 for the
  16-bit dtypes (PREC-4).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from spec import AttentionSpec, Shaw

from . import _checks
from . import relative as rel


def _split(x: torch.Tensor, H: int) -> torch.Tensor:
    """HEAD-1: (B, L, D) -> (B, H, L, d), feature f to head f // d."""
    B, L, D = x.shape
    return x.view(B, L, H, D // H).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    """HEAD-2: (B, H, L, d) -> (B, L, D)."""
    B, H, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, H * d)


def _project(x, w, b):
    """PROJ-1 / OUT-1: x @ W + b, W stored (in, out)."""
    y = x @ w
    return y if b is None else y + b


def _positions(p: Optional[torch.Tensor], L: int, device) -> torch.Tensor:
    """POS-1: (1|B, L) int64 positions, default arange."""
    if p is None:
        return torch.arange(L, device=device).unsqueeze(0)
    p = p.to(torch.int64)
    return p.unsqueeze(0) if p.dim() == 1 else p


def _is_consecutive(q_pos: Optional[torch.Tensor], k_pos: Optional[torch.Tensor]) -> bool:
    """Default positions only: the skew then applies without reading any tensor."""
    return q_pos is None and k_pos is None


def allowed_keys(spec: AttentionSpec, delta: Optional[torch.Tensor], mask, bias) -> Optional[torch.Tensor]:
    """MASK-4: mask AND causal AND bias != -inf, at its broadcast shape; None when all allowed."""
    allowed = None
    if spec.causal:
        allowed = (delta <= 0).unsqueeze(1)  # CAUSAL-1, (1|B, 1, Lq, Lk)
    for part in (mask, None if bias is None else bias != float("-inf")):
        if part is not None:
            allowed = part if allowed is None else allowed & part
    return allowed


def _as4d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))


def _dead_keys(allowed: torch.Tensor, B: int, Lk: int) -> torch.Tensor:
    """MASK-7: keys no query of any head may attend, (B, Lk)."""
    return ~_as4d(allowed).any(dim=2).any(dim=1).expand(B, Lk)


def _relative_key_term(spec, params, q, q_pos, k_pos, delta, Lk):
    """REL-1: the relative key logits (B, H, Lq, Lk) from a query already scaled by s_rel."""
    r = spec.relative
    table = params["rel_k"]
    if isinstance(r, Shaw):  # SHAW-3
        return rel.gather_rows(rel.rows_logits(q, table), rel.shaw_index(delta, r.max_distance))
    if _is_consecutive(q_pos, k_pos):  # HUANG-4: skew over the reachable rows
        if spec.causal:  # only distances <= 0 survive the mask: half the matmul
            rows = rel.reachable_rows_causal(table, q.shape[2], r.max_len)
            return rel.skew_causal(rel.rows_logits(q, rows), Lk)
        rows = rel.reachable_rows(table, q.shape[2], Lk, r.max_len)
        return rel.skew(rel.rows_logits(q, rows), Lk)
    index, valid = rel.huang_index(delta, r.max_len)  # HUANG-4: gather
    term = rel.gather_rows(rel.rows_logits(q, table), index)
    return term.masked_fill(~valid.unsqueeze(1), 0.0)


def _content_logits(q_s, k, term, stat):
    """s * q @ k.T (+ the relative term), in the statistics dtype.

    In the input dtype the relative term is the accumulator of one batched
    matmul (baddbmm), which saves a pass over the (Lq, Lk) logits.
    """
    B, H, Lq, d = q_s.shape
    Lk = k.shape[2]
    if term is not None and term.dtype == stat:
        q3, k3 = q_s.reshape(B * H, Lq, d), k.reshape(B * H, Lk, d).transpose(1, 2)
        if not torch.is_grad_enabled() and term.is_contiguous():
            # inference: accumulate into the term itself, one (Lq, Lk) buffer fewer
            return term.view(B * H, Lq, Lk).baddbmm_(q3, k3).view(B, H, Lq, Lk)
        return torch.baddbmm(term.reshape(B * H, Lq, Lk), q3, k3).view(B, H, Lq, Lk)
    logits = (q_s @ k.transpose(-1, -2)).to(stat)
    return logits if term is None else logits + term.to(stat)


def _masked_softmax(logits: torch.Tensor, allowed: Optional[torch.Tensor], mask_fill,
                    every_row_has_a_key: bool = False) -> torch.Tensor:
    """SOFTMAX-1 with MASK-5 (exact zeros) or MASK-6 (replace by mask_fill).

    ``every_row_has_a_key``: the caller knows no row is fully masked (only a
    top-left causal rule with default positions: key 0 is always allowed), so
    the plain softmax of -inf-filled logits is exact and NaN-free.
    """
    if allowed is None:
        return torch.softmax(logits, dim=-1)
    if every_row_has_a_key and mask_fill is None:
        return torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    if mask_fill is not None:
        return torch.softmax(logits.masked_fill(~allowed, mask_fill), dim=-1)
    z = logits.masked_fill(~allowed, float("-inf"))
    m = z.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()  # rows with no allowed key
    e = torch.exp(z - m)  # exp(-inf) = 0 at disallowed keys
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def attention(spec: AttentionSpec, params: dict, query: torch.Tensor, key: Optional[torch.Tensor] = None,
              value: Optional[torch.Tensor] = None, *, mask=None, bias=None, q_positions=None,
              k_positions=None, dropout_keep=None, return_weights: bool = False):
    """Multi-head attention (spec/attention.md) over tensors; autograd through everything.

    Args:
      spec: the layer's ``AttentionSpec``.
      params: canonical tensors, ``spec.param_shapes()``, in the query's dtype and device.
      query: [B, Lq, D]; key: [B, Lk, D] or None (= query); value: [B, Lk, D] or None (= key).
      mask: bool, True = attend, broadcastable to [B, H, Lq, Lk] (MASK-1).
      bias: float, broadcastable to [B, H, Lq, Lk], unscaled; -inf disallows (BIAS-1, BIAS-2).
      q_positions / k_positions: int [L] or [B, L] (POS-1).
      dropout_keep: bool [B, H, Lq, Lk] keep mask, only with spec.dropout > 0 (DROP-1..3).
      return_weights: also return the post-softmax, pre-dropout weights [B, H, Lq, Lk].

    Returns:
      out [B, Lq, D] in the query's dtype, or (out, weights).
    """
    B, Lq, Lk = _checks.check(spec, params, query, key, value, mask, bias, q_positions, k_positions, dropout_keep)
    key = query if key is None else key
    value = key if value is None else value
    H = spec.num_heads
    device = query.device
    p = params

    need_delta = spec.causal or spec.relative is not None
    q_pos = _positions(q_positions, Lq, device) if need_delta else None
    k_pos = _positions(k_positions, Lk, device) if need_delta else None
    delta = (k_pos.unsqueeze(1) - q_pos.unsqueeze(2)) if need_delta else None  # POS-2, (1|B, Lq, Lk)
    allowed = allowed_keys(spec, delta, mask, bias)
    if allowed is not None and spec.mask_fill is None:  # MASK-7
        dead = _dead_keys(allowed, B, Lk).unsqueeze(-1)
        key, value = key.masked_fill(dead, 0.0), value.masked_fill(dead, 0.0)

    q = _split(_project(query, p["wq"], p.get("bq")), H)  # (B, H, Lq, d)
    k = _split(_project(key, p["wk"], p.get("bk")), H)  # (B, H, Lk, d)
    v = _split(_project(value, p["wv"], p.get("bv")), H)  # (B, H, Lk, d)

    fused = spec.relative is None and spec.mask_fill is None and dropout_keep is None and not return_weights
    if fused:
        o = _fused(spec, q, k, v, allowed, bias, default_causal=spec.causal and q_positions is None
                   and k_positions is None and mask is None and bias is None)
        return _project(_merge(o), p["wo"], p.get("bo"))

    # explicit path; logits and softmax in float32 for the 16-bit dtypes (PREC-4)
    stat = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    q_s = q * spec.effective_scale  # SCALE-2 folded into the query: a (B, H, Lq, d) pass, not (Lq, Lk)
    term = None
    if "rel_k" in p:  # SCALE-3: the relative term sees the same scaled query, or the unscaled one
        term = _relative_key_term(spec, p, q_s if spec.scale_relative else q, q_positions, k_positions, delta, Lk)
    logits = _content_logits(q_s, k, term, stat)
    if bias is not None:
        logits = logits + bias.to(stat)  # BIAS-1, SCALE-4
    every_row_has_a_key = mask is None and bias is None and q_positions is None and k_positions is None
    weights = _masked_softmax(logits, allowed, spec.mask_fill, every_row_has_a_key)
    del logits, term  # free the (Lq, Lk) buffers before the value side (autograd keeps what it needs)
    dropped = weights
    if dropout_keep is not None:  # DROP-1
        dropped = weights.masked_fill(~dropout_keep, 0.0) / (1.0 - spec.dropout)
    dropped_t = dropped.to(query.dtype)
    o = dropped_t @ v
    if isinstance(spec.relative, Shaw) and spec.relative.values:  # SHAW-4, DROP-4
        if q_positions is None and k_positions is None:
            buckets = rel.bucket_sums_banded(dropped, spec.relative.max_distance)
        else:
            buckets = rel.bucket_sums(dropped, rel.shaw_index(delta, spec.relative.max_distance),
                                      spec.relative.num_rows)
        table = p["rel_v"]
        o = o + buckets.to(query.dtype) @ (table if table.dim() == 2 else table.unsqueeze(0))
    out = _project(_merge(o), p["wo"], p.get("bo"))
    return (out, weights.to(query.dtype)) if return_weights else out


def _fused(spec, q, k, v, allowed, bias, default_causal: bool) -> torch.Tensor:
    """The vanilla core through F.scaled_dot_product_attention (MASK-5 holds: it zeroes empty rows)."""
    s = spec.effective_scale
    if default_causal:  # top-left, which is CAUSAL-1 with default positions
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=s)
    if bias is not None:
        attn_mask = bias.to(q.dtype) if allowed is None else bias.to(q.dtype).masked_fill(~allowed, float("-inf"))
    else:
        attn_mask = allowed
    attn_mask = None if attn_mask is None else _as4d(attn_mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=s)
