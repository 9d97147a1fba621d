"""What the bias schemes share: positions per call, per tile and per pair, and a bias read from a table by row.

A bias scheme (ALiBi, T5, Swin; REL-3 (3)) adds to the logits a per-head
scalar that depends on the positions only. Its eager hook reads the
positions of the whole call; its tile hook those of one tile (the tile's
batches, queries q0 .. q1 - 1 and keys 0 .. k1 - 1), so the tiles never
build a (B, H, Lq, Lk) bias. A table scheme (T5, Swin) reads ``rel_b``
(H, R) at an integer row per (query, key) pair.

Axis legend (AXES-1): B, H, Lq, Lk; R the rows of a table; a tile has T
queries and k1 keys.
"""

from __future__ import annotations

import torch

from .. import _core


def call_positions(call) -> tuple:
    """POS-1: the call's positions (1|B, Lq) and (1|B, Lk), int64, the defaults filled in."""
    return (
        _core.positions(call.q_positions, call.Lq, call.device),
        _core.positions(call.k_positions, call.Lk, call.device),
    )


def tile_positions(q_pos: torch.Tensor, k_pos: torch.Tensor, tile) -> tuple:
    """The positions of one tile: (1|b, T) of queries q0 .. q1 - 1 and (1|b, k1) of keys 0 .. k1 - 1;
    per-batch positions keep the tile's batches, shared ones (one row) stay shared."""

    def batches(p: torch.Tensor) -> torch.Tensor:
        return p[tile.b] if p.shape[0] > 1 else p

    return batches(q_pos)[:, tile.q0 : tile.q1], batches(k_pos)[:, : tile.k1]


def pair_positions(q_pos: torch.Tensor, k_pos: torch.Tensor, b, i, j) -> tuple:
    """The positions of one (query, key) pair inside a FlexAttention ``score_mod``: 0-d int64 q_pos[b, i]
    and k_pos[b, j] from (1|B, Lq), (1|B, Lk) (shared positions read row 0). Every scheme's score hook
    (key terms too) reads its pair's positions here."""
    return q_pos[b if q_pos.shape[0] > 1 else 0, i], k_pos[b if k_pos.shape[0] > 1 else 0, j]


def distances(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """POS-2: delta[b, i, j] = k_pos[b, j] - q_pos[b, i]: (1|B, Lq), (1|B, Lk) -> (1|B, Lq, Lk) int64, the
    distance that ALiBi's bias (ALIBI-1) and T5's buckets (T5-1) read in a tile."""
    return k_pos.unsqueeze(1) - q_pos.unsqueeze(2)


def call_distances(call) -> torch.Tensor:
    """POS-3: the distances -(Lq - 1) .. Lk - 1 of a call at default positions, (1, 1, Lq + Lk - 1) int64:
    every value delta_ij = j - i takes, once, in a shape the hooks read like delta (1, Lq, Lk)."""
    return torch.arange(1 - call.Lq, call.Lk, device=call.device).view(1, 1, -1)


def table_bias(rel_b: torch.Tensor, rows: torch.Tensor, stat: torch.dtype) -> torch.Tensor:
    """T5-1, SWIN-1: bias[b, h, i, j] = rel_b[h, rows[b, i, j]] in the stat dtype (PREC-4).

    rel_b (H, R) in the compute dtype, rows (1|B, Lq, Lk) int64 -> (1|B, H, Lq, Lk).
    The table is widened first (exact), then read: the values are the
    table's, and autograd's backward of the index, a scatter-add of the
    gradient of every pair into the row it read (T5-5), sums in the stat
    dtype; the (H, R) sum is rounded to the table's dtype once. (Read in
    bfloat16 first, the backward would add up to Lq * Lk gradients per row
    in bfloat16, off by tens of percent at L = 512.)
    """
    return rel_b.to(stat)[:, rows].movedim(0, 1)  # (H, 1|B, Lq, Lk) -> (1|B, H, Lq, Lk)
