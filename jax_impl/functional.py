"""The functional core: multi-head attention with relative positions in JAX.

    logits[b,h,i,j] = s * q_i . k_j  +  s_rel * rel_key(i, j)  +  bias[b,h,i,j]
    w               = softmax over allowed keys (exact zeros elsewhere)
    o_i             = sum_j w'_ij v_j  +  sum_j w'_ij rel_v[idx_ij]        w' = dropout(w)
    out             = merge(o) @ wo + bo

Pure and jit-able with ``spec`` static (it is hashable):
``jax.jit(attention, static_argnums=0, static_argnames="return_weights")``.
Differentiable in every array argument. Softmax statistics in float32 for
the 16-bit dtypes (PREC-4). Axis legend AXES-1. Under a plain top-left
causal rule, long inputs are cut into query tiles that skip the keys after
their last query (QUERY_TILE_ROWS).
"""

from __future__ import annotations

import jax.numpy as jnp

from spec import AttentionSpec, Shaw

from . import _checks
from . import relative as rel


def _split(x, H: int):
    """HEAD-1: (B, L, D) -> (B, H, L, d)."""
    B, L, D = x.shape
    return x.reshape(B, L, H, D // H).transpose(0, 2, 1, 3)


def _merge(x):
    """HEAD-2: (B, H, L, d) -> (B, L, D)."""
    B, H, L, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, L, H * d)


def _project(x, w, b):
    """PROJ-1 / OUT-1."""
    y = x @ w
    return y if b is None else y + b


def _positions(p, L: int):
    """POS-1: (1|B, L) positions, default arange."""
    if p is None:
        return jnp.arange(L)[None]
    p = jnp.asarray(p)
    return p[None] if p.ndim == 1 else p


def _as4d(x):
    return x.reshape((1,) * (4 - x.ndim) + tuple(x.shape))


def allowed_keys(spec: AttentionSpec, delta, mask, bias):
    """MASK-4 at its broadcast shape (4-d); None when every key is allowed."""
    parts = []
    if spec.causal:
        parts.append((delta <= 0)[:, None])  # CAUSAL-1
    if mask is not None:
        parts.append(_as4d(jnp.asarray(mask)))
    if bias is not None:
        parts.append(_as4d(bias != -jnp.inf))  # BIAS-2
    if not parts:
        return None
    allowed = parts[0]
    for part in parts[1:]:
        allowed = allowed & part
    return allowed


