"""Ring (sequence-parallel) attention over a ``torch.distributed`` process group: BLOCK-1..BLOCK-5 on n ranks.

Each rank holds one shard of the sequence: its queries, keys and values and
their *global* positions. The key/value blocks travel round the ring (point
to point, rank r to r + 1, with their positions and global key indices); at
each of the n steps every rank computes the statistics of its queries
against the block it holds from the blocks' global positions (BLOCK-1,
BLOCK-2) and folds them into its running (m, l, o) (BLOCK-3). A key that no
query of any rank may attend (MASK-7) has its key and value rows zeroed
before the projections: each rank marks the keys its queries may attend
(every key's position gathered once) and a MAX over the ranks finds the
dead ones. After n steps
every query has met every key: the rank's output is its rows of the
unsharded attention (BLOCK-4).

The ring is one autograd function (``_Ring``) whose forward keeps no
step's graph, only each row's final statistics, and whose backward is a
second ring (BLOCK-6): the blocks travel round again with their key and
value gradients, each rank recomputing a block's weights from the final
(m, l) and taking the softmax's row sum as ``d_o . o``; after n passes a
block's gradients are home. Every tensor is made contiguous before it is
sent (a non-contiguous gradient sent by gloo arrived wrong elsewhere). The
projections and the q/k transform around the ring are autograd's. The
parameters' gradients of each rank are its shard's part: their sum over the
ranks (``all_reduce``) is the whole call's. Per-pair inputs (mask, bias, keep mask) are the rank's query rows
against every key, in global key order. A key that no query of the rank may
attend in a step has its value row zeroed for that step and its logits
exponentiated at 0 (nothing of it reaches a gradient).
Gloo on CPU tensors, NCCL on CUDA tensors: the tensors follow their inputs.
Axis legend (AXES-1): B, H, D, d; Ls the rank's tokens, Lk all keys.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from spec import AttentionSpec

from . import _core, schemes
from .kernels._base import transform_qk
from .kernels.eager import block_logits

LAYOUTS = ("contiguous", "zigzag")


def shard_tokens(L: int, n: int, rank: int, layout: str = "contiguous") -> torch.Tensor:
    """The global token indices rank ``rank`` of ``n`` holds (BLOCK-5): ``contiguous``, tokens rank * L / n ..;
    ``zigzag``, chunks rank and 2n - 1 - rank of 2n chunks of L / (2n)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    unit = 2 * n if layout == "zigzag" else n
    if L % unit:
        raise ValueError(f"L: expected a multiple of {unit} ({'2 x ' if layout == 'zigzag' else ''}{n} ranks), got {L}")
    if layout == "contiguous":
        size = L // n
        return torch.arange(rank * size, (rank + 1) * size)
    size = L // (2 * n)
    return torch.cat([torch.arange(rank * size, (rank + 1) * size), torch.arange((2 * n - 1 - rank) * size,
                                                                                 (2 * n - rank) * size)])  # fmt: skip


