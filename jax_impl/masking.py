"""Positions, the keys a query may attend, and the softmax that honours them.

Rules POS-1, POS-2, CAUSAL-1, WINDOW-1, MASK-2, MASK-4..MASK-7, BIAS-2,
SOFTCAP-1, SOFTMAX-1, DROP-1, PREC-4. Every kernel uses these; none has its own copy.
Axis legend (AXES-1): B, H, Lq, Lk; "(1|B, ...)" is an axis of size 1 or B.
"""

from __future__ import annotations

import jax.numpy as jnp

from spec import AttentionSpec


def positions(p, L: int):
    """POS-1: positions as (1|B, L) integers; None means arange(L)."""
    if p is None:
        return jnp.arange(L)[None]
    p = jnp.asarray(p)
    if jnp.issubdtype(p.dtype, jnp.unsignedinteger):  # k - q must not wrap around (POS-2)
        p = p.astype(jnp.promote_types(p.dtype, jnp.int8))
    return p[None] if p.ndim == 1 else p


def distance(q_positions, k_positions):
    """POS-2: delta[b, i, j] = k_pos[b, j] - q_pos[b, i]: (1|B, Lq), (1|B, Lk) -> (1|B, Lq, Lk)."""
    return k_positions[:, None, :] - q_positions[:, :, None]


def as4d(x):
    """An array broadcastable to (B, H, Lq, Lk) (rank 1..4, MASK-1) as rank 4, by leading unit axes."""
    return x.reshape((1,) * (4 - x.ndim) + tuple(x.shape))


def allowed_keys(spec: AttentionSpec, delta, mask, bias):
    """MASK-4: mask AND (delta <= 0 under causal) AND (-left <= delta <= right in the window) AND bias != -inf.

    At its broadcast shape (rank 4); None when every key is allowed. delta
    (1|B, Lq, Lk) is needed only with ``spec.causal`` or ``spec.window``.
    """
    parts = []
    if spec.causal:
        parts.append((delta <= 0)[:, None])  # CAUSAL-1, (1|B, 1, Lq, Lk)
    if spec.window is not None:  # WINDOW-1, (1|B, 1, Lq, Lk); a None side is unbounded
        left, right = spec.window
        if left is not None:
            parts.append((delta >= -left)[:, None])
        if right is not None:
            parts.append((delta <= right)[:, None])
    if mask is not None:
        parts.append(as4d(jnp.asarray(mask)))  # MASK-2: combined by AND
    if bias is not None:
        parts.append(as4d(bias != -jnp.inf))  # BIAS-2
    if not parts:
        return None
    allowed = parts[0]
    for part in parts[1:]:
        allowed = allowed & part
    return allowed


def dead_keys(allowed, B: int, Lk: int):
    """MASK-7: key j of batch element b is dead when no head and no query may attend it: (B, Lk) bool."""
    return jnp.broadcast_to(~jnp.any(allowed, axis=(1, 2)), (B, Lk))


def stat_dtype(dtype):
    """PREC-4: the dtype of the logits and the softmax: float32 for float16 / bfloat16, else the input's."""
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def softcap(score, cap: float):
    """SOFTCAP-1: cap * tanh(score / cap), applied to the score before every bias and mask.

    The bias input's -inf still disallows a key (BIAS-2): it is added after
    the cap, never passed through tanh. The gradient, 1 - tanh^2(score / cap)
    times that of the capped score, is autodiff's.
    """
    return cap * jnp.tanh(score / cap)


def masked_softmax(logits, allowed, mask_fill, rows_nonempty: bool = False):
    """SOFTMAX-1 over the key axis, with MASK-5 (mask_fill None) or MASK-6 (a float).

    MASK-5: a disallowed key gets weight exactly 0, a row with no allowed
    key all-zero weights (never NaN). MASK-6: disallowed logits are replaced
    by ``mask_fill`` and ordinary softmax arithmetic follows. ``allowed``
    None: every key is allowed. ``rows_nonempty``: the caller knows every
    row has an allowed key (CAUSAL-1 alone with default positions: key 0),
    so the plain softmax of -inf-filled logits is exact and NaN-free.
    """
    if allowed is not None and mask_fill is None and rows_nonempty:
        logits = jnp.where(allowed, logits, -jnp.inf)
        allowed = None
    if allowed is None:
        z = logits - jnp.max(logits, axis=-1, keepdims=True)
        e = jnp.exp(z)
        return e / jnp.sum(e, axis=-1, keepdims=True)
    if mask_fill is not None:
        z = jnp.where(allowed, logits, jnp.asarray(mask_fill, logits.dtype))
        e = jnp.exp(z - jnp.max(z, axis=-1, keepdims=True))
        return e / jnp.sum(e, axis=-1, keepdims=True)
    z = jnp.where(allowed, logits, -jnp.inf)
    m = jnp.max(z, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # a fully masked row
    # where, not multiply: exp of a disallowed logit never enters the arithmetic (0 * inf = NaN)
    e = jnp.where(allowed, jnp.exp(jnp.where(allowed, z - m, 0.0)), 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(total > 0, total, 1.0)


def dropout(weights, keep, p: float):
    """DROP-1: w * keep / (1 - p) for a boolean keep mask (B, H, Lq, Lk); None keeps every weight."""
    return weights if keep is None else jnp.where(keep, weights / (1.0 - p), 0.0)


def cut(x, q0: int, q1: int, k1: int):
    """Queries q0 .. q1 - 1 and keys 0 .. k1 - 1 of an array broadcastable to (B, H, Lq, Lk) (rank 4 out).

    Unit axes stay unit axes; None stays None.
    """
    if x is None:
        return None
    x = as4d(x)
    return x[..., q0 : q1 if x.shape[2] > 1 else None, : k1 if x.shape[3] > 1 else None]
