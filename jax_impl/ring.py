"""Ring (sequence-parallel) attention over a named mesh axis: BLOCK-1..BLOCK-5 on n devices.

The tokens are cut into n shards along the sequence; shard r holds its
queries, keys and values (projected where they are) and their *global*
positions. The key/value blocks travel round the ring (``lax.ppermute``,
shard r to r + 1) with their positions and their global key indices; at
each of the n steps every shard computes the statistics of its queries
against the block it holds (BLOCK-2: the largest allowed logit, the sum of
exponentials, the block's own output with its value term) from the
blocks' global positions (BLOCK-1), and folds them into its running
(m, l, o) (BLOCK-3). After n steps every query has met every key: the
output is the unsharded attention (BLOCK-4), then the output projection.

Per-pair inputs (mask, bias, keep mask) are cut by query rows: shard r
holds the rows of its queries for every key, and each step reads the
columns of the block it holds by the block's key indices. A key that no
query of any shard may attend (MASK-7) has its key and value rows zeroed
before the projections: each shard marks the keys its queries may attend
(its rows against every key's position, a boolean (B, H, Ls, Lk)) and a
``psum`` over the shards finds the dead ones. In each step a key no query of
the shard may attend has its value row zeroed and its logits exponentiated
at 0, so that nothing of it reaches a gradient.

``layout="zigzag"`` (BLOCK-5) puts the tokens in the load-balanced causal
order before sharding (shard r: chunks r and 2n - 1 - r of 2n) with their
positions, and puts the output back in token order.

Differentiable, with a VJP of its own for the ring (BLOCK-6): from the
final (m, l) and output of each row, a second ring passes the key/value
blocks round with their gradients; each shard recomputes its queries'
logits against the block it holds, takes the pairs' final weights and the
row sums ``d_o . o``, and adds the block's key and value gradients to those
travelling with it, which arrive home after n steps. No step's residuals
are kept (the forward stores its inputs and the row statistics only), and
XLA compiles about half the program that JAX's differentiation of the
forward's scan gives. The projections, the q/k transform and the dead keys
around the ring are differentiated by JAX. Axis legend (AXES-1): B, H, Lq,
Lk, D, d; n shards, Ls = L / n per shard.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from spec import AttentionSpec

from . import _checks, schemes
from .heads import merge, project, split, weighted_values
from .kernels._base import Inputs
from .kernels.xla import block_logits
from .masking import allowed_keys, as4d, dead_keys, distance, dropout, positions, stat_dtype

LAYOUTS = ("contiguous", "zigzag")
#: The projections' parameters (PROJ-1, OUT-1); the others are the scheme's tables.
PROJECTIONS = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo")


def zigzag_order(L: int, n: int) -> np.ndarray:
    """BLOCK-5: the token order of the load-balanced causal layout: shard r holds chunks r and 2n - 1 - r of the
    2n chunks of L / (2n) tokens, shards in order. ``order[t]`` is the token at slot t."""
    chunks = np.arange(L).reshape(2 * n, L // (2 * n))
    return np.concatenate([np.concatenate([chunks[r], chunks[2 * n - 1 - r]]) for r in range(n)])


def ring_attention(
    spec: AttentionSpec,
    params: dict,
    query,
    key=None,
    value=None,
    *,
    mesh,
    axis_name: str,
    mask=None,
    bias=None,
    q_positions=None,
    k_positions=None,
    dropout_keep=None,
    layout: str = "contiguous",
):
    """Multi-head attention with the sequence sharded over ``mesh``'s axis ``axis_name`` (BLOCK-1..BLOCK-5).

    Same arguments and result as ``jax_impl.attention`` (no weights, no kernel choice), plus ``mesh`` (a
    ``jax.sharding.Mesh``), ``axis_name`` (one of its axes, n devices) and ``layout`` ("contiguous": shard r
    holds tokens r * L / n ..; "zigzag": the load-balanced causal order of BLOCK-5). Lq and Lk must be
    multiples of n (of 2n for "zigzag"). Jit it with ``spec``, ``mesh``, ``axis_name`` and ``layout`` static.
    """
    B, Lq, Lk = _checks.check(spec, params, query, key, value, mask, bias, q_positions, k_positions, dropout_keep)
    if spec.relative is not None:
        schemes.module_for(spec.relative)  # REL-4
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    if axis_name not in mesh.axis_names:
        raise ValueError(f"axis_name: expected one of the mesh's axes {tuple(mesh.axis_names)}, got {axis_name!r}")
    n = mesh.shape[axis_name]
    unit = 2 * n if layout == "zigzag" else n
    for name, L in (("Lq", Lq), ("Lk", Lk)):
        if L % unit:
            raise ValueError(
                f"{name}: expected a multiple of {unit} ({'2 x ' if layout == 'zigzag' else ''}{n} shards on "
                f"axis {axis_name!r}), got {L}"
            )
    key = query if key is None else key
    value = key if value is None else value
    q_pos = jnp.broadcast_to(positions(q_positions, Lq), (B, Lq))  # POS-1, global
    k_pos = jnp.broadcast_to(positions(k_positions, Lk), (B, Lk))
    pairs = {}  # per-pair inputs: (B|1, H|1, Lq, Lk), their query rows sharded
    for name, a in (("mask", mask), ("bias", bias), ("keep", dropout_keep)):
        if a is not None:
            a4 = as4d(jnp.asarray(a))
            pairs[name] = jnp.broadcast_to(a4, a4.shape[:2] + (Lq, Lk))
    if layout == "zigzag":  # BLOCK-5: the tokens in the load-balanced order, their positions with them
        qo, ko = zigzag_order(Lq, n), zigzag_order(Lk, n)
        query, key, value = query[:, qo], key[:, ko], value[:, ko]
        q_pos, k_pos = q_pos[:, qo], k_pos[:, ko]
        pairs = {name: a[:, :, qo][..., ko] for name, a in pairs.items()}
    k_index = jnp.broadcast_to(jnp.arange(Lk), (B, Lk))  # the columns of the per-pair inputs, in the held order
    all_k_pos = k_pos  # every key's position in the held order, replicated: for the dead keys (MASK-7)
    row, tok = P(None, axis_name), P(None, axis_name, None)
    body = functools.partial(_shard, spec, axis_name, n, sorted(pairs))
    out = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P(), tok, tok, tok, row, row, row, P(), *[P(None, None, axis_name, None)] * len(pairs)),
        out_specs=tok,
        check_vma=False,
    )(params, query, key, value, q_pos, k_pos, k_index, all_k_pos, *[pairs[name] for name in sorted(pairs)])
    if layout == "zigzag":
        out = out[:, np.argsort(qo)]
    return out


def _shard(spec: AttentionSpec, axis_name: str, n: int, pair_names: list, params, query, key, value, q_pos, k_pos,
           k_index, all_k_pos, *pair_rows):  # fmt: skip
    """One shard: its queries against every key block in turn, the blocks passed on round the ring."""
    p, H, Hkv = params, spec.num_heads, spec.kv_heads
    pairs = dict(zip(pair_names, pair_rows))  # (B|1, H|1, Ls, Lk) rows of this shard's queries
    if spec.mask_fill is None:  # MASK-7: the rows of keys that no query of any shard may attend become zero
        dead = _dead_keys(spec, axis_name, pairs, q_pos, all_k_pos, k_index)
        if dead is not None:
            key = jnp.where(dead[..., None], 0, key).astype(key.dtype)
            value = jnp.where(dead[..., None], 0, value).astype(value.dtype)
    hooks = _stat_key_term(schemes.plain_hooks(spec.relative), stat_dtype(query.dtype))
    q = split(project(query, p["wq"], p.get("bq")), H)  # (B, H, Ls, d)
    k = split(project(key, p["wk"], p.get("bk")), Hkv)  # (B, Hkv, Ls, d)
    v = split(project(value, p["wv"], p.get("bv")), Hkv)  # (B, Hkv, Ls, dv)
    if hooks.qk_transform is not None:  # REL-3 (1): per token, at its global position
        q, k = hooks.qk_transform(p, q, k, q_pos, k_pos)
    tables = {name: a for name, a in p.items() if name not in PROJECTIONS}  # the scheme's parameters
    bias = {"bias": pairs["bias"]} if "bias" in pairs else {}  # the one per-pair input with a gradient (GRAD-3)
    fixed = (q_pos, k_pos, k_index, {name: a for name, a in pairs.items() if name != "bias"})
    attend = _ring(spec, axis_name, n, hooks)
    o = attend(q, k, v, tables, bias, fixed).astype(q.dtype)
    return project(merge(o), p["wo"], p.get("bo"))  # OUT-1


def _ring(spec: AttentionSpec, axis_name: str, n: int, hooks):
    """The ring over one shard's projected heads: ``attend(q, k, v, tables, bias, fixed)`` -> its normalised
    output (B, H, Ls, dv) in the stat dtype, with a VJP of its own (BLOCK-6): a second ring from the final
    statistics, not JAX's differentiation of the first (which keeps every step's residuals)."""
    ring = [(i, (i + 1) % n) for i in range(n)]

    def forward(q, k, v, tables, bias, fixed):
        q_pos, k_pos, k_index, pairs = fixed
        pairs = {**pairs, **bias}
        stat = stat_dtype(q.dtype)
        B, H, Ls, _ = q.shape
        m = jnp.full((B, H, Ls), -jnp.inf, stat)
        l_sum = jnp.zeros((B, H, Ls), stat)
        o = jnp.zeros((B, H, Ls, v.shape[-1]), stat)

        def step(carry, _):  # fold the held block in, pass it on: one program for any n (lax.scan)
            stats, block = carry
            stats = _fold(spec, tables, hooks, pairs, q, q_pos, *block, *stats)
            return (stats, jax.lax.ppermute(block, axis_name, ring)), None

        ((m, l_sum, o), block), _ = jax.lax.scan(step, ((m, l_sum, o), (k, v, k_pos, k_index)), length=n - 1)
        m, l_sum, o = _fold(spec, tables, hooks, pairs, q, q_pos, *block, m, l_sum, o)  # the last: not passed on
        # BLOCK-4: one division by the denominator; MASK-5: a row with no allowed key (l = 0, o = 0) stays 0
        o = jnp.where(l_sum[..., None] > 0, o / jnp.where(l_sum > 0, l_sum, 1.0)[..., None], 0.0)
        return o, (q, k, v, tables, bias, fixed, o, m, l_sum)

    def backward(residuals, d_o):
        q, k, v, tables, bias, fixed, o, m, l_sum = residuals
        q_pos, _, _, pairs = fixed
        stat = stat_dtype(q.dtype)
        d_o = d_o.astype(stat)
        # BLOCK-6: each row's sum over every key of w_ij dL/dw_ij, which is d_o . o (o holds the value term)
        rows = jnp.sum(d_o * o, axis=-1)
        shift = jnp.where(jnp.isfinite(m), m, 0.0)
        scale = jnp.where(l_sum > 0, 1.0 / jnp.where(l_sum > 0, l_sum, 1.0), 0.0)  # 1 / l, 0 for an empty row
        up = functools.partial(jax.tree.map, lambda a: a.astype(stat))

        def pulled(diff, kb, vb, k_pos, k_index):
            """The block's share: the gradient of <d_o, o_J> - sum_ij rows_i w_ij, w the final weights."""

            def share(diff, kb, vb):
                qs, tab, b = diff
                z, counted, x = _block_logits(spec, tab, hooks, {**pairs, **b}, qs, q_pos, kb, vb, k_pos, k_index)
                e = jnp.where(counted, jnp.exp(jnp.where(counted, z - shift[..., None], 0.0)), 0.0)
                w = e * scale[..., None]  # the final weights of the block's keys (SOFTMAX-1)
                o_block = _block_values(spec, tab, hooks, x, counted, w)
                return jnp.sum(d_o * o_block) - jnp.sum(w * rows[..., None])

            return jax.grad(share, argnums=(0, 1, 2))(diff, up(kb), up(vb))

        def step(carry, _):
            acc, (kb, vb, k_pos, k_index, d_kb, d_vb) = carry
            g, g_k, g_v = pulled(diff, kb, vb, k_pos, k_index)
            acc = jax.tree.map(jnp.add, acc, g)
            block = (kb, vb, k_pos, k_index, d_kb + g_k, d_vb + g_v)
            return (acc, jax.lax.ppermute(block, axis_name, ring)), None  # after n steps each block is home

        diff = up((q, tables, bias))
        zeros = functools.partial(jax.tree.map, jnp.zeros_like)
        start = (zeros(diff), (k, v, fixed[1], fixed[2], zeros(up(k)), zeros(up(v))))
        ((d_q, d_tables, d_bias), block), _ = jax.lax.scan(step, start, length=n)
        down = functools.partial(jax.tree.map, lambda g, a: g.astype(a.dtype))
        return down(d_q, q), down(block[4], k), down(block[5], v), down(d_tables, tables), down(d_bias, bias), None

    attend = jax.custom_vjp(lambda q, k, v, tables, bias, fixed: forward(q, k, v, tables, bias, fixed)[0])
    attend.defvjp(forward, backward)
    return attend