def _shift(tensors: list, group, direction: int) -> list:
    """Every tensor sent to rank + direction and the same shapes received from rank - direction (contiguous)."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    to = dist.get_global_rank(group, (rank + direction) % n) if group is not None else (rank + direction) % n
    frm = dist.get_global_rank(group, (rank - direction) % n) if group is not None else (rank - direction) % n
    out = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    ops = []
    for t, o in zip(tensors, out):
        ops.append(dist.P2POp(dist.isend, t.contiguous(), to, group))
        ops.append(dist.P2POp(dist.irecv, o, frm, group))
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return out


def ring_attention(
    spec: AttentionSpec,
    params: dict,
    query: torch.Tensor,
    key: Optional[torch.Tensor] = None,
    value: Optional[torch.Tensor] = None,
    *,
    group=None,
    q_positions: Optional[torch.Tensor] = None,
    k_positions: Optional[torch.Tensor] = None,
    mask: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    dropout_keep: Optional[torch.Tensor] = None,
    layout: str = "contiguous",
) -> torch.Tensor:
    """This rank's rows of multi-head attention over the whole sequence of the group (BLOCK-1..BLOCK-5).

    Args:
      query, key, value: this rank's tokens (B, Ls, D) (key None = query, value None = key); every rank the same
        Ls.
      q_positions, k_positions: the global positions of this rank's tokens, (Ls,) or (B, Ls); None: the
        token indices the layout gives this rank (``shard_tokens``), so that "zigzag" shards read as one
        sequence.
      mask, bias, dropout_keep: this rank's query rows against every key of the group in global key order,
        broadcastable to (B, H, Ls, n * Ls).
      layout: "contiguous" or "zigzag" (BLOCK-5): which global tokens this rank's shard is.
      group: the process group of the ring (None: the default group).
    Returns: this rank's output rows (B, Ls, D) in the query's dtype; differentiable.
    """
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    key = query if key is None else key
    value = key if value is None else value
    B, Ls, _ = query.shape
    Lk = n * key.shape[1]
    tokens = shard_tokens(Lk, n, rank, layout).to(query.device)
    k_tokens = tokens
    q_pos = _core.positions(q_positions, Ls, query.device) if q_positions is not None else tokens[None]
    k_pos = _core.positions(k_positions, key.shape[1], key.device) if k_positions is not None else k_tokens[None]
    pairs = {
        name: _core.as_4d(a) for name, a in (("mask", mask), ("bias", bias), ("keep", dropout_keep)) if a is not None
    }
    if spec.mask_fill is None:  # MASK-7: the rows of keys that no query of any rank may attend become zero
        dead = _dead_keys(spec, group, pairs, q_pos, k_pos, Lk, layout)
        if dead is not None:
            key, value = key.masked_fill(dead[..., None], 0.0), value.masked_fill(dead[..., None], 0.0)
    p, H, Hkv = params, spec.num_heads, spec.kv_heads
    q = _core.split_heads(_core.project(query, p["wq"], p.get("bq")), H)  # (B, H, Ls, d)
    k = _core.split_heads(_core.project(key, p["wk"], p.get("bk")), Hkv)
    v = _core.split_heads(_core.project(value, p["wv"], p.get("bv")), Hkv)
    local = _core.Call(B, Ls, key.shape[1], query.device, q_positions=q_pos, k_positions=k_pos)
    q, k = transform_qk(spec, p, q, k, local)  # REL-3 (1): per token, at its global position
    names = sorted(name for name in p if name not in PROJECTIONS)  # the scheme's tables
    fixed = {
        "pairs": {name: a for name, a in pairs.items() if name != "bias"},  # not differentiated (GRAD-3)
        "q_pos": q_pos,
        "k_pos": k_pos.expand(B, -1).contiguous(),
        "k_tokens": k_tokens.expand(B, -1).contiguous(),
    }
    o = _Ring.apply(spec, group, fixed, names, q, k, v, pairs.get("bias"), *(p[name] for name in names))
    return _core.project(_core.merge_heads(o.to(q.dtype)), p["wo"], p.get("bo"))  # OUT-1


#: The canonical projections' parameters; the others are the scheme's tables.
PROJECTIONS = frozenset({"wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"})


class _Ring(torch.autograd.Function):
    """BLOCK-1..BLOCK-4 and BLOCK-6: q (B, H, Ls, d), k, v (B, Hkv, Ls, d|dv) of this rank and the tables ->
    this rank's normalised output (B, H, Ls, dv) in the stat dtype; the backward a second ring."""

    @staticmethod
    def forward(ctx, spec, group, fixed, names, q, k, v, bias, *tables):
        n = dist.get_world_size(group)
        params = dict(zip(names, tables))
        pairs = {**fixed["pairs"], **({} if bias is None else {"bias": bias})}
        B, H, Ls = q.shape[:3]
        stat = _core.stat_dtype(q.dtype)
        m = torch.full((B, H, Ls), float("-inf"), dtype=stat, device=q.device)
        l_sum = torch.zeros((B, H, Ls), dtype=stat, device=q.device)
        o = torch.zeros((B, H, Ls, v.shape[-1]), dtype=stat, device=q.device)
        block = [k, v, fixed["k_pos"], fixed["k_tokens"]]
        for step in range(n):
            bk, bv, bpos, bidx = block
            m, l_sum, o = _fold(spec, params, pairs, q, fixed["q_pos"], bk, bv, bpos, bidx[0], m, l_sum, o)
            if step < n - 1:
                block = _shift(block, group, +1)
        # BLOCK-4: one division by the denominator; MASK-5: a row with no allowed key (l = 0, o = 0) stays 0
        o = torch.where(l_sum[..., None] > 0, o / torch.where(l_sum > 0, l_sum, 1.0)[..., None], 0.0)
        ctx.spec, ctx.group, ctx.fixed, ctx.names, ctx.has_bias = spec, group, fixed, names, bias is not None
        ctx.save_for_backward(q, k, v, bias, m, l_sum, o, *tables)
        return o

    @staticmethod
    def backward(ctx, d_o):
        """BLOCK-6: for each block, dz = w (dL/dw - r) with w from the final (m, l) and r each row's sum of
        w dL/dw over every pair (a first ring), as the gradient of ``<d_o, w v + value term> - sum w r`` at the
        block's recomputed logits; the key and value gradients travel with their block and are home after n
        passes of the second ring."""
        spec, group, fixed, names = ctx.spec, ctx.group, ctx.fixed, ctx.names
        q, k, v, bias, m, l_sum, o, *tables = ctx.saved_tensors
        n = dist.get_world_size(group)
        stat = o.dtype
        d_o = d_o.to(stat)
        tabs = dict(zip(names, tables))
        pairs = {**fixed["pairs"], **({"bias": bias} if ctx.has_bias else {})}
        # r = sum_j w_ij dL/dw_ij, summed over the pairs block by block (a first ring): d_o . o is the same sum in
        # exact arithmetic, but its rounding is not the pairs', which the cancelling table gradients (every pair
        # in one row: sum_j dz_ij = 0) expose beyond the float64 budgets
        r = torch.zeros_like(m)
        block = [k, v, fixed["k_pos"], fixed["k_tokens"]]
        for step in range(n):
            bk, bv, bpos, bidx = block
            r = r + _row_sums(spec, tabs, pairs, q, fixed["q_pos"], bk, bv, bpos, bidx[0], m, l_sum, d_o)
            if step < n - 1:
                block = _shift(block, group, +1)
        leaves = [q, *tables] + ([bias] if ctx.has_bias else [])
        acc = [torch.zeros_like(t, dtype=stat) for t in leaves]  # this rank's q, tables, bias
        block = [k, v, fixed["k_pos"], fixed["k_tokens"]]
        dk, dv = torch.zeros_like(k, dtype=stat), torch.zeros_like(v, dtype=stat)
        for step in range(n):
            bk, bv, bpos, bidx = block
            with torch.enable_grad():
                # PREC-4: each block's partial gradients in the stat dtype (the leaves are exact upcasts), summed
                # over the blocks there and rounded to a 16-bit input's dtype once, at the end
                wrt = [t.detach().to(stat).requires_grad_() for t in (*leaves, bk, bv)]
                qd, *rest = wrt
                tabs_d = dict(zip(names, rest[: len(names)]))
                pairs_d = {**fixed["pairs"], **({"bias": rest[len(names)]} if ctx.has_bias else {})}
                loss = _block_loss(spec, tabs_d, pairs_d, qd, fixed["q_pos"], wrt[-2], wrt[-1], bpos, bidx[0], m,
                                   l_sum, d_o, r, q.dtype)  # fmt: skip
                grads = torch.autograd.grad(loss, wrt, allow_unused=True)
            for a, g in zip(acc, grads[:-2]):
                if g is not None:
                    a += g
            dk = dk + (0 if grads[-2] is None else grads[-2])
            dv = dv + (0 if grads[-1] is None else grads[-1])
            # the block and its gradients to the next rank; the last pass brings the gradients home
            block_and_grads = _shift([bk, bv, bpos, bidx, dk, dv] if step < n - 1 else [dk, dv], group, +1)
            if step < n - 1:
                *block, dk, dv = block_and_grads
            else:
                dk, dv = block_and_grads
        d_q, *d_rest = (a.to(t.dtype) for a, t in zip(acc, leaves))
        d_tables = d_rest[: len(names)]
        d_bias = d_rest[len(names)] if ctx.has_bias else None
        return (None, None, None, None, d_q, dk.to(k.dtype), dv.to(v.dtype), d_bias, *d_tables)


