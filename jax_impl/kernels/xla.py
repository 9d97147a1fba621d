"""The ``xla`` kernel: the readable baseline (KERN-1).

    q, k            = qk_transform(q, k)                              (REL-3 hook 1)
    score[b,h,i,j]  = s * q_i . k_j + s_rel * key_term                (SCALE-2, SCALE-3)
                      + s_side * key_side_term                        (SHAW-6, SHAW-7)
    logits          = cap(score) + scheme bias + bias                 (SOFTCAP-1, SCALE-4)
    w               = masked softmax over the keys                    (SOFTMAX-1, MASK-5/6)
    o_i             = sum_j w'_ij v_j + value_term(w')_i,   w' = dropout(w)   (DROP-1, DROP-4)

Query head h reads key/value head h // G (HEAD-3): the queries are grouped
over the Hkv key/value heads inside the two einsums (``heads.scores``,
``heads.weighted_values``), the key/value heads are never copied.

Whole (B, H, Lq, Lk) logits and the schemes' plain hooks (a gather by
relative index, a scatter-add): no skew, no bands, no query tiles. Every
other kernel is tested against this one and against numpy_ref. ``attend``
is also the body of each query tile of ``tiles``, which gives it the
schemes' tiled hooks instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from spec import AttentionSpec

from .. import schemes
from ..heads import scores, weighted_values
from ..masking import dropout, masked_softmax, softcap, stat_dtype
from ._base import Call, Inputs, Kernel


@dataclass(frozen=True)
class Xla(Kernel):
    """Whole logits and the plain scheme hooks; supports every call. No knobs."""

    name: ClassVar[str] = "xla"

    def unsupported(self, spec: AttentionSpec, call: Call) -> Optional[str]:
        return None  # every scheme module has the plain hooks (REL-4)

    def __call__(self, spec: AttentionSpec, params: dict, x: Inputs, call: Call):
        hooks = schemes.plain_hooks(spec.relative)
        if hooks.qk_transform is not None:  # REL-3 (1): after the head split, before any logit
            q, k = hooks.qk_transform(params, x.q, x.k, x.q_positions, x.k_positions)
            x = x._replace(q=q, k=k)
        return attend(spec, params, x, hooks)


def block_logits(spec: AttentionSpec, params: dict, x: Inputs, hooks: schemes.Hooks):
    """The logits (B, H, Lq, Lk) of the queries of ``x`` against its keys, every term in REL-3 order, in the
    softmax dtype (float32 for the 16-bit dtypes, PREC-4), before the masks: SCALE-2..4, SOFTCAP-1, HEAD-3.
    ``attend`` takes its softmax; a ring (``jax_impl.ring``) takes the statistics of one block (BLOCK-2)."""
    stat = stat_dtype(x.q.dtype)  # PREC-4
    logits = scores(x.q, x.k).astype(stat) * spec.effective_scale  # SCALE-2, HEAD-3: (B, H, Lq, Lk)
    if hooks.key_term is not None:  # REL-3 (2), REL-1
        logits = logits + hooks.key_term(params, x.q, x.delta).astype(stat) * spec.relative_scale  # SCALE-3
    if hooks.key_side_term is not None:  # SHAW-6, SHAW-7: from the key heads (HEAD-3)
        term = hooks.key_side_term(params, x.k, x.delta, num_heads=x.q.shape[1])
        logits = logits + term.astype(stat) * spec.key_side_scale
    if spec.softcap is not None:  # SOFTCAP-1: the score only, before every bias and mask
        logits = softcap(logits, spec.softcap)
    if hooks.bias is not None:  # REL-3 (3): unscaled, computed in the softmax dtype (PREC-4)
        term = hooks.bias(params, x.q_positions, x.k_positions, x.delta, num_heads=x.q.shape[1], dtype=stat)
        logits = logits + term.astype(stat)
    if x.bias is not None:
        logits = logits + x.bias.astype(stat)  # BIAS-1, never scaled (SCALE-4)
    return logits


def attend(spec: AttentionSpec, params: dict, x: Inputs, hooks: schemes.Hooks, rows_nonempty: bool = False):
    """Logits, softmax and values of the queries of ``x`` against all its keys: (o, weights).

    ``rows_nonempty``: every query has an allowed key (the tiles kernel's plain
    causal rule), so the softmax needs no empty-row guard.

    x.q (B, H, Lq, d), x.k (B, Hkv, Lk, d), x.v (B, Hkv, Lk, dv) -> o
    (B, H, Lq, dv) in the query's dtype, weights (B, H, Lq, Lk) post-softmax
    and pre-dropout, in the softmax dtype (float32 for the 16-bit dtypes,
    PREC-4). The hooks' key term, bias and value term are applied in REL-3
    order, the cap between the first two (SOFTCAP-1). Implements SCALE-2..4,
    SOFTCAP-1, HEAD-3, HEAD-4, SOFTMAX-1, MASK-5, MASK-6, DROP-1, DROP-4.
    """
    dtype = x.q.dtype
    logits = block_logits(spec, params, x, hooks)
    weights = masked_softmax(logits, x.allowed, spec.mask_fill, rows_nonempty)  # SOFTMAX-1, MASK-5 / MASK-6
    dropped = dropout(weights, x.dropout_keep, spec.dropout)  # DROP-1
    o = weighted_values(dropped.astype(dtype), x.v)  # HEAD-3, HEAD-4: (B, H, Lq, dv)
    if hooks.value_term is not None:  # REL-3 (4), from the weights after dropout (DROP-4)
        o = o + hooks.value_term(params, dropped, x.delta).astype(dtype)
    return o, weights
