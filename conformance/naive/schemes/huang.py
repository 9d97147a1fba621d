"""Huang et al. 2018 (Music Transformer) in the naive emulation: a key term and a value term
(HUANG-1..HUANG-3, HUANG-6)."""

from __future__ import annotations

import numpy as np

from .base import NaiveScheme, register


def huang_index(delta: np.ndarray, max_len: int):
    """HUANG-2, HUANG-3: (row, valid), both (1|B, Lq, Lk).

    Row ``r`` of the (2M - 1)-row table holds distance ``r - (M - 1)``, so
    row = delta + M - 1 where -(M - 1) <= delta <= M - 1; beyond that the
    term is zero (not clipped), ``valid`` is False and the row is 0 (any row
    would do: the core zeroes the term there). Two comparisons against the
    table's ends, independently of ``numpy_ref``'s ``abs``.
    """
    last = max_len - 1
    valid = np.logical_and(delta >= -last, delta <= last)
    return np.where(valid, delta + last, 0), valid


@register
class HuangHooks(NaiveScheme):
    """The key term reads row ``delta + M - 1`` of ``rel_k`` where the table reaches."""

    name = "huang"

    def key_index(self, scheme, delta):
        return huang_index(delta, scheme.max_len)

    def value_index(self, scheme, delta):
        """HUANG-6: the row of ``rel_v`` of each weight, and where the table reaches (no term beyond)."""
        return huang_index(delta, scheme.max_len)