def _dead_keys(spec, group, pairs: dict, q_pos, k_pos, Lk: int, layout: str):
    """MASK-7 over the whole group: (B, Ls) True for this rank's keys that no query of any rank may attend (its
    queries against every key's position, gathered from the ranks; then a MAX over the ranks); None when every
    key is allowed."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    B = max(q_pos.shape[0], k_pos.shape[0], *(a.shape[0] for a in pairs.values()))
    mine = k_pos.expand(B, -1).contiguous()
    gathered = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(gathered, mine, group=group)
    every = mine.new_empty(B, Lk)
    for r, part in enumerate(gathered):  # the ranks' key positions in global key order
        every[:, shard_tokens(Lk, n, r, layout).to(every.device)] = part
    call = _core.Call(
        B, q_pos.shape[-1], Lk, q_pos.device, mask=pairs.get("mask"), bias=pairs.get("bias"), q_positions=q_pos,
        k_positions=every, causal=spec.causal, window=spec.window,
    )  # fmt: skip
    if call.allowed is None:
        return None
    seen = (~_core.dead_keys(call.allowed, B, Lk)).to(torch.int32).contiguous()
    dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=group)
    return seen[:, shard_tokens(Lk, n, rank, layout).to(seen.device)] == 0


def _block_logits(spec, params, pairs, q, q_pos, k, k_pos, k_index):
    """BLOCK-1, BLOCK-2: the logits (B, H, Ls, Lb) of this rank's queries against one key block in the stat dtype,
    the pairs that count (MASK-4; under MASK-6 every pair, the disallowed ones at the fill), and the block's call
    (its distances, its columns of the bias and the keep mask)."""
    B, H, Ls = q.shape[:3]
    cols = {n: a[..., k_index] if a.shape[-1] > 1 else a for n, a in pairs.items()}
    call = _core.Call(
        B, Ls, k.shape[2], q.device, mask=cols.get("mask"), bias=cols.get("bias"), q_positions=q_pos,
        k_positions=k_pos, dropout_keep=cols.get("keep"), causal=spec.causal, window=spec.window,
    )  # fmt: skip
    z = block_logits(spec, params, q, k, call)
    allowed = call.allowed
    counted = torch.ones_like(z, dtype=torch.bool) if allowed is None else allowed.expand(z.shape)
    if spec.mask_fill is not None:  # MASK-6: every key counts, the disallowed ones at the fill
        z, counted = torch.where(counted, z, spec.mask_fill), torch.ones_like(counted)
    return z, counted, call


def _block_values(spec, params, call, counted, v, e):
    """sum_j w'_ij v_j plus the value term of w' = dropout(e) (HEAD-3, HEAD-4, DROP-1, DROP-4, REL-3 (4)), in e's
    dtype (the stat dtype, PREC-4: the weights are not rounded to a 16-bit input's dtype, whose rounding the
    gradient of a cancelling sum, a table row every key shares, would not undo)."""
    dropped = _core.dropout(e, call.dropout_keep, spec.dropout)  # DROP-1 on the weights (linear)
    live = counted.any(1).any(1)[:, None, :, None]  # MASK-7 per block: (B, 1, Lb, 1)
    add = _core.grouped_values(dropped, v.masked_fill(~live, 0).to(e.dtype))
    scheme = spec.relative
    if scheme is not None and "value_term" in scheme.hooks:  # REL-3 (4): after dropout (DROP-4)
        table = {**params, "rel_v": params["rel_v"].to(e.dtype)}  # in the stat dtype too, like the weights
        add = add + schemes.module_for(scheme).value_term(scheme, table, dropped, call.delta).to(e.dtype)
    return add


def _exp(z, counted, shift):
    """exp(z - shift) where a pair counts, 0 elsewhere: a pair that does not count is exponentiated at 0, not at
    its logit, so that a NaN or an overflow there (a poisoned dead key, MASK-7) reaches nothing."""
    return torch.where(counted, torch.exp(torch.where(counted, z - shift[..., None], 0.0)), 0.0)


def _fold(spec, params, pairs, q, q_pos, k, v, k_pos, k_index, m, l_sum, o):
    """BLOCK-2 for this rank's queries against one key block, folded into the running (m, l, o) by BLOCK-3."""
    z, counted, call = _block_logits(spec, params, pairs, q, q_pos, k, k_pos, k_index)
    m_new = torch.maximum(m, torch.where(counted, z, float("-inf")).amax(-1))
    shift = torch.where(torch.isfinite(m_new), m_new, 0.0)
    e = _exp(z, counted, shift)
    alpha = torch.exp(torch.where(torch.isfinite(m), m, float("-inf")) - shift)
    l_new = l_sum * alpha + e.sum(-1)
    add = _block_values(spec, params, call, counted, v, e).to(o.dtype)
    return m_new, l_new, o * alpha[..., None] + add  # o unnormalised (BLOCK-2): divided once, at the end


