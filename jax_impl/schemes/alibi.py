"""ALiBi in JAX: a bias of slope times distance, no tables (ALIBI-1..ALIBI-5).

bias[h, i, j] = -m_h * |delta_ij| (symmetric, ALIBI-3) or m_h * delta_ij
(linear, ALIBI-4), m_h the slope of query head h (ALIBI-2). The slopes are
a constant of the program (static: ``scheme.slopes_for(H)``), so only the
positions are traced and new position values never recompile.

Precision (ALIBI-5, PREC-4): the slopes and the integer distances are
converted to the softmax dtype (float32 for float16 / bfloat16) and
multiplied there, never in a 16-bit dtype: at distance 2047 with slope 0.5
the bias is -1023.5, whose nearest bfloat16 is -1024.

One hook, the same for the ``xla`` and the ``tiles`` kernel. Axis legend
(AXES-1): B, H, Lq, Lk.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def distance_form(scheme, delta):
    """ALIBI-3 / ALIBI-4: -|delta| (symmetric) or delta (linear), integers of delta's shape."""
    return -jnp.abs(delta) if scheme.symmetric else delta


# ------------------------------------------------------- the hooks (xla and tiles)
def bias(scheme, params: dict, q_positions, k_positions, delta, *, num_heads: int, dtype):
    """ALIBI-1: (1|B, H, Lq, Lk) = m_h * g(delta) in ``dtype`` from delta (1|B, Lq, Lk); no tables."""
    slopes = np.asarray(scheme.slopes_for(num_heads), dtype=dtype)  # (H,), static (ALIBI-2)
    return slopes[None, :, None, None] * distance_form(scheme, delta).astype(dtype)[:, None]


def bias_tiled(scheme, params: dict, q_positions, k_positions, delta, *, num_heads: int, dtype, tile):
    """ALIBI-1 for a block of queries: ``bias`` (elementwise in delta, already O(Lq Lk))."""
    return bias(scheme, params, q_positions, k_positions, delta, num_heads=num_heads, dtype=dtype)
