"""``"eager"``: the readable baseline, every rule on the whole (B, H, Lq, Lk) logits (KERN-1).

    q, k   = qk_transform(q, k)                                             (REL-3 (1): RoPE)
    score  = s * q @ k.T  +  s_rel * key_term(q, delta)                     (REL-1, SCALE-2, SCALE-3, HEAD-3)
             +  s_side * key_side_term(k, delta)                            (SHAW-6, SHAW-7)
    logits = cap(score)  +  scheme_bias(positions)  +  bias                 (SOFTCAP-1, REL-3 (3), SCALE-4)
    w      = softmax over the allowed keys                                  (SOFTMAX-1, MASK-4..6, WINDOW-1)
    o      = w' @ v  +  value_term(w', delta),   w' = dropout(w)            (DROP-1, DROP-4, HEAD-4)

The scheme hooks are the plain algorithms (a gather and a scatter by the
index from delta, the scheme bias of the whole call); no tiles, no reused
buffers. Every other kernel is tested against this one. The logits, the
scheme bias and the softmax are in float32 for the 16-bit dtypes (PREC-4).
Grouped key/value heads are read in place (``_core.grouped_scores`` /
``grouped_values``), never repeated. Axis legend (AXES-1): B, H, Lq, Lk,
d; Hkv, G = H / Hkv (HEAD-3); dv (HEAD-4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import _core, schemes
from ._base import Kernel, scheme_bias, transform_qk


@dataclass(frozen=True)
class Eager(Kernel):
    """The readable baseline; it runs every call (KERN-1)."""

    name: ClassVar[str] = "eager"
    scheme_hooks: ClassVar[frozenset] = frozenset({"qk_transform", "key_term", "key_side_term", "bias", "value_term"})


def block_logits(spec, params: dict, q, k, call: _core.Call):
    """The logits (B, H, Lq, Lk) of q against k (after any q/k transform), every term in REL-3 order, in the stat
    dtype (float32 for the 16-bit dtypes, PREC-4), before the masks: SCALE-2..4, REL-1, SOFTCAP-1, HEAD-3.
    ``attention`` takes their softmax; the ring (``torch_impl.ring``) the statistics of one block (BLOCK-2)."""
    scheme = spec.relative
    unit = None if scheme is None else schemes.module_for(scheme)
    hooks = frozenset() if scheme is None else scheme.hooks
    stat = _core.stat_dtype(q.dtype)  # PREC-4
    logits = spec.effective_scale * _core.grouped_scores(q, k).to(stat)  # (B, H, Lq, Lk), SCALE-2, HEAD-3
    if "key_term" in hooks:  # REL-1, SCALE-3
        logits = logits + spec.relative_scale * unit.key_term(scheme, params, q, call.delta).to(stat)
    if "key_side_term" in hooks:  # SHAW-6, SHAW-7: from the key heads, read in place (HEAD-3)
        term = unit.key_side_term(scheme, params, k, call.delta, group=spec.group_size)
        logits = logits + spec.key_side_scale * term.to(stat)
    logits = _core.softcap(logits, spec.softcap)  # SOFTCAP-1: the score, before the biases and the masks
    if "bias" in hooks:  # REL-3 (3): unscaled, in the stat dtype (PREC-4)
        logits = logits + scheme_bias(spec, params, call, stat)
    if call.bias is not None:  # BIAS-1, SCALE-4: unscaled
        logits = logits + call.bias.to(stat)
    return logits


def attention(spec, params: dict, q, k, v, call: _core.Call):
    """q (B, H, Lq, d), k (B, Hkv, Lk, d), v (B, Hkv, Lk, dv) -> (o (B, H, Lq, dv), weights (B, H, Lq, Lk) or None).

    Implements REL-3, SCALE-2..4, REL-1, SOFTCAP-1, MASK-4..6 (through ``call.allowed``:
    CAUSAL-1, WINDOW-1), SOFTMAX-1, DROP-1, DROP-4, HEAD-3, HEAD-4, PREC-4.
    """
    q, k = transform_qk(spec, params, q, k, call)  # REL-3 (1): after the head split, before any logit
    scheme = spec.relative
    unit = None if scheme is None else schemes.module_for(scheme)
    hooks = frozenset() if scheme is None else scheme.hooks
    logits = block_logits(spec, params, q, k, call)
    weights = _core.masked_softmax(logits, call.allowed, spec.mask_fill)  # SOFTMAX-1, MASK-5, MASK-6
    dropped = _core.dropout(weights, call.dropout_keep, spec.dropout)  # DROP-1
    o = _core.grouped_values(dropped.to(q.dtype), v)  # (B, H, Lq, dv), HEAD-3, HEAD-4
    if "value_term" in hooks:  # DROP-4: from the weights after dropout
        o = o + unit.value_term(scheme, params, dropped, call.delta)
    return o, (weights.to(q.dtype) if call.return_weights else None)