def _masked_softmax(logits, allowed, mask_fill):
    """SOFTMAX-1 with MASK-5 (exact zeros, no NaN) or MASK-6 (replace by mask_fill)."""
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
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    # where, not multiply: exp of a disallowed logit never enters the arithmetic (0 * inf = NaN)
    e = jnp.where(allowed, jnp.exp(jnp.where(allowed, z - m, 0.0)), 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(total > 0, total, 1.0)


def _relative_key_term(spec, params, q, default_positions: bool, delta, Lk: int, q_start: int):
    r = spec.relative
    table = params["rel_k"]
    if isinstance(r, Shaw):  # SHAW-3
        return rel.gather_rows(rel.rows_logits(q, table), rel.shaw_index(delta, r.max_distance))
    if default_positions:  # HUANG-4: skew over the reachable rows
        return rel.huang_skew_term(q, table, Lk, r.max_len, causal=spec.causal, q_start=q_start)
    index, valid = rel.huang_index(delta, r.max_len)  # HUANG-4: gather
    return jnp.where(valid[:, None], rel.gather_rows(rel.rows_logits(q, table), index), 0.0)


def attention(spec: AttentionSpec, params: dict, query, key=None, value=None, *, mask=None, bias=None,
              q_positions=None, k_positions=None, dropout_keep=None, return_weights: bool = False):
    """Multi-head attention (spec/attention.md) over jax arrays.

    Args:
      spec: the layer's ``AttentionSpec`` (static under jit).
      params: canonical arrays, ``spec.param_shapes()``, in the query's dtype.
      query: [B, Lq, D]; key: [B, Lk, D] or None (= query); value: [B, Lk, D] or None (= key).
      mask: bool, True = attend, broadcastable to [B, H, Lq, Lk] (MASK-1).
      bias: float, broadcastable to [B, H, Lq, Lk], unscaled; -inf disallows (BIAS-1, BIAS-2).
      q_positions / k_positions: int [L] or [B, L] (POS-1).
      dropout_keep: bool [B, H, Lq, Lk], only with spec.dropout > 0 (DROP-1..3).
      return_weights: also return the post-softmax, pre-dropout weights [B, H, Lq, Lk].

    Returns:
      out [B, Lq, D] in the query's dtype, or (out, weights).
    """
    B, Lq, Lk = _checks.check(spec, params, query, key, value, mask, bias, q_positions, k_positions, dropout_keep)
    key = query if key is None else key
    value = key if value is None else value
    H, p = spec.num_heads, params
    dtype = query.dtype
    delta = None
    if spec.causal or spec.relative is not None:
        delta = _positions(k_positions, Lk)[:, None, :] - _positions(q_positions, Lq)[:, :, None]  # POS-2
    allowed = allowed_keys(spec, delta, mask, bias)
    if allowed is not None and spec.mask_fill is None:  # MASK-7: dead keys become zero rows
        dead = ~jnp.any(jnp.broadcast_to(allowed, (allowed.shape[0], allowed.shape[1], Lq, Lk)), axis=(1, 2))
        dead = jnp.broadcast_to(dead, (B, Lk))[..., None]
        key, value = jnp.where(dead, 0, key).astype(dtype), jnp.where(dead, 0, value).astype(dtype)

    q = _split(_project(query, p["wq"], p.get("bq")), H)  # (B, H, Lq, d)
    k = _split(_project(key, p["wk"], p.get("bk")), H)  # (B, H, Lk, d)
    v = _split(_project(value, p["wv"], p.get("bv")), H)  # (B, H, Lk, d)

    default_positions = q_positions is None and k_positions is None
    plain_causal = spec.causal and default_positions and mask is None and bias is None and spec.mask_fill is None
    if plain_causal and Lq >= 2 * QUERY_TILE_ROWS:
        # CAUSAL-1 alone, top-left: a tile of queries q0 .. q1 - 1 attends keys 0 .. q1 - 1 only
        parts = [_core(spec, p, q[:, :, q0:q1], k[:, :, :k1], v[:, :, :k1], allowed=_cut(allowed, q0, q1, k1),
                       bias=None, delta=delta[:, q0:q1, :k1], dropout_keep=_cut(dropout_keep, q0, q1, k1),
                       default_positions=True, plain_causal=True, q_start=q0)
                 for q0 in range(0, Lq, QUERY_TILE_ROWS)
                 for q1, k1 in [(min(q0 + QUERY_TILE_ROWS, Lq), min(q0 + QUERY_TILE_ROWS, Lq, Lk))]]
        o = jnp.concatenate([o for o, _ in parts], axis=2)
        weights = jnp.concatenate([jnp.pad(w, [(0, 0)] * 3 + [(0, Lk - w.shape[-1])]) for _, w in parts], axis=2)
    else:
        o, weights = _core(spec, p, q, k, v, allowed=allowed, bias=bias, delta=delta, dropout_keep=dropout_keep,
                           default_positions=default_positions, plain_causal=plain_causal, q_start=0)
    out = _project(_merge(o), p["wo"], p.get("bo"))
    return (out, weights.astype(dtype)) if return_weights else out


#: Queries per tile under a plain top-left causal rule with default positions
#: (from Lq = 2 tiles on): a tile attends only the keys up to its last query,
#: which XLA then never computes (3/8 of the work at L = 1024). Python unrolls
#: this fixed tiling at trace time; there is no loop over positions at run time.
QUERY_TILE_ROWS = 256


def _cut(x, q0: int, q1: int, k1: int):
    """Rows q0 .. q1 - 1 and keys 0 .. k1 - 1 of an array broadcastable to (B, H, Lq, Lk)."""
    if x is None:
        return None
    x = _as4d(x)
    return x[..., q0:q1 if x.shape[2] > 1 else None, :k1 if x.shape[3] > 1 else None]


def _core(spec, p, q, k, v, *, allowed, bias, delta, dropout_keep, default_positions: bool, plain_causal: bool,
          q_start: int):
    """Logits, softmax, values and the relative terms of queries q_start .. q_start + Lq - 1: (o, weights).

    plain_causal: the only rule is CAUSAL-1, top-left (default positions, no mask, bias or mask_fill).
    """
    dtype = q.dtype
    Lk = k.shape[2]
    stat = jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype  # PREC-4
    logits = jnp.einsum("bhid,bhjd->bhij", q, k).astype(stat) * spec.effective_scale  # SCALE-2
    if "rel_k" in p:
        term = _relative_key_term(spec, p, q, default_positions, delta, Lk, q_start)
        logits = logits + term.astype(stat) * spec.relative_scale  # SCALE-3
    if bias is not None:
        logits = logits + bias.astype(stat)  # BIAS-1, SCALE-4
    if plain_causal and spec.relative is not None and not isinstance(spec.relative, Shaw):
        allowed = None  # the Huang skew term holds -inf at every key CAUSAL-1 disallows; key 0 is always allowed
    weights = _masked_softmax(logits, allowed, spec.mask_fill)
    dropped = weights
    if dropout_keep is not None:  # DROP-1
        dropped = jnp.where(dropout_keep, weights / (1.0 - spec.dropout), 0.0)
    o = jnp.einsum("bhij,bhjd->bhid", dropped.astype(dtype), v)
    if isinstance(spec.relative, Shaw) and spec.relative.values:  # SHAW-4, DROP-4
        if default_positions:
            buckets = rel.bucket_sums_banded(dropped, spec.relative.max_distance, q_start)
        else:
            buckets = rel.bucket_sums(dropped, rel.shaw_index(delta, spec.relative.max_distance),
                                      spec.relative.num_rows)
        table = p["rel_v"]
        o = o + (jnp.einsum("bhir,rd->bhid", buckets.astype(dtype), table) if table.ndim == 2
                 else jnp.einsum("bhir,hrd->bhid", buckets.astype(dtype), table))
    return o, weights
