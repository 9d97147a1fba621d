"""Head split and merge (rules HEAD-1, HEAD-2)."""

from __future__ import annotations

import numpy as np


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """HEAD-1: feature f goes to head f // d, channel f % d.

    (B, L, D) -> (B, H, L, d), the same as ``x.view(B, L, H, d).transpose(1, 2)``.
    """
    B, L, D = x.shape
    return x.reshape(B, L, num_heads, D // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """HEAD-2: the exact inverse of ``split_heads``. (B, H, L, d) -> (B, L, D)."""
    B, H, L, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, L, H * d)
