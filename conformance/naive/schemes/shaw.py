"""Shaw et al. 2018 in the naive emulation: a key term, a key-side term and a value term (SHAW-1..SHAW-7)."""

from __future__ import annotations

import numpy as np

from .base import NaiveScheme, register


def shaw_index(delta: np.ndarray, max_distance: int) -> np.ndarray:
    """SHAW-2: row = clip(delta, -k, k) + k, in [0, 2k].  (1|B, Lq, Lk) int -> same.

    Written as max/min against the two bounds (not ``np.clip``), independently
    of ``numpy_ref``.
    """
    k = max_distance
    return np.minimum(np.maximum(delta, -k), k) + k


@register
class ShawHooks(NaiveScheme):
    """Both terms read row ``shaw_index(delta)`` of their table, at every (b, i, j)."""

    name = "shaw"

    def key_index(self, scheme, delta):
        """SHAW-3: the row of ``rel_k`` per (b, i, j); the term exists everywhere (clipped)."""
        return shaw_index(delta, scheme.max_distance), None

    def key_side_index(self, scheme, delta):
        """SHAW-6: the key-side table (``rel_k`` shared, or its own ``rel_q``) and its row per (b, i, j)."""
        return ("rel_k" if scheme.key_side == "shared" else "rel_q"), shaw_index(delta, scheme.max_distance)

    def value_index(self, scheme, delta):
        """SHAW-4: the row of ``rel_v`` that weight (b, h, i, j) adds into; every pair adds."""
        return shaw_index(delta, scheme.max_distance), None
