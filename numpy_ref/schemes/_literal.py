"""Plain-Python helpers for the schemes' literal forms (used by ``numpy_ref.definition`` only).

Rules REL-1, REL-2: a table is (R, d) shared by heads or (H, R, d) per head.
"""

from __future__ import annotations

import math

import numpy as np


def dot(a, b) -> float:
    """sum_c a[c] * b[c], correctly rounded (``math.fsum``)."""
    return math.fsum(float(x) * float(y) for x, y in zip(a, b, strict=True))


def table_row(table: np.ndarray, h: int, r: int) -> np.ndarray:
    """REL-2: row r of head h's table: ``table[h, r]`` per head, ``table[r]`` shared."""
    return table[h, r] if table.ndim == 3 else table[r]
