"""``"sdpa"``: the vanilla core through ``F.scaled_dot_product_attention`` (KERN-1).

The spec's masks, bias, positions and window (WINDOW-1) become SDPA's
``attn_mask``; a top-left causal rule with nothing else is its
``is_causal``. Grouped key/value heads (HEAD-3) are its ``enable_gqa``,
whose groups are contiguous like the spec's (query head h reads key/value
head h // G); values may have their own head size (HEAD-4). SDPA gives a
row with no allowed key exact zeros (MASK-5). A scheme's q/k transform
(RoPE, REL-3 (1)) rotates q and k before the fused call, which then sees
plain vectors. A scheme's bias (ALiBi, T5, Swin, REL-3 (3)) is added to the
float ``attn_mask`` with the bias input, in the stat dtype (float32 for the
16-bit dtypes, PREC-4; SDPA takes a float32 mask beside bfloat16 queries):

    attn_mask = where(allowed, scheme_bias + bias, -inf)        (1|B, H, Lq, Lk)

A bias of the distance alone (ALiBi, T5) at default positions with nothing
else in the mask is never written out: its Lq + Lk - 1 values
(``distance_bias``) make a strided view whose row t holds query Lq - 1 - t,
and SDPA runs the queries in that order (each row's arithmetic is the
same, so the output is too). Swin's bias of one whole window
(``reversed_bias``) is, in that order, one straight copy of a view of its
table; in a call that records no gradient it goes into a buffer kept
between calls (``_workspace.persistent``), so no fresh memory is faulted in.

It takes no other relative term (a key term or value term needs the
logits, which SDPA never exposes), no ``mask_fill`` (MASK-6), no soft cap
(SOFTCAP-1: it has no hook between the score and the mask; the scheme bias
comes after the cap, so it cannot stand in for one), no given keep mask
(DROP-1) and returns no weights.
Axis legend (AXES-1): B, H, Lq, Lk, d; Hkv, G = H / Hkv (HEAD-3); dv (HEAD-4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
import torch.nn.functional as F

from .. import _core, _workspace
from ._base import Kernel, scheme_bias, scheme_reversed_bias, transform_qk


@dataclass(frozen=True)
class SDPA(Kernel):
    """PyTorch's fused attention, for calls without a relative key term or value term, mask_fill, softcap,
    keep mask or weights; it runs a q/k transform (RoPE) first and takes a scheme bias in its mask (KERN-1)."""

    name: ClassVar[str] = "sdpa"
    scheme_hooks: ClassVar[frozenset] = frozenset({"qk_transform", "bias"})

    def unsupported(self, spec, call) -> Optional[str]:
        reasons = [
            r
            for r in (
                self.missing_hooks(spec),
                None
                if spec.mask_fill is None
                else f"spec.mask_fill={spec.mask_fill!r} replaces disallowed logits (MASK-6), and sdpa only gives "
                "them weight 0 (MASK-5)",
                None
                if spec.softcap is None
                else f"spec.softcap={spec.softcap!r} caps the score before the masks (SOFTCAP-1), and sdpa has no "
                "score modification",
                None if call.dropout_keep is None else "sdpa takes no dropout_keep mask (DROP-1)",
                "sdpa does not return the weights (return_weights=True)" if call.return_weights else None,
            )
            if r is not None
        ]
        return "; ".join(reasons) or None


def attention(spec, params: dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: _core.Call) -> torch.Tensor:
    """q (B, H, Lq, d), k (B, Hkv, Lk, d), v (B, Hkv, Lk, dv) -> o (B, H, Lq, dv).

    ``params``: the canonical tensors (the scheme hooks receive them, as in eager).
    Implements REL-3 (1), REL-3 (3), SCALE-2, SCALE-4, MASK-4, MASK-5, BIAS-1, BIAS-2, CAUSAL-1, WINDOW-1,
    HEAD-3, HEAD-4, PREC-4.
    """
    q, k = transform_qk(spec, params, q, k, call)  # REL-3 (1): before the fused kernel
    s = spec.effective_scale
    gqa = k.shape[1] != q.shape[1]  # HEAD-3: SDPA repeats each key/value head for G consecutive query heads
    stat = _core.stat_dtype(q.dtype)
    alone = not spec.causal and spec.window is None and call.mask is None and call.bias is None
    records_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *params.values()))
    reuse = None if records_grad or torch.compiler.is_compiling() else _workspace.persistent(q.device)
    reversed_rows = scheme_reversed_bias(spec, params, call, stat, reuse) if alone else None  # (1, H, Lq, Lk)
    if reversed_rows is not None:  # REL-3 (3): row t holds query Lq - 1 - t's bias
        o = F.scaled_dot_product_attention(q.flip(2), k, v, attn_mask=reversed_rows, scale=s, enable_gqa=gqa)
        return o.flip(2)
    added = scheme_bias(spec, params, call, stat)  # REL-3 (3): (1|B, H, Lq, Lk) or None
    plain_causal = spec.causal and spec.window is None and call.default_positions
    if plain_causal and call.mask is None and call.bias is None and added is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=s, enable_gqa=gqa)  # CAUSAL-1 top-left
    allowed, bias = call.allowed, call.bias
    if bias is not None:  # BIAS-1, SCALE-4: unscaled, after the scheme bias
        added = bias.to(q.dtype) if added is None else added + bias.to(added.dtype)
    if added is not None:  # BIAS-2, MASK-4: the float attn_mask carries -inf at disallowed keys
        attn_mask = added if allowed is None else torch.where(allowed, added, float("-inf"))
    else:
        attn_mask = allowed  # MASK-4: bool, True = attend (SDPA's polarity)
    attn_mask = None if attn_mask is None else _core.as_4d(attn_mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=s, enable_gqa=gqa)
