"""Projections and the head split (PROJ-1, HEAD-1, HEAD-2, OUT-1).

Axis legend (AXES-1): B batch, H heads, L a sequence length, D = H * d model dim, d head dim.
"""

from __future__ import annotations


def project(x, w, b):
    """PROJ-1 / OUT-1: x @ W + b, W stored (in, out): (B, L, D) -> (B, L, D)."""
    y = x @ w
    return y if b is None else y + b


def split(x, H: int):
    """HEAD-1: (B, L, D) -> (B, H, L, d); feature f belongs to head f // d, channel f % d."""
    B, L, D = x.shape
    return x.reshape(B, L, H, D // H).transpose(0, 2, 1, 3)


def merge(x):
    """HEAD-2, the inverse of ``split``: (B, H, L, d) -> (B, L, D)."""
    B, H, L, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, L, H * d)
