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

Autograd runs through the ring: the pass of a block is an autograd function
whose backward passes the block's gradient the other way round (rank r to
r - 1), made contiguous before it is sent (a non-contiguous gradient sent by
gloo arrived wrong elsewhere). The parameters' gradients of each rank are
its shard's part: their sum over the ranks (``all_reduce``) is the whole
call's. Per-pair inputs (mask, bias, keep mask) are the rank's query rows
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


class _Pass(torch.autograd.Function):
    """One step of the ring: send the block to the next rank, receive the previous rank's; backward the other way."""

    @staticmethod
    def forward(ctx, group, *block):
        ctx.group = group
        return tuple(_shift(list(block), group, +1))

    @staticmethod
    def backward(ctx, *grads):
        grads = [torch.zeros_like(g) if g is None else g for g in grads]
        return (None, *_shift(grads, ctx.group, -1))


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
    stat = _core.stat_dtype(q.dtype)
    m = torch.full((B, H, Ls), float("-inf"), dtype=stat, device=q.device)
    l_sum = torch.zeros((B, H, Ls), dtype=stat, device=q.device)
    o = torch.zeros((B, H, Ls, v.shape[-1]), dtype=stat, device=q.device)
    block = (k, v, k_pos.expand(B, -1).contiguous(), k_tokens.expand(B, -1).contiguous())
    for step in range(n):
        bk, bv, bpos, bidx = block
        m, l_sum, o = _fold(spec, p, pairs, q, q_pos, bk, bv, bpos, bidx[0], m, l_sum, o)
        if step < n - 1:
            block = _Pass.apply(group, *block)
    # BLOCK-4: one division by the denominator; MASK-5: a row with no allowed key (l = 0, o = 0) stays exactly 0
    o = torch.where(l_sum[..., None] > 0, o / torch.where(l_sum > 0, l_sum, 1.0)[..., None], 0.0).to(q.dtype)
    return _core.project(_core.merge_heads(o), p["wo"], p.get("bo"))  # OUT-1


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


def _fold(spec, params, pairs, q, q_pos, k, v, k_pos, k_index, m, l_sum, o):
    """BLOCK-2 for this rank's queries against one key block, folded into the running (m, l, o) by BLOCK-3."""
    B, H, Ls = q.shape[:3]
    cols = {n: a[..., k_index] if a.shape[-1] > 1 else a for n, a in pairs.items()}
    call = _core.Call(
        B, Ls, k.shape[2], q.device, mask=cols.get("mask"), bias=cols.get("bias"), q_positions=q_pos,
        k_positions=k_pos, dropout_keep=cols.get("keep"), causal=spec.causal, window=spec.window,
    )  # fmt: skip
    z = block_logits(spec, params, q, k, call)  # (B, H, Ls, Lb) in the stat dtype
    allowed = call.allowed
    counted = torch.ones_like(z, dtype=torch.bool) if allowed is None else allowed.expand(z.shape)
    if spec.mask_fill is not None:  # MASK-6: every key counts, the disallowed ones at the fill
        z, counted = torch.where(counted, z, spec.mask_fill), torch.ones_like(counted)
    # the running maximum is not differentiated (the result does not depend on it): its gradient paths cancel in
    # exact arithmetic; measured over the catalog, this ring's float64 key gradients need them left out
    # (t5/cross/default-buckets-to-512: 3.9e-16 against a budget of 3.2e-16 with them)
    m_new = torch.maximum(m, torch.where(counted, z.detach(), float("-inf")).amax(-1))
    shift = torch.where(torch.isfinite(m_new), m_new, 0.0)
    # a pair that does not count is exponentiated at 0, not at its logit: a NaN or an overflow there (a poisoned
    # dead key, MASK-7) reaches no gradient through the where
    e = torch.where(counted, torch.exp(torch.where(counted, z - shift[..., None], 0.0)), 0.0)
    dropped = _core.dropout(e, call.dropout_keep, spec.dropout)  # DROP-1 on the unnormalised weights (linear)
    live = counted.any(1).any(1)[:, None, :, None]  # MASK-7 per block: (B, 1, Lb, 1)
    # HEAD-3, HEAD-4 in the stat dtype (PREC-4): the weights are not rounded to a 16-bit input's dtype, whose
    # rounding the gradient of a cancelling sum (a table row every key shares) would not undo
    add = _core.grouped_values(dropped, v.masked_fill(~live, 0).to(o.dtype))
    scheme = spec.relative
    if scheme is not None and "value_term" in scheme.hooks:  # REL-3 (4): after dropout (DROP-4)
        table = {**params, "rel_v": params["rel_v"].to(o.dtype)}  # in the stat dtype too, like the weights
        add = add + schemes.module_for(scheme).value_term(scheme, table, dropped, call.delta).to(o.dtype)
    alpha = torch.exp(torch.where(torch.isfinite(m), m, float("-inf")) - shift)
    l_new = l_sum * alpha + e.sum(-1)
    return m_new, l_new, o * alpha[..., None] + add  # o unnormalised (BLOCK-2): divided once, at the end
