"""``"eager"``: the readable baseline, every rule on the whole (B, H, Lq, Lk) logits (KERN-1).

    logits = s * q @ k.T  +  s_rel * key_term(q, delta)  +  bias           (REL-1, SCALE-2..4)
    w      = softmax over the allowed keys                                  (SOFTMAX-1, MASK-4..6)
    o      = w' @ v  +  value_term(w', delta),   w' = dropout(w)            (DROP-1, DROP-4)

The scheme hooks are the plain algorithms (a gather and a scatter by the
index from delta); no tiles, no reused buffers. Every other kernel is
tested against this one. The logits and the softmax are in float32 for the
16-bit dtypes (PREC-4). Axis legend (AXES-1): B, H, Lq, Lk, d.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import _core, schemes
from ._base import Kernel


@dataclass(frozen=True)
class Eager(Kernel):
    """The readable baseline; it runs every call (KERN-1)."""

    name: ClassVar[str] = "eager"
    scheme_hooks: ClassVar[frozenset] = frozenset({"key_term", "value_term"})


def attention(spec, params: dict, q, k, v, call: _core.Call):
    """q (B, H, Lq, d), k and v (B, H, Lk, d) -> (o (B, H, Lq, d), weights (B, H, Lq, Lk) or None)."""
    scheme = spec.relative
    unit = None if scheme is None else schemes.module_for(scheme)
    hooks = frozenset() if scheme is None else scheme.hooks
    stat = _core.stat_dtype(q.dtype)  # PREC-4

    logits = spec.effective_scale * (q @ k.transpose(-1, -2)).to(stat)  # (B, H, Lq, Lk), SCALE-2
    if "key_term" in hooks:  # REL-1, SCALE-3
        logits = logits + spec.relative_scale * unit.key_term(scheme, params, q, call.delta).to(stat)
    if call.bias is not None:  # BIAS-1, SCALE-4: unscaled
        logits = logits + call.bias.to(stat)
    weights = _core.masked_softmax(logits, call.allowed, spec.mask_fill)  # SOFTMAX-1, MASK-5, MASK-6
    dropped = _core.dropout(weights, call.dropout_keep, spec.dropout)  # DROP-1
    o = dropped.to(q.dtype) @ v  # (B, H, Lq, d)
    if "value_term" in hooks:  # DROP-4: from the weights after dropout
        o = o + unit.value_term(scheme, params, dropped, call.delta)
    return o, (weights.to(q.dtype) if call.return_weights else None)