def _stat_key_term(hooks, stat):
    """The hooks with the key term computed from q and the tables in the stat dtype (PREC-4): its gradient then
    gathers each table row's sum of the blocks' logit gradients in that dtype, not rounded to a 16-bit one per
    pair first (a row every key shares cancels: Shaw(0)'s key table)."""
    if hooks.key_term is None:
        return hooks
    term = hooks.key_term

    def key_term(params, q, delta):
        tables = {n: t.astype(stat) if n.startswith("rel_") else t for n, t in params.items()}
        return term(tables, q.astype(stat), delta)

    return hooks._replace(key_term=key_term)


def _dead_keys(spec, axis_name, pairs, q_pos, all_k_pos, k_index):
    """MASK-7 over the whole call: (B, Ls) True for this shard's keys that no query of any shard may attend (its
    queries against every key, then a sum over the shards); None when every key is allowed."""
    allowed = allowed_keys(spec, distance(q_pos, all_k_pos), pairs.get("mask"), pairs.get("bias"))
    if allowed is None:
        return None
    B, Lk = k_index.shape[0], all_k_pos.shape[-1]
    seen = jax.lax.psum((~dead_keys(allowed, B, Lk)).astype(jnp.int32), axis_name)  # (B, Lk) in the held order
    return jnp.take_along_axis(seen, k_index, axis=1) == 0


