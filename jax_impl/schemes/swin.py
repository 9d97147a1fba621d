"""Swin's 2-D relative position bias in JAX (SWIN-1..SWIN-6, POS-5).

A position p < P is a prefix token; p >= P is the window token at row
(p - P) // Ww, column (p - P) % Ww (floor division, POS-5). Two window
tokens read row (dh + Wh - 1)(2Ww - 1) + (dw + Ww - 1) of rel_b, (dh, dw)
the key's coordinates minus the query's, clipped to the window (SWIN-3); a
pair with a prefix token one of the three prefix rows (SWIN-4). The bias
depends on both positions, not on delta alone (SWIN-6).

The window and P are static; the positions are traced, so new position
values never recompile. The table is converted to the softmax dtype before
the gather (PREC-4, ``table_bias``); d rel_b is autodiff's scatter-add. One
hook, the same for the ``xla`` and the ``tiles`` kernel. Axis legend
(AXES-1): B, H, Lq, Lk; R the table rows.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._bias_tables import table_bias


def rows(scheme, q_positions, k_positions):
    """SWIN-3, SWIN-4: the table row of every pair, (1|B, Lq, Lk) from positions (1|B, Lq), (1|B, Lk).

    The rows route the table's gradient too (GRAD-1): a row past the table's end is read as its last row by
    JAX's gather (the forward is unchanged where that is the right row) but drops its pairs' gradient.
    """
    (Wh, Ww), P = scheme.window, scheme.prefix_tokens
    wide = jnp.promote_types(q_positions.dtype, jnp.int32)  # room for the rows: 8-bit positions would wrap
    q_positions, k_positions = q_positions.astype(wide), k_positions.astype(wide)
    qh, qw = jnp.divmod(q_positions - P, Ww)  # POS-5, floor division: negative positions get negative rows
    kh, kw = jnp.divmod(k_positions - P, Ww)
    dh = jnp.clip(kh[:, None, :] - qh[:, :, None], 1 - Wh, Wh - 1)  # (1|B, Lq, Lk)
    dw = jnp.clip(kw[:, None, :] - qw[:, :, None], 1 - Ww, Ww - 1)
    row = (dh + Wh - 1) * (2 * Ww - 1) + (dw + Ww - 1)
    if not P:
        return row
    q_prefix = (q_positions < P)[:, :, None]  # (1|B, Lq, 1)
    k_prefix = (k_positions < P)[:, None, :]  # (1|B, 1, Lk)
    base = scheme.offset_rows
    prefix_row = jnp.where(q_prefix & k_prefix, base + 2, jnp.where(q_prefix, base, base + 1))
    return jnp.where(q_prefix | k_prefix, prefix_row, row)


# ------------------------------------------------------- the hooks (xla and tiles)
def bias(scheme, params: dict, q_positions, k_positions, delta, *, num_heads: int, dtype):
    """SWIN-1: (1|B, H, Lq, Lk) = rel_b[h, row(q_pos_i, k_pos_j)] in ``dtype``, rel_b (H, R)."""
    return table_bias(params["rel_b"], rows(scheme, q_positions, k_positions), dtype)


def bias_tiled(scheme, params: dict, q_positions, k_positions, delta, *, num_heads: int, dtype, tile):
    """SWIN-1 for a block of queries: the gather of ``bias``, from the block's own positions."""
    return bias(scheme, params, q_positions, k_positions, delta, num_heads=num_heads, dtype=dtype)
