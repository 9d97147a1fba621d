"""Swin's 2-D relative position bias in PyTorch (SWIN-1..SWIN-6, POS-5).

    bias[b, h, i, j] = rel_b[h, row(q_pos_i, k_pos_j)]

With P = ``prefix_tokens`` and the window (Wh, Ww): a position p < P (when
P > 0) is a prefix token; any other p is the window token at
(row, column) = floor-divmod(p - P, Ww) (POS-5), so negative positions and
positions past the window have coordinates too. Two window tokens read row
(dh + Wh - 1)(2Ww - 1) + (dw + Ww - 1), (dh, dw) the key's coordinates minus
the query's, each clipped to the window (SWIN-3); a pair with a prefix
token reads ``offset_rows`` (query prefix), + 1 (key prefix) or + 2 (both)
(SWIN-4). The row needs both positions, not only their difference.

One hook, the bias (REL-3 (3)), eager and per tile (the protocol is in
``torch_impl.schemes``); ``rel_b`` (H, R) gets its gradient from autograd's
scatter-add. Axis legend (AXES-1): B, H, Lq, Lk; R = ``num_rows``; a tile
has T queries and k1 keys.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _workspace
from ._bias_tables import call_positions, pair_positions, table_bias, tile_positions


def coordinates(scheme, positions: torch.Tensor) -> tuple:
    """POS-5, SWIN-2: (row, column) of window tokens at ``positions`` by floor division, (p - P) // Ww and
    (p - P) % Ww, int64 of their shape (prefix tokens get numbers too; ``pair_rows`` replaces their rows)."""
    p = positions - scheme.prefix_tokens
    Ww = scheme.window[1]
    return torch.div(p, Ww, rounding_mode="floor"), torch.remainder(p, Ww)  # remainder: the sign of Ww


def pair_rows(scheme, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """SWIN-3, SWIN-4: the table row of every pair, (1|B, Lq, Lk) int64 from (1|B, Lq), (1|B, Lk) positions."""
    return rows_of(scheme, q_pos.unsqueeze(2), k_pos.unsqueeze(1))


def rows_of(scheme, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """SWIN-3, SWIN-4: the table row of query and key positions that broadcast against each other, int64
    of their broadcast shape; pointwise operations only (a FlexAttention ``score_mod`` reads one pair)."""
    (Wh, Ww), P = scheme.window, scheme.prefix_tokens
    qh, qw = coordinates(scheme, q_pos)
    kh, kw = coordinates(scheme, k_pos)
    dh = (kh - qh).clamp(1 - Wh, Wh - 1)
    dw = (kw - qw).clamp(1 - Ww, Ww - 1)
    row = (dh + (Wh - 1)) * (2 * Ww - 1) + (dw + (Ww - 1))
    if not P:
        return row
    q_prefix, k_prefix = q_pos < P, k_pos < P
    base = scheme.offset_rows
    prefix_row = base + 2 * (q_prefix & k_prefix) + (~q_prefix & k_prefix)  # +0 query, +1 key, +2 both
    return torch.where(q_prefix | k_prefix, prefix_row, row)


# ---------------------------------------------------------------- fused hook (the triton kernel)
def fused_pair_table(scheme, params: dict) -> tuple:
    """(rel_b (H, R), window, prefix_tokens): the triton kernel computes each pair's row itself (SWIN-3,
    SWIN-4) from consecutive positions and reads rel_b there; its gradient is added atomically at the rows."""
    return params["rel_b"], tuple(scheme.window), scheme.prefix_tokens


# ---------------------------------------------------------------- eager hook
def bias(scheme, params: dict, call, *, num_heads: int, stat: torch.dtype) -> torch.Tensor:
    """SWIN-1: (1|B, H, Lq, Lk) = rel_b[h, row(q_pos_i, k_pos_j)] in the stat dtype."""
    if _one_window(scheme, call):
        return _reversed_pairs(params["rel_b"], *scheme.window, stat).flip(1, 2).reshape(1, num_heads, call.Lq, call.Lk)
    return table_bias(params["rel_b"], pair_rows(scheme, *call_positions(call)), stat)


def reversed_bias(scheme, params: dict, call, *, num_heads: int, stat: torch.dtype, workspace=None):
    """SWIN-1 for the call Swin makes per window, rows in reverse query order: (1, H, L, L) whose row t is
    query L - 1 - t's bias, written into a buffer of ``workspace`` when given (reused memory: no page
    faults); None for any other call.

    Reversing the queries turns the window's bias into a plain strided view of the table (no flip), so
    the one (H, L, L) write is a straight copy (the sdpa kernel runs SDPA on the reversed queries).
    """
    if not _one_window(scheme, call):
        return None
    view = _reversed_pairs(params["rel_b"], *scheme.window, stat)
    shape = (1, num_heads, call.Lq, call.Lk)
    out = _workspace.take(workspace, "reversed-bias", view.shape, stat)
    return view.reshape(shape) if out is None else out.copy_(view).view(shape)


def _one_window(scheme, call) -> bool:
    """One whole window: its Wh * Ww tokens at default positions, no prefix (every pair inside, no clip)."""
    Wh, Ww = scheme.window
    return call.default_positions and not scheme.prefix_tokens and call.Lq == call.Lk == Wh * Ww


def _reversed_pairs(rel_b: torch.Tensor, Wh: int, Ww: int, stat: torch.dtype) -> torch.Tensor:
    """SWIN-3 inside one window as a view, (H, Wh, Ww, Wh, Ww) indexed (Wh - 1 - qh, Ww - 1 - qw, kh, kw).

    The (H, 2Wh - 1, 2Ww - 1) table is read at [kh - qh + Wh - 1, kw - qw + Ww - 1]; two unfolds give
    [a, c, b, e] = table[a + b, c + e], which is that with a = Wh - 1 - qh, c = Ww - 1 - qw: the queries
    in reverse (row-major) order, with no (L, L) row index.
    """
    H = rel_b.shape[0]
    table = rel_b.to(stat).reshape(H, 2 * Wh - 1, 2 * Ww - 1)
    return table.unfold(1, Wh, 1).unfold(2, Ww, 1)


# ---------------------------------------------------------------- tile hooks
class TileState(NamedTuple):
    """What every tile of one call reads, built once (``tile_state``)."""

    scheme: object
    rel_b: torch.Tensor  # (H, R), widened to the stat dtype once: the tiles' gradients sum there
    q_pos: torch.Tensor  # (1|B, Lq) int64
    k_pos: torch.Tensor  # (1|B, Lk) int64
    stat: torch.dtype  # PREC-4


def tile_state(scheme, params: dict, q: torch.Tensor, call, *, causal: bool, rows: int, stat: torch.dtype) -> TileState:
    """The table in ``stat`` (PREC-4) and the call's positions; ``q``, ``causal`` and ``rows`` are not needed."""
    return TileState(scheme, params["rel_b"].to(stat), *call_positions(call), stat)


def tile_bias(state: TileState, tile) -> torch.Tensor:
    """SWIN-1 for one tile: (1|b, h, T, k1) in the stat dtype."""
    return table_bias(
        state.rel_b[tile.h], pair_rows(state.scheme, *tile_positions(state.q_pos, state.k_pos, tile)), state.stat
    )


# ---------------------------------------------------------------- score hooks (FlexAttention)
def score_state(scheme, params: dict, q: torch.Tensor, call, *, stat: torch.dtype) -> TileState:
    """The tiles' state: the table in ``stat`` and the call's positions."""
    return tile_state(scheme, params, q, call, causal=False, rows=0, stat=stat)


def score_term(state: TileState, b, h, i, j) -> torch.Tensor:
    """SWIN-1 of one pair (0-d tensors b, h, i, j): rel_b[h, row(q_pos_i, k_pos_j)], 0-d in the stat dtype."""
    q_pos, k_pos = pair_positions(state.q_pos, state.k_pos, b, i, j)
    return state.rel_b[h, rows_of(state.scheme, q_pos, k_pos)]
