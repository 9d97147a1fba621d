"""ALiBi in PyTorch: a bias of slope times distance, no tables (ALIBI-1..ALIBI-5).

    bias[b, h, i, j] = -m_h * |delta_ij|   (symmetric, ALIBI-3)
                     =  m_h *  delta_ij    (linear, ALIBI-4)

m_h the slope of query head h (``scheme.slopes_for(H)``, float64 Python
numbers, ALIBI-2), delta = k_pos - q_pos the exact integer distance (POS-2).
Both are converted to the stat dtype, float32 for float16 and bfloat16
inputs (PREC-4), before the product: a bias computed in a 16-bit dtype
would be off by more than 1 at distances in the thousands.

One hook, the bias (REL-3 (3)), eager and per tile (the protocol is in
``torch_impl.schemes``). Axis legend (AXES-1): B, H, Lq, Lk; a tile has T
queries and k1 keys.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._bias_tables import call_distances, call_positions, distances, pair_positions, tile_positions


def slopes(scheme, num_heads: int, dtype: torch.dtype, device) -> torch.Tensor:
    """ALIBI-2: the (H,) slopes of the query heads in ``dtype``, each rounded once from float64."""
    return torch.tensor(scheme.slopes_for(num_heads), dtype=dtype, device=device)


def distance_form(scheme, delta: torch.Tensor) -> torch.Tensor:
    """ALIBI-3 / ALIBI-4: -|delta| (symmetric) or delta (linear), exact in int64, of delta's shape."""
    return -delta.abs() if scheme.symmetric else delta


def alibi_bias(scheme, head_slopes: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """ALIBI-3 / ALIBI-4: (H',) slopes, delta (1|B, Lq, Lk) int64 -> (1|B, H', Lq, Lk) in the slopes' dtype."""
    return head_slopes.view(-1, 1, 1) * distance_form(scheme, delta).to(head_slopes.dtype).unsqueeze(1)


# ---------------------------------------------------------------- eager hook
def bias(scheme, params: dict, call, *, num_heads: int, stat: torch.dtype) -> torch.Tensor:
    """ALIBI-1: (1|B, H, Lq, Lk) in the stat dtype from ``call.delta``; ``params`` holds no table of ALiBi's."""
    return alibi_bias(scheme, slopes(scheme, num_heads, stat, call.device), call.delta)


def distance_bias(scheme, params: dict, call, *, num_heads: int, stat: torch.dtype) -> torch.Tensor:
    """ALIBI-3 / ALIBI-4 at default positions: (1, H, Lq + Lk - 1), the bias of every distance once."""
    head_slopes = slopes(scheme, num_heads, stat, call.device)
    return alibi_bias(scheme, head_slopes, call_distances(call)).squeeze(-2)


# ---------------------------------------------------------------- tile hooks
class TileState(NamedTuple):
    """What every tile of one call reads, built once (``tile_state``)."""

    scheme: object
    slopes: torch.Tensor  # (H,) in the stat dtype
    q_pos: torch.Tensor  # (1|B, Lq) int64
    k_pos: torch.Tensor  # (1|B, Lk) int64


def tile_state(scheme, params: dict, q: torch.Tensor, call, *, causal: bool, rows: int, stat: torch.dtype) -> TileState:
    """The slopes of the H = q.shape[1] query heads in ``stat`` and the call's positions; ``causal`` and
    ``rows`` are not needed (every key's bias is computed)."""
    return TileState(scheme, slopes(scheme, q.shape[1], stat, q.device), *call_positions(call))


def tile_bias(state: TileState, tile) -> torch.Tensor:
    """ALIBI-3 / ALIBI-4 for one tile: (1|b, h, T, k1) in the stat dtype."""
    delta = distances(*tile_positions(state.q_pos, state.k_pos, tile))  # (1|b, T, k1)
    return alibi_bias(state.scheme, state.slopes[tile.h], delta)


# ---------------------------------------------------------------- score hooks (FlexAttention)
def score_state(scheme, params: dict, q: torch.Tensor, call, *, stat: torch.dtype) -> TileState:
    """The tiles' state: the slopes in ``stat`` and the call's positions."""
    return tile_state(scheme, params, q, call, causal=False, rows=0, stat=stat)


def score_term(state: TileState, b, h, i, j) -> torch.Tensor:
    """ALIBI-3 / ALIBI-4 of one pair (0-d tensors b, h, i, j): 0-d in the stat dtype."""
    q_pos, k_pos = pair_positions(state.q_pos, state.k_pos, b, i, j)
    return state.slopes[h] * distance_form(state.scheme, k_pos - q_pos).to(state.slopes.dtype)
