"""ALiBi in the naive emulation: slope times distance, made the way real code makes it (ALIBI-1..ALIBI-5).

The slopes are taken as ``2 ** (-max_bias * k / c)`` here again (ALIBI-2,
independently of ``spec.alibi_slopes``), held in the accumulation dtype,
multiplied by the integer distance held there too, and the bias is rounded
to the compute dtype like any stored logit term.
"""

from __future__ import annotations

import math

import numpy as np

from .base import NaiveScheme, register


def press_slopes(H: int, max_bias: float) -> list:
    """ALIBI-2 by the paper's recursion: the power-of-two rule, then every other slope of the next one."""

    def power_of_two(n: int) -> list:
        start = 2.0 ** (-max_bias / n)
        return [start ** (k + 1) for k in range(n)]

    if math.log2(H).is_integer():
        return power_of_two(H)
    c = 2 ** math.floor(math.log2(H))
    return power_of_two(c) + power_of_two(2 * c)[0::2][: H - c]


@register
class AlibiHooks(NaiveScheme):
    name = "alibi"

    def bias(self, scheme, P, params, num_heads, q_positions, k_positions, delta):
        """ALIBI-1, ALIBI-3, ALIBI-4: m_h * g(delta), slopes and distances in acc, rounded to t."""
        slopes = scheme.slopes if scheme.slopes is not None else press_slopes(num_heads, scheme.max_bias)
        m = np.asarray(slopes, np.float64).astype(P.acc)[None, :, None, None]
        g = (-np.abs(delta) if scheme.symmetric else delta).astype(P.acc)
        return P.rnd(m * g[:, None])

    def bias_vjp(self, scheme, P, params, num_heads, q_positions, k_positions, delta, grad):
        """No tables (ALIBI-1)."""
        return {}
