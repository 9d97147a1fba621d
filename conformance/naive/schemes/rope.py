"""RoPE in the naive emulation: the q/k transform the way real code builds it (ROPE-3..ROPE-9, PREC-2).

The truth (numpy_ref) turns pair c at position p by the float64 angle
``p * f_c``. Real code does not: it makes the angles in float32 (the
accumulation dtype ``P.acc`` here: float32 for float32 and the 16-bit types,
float64 only for float64), from positions held as float32 and float32
frequencies, rounds cos and sin to the compute dtype and rotates there. The
two operation orders are the two families seen in the wild:

- order 0 (Hugging Face, torchtune, x-transformers): ``angle = p * f``, cos
  and sin (times the attention factor) rounded to ``t``, each product of the
  rotation rounded to ``t`` before the sum;
- order 1 (Gemma, keras-hub): ``angle = p / timescale`` with the timescale
  ``1 / f`` in ``acc`` (0 frequency = infinite timescale = angle 0), the
  rotation in ``acc`` and rounded to ``t`` once.

Pairs are found independently of numpy_ref: by a per-layout channel
permutation that puts each pair's two channels into two halves.
"""

from __future__ import annotations

import numpy as np

from .base import NaiveScheme, register


def _halves(scheme, d: int):
    """ROPE-2, ROPE-3: the channel lists (a, b) so that channel a[c] pairs with b[c]."""
    r = scheme.rotated(d)
    if scheme.layout == "half":
        return list(range(0, r // 2)), list(range(r // 2, r))
    return list(range(0, r, 2)), list(range(1, r, 2))


def _cos_sin(scheme, P, positions, d: int):
    """ROPE-4, ROPE-7, ROPE-9: af * cos, af * sin of the angles, (1|B, 1, L, r/2), as real code makes them."""
    acc = P.acc.type
    pos = np.asarray(positions).astype(P.acc)[:, None, :, None]  # positions held in acc (float32: exact < 2**24)
    freq = np.asarray(scheme.frequencies(d), dtype=np.float64).astype(P.acc)
    if P.reverse:
        with np.errstate(divide="ignore"):
            timescale = (acc(1) / freq).astype(P.acc)  # 0 -> inf
        angle = (pos / timescale).astype(P.acc)
    else:
        angle = (pos * freq).astype(P.acc)
    af = acc(scheme.attention_factor)
    return (np.cos(angle) * af).astype(P.acc), (np.sin(angle) * af).astype(P.acc)


def _rotate(scheme, P, x, cos, sin, sign: int):
    """(x_a, x_b) -> (x_a cos - s x_b sin, s x_a sin + x_b cos), s = sign (-1: the transpose, GRAD-1)."""
    a, b = _halves(scheme, x.shape[-1])
    xa, xb = x[..., a], x[..., b]
    out = np.array(x, dtype=P.acc)
    if P.reverse:  # rotate in acc, round once
        out[..., a] = P.rnd(xa * cos - sign * (xb * sin))
        out[..., b] = P.rnd(sign * (xa * sin) + xb * cos)
    else:  # cos, sin in t; every product rounded to t
        c, s = P.rnd(cos), P.rnd(sin)
        out[..., a] = P.rnd(P.rnd(xa * c) - sign * P.rnd(xb * s))
        out[..., b] = P.rnd(sign * P.rnd(xa * s) + P.rnd(xb * c))
    return out


@register
class RopeHooks(NaiveScheme):
    """ROPE-5: q at its positions and k at its positions, rotated; v untouched."""

    name = "rope"

    def qk_transform(self, scheme, P, q, k, q_positions, k_positions):
        d = q.shape[-1]
        cq, sq = _cos_sin(scheme, P, q_positions, d)
        ck, sk = _cos_sin(scheme, P, k_positions, d)
        return _rotate(scheme, P, q, cq, sq, 1), _rotate(scheme, P, k, ck, sk, 1)

    def qk_transform_vjp(self, scheme, P, dq, dk, q_positions, k_positions):
        d = dq.shape[-1]
        cq, sq = _cos_sin(scheme, P, q_positions, d)
        ck, sk = _cos_sin(scheme, P, k_positions, d)
        return _rotate(scheme, P, dq, cq, sq, -1), _rotate(scheme, P, dk, ck, sk, -1)