def _block_logits(spec, params, hooks, pairs, q, q_pos, k, v, k_pos, k_index):
    """BLOCK-1, BLOCK-2: the logits (B, H, Ls, Lb) of this shard's queries against one key block, from the global
    positions, in the stat dtype; the pairs that count (MASK-4; under MASK-6 every pair, the disallowed ones at
    the fill); the block's ``Inputs`` (its distances, its columns of the bias and the keep mask)."""
    delta = distance(q_pos, k_pos)  # POS-2 from the global positions (BLOCK-1)
    cols = {name: jnp.take_along_axis(a, _columns(k_index, a), axis=-1) for name, a in pairs.items()}
    allowed = allowed_keys(spec, delta, cols.get("mask"), cols.get("bias"))  # MASK-4
    x = Inputs(q, k, v, q_pos, k_pos, delta, allowed, cols.get("bias"), cols.get("keep"))
    z = block_logits(spec, params, x, hooks)
    counted = jnp.ones(z.shape, bool) if allowed is None else jnp.broadcast_to(allowed, z.shape)
    if spec.mask_fill is not None:  # MASK-6: every key counts, the disallowed ones at the fill
        z, counted = jnp.where(counted, z, spec.mask_fill), jnp.ones(z.shape, bool)
    return z, counted, x


