"""``"flex"``: PyTorch's FlexAttention, every logit term written as one ``score_mod`` (KERN-1).

FlexAttention computes ``softmax(score_mod(s * q @ k.T)) @ v`` and calls
``score_mod(score, b, h, q_idx, kv_idx)`` per (batch, head, query, key)
with 0-d tensors; it never hands the logits to Python code. Every term of
the spec that is a function of one pair goes there, in the spec's order:

    score  = s * q . k                                   (SCALE-2, HEAD-3: ``enable_gqa``)
           + key_term(b, h, i, j)                        (REL-1, SCALE-3: Shaw, Huang keys)
           + key_side_term(b, h, i, j)                   (SHAW-6, SHAW-7: Shaw's key side)
    score  = cap(score)                                  (SOFTCAP-1)
           + scheme_bias(b, h, i, j) + bias[b, h, i, j]  (REL-3 (3): ALiBi, T5, Swin; SCALE-4, BIAS-1)
    logit  = score where allowed[b, h, i, j], else -inf (MASK-4, MASK-5) or mask_fill (MASK-6)

The scheme's part comes from its score hooks (``score_state`` once per
call, ``score_term`` per pair; the protocol is in ``torch_impl.schemes``):
a key term reads its (B, H, Lq, R) table logits at the row of the pair's
distance, a key-side term its (B, H, Lk, R) ones (``key_side_score_state``,
``key_side_score_term``), a bias computes slope times distance or reads ``rel_b`` at the
pair's row. Nothing of shape (Lq, Lk) is built for a scheme: the
distances come from the positions inside ``score_mod``. The ``mask`` and
``bias`` inputs and the causal and window rules are read from their own
broadcast tensors (``call.allowed``). FlexAttention gives a row with no
allowed key exact zeros (MASK-5) and keeps the logits and the softmax in
float32 for float16 and bfloat16 inputs (PREC-4).

It takes no value term (Shaw and Huang values: the weights never leave the kernel),
no given keep mask (DROP-1) and returns no weights. PyTorch 2.13 has no
FlexAttention backward on the CPU: there it runs forward calls only (a
call that records gradients raises PyTorch's ``NotImplementedError``).

``Flex(compiled=True)`` (the default) calls ``torch.compile(flex_attention)``,
the fused kernel (one compilation per shape, dtype and scheme, then cached
by PyTorch); ``Flex(compiled=False)`` calls FlexAttention eagerly, which
writes the (B, H, Lq, Lk) scores: the same function, no compilation.
Axis legend (AXES-1): B, H, Lq, Lk, d; Hkv (HEAD-3); dv (HEAD-4).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

from spec._fields import require_bool

from .. import _core, schemes
from ._base import Kernel, transform_qk


@dataclass(frozen=True)
class Flex(Kernel):
    """FlexAttention with the spec's logit terms as its score_mod; no value term, keep mask or weights (KERN-1).

    Fields:
      compiled: run ``torch.compile(flex_attention)`` (True) or FlexAttention eagerly (False).
    """

    name: ClassVar[str] = "flex"
    scheme_hooks: ClassVar[frozenset] = frozenset({"qk_transform", "key_term", "key_side_term", "bias"})

    compiled: bool = True

    def __post_init__(self):
        require_bool("Flex", "compiled", self.compiled)

    def unsupported(self, spec, call) -> Optional[str]:
        reasons = [
            r
            for r in (
                self.missing_hooks(spec),
                None if call.dropout_keep is None else "flex takes no dropout_keep mask (DROP-1)",
                "flex does not return the weights (return_weights=True)" if call.return_weights else None,
            )
            if r is not None
        ]
        return "; ".join(reasons) or None


@functools.cache
def _flex_attention(compiled: bool):
    """FlexAttention, compiled once per process or eager (whose advice to compile is not repeated per call)."""
    from torch.nn.attention.flex_attention import flex_attention

    if compiled:
        return torch.compile(flex_attention, dynamic=False)

    def eager(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return flex_attention(*args, **kwargs)

    return eager


def _reader(t: Optional[torch.Tensor], B: int, H: int, Lq: int, Lk: int):
    """A (1|B, 1|H, Lq, Lk)-broadcastable tensor as a function of one pair, or None for None."""
    if t is None:
        return None
    full = _core.as_4d(t).expand(B, H, Lq, Lk)  # a view: broadcast axes have stride 0
    return lambda b, h, i, j: full[b, h, i, j]


def attention(kernel: Flex, spec, params: dict, q, k, v, call: _core.Call) -> torch.Tensor:
    """q (B, H, Lq, d), k (B, Hkv, Lk, d), v (B, Hkv, Lk, dv) -> o (B, H, Lq, dv).

    Implements REL-1, REL-3 (1), REL-3 (3), SCALE-2..4, SOFTCAP-1, MASK-4..6, BIAS-1, BIAS-2, CAUSAL-1,
    WINDOW-1, HEAD-3, HEAD-4, PREC-4.
    """
    q, k = transform_qk(spec, params, q, k, call)  # REL-3 (1): before the kernel
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    stat = _core.stat_dtype(q.dtype)  # PREC-4: FlexAttention's logits for 16-bit inputs are float32 too
    scheme = spec.relative
    hooks = frozenset() if scheme is None else scheme.hooks
    unit = None if scheme is None else schemes.module_for(scheme)
    key_state = side_state = bias_state = None
    if "key_term" in hooks:  # the queries as the key term sees them, s_rel folded in (SCALE-3)
        key_state = unit.score_state(scheme, params, q * spec.relative_scale, call, stat=stat)
    if "key_side_term" in hooks:  # SHAW-6: the keys as the key-side term sees them, its factor folded in (SHAW-7)
        side_state = unit.key_side_score_state(
            scheme, params, k * spec.key_side_scale, call, group=spec.group_size, stat=stat
        )
    if "bias" in hooks:
        bias_state = unit.score_state(scheme, params, q, call, stat=stat)
    bias = _reader(None if call.bias is None else call.bias.to(stat), B, H, Lq, Lk)
    allowed = _reader(call.allowed, B, H, Lq, Lk)
    fill = float("-inf") if spec.mask_fill is None else spec.mask_fill
    cap = spec.softcap

    def score_mod(score, b, h, i, j):
        if key_state is not None:  # REL-1, SCALE-3
            score = score + unit.score_term(key_state, b, h, i, j)
        if side_state is not None:  # SHAW-6, SHAW-7
            score = score + unit.key_side_score_term(side_state, b, h, i, j)
        score = _core.softcap(score, cap)  # SOFTCAP-1: before the biases and the masks
        if bias_state is not None:  # REL-3 (3), SCALE-4: unscaled
            score = score + unit.score_term(bias_state, b, h, i, j)
        if bias is not None:  # BIAS-1
            score = score + bias(b, h, i, j)
        if allowed is not None:  # MASK-4..6: the causal rule, the window, the mask, -inf in the bias
            score = torch.where(allowed(b, h, i, j), score, fill)
        return score

    flex = _flex_attention(kernel.compiled)
    return flex(q, k, v, score_mod=score_mod, scale=spec.effective_scale, enable_gqa=k.shape[1] != H)
