"""Rotary position embedding in JAX: a q/k transform (ROPE-1..ROPE-9).

Each head's first r channels form r/2 pairs (ROPE-2, ROPE-3): ``"half"``
pairs channel c with c + r/2, ``"interleaved"`` pairs 2c with 2c + 1. Pair c
of a q (k) vector at position p turns by the angle ``a = p * f_c``
(ROPE-4, ROPE-5), both members multiplied by the attention factor af
(ROPE-7):

    (x, y) -> af * (x cos a - y sin a,  x sin a + y cos a)

Channels r .. d - 1 pass unchanged; v is never rotated. One hook,
``qk_transform``, the same for the ``xla`` and the ``tiles`` kernel (the
tiles kernel calls it once, before its query tiles).

Precision: the angles come from the integer positions in the widest float
JAX has, float64 under ``jax_enable_x64`` (ROPE-9, PREC-1), else float32;
``af * cos`` and ``af * sin`` are taken in that dtype. The rotation itself
runs in the input's dtype, in float32 for float16 / bfloat16, and the
rotated q and k are rounded to the input's dtype once (PREC-4).

Static under jit (the spec is a static argument): the frequencies and the
channel slices are Python values, so only the positions are traced and new
position values never recompile. No gather: the half layout splits the
channels in two slices, the interleaved one reshapes them to (r/2, 2).

Axis legend (AXES-1): B, H, Lq, Lk, d; Hkv key/value heads (HEAD-3);
r the rotated channels, r/2 pairs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..masking import stat_dtype


def angle_dtype():
    """ROPE-9: float64 under ``jax_enable_x64``, else float32 (the widest float JAX computes in)."""
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def rotation(scheme, positions, head_dim: int):
    """ROPE-4, ROPE-7, ROPE-9: (af * cos a, af * sin a), a = p * f_c: positions (1|B, L) -> two (1|B, 1, L, r/2).

    In ``angle_dtype()``; the frequencies are a constant of the program (static).
    """
    dtype = angle_dtype()
    freq = np.asarray(scheme.frequencies(head_dim), dtype=dtype)  # (r/2,)
    angles = positions.astype(dtype)[:, None, :, None] * freq  # (1|B, 1, L, r/2)
    af = scheme.attention_factor
    return af * jnp.cos(angles), af * jnp.sin(angles)


def rotate(x, layout: str, rotary_dim: int, cos, sin):
    """ROPE-3, ROPE-5: each pair (x_a, x_b) of the first r channels -> (x_a cos - x_b sin, x_a sin + x_b cos).

    x (B, heads, L, d), cos and sin (1|B, 1, L, r/2) of x's dtype, already
    carrying the attention factor (ROPE-7); channels r .. d - 1 unchanged.
    """
    half = rotary_dim // 2
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if layout == "half":  # pairs (c, c + r/2): two slices
        a, b = rot[..., :half], rot[..., half:]
        rot = jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    else:  # "interleaved", pairs (2c, 2c + 1): a reshape to (..., r/2, 2)
        pairs = rot.reshape(rot.shape[:-1] + (half, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        rot = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(rot.shape)
    return jnp.concatenate([rot, rest], axis=-1)  # rest may be empty (r == d)


def rotate_at(scheme, x, positions):
    """ROPE-5 for one of q, k: x (B, heads, L, d) at positions (1|B, L) -> x rotated, in x's dtype (PREC-4)."""
    d = x.shape[-1]
    compute = stat_dtype(x.dtype)  # float32 for float16 / bfloat16 (PREC-4)
    cos, sin = (t.astype(compute) for t in rotation(scheme, positions, d))
    return rotate(x.astype(compute), scheme.layout, scheme.rotated(d), cos, sin).astype(x.dtype)


# ------------------------------------------------------- the hook (xla and tiles)
def qk_transform(scheme, params: dict, q, k, q_positions, k_positions):
    """ROPE-5: q (B, H, Lq, d) at q_positions (1|B, Lq) and k (B, Hkv, Lk, d) at k_positions (1|B, Lk), rotated.

    Every key/value head's k turns like a query head's q (HEAD-3); no tables (ROPE-1).
    """
    return rotate_at(scheme, q, q_positions), rotate_at(scheme, k, k_positions)
