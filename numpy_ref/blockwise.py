"""BLOCK-1..BLOCK-4: attention evaluated over a split of the keys, combined by their maxima and denominators.

Each block is a call of its own (the block's keys and values, their global
positions, its columns of the mask, bias and keep mask) run by the
reference's forward pass; its statistics are the largest of its allowed
logits, their sum of exponentials and its own normalised output per head
(BLOCK-2); the blocks combine by BLOCK-3. The result equals ``attention`` for every split (BLOCK-4), which
the tests check, so this is the oracle for sharded and fused
implementations: what each shard of a ring must send on is exactly
``(m_J, l_J, o_J)``. Axis legend (AXES-1): B, H, Lq, Lk, D, dv.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from spec import AttentionSpec

from ._inputs import Call, prepare
from .backward import _project_vjp, backward_heads, in_order, prepare_vjp, weight_row_sums
from .forward import Trace, project, run
from .heads import merge_heads, split_heads


def key_split(key_blocks, Lk: int) -> list:
    """BLOCK-1: ``key_blocks`` as a list of int64 index arrays holding every key in 0 .. Lk - 1 exactly once.

    Accepts a sequence of block sizes (ints summing to Lk: consecutive blocks) or a sequence of index
    sequences (any order, empty blocks allowed).
    """
    blocks = list(key_blocks)
    if all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in blocks):
        if any(b < 0 for b in blocks) or sum(blocks) != Lk:
            raise ValueError(f"key_blocks: expected block sizes >= 0 summing to Lk = {Lk}, got {blocks}")
        ends = np.cumsum([0, *blocks])
        return [np.arange(a, b, dtype=np.int64) for a, b in zip(ends[:-1], ends[1:])]
    out = [np.asarray(b, dtype=np.int64).reshape(-1) for b in blocks]
    every = np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)
    if not np.array_equal(every, np.arange(Lk)):
        raise ValueError(f"key_blocks: expected blocks holding every key 0 .. {Lk - 1} exactly once, got {blocks}")
    return out


def _columns(a: Optional[np.ndarray], J: np.ndarray, Lk: int) -> Optional[np.ndarray]:
    """BLOCK-1: the block's columns of a per-pair input (its key axis last; a broadcast key axis stays)."""
    if a is None or a.ndim == 0 or a.shape[-1] != Lk:
        return a
    return a[..., J]


def block_call(call: Call, J: np.ndarray) -> Call:
    """BLOCK-1: the call of block J: its keys, values and global positions, its columns of every per-pair input."""
    Lk = call.dims.Lk
    return dataclasses.replace(
        call,
        dims=call.dims._replace(Lk=len(J)),
        key=call.key[:, J],
        value=call.value[:, J],
        mask=_columns(call.mask, J, Lk),
        bias=_columns(call.bias, J, Lk),
        k_positions=call.k_positions[:, J],
        dropout_keep=_columns(call.dropout_keep, J, Lk),
    )


def block_statistics(spec: AttentionSpec, call: Call, trace: Optional[Trace] = None) -> tuple:
    """BLOCK-2: (m, l (B, H, Lq), o (B, H, Lq, dv)) of one block's call: the largest allowed logit (-inf for a
    row without one; with ``mask_fill`` every logit counts, the disallowed ones filled, MASK-6), the sum of
    exp(z - m) over them (0 for a row without one), and the block's own normalised output per head (0 for a
    row without an allowed key, MASK-5). ``trace``: the block's forward pass, when already run."""
    trace = run(spec, call) if trace is None else trace
    if spec.mask_fill is not None:
        z, counted = np.where(trace.allowed, trace.logits, spec.mask_fill), np.ones_like(trace.allowed)
    else:
        z, counted = trace.logits, trace.allowed
    z = np.where(counted, z, -np.inf)  # a disallowed logit never reaches exp (it may be large: no overflow)
    m = z.max(axis=-1)
    shift = np.where(np.isfinite(m), m, 0.0)
    l = np.exp(z - shift[..., None]).sum(axis=-1)  # noqa: E741  exp(-inf) = 0
    return m, l, trace.heads


def combine(stats: list) -> tuple:
    """BLOCK-3: [(m_J, l_J, o_J)] -> (m, l, o): m = max_J m_J, c_J = l_J exp(m_J - m), l = sum_J c_J,
    o = sum_J (c_J / l) o_J; a row whose every block is empty gets m = -inf, l = 0 and o = 0 exactly (MASK-5),
    never NaN."""
    m, total, weights = block_weights(stats)
    o = sum(w[..., None] * s[2] for w, s in zip(weights, stats))
    return m, total, o


