"""Rotary position embedding in the reference: a q/k transform (ROPE-1..ROPE-9).

Each head's rotated channels form r/2 pairs (ROPE-2, ROPE-3); pair c of a
vector at position p turns by the angle ``p * f_c`` (ROPE-4, ROPE-5), the
angle computed in float64 from the exact integer position (ROPE-9, PREC-1),
and both of its channels are multiplied by the attention factor (ROPE-7).
Channels r .. d - 1 pass unchanged; v is never rotated. Axis legend
(AXES-1): B, H, Lq, Lk, d.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class Saved(NamedTuple):
    first: np.ndarray  # (r/2,) the channel index of each pair's first member (ROPE-3)
    second: np.ndarray  # (r/2,) its partner
    cos_q: np.ndarray  # (1|B, 1, Lq, r/2), af * cos(angle) (ROPE-5, ROPE-7)
    sin_q: np.ndarray
    cos_k: np.ndarray  # (1|B, 1, Lk, r/2)
    sin_k: np.ndarray


def pairs(scheme, head_dim: int):
    """ROPE-3: (first, second) channel indices of the r/2 pairs: (c, c + r/2) or (2c, 2c + 1)."""
    half = scheme.rotated(head_dim) // 2
    c = np.arange(half)
    return (c, c + half) if scheme.layout == "half" else (2 * c, 2 * c + 1)


def angles(scheme, positions: np.ndarray, head_dim: int) -> np.ndarray:
    """ROPE-4, ROPE-9: p * f_c in float64, positions (1|B, L) -> (1|B, 1, L, r/2)."""
    freq = np.asarray(scheme.frequencies(head_dim), dtype=np.float64)
    return (positions.astype(np.float64)[:, None, :, None]) * freq


def rotate(x: np.ndarray, first, second, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """ROPE-5: (x_a, x_b) -> (x_a cos - x_b sin, x_a sin + x_b cos) per pair; other channels unchanged.

    cos and sin already carry the attention factor (ROPE-7). ``rotate`` with
    ``-sin`` is the inverse rotation (and the transpose, GRAD-1).
    """
    a, b = x[..., first], x[..., second]
    out = x.copy()
    out[..., first] = a * cos - b * sin
    out[..., second] = a * sin + b * cos
    return out


def apply_rope(scheme, x, positions) -> np.ndarray:
    """ROPE-5 on its own: vectors x (..., L, d) at integer positions (L,), rotated in float64.

    The q/k transform of one head, for porting and for worked examples:
    ``apply_rope(Rope(), q_head, q_positions)``.
    """
    x = np.array(x, dtype=np.float64)  # a copy: the caller's array is never written
    positions = np.asarray(positions)
    if x.ndim < 2 or positions.shape != x.shape[-2:-1] or not np.issubdtype(positions.dtype, np.integer):
        raise ValueError(
            f"apply_rope: expected x (..., L, d) and integer positions (L,), got x {x.shape} and "
            f"positions {positions.shape} of dtype {positions.dtype}"
        )
    scheme.check_sizes(1, x.shape[-1], x.shape[-1])
    first, second = pairs(scheme, x.shape[-1])
    angle = angles(scheme, positions[None], x.shape[-1])[0, 0]  # (L, r/2)
    af = scheme.attention_factor
    return rotate(x, first, second, af * np.cos(angle), af * np.sin(angle))


def qk_transform(scheme, params: dict, q: np.ndarray, k: np.ndarray, ctx):
    """ROPE-5: q (B, H, Lq, d) at q_positions and k (B, H, Lk, d) at k_positions, each rotated."""
    first, second = pairs(scheme, ctx.head_dim)
    af = scheme.attention_factor
    aq, ak = angles(scheme, ctx.q_positions, ctx.head_dim), angles(scheme, ctx.k_positions, ctx.head_dim)
    saved = Saved(first, second, af * np.cos(aq), af * np.sin(aq), af * np.cos(ak), af * np.sin(ak))
    q_rot = rotate(q, first, second, saved.cos_q, saved.sin_q)
    k_rot = rotate(k, first, second, saved.cos_k, saved.sin_k)
    return q_rot, k_rot, saved


def qk_transform_vjp(scheme, params: dict, saved: Saved, dq: np.ndarray, dk: np.ndarray):
    """VJP of ``qk_transform`` (GRAD-1): each pair's 2x2 block af * R(angle) transposed; no tables."""
    f, s = saved.first, saved.second
    return rotate(dq, f, s, saved.cos_q, -saved.sin_q), rotate(dk, f, s, saved.cos_k, -saved.sin_k), {}


# ------------------------------------------------------- literal forms (definition)
def _literal(scheme, vec, pos: int) -> list:
    """ROPE-3..ROPE-7 for one vector at one position, in plain Python floats."""
    d = len(vec)
    half = scheme.rotated(d) // 2
    out = [float(x) for x in vec]
    for c, f in enumerate(scheme.frequencies(d)):
        a, b = (c, c + half) if scheme.layout == "half" else (2 * c, 2 * c + 1)
        angle = float(pos) * f
        cos, sin = scheme.attention_factor * math.cos(angle), scheme.attention_factor * math.sin(angle)
        out[a], out[b] = float(vec[a]) * cos - float(vec[b]) * sin, float(vec[a]) * sin + float(vec[b]) * cos
    return out


def literal_q(scheme, params: dict, h: int, q_vec, q_pos: int) -> list:
    """ROPE-5: the query vector of head h at position q_pos, rotated."""
    return _literal(scheme, q_vec, q_pos)


def literal_k(scheme, params: dict, h: int, k_vec, k_pos: int) -> list:
    """ROPE-5: the key vector of head h at position k_pos, rotated (the values never are)."""
    return _literal(scheme, k_vec, k_pos)
