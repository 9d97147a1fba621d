"""Head split and merge, and the key/value heads shared by query heads (rules HEAD-1..HEAD-4)."""

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


def repeat_kv_heads(x: np.ndarray, group: int) -> np.ndarray:
    """HEAD-3: (B, Hkv, L, c) -> (B, H, L, c), H = Hkv * G; query head h reads key/value head h // G.

    Contiguous groups (``np.repeat``, PyTorch's ``repeat_interleave``):
    heads 0..G-1 share key/value head 0. Tiling (``h % Hkv``) is a different layer.
    """
    return x if group == 1 else np.repeat(x, group, axis=1)


def sum_kv_heads(g: np.ndarray, group: int) -> np.ndarray:
    """GRAD-1 for HEAD-4, the adjoint of ``repeat_kv_heads``: (B, H, L, c) -> (B, Hkv, L, c).

    The G query heads of a group summed."""
    if group == 1:
        return g
    B, H, L, c = g.shape
    return g.reshape(B, H // group, group, L, c).sum(axis=2)
