"""T5's bucketed relative position bias in PyTorch (T5-1..T5-5).

    bias[b, h, i, j] = rel_b[h, bucket(delta_ij)]

With S = ``scheme.side_buckets`` and e = ``scheme.max_exact`` (T5-2): a
bidirectional scheme starts a key after its query (delta > 0) at bucket S
and takes n = |delta|; a causal one takes n = max(-delta, 0), so every key
after the query is bucket 0. A distance n < e is its own bucket; beyond,
the bucket is e plus the number of ``scheme.thresholds()`` that are <= n
(T5-3), found by ``torch.bucketize``: integers only, no logarithm, so the
buckets are exact at every distance.

One hook, the bias (REL-3 (3)), eager and per tile (the protocol is in
``torch_impl.schemes``); ``rel_b`` (H, N) gets its gradient from autograd's
scatter-add (T5-5). Axis legend (AXES-1): B, H, Lq, Lk; N = num_buckets; a
tile has T queries and k1 keys.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._bias_tables import call_distances, call_positions, distances, pair_positions, table_bias, tile_positions


def thresholds(scheme, device) -> torch.Tensor:
    """T5-3: the increasing int64 thresholds t_1 .. of ``scheme.thresholds()`` (possibly none)."""
    return torch.tensor(scheme.thresholds(), dtype=torch.int64, device=device)


def buckets(scheme, delta: torch.Tensor, limits) -> torch.Tensor:
    """T5-2, T5-3: the bucket of every distance, int64 of delta's shape; ``limits`` = ``thresholds(scheme)``
    (``torch.bucketize``), or ``scheme.thresholds()`` as a tuple of ints for one comparison per threshold:
    pointwise operations only, as in a FlexAttention ``score_mod``, which compiles to one fused loop with no
    buffer of its own."""
    S, e = scheme.side_buckets, scheme.max_exact
    if scheme.bidirectional:
        base, n = (delta > 0) * S, delta.abs()  # keys after the query: the upper half
    else:
        base, n = 0, (-delta).clamp_min(0)  # keys after the query: bucket 0
    if isinstance(limits, tuple):
        far = e + sum((n >= t).long() for t in limits)  # e + #{t <= n}
    else:
        far = torch.bucketize(n, limits, right=True).add_(e)
    return torch.where(n < e, n, far) + base


# ---------------------------------------------------------------- eager hook
def bias(scheme, params: dict, call, *, num_heads: int, stat: torch.dtype) -> torch.Tensor:
    """T5-1: (1|B, H, Lq, Lk) = rel_b[h, bucket(delta)] in the stat dtype, from ``call.delta``."""
    return table_bias(params["rel_b"], buckets(scheme, call.delta, thresholds(scheme, call.device)), stat)


def distance_bias(scheme, params: dict, call, *, num_heads: int, stat: torch.dtype) -> torch.Tensor:
    """T5-1 at default positions: (1, H, Lq + Lk - 1), the table read once per distance."""
    rows = buckets(scheme, call_distances(call), thresholds(scheme, call.device))  # (1, 1, Lq + Lk - 1)
    return table_bias(params["rel_b"], rows, stat).squeeze(-2)


# ---------------------------------------------------------------- tile hooks
class TileState(NamedTuple):
    """What every tile of one call reads, built once (``tile_state``)."""

    scheme: object
    rel_b: torch.Tensor  # (H, N), widened to the stat dtype once: the tiles' gradients sum there
    limits: object  # T5-3 thresholds: int64 (tiles), a tuple of ints (score hooks)
    q_pos: torch.Tensor  # (1|B, Lq) int64
    k_pos: torch.Tensor  # (1|B, Lk) int64
    stat: torch.dtype  # PREC-4


def tile_state(scheme, params: dict, q: torch.Tensor, call, *, causal: bool, rows: int, stat: torch.dtype) -> TileState:
    """The table in ``stat`` (PREC-4), the thresholds and the call's positions; ``causal`` and ``rows`` are not
    needed."""
    return TileState(scheme, params["rel_b"].to(stat), thresholds(scheme, q.device), *call_positions(call), stat)


def tile_bias(state: TileState, tile) -> torch.Tensor:
    """T5-1 for one tile: (1|b, h, T, k1) in the stat dtype."""
    delta = distances(*tile_positions(state.q_pos, state.k_pos, tile))  # (1|b, T, k1)
    return table_bias(state.rel_b[tile.h], buckets(state.scheme, delta, state.limits), state.stat)


# ---------------------------------------------------------------- score hooks (FlexAttention)
def score_state(scheme, params: dict, q: torch.Tensor, call, *, stat: torch.dtype) -> TileState:
    """The tiles' state with the thresholds as Python ints (compared one by one inside the score_mod)."""
    state = tile_state(scheme, params, q, call, causal=False, rows=0, stat=stat)
    return state._replace(limits=tuple(scheme.thresholds()))


def score_term(state: TileState, b, h, i, j) -> torch.Tensor:
    """T5-1 of one pair (0-d tensors b, h, i, j): rel_b[h, bucket(delta)], 0-d in the stat dtype."""
    q_pos, k_pos = pair_positions(state.q_pos, state.k_pos, b, i, j)
    return state.rel_b[h, buckets(state.scheme, k_pos - q_pos, state.limits)]