def _row_sums(spec, params, pairs, q, q_pos, k, v, k_pos, k_index, m, l_sum, d_o):
    """BLOCK-6: sum_j w_ij dL/dw_ij over one block's pairs, (B, H, Ls), with w the block's final weights and dL/dw
    the gradient of ``<d_o, sum_j w'_ij (v_j + a_ij)>`` (dropout and the value term included)."""
    z, counted, call = _block_logits(spec, params, pairs, q, q_pos, k, k_pos, k_index)
    shift = torch.where(torch.isfinite(m), m, 0.0)
    w = _exp(z, counted, shift) / torch.where(l_sum > 0, l_sum, 1.0)[..., None]
    with torch.enable_grad():
        leaf = w.detach().requires_grad_()
        (g,) = torch.autograd.grad((d_o * _block_values(spec, params, call, counted, v.detach(), leaf)).sum(), leaf)
    return (w * g).sum(-1)


def _block_loss(spec, params, pairs, q, q_pos, k, v, k_pos, k_index, m, l_sum, d_o, r, dtype):
    """BLOCK-6 for one block: ``<d_o, sum_j w'_ij (v_j + a_ij)> - sum_j w_ij r_i`` with w the block's final
    weights (from the rows' final m and l, held constant); its gradient at the logits is w (dL/dw - r).

    q, k, v and the tables are the stat dtype's upcasts of inputs in ``dtype``. For a 16-bit ``dtype`` the logits'
    values are the forward's (its products in ``dtype``, so that w is the forward's m and l exactly), and their
    gradients are those of the same logits computed in the stat dtype (PREC-4: no partial gradient of a block is
    rounded to 16 bits before the blocks are summed)."""
    z, counted, call = _block_logits(spec, params, pairs, q, q_pos, k, k_pos, k_index)
    if dtype != q.dtype:
        with torch.no_grad():
            low = {n: t.to(dtype) for n, t in params.items()}
            z_low, _, _ = _block_logits(spec, low, pairs, q.to(dtype), q_pos, k.to(dtype), k_pos, k_index)
        z = torch.where(torch.isfinite(z_low), z_low + (z - z.detach()), z_low)
    shift = torch.where(torch.isfinite(m), m, 0.0)
    w = _exp(z, counted, shift) / torch.where(l_sum > 0, l_sum, 1.0)[..., None]
    return (d_o * _block_values(spec, params, call, counted, v, w)).sum() - (w * r[..., None]).sum()