def block_weights(stats: list) -> tuple:
    """BLOCK-3: (m, l, [c_J / l]): the combined maximum and denominator and each block's share of every row
    (0 for all when every block is empty, MASK-5): the normalisation of SOFTMAX-1 across the blocks (BLOCK-4)."""
    m_all = np.stack([s[0] for s in stats])  # (n, B, H, Lq)
    m = m_all.max(axis=0)
    shift = np.where(np.isfinite(m), m, 0.0)
    c = np.stack([s[1] for s in stats]) * np.exp(m_all - shift)  # exp(-inf) = 0 for an empty block
    total = c.sum(axis=0)
    empty = total == 0
    return m, total, list(np.where(empty, 0.0, c / np.where(empty, 1.0, total)))


def attention_blockwise(
    spec: AttentionSpec,
    params: dict,
    query,
    key=None,
    value=None,
    *,
    key_blocks,
    mask=None,
    bias=None,
    q_positions=None,
    k_positions=None,
    dropout_keep=None,
) -> np.ndarray:
    """Multi-head attention evaluated block by block over a split of the keys (BLOCK-1..BLOCK-4), in float64.

    Same arguments and result as ``numpy_ref.attention`` (no weights), plus ``key_blocks``: block sizes
    summing to Lk, or index arrays holding every key exactly once (``key_split``). Equals
    ``numpy_ref.attention`` for every split up to rounding (BLOCK-4).
    """
    call = prepare(
        spec,
        params,
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        q_positions=q_positions,
        k_positions=k_positions,
        dropout_keep=dropout_keep,
    )
    blocks = [J for J in key_split(key_blocks, call.dims.Lk) if len(J)]
    _, _, o = combine([block_statistics(spec, block_call(call, J)) for J in blocks])
    return project(merge_heads(o), call.params["wo"], call.params.get("bo"))  # OUT-1


def attention_blockwise_vjp(
    spec: AttentionSpec,
    params: dict,
    query,
    key,
    value,
    grad_out,
    *,
    key_blocks,
    mask=None,
    bias=None,
    q_positions=None,
    k_positions=None,
    dropout_keep=None,
) -> dict:
    """The gradients of ``attention_blockwise`` block by block (BLOCK-6), in float64.

    Same arguments and result as ``numpy_ref.attention_vjp``, plus ``key_blocks`` (as in
    ``attention_blockwise``). Each block's gradients come from its own call's backward pass, given the
    combined statistics only: its share a_J = c_J / l of each row (BLOCK-3) and the row sums
    sum_j w_ij dL/dw_ij over every key, here summed over the pairs block by block (the unsplit reference's
    rounding; ``d_o . o`` is the same in exact arithmetic). Equals ``attention_vjp`` for every split up to
    rounding.
    """
    call, g = prepare_vjp(
        "attention_blockwise_vjp",
        spec,
        params,
        query,
        key,
        value,
        grad_out,
        mask=mask,
        bias=bias,
        q_positions=q_positions,
        k_positions=k_positions,
        dropout_keep=dropout_keep,
    )
    grads = blockwise_backward(spec, call, g, key_split(key_blocks, call.dims.Lk))
    return in_order(spec, grads, bias is not None)


def blockwise_backward(spec: AttentionSpec, call: Call, grad_out: np.ndarray, blocks: list, block_backward=None):
    """BLOCK-6 over the blocks (index arrays) of a prepared call: every gradient by name (GRAD-1).

    ``block_backward(spec, trace, d_o, rows)`` differentiates one block's call (default ``backward_heads``)."""
    block_backward = backward_heads if block_backward is None else block_backward
    Lk = call.dims.Lk
    blocks = [J for J in blocks if len(J)]
    traces = [run(spec, block_call(call, J)) for J in blocks]
    stats = [block_statistics(spec, t.call, t) for t in traces]
    _, _, shares = block_weights(stats)
    o = sum(a[..., None] * s[2] for a, s in zip(shares, stats))  # BLOCK-3
    d_merged, d_wo, d_bo = _project_vjp(merge_heads(o), call.params["wo"], grad_out)  # OUT-1
    d_o = split_heads(d_merged, spec.num_heads)
    # BLOCK-6: sum_j w_ij dL/dw_ij over the whole row, summed over the pairs (d_o . o rounds otherwise)
    rows = sum(weight_row_sums(spec, t, a[..., None] * d_o) for t, a in zip(traces, shares))
    grads = {"query": np.zeros(call.query.shape), "key": np.zeros(call.key.shape), "value": np.zeros(call.value.shape)}
    if call.bias is not None:
        grads["bias"] = np.zeros(call.bias.shape)
    for J, trace, a in zip(blocks, traces, shares):
        part = block_backward(spec, trace, a[..., None] * d_o, a * rows)
        for name, gj in part.items():
            if name in ("key", "value"):
                grads[name][:, J] += gj
            elif name == "bias" and call.bias.ndim and call.bias.shape[-1] == Lk:
                grads[name][..., J] += gj
            else:
                grads[name] = grads[name] + gj if name in grads else gj
    grads["wo"] = d_wo
    if spec.bias:
        grads["bo"] = d_bo
    return grads