def _block_values(spec, params, hooks, x, counted, e):
    """sum_j w'_ij v_j plus the value term of w' = dropout(e) (HEAD-3, HEAD-4, DROP-1, DROP-4, REL-3 (4)), in
    e's dtype (the stat dtype, PREC-4: the weights are not rounded to a 16-bit input's dtype, whose rounding the
    gradient of a cancelling sum, a table row every key shares, would not undo)."""
    dropped = dropout(e, x.dropout_keep, spec.dropout)  # DROP-1 on the weights (linear)
    live = jnp.any(counted, axis=(1, 2))[:, None, :, None]  # MASK-7 per block: (B, 1, Lb, 1)
    v_live = jnp.where(live, x.v, 0).astype(x.v.dtype)
    add = weighted_values(dropped, v_live.astype(e.dtype))
    if hooks.value_term is not None:  # REL-3 (4): from the weights after dropout (DROP-4)
        table = {**params, "rel_v": params["rel_v"].astype(e.dtype)}  # in the stat dtype too, like the weights
        add = add + hooks.value_term(table, dropped, x.delta).astype(e.dtype)
    return add


def _fold(spec, params, hooks, pairs, q, q_pos, k, v, k_pos, k_index, m, l_sum, o):
    """BLOCK-2 for this shard's queries against one key block, folded into the running (m, l, o) by BLOCK-3."""
    z, counted, x = _block_logits(spec, params, hooks, pairs, q, q_pos, k, v, k_pos, k_index)
    m_new = jnp.maximum(m, jnp.max(jnp.where(counted, z, -jnp.inf), axis=-1))
    shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    # weights relative to the new maximum; a pair that does not count is exponentiated at 0, not at its logit, so
    # that a NaN or an overflow there (a poisoned dead key, MASK-7) reaches nothing
    e = jnp.where(counted, jnp.exp(jnp.where(counted, z - shift[..., None], 0.0)), 0.0)
    alpha = jnp.exp(jnp.where(jnp.isfinite(m), m, -jnp.inf) - shift)  # 0 while a row has had no allowed key
    l_new = l_sum * alpha + jnp.sum(e, axis=-1)
    o_new = o * alpha[..., None] + _block_values(spec, params, hooks, x, counted, e).astype(o.dtype)
    return m_new, l_new, o_new  # o unnormalised (BLOCK-2): divided once, at the end


def _columns(k_index, a):
    """The gather index of a per-pair input's columns: the block's key indices, broadcast to a's rows."""
    idx = k_index[:, None, None, :] if a.shape[0] > 1 else k_index[:1, None, None, :]
    return jnp.broadcast_to(idx, a.shape[:3] + (k_index.shape[-1],))
