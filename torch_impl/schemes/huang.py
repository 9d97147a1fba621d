"""Huang et al. 2018 (Music Transformer) in PyTorch: an unclipped key term and value term (HUANG-1..HUANG-6).

Row ``delta + M - 1`` of ``rel_k`` (R = 2M - 1 rows) holds distance delta;
a distance beyond the table adds nothing (HUANG-3). Two O(L d)-memory
algorithms, nothing of shape (Lq, Lk, d) (HUANG-4):

- the gather, for any positions: ``(q @ rel_k.T)[..., delta + M - 1]``,
  zero where |delta| > M - 1 (the eager hook, and the tiles with explicit
  positions);
- the skew, for default positions: one matmul with the table rows of the
  distances a tile can meet (``distance_rows``, through
  ``spec.index.distance_row_span``), then a reshape or strided view
  (``huang_skew_term``; the tiles with default positions).

The value term (HUANG-6) sums the weights per table row, the pairs beyond
the table left out, then ``@ rel_v``.

Axis legend (AXES-1): B, H, Lq, Lk, d; a tile holds the queries q0 .. q1 - 1
(T of them) and the keys 0 .. k1 - 1.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from spec.index import distance_row_span

from .._workspace import take
from ._bias_tables import pair_positions
from ._tables import ScoreState, bucket_sums_valid, gather_rows, head_rows, key_score_state, rows_logits, rows_sum

#: Zero columns pad the (T, W) product of the non-causal skew to a multiple of
#: this width: they are never read, and the matmul is faster (benchmarks/).
SKEW_WIDTH_MULTIPLE = 16


def huang_index(delta: torch.Tensor, max_len: int):
    """HUANG-2/3: (row, valid), row = delta + M - 1 where |delta| <= M - 1 (else 0, and valid False)."""
    valid = delta.abs() <= max_len - 1
    return torch.where(valid, delta + max_len - 1, torch.zeros_like(delta)), valid


# ---------------------------------------------------------------- eager hook
def key_term(scheme, params: dict, q: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """HUANG-2..4 by the gather: term[b, h, i, j] = q_i . rel_k[delta_ij + M - 1], 0 where |delta| > M - 1.

    q (B, H, Lq, d), delta (1|B, Lq, Lk) -> (B, H, Lq, Lk), before s_rel (SCALE-3).
    """
    row, valid = huang_index(delta, scheme.max_len)
    term = gather_rows(rows_logits(q, params["rel_k"]), row)
    return term.masked_fill(~valid.unsqueeze(1), 0.0)


def value_term(scheme, params: dict, w: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """HUANG-6: o_add[b, h, i] = sum_j w'_ij rel_v[delta_ij + M - 1] over |delta| <= M - 1, from the
    weights after dropout (DROP-4): w' (B, H, Lq, Lk) -> (B, H, Lq, dv) in the table's dtype."""
    row, valid = huang_index(delta, scheme.max_len)
    return rows_sum(bucket_sums_valid(w, row, valid, scheme.num_rows), params["rel_v"])


# ---------------------------------------------------------------- fused hooks (the triton kernel)
def fused_rows(scheme) -> int:
    """The rows of the tables ``fused_tables`` gives: 2M + 1 (its 2M - 1, HUANG-1, and a zero row at each end)."""
    return 2 * scheme.max_len + 1


def fused_tables(scheme, params: dict) -> tuple:
    """(rel_k, rel_v or None, M): the tables with a zero row before and after, (2M + 1, c) or (H, 2M + 1, c),
    read by the triton kernel's clipped index ``clip(j - i, -M, M) + M`` (SHAW-2's): distance delta with
    |delta| <= M - 1 reads its own row delta + M - 1 + 1, every distance beyond the table a zero row (HUANG-3),
    in the key and the value term alike. The padding rows' gradients are dropped by ``F.pad``'s backward."""
    pad = lambda t: F.pad(t, (0, 0, 1, 1))  # noqa: E731
    return pad(params["rel_k"]), pad(params["rel_v"]) if scheme.values else None, scheme.max_len


# ---------------------------------------------------------------- tile hooks
class TileState(NamedTuple):
    """What every tile of one call reads, built once (``tile_state``)."""

    max_len: int
    causal: bool  # the caller masks the keys after the diagonal (CAUSAL-1)
    q: torch.Tensor  # (B, H, Lq, d), the queries as the key term sees them
    table: torch.Tensor  # rel_k, (R, d) or (H, R, d)
    rel_v: Optional[torch.Tensor]  # HUANG-6, with values
    row: Optional[torch.Tensor]  # HUANG-2 (1|B, Lq, Lk), explicit positions only
    valid: Optional[torch.Tensor]  # HUANG-3 (1|B, Lq, Lk), explicit positions only


def tile_state(scheme, params: dict, q: torch.Tensor, call, *, causal: bool, rows: int, stat: torch.dtype) -> TileState:
    """The per-call state of the tile hooks.

    q (B, H, Lq, d): the queries as the key term sees them (times s_rel,
    SCALE-3); ``call``: the positions; ``causal``: whether the caller masks
    every key after the diagonal (CAUSAL-1), so that the skew may skip the
    positive distances. ``rows`` is not needed; ``stat``: the dtype of the weights (PREC-4), and of the value
    table, whose gradient every tile adds to (summed in float32 for 16-bit inputs, rounded once).
    """
    row = valid = None
    if not call.default_positions:
        row, valid = huang_index(call.delta, scheme.max_len)
    rel_v = params["rel_v"].to(stat) if scheme.values else None
    return TileState(scheme.max_len, causal, q, params["rel_k"], rel_v, row, valid)


def tile_key_term(state: TileState, tile, ws=None) -> torch.Tensor:
    """HUANG-2..4 for one tile: (b, h, T, k1); with ``causal`` the keys after the diagonal are
    unspecified finite numbers (see ``huang_skew_term``). ``ws``: a Workspace or None."""
    q, table = state.q[tile.part], head_rows(state.table, tile.h)
    if state.row is None:
        return huang_skew_term(q, table, tile.q0, tile.k1, state.max_len, causal=state.causal, ws=ws)
    term = gather_rows(rows_logits(q, table), tile.cut(state.row, lead=1))
    return term.masked_fill(~tile.cut(state.valid, lead=1).unsqueeze(1), 0.0)


def tile_value_term(state: TileState, w: torch.Tensor, tile) -> torch.Tensor:
    """HUANG-6 for one tile from its weights after dropout (DROP-4): (b, h, T, k1) -> (b, h, T, dv). With
    default positions the tile's rows are those of j - i for its own queries and keys, (T, k1)."""
    if state.row is not None:
        row, valid = tile.cut(state.row, lead=1), tile.cut(state.valid, lead=1)
    else:
        i = torch.arange(tile.q0, tile.q1, device=w.device).unsqueeze(1)
        row, valid = huang_index((torch.arange(tile.k1, device=w.device) - i).unsqueeze(0), state.max_len)
    buckets = bucket_sums_valid(w, row, valid, 2 * state.max_len - 1)
    return rows_sum(buckets, head_rows(state.rel_v, tile.h))


# ---------------------------------------------------------------- score hooks (FlexAttention)
def score_state(scheme, params: dict, q: torch.Tensor, call, *, stat: torch.dtype) -> ScoreState:
    """q (B, H, Lq, d) as the key term sees it (times s_rel, SCALE-3): its table logits and the positions."""
    return key_score_state(scheme.max_len, params["rel_k"], q, call, stat)


def score_term(state: ScoreState, b, h, i, j) -> torch.Tensor:
    """HUANG-2..4 of one pair (0-d tensors b, h, i, j): q_i . rel_k[delta + M - 1], 0 beyond the table,
    s_rel included, 0-d in the stat dtype."""
    q_pos, k_pos = pair_positions(state.q_pos, state.k_pos, b, i, j)
    row, valid = huang_index(k_pos - q_pos, state.extent)
    return torch.where(valid, state.rows[b, h, i, row], 0.0)


# ---------------------------------------------------------------- the skew (default positions)
def distance_rows(table: torch.Tensor, first: int, count: int, max_len: int) -> torch.Tensor:
    """HUANG-2/3: the table rows of distances first .. first + count - 1, zero rows beyond the table.

    (R, d) -> (count, d) or (H, R, d) -> (H, count, d). Built by slicing and
    zero padding (``spec.index.distance_row_span``): no index tensor, no loop.
    """
    span = distance_row_span(first, count, max_len)
    if span is None:  # no distance of the range is in the table
        return table.new_zeros(table.shape[:-2] + (count, table.shape[-1]))
    rows = table[..., span.first_row : span.last_row + 1, :]
    if span.pad_before or span.pad_after:
        return F.pad(rows, (0, 0, span.pad_before, span.pad_after))
    return rows


def huang_skew_term(
    q: torch.Tensor, table: torch.Tensor, q_start: int, Lk: int, max_len: int, causal: bool, ws=None
) -> torch.Tensor:
    """HUANG-4 with default positions: the (B, H, T, Lk) term of queries q_start .. q_start + T - 1, keys 0 .. Lk - 1.

    One matmul of the queries with the table rows of every distance they
    can meet, then the skew. Column m of that product holds distance
    m - (q_start + T - 1).

    ``causal``: only the distances <= 0 are multiplied, and the values at
    keys after the diagonal (j > i) are **unspecified finite numbers**: the
    caller masks them (CAUSAL-1). (jax_impl's function of the same name has
    the same contract.) Without ``causal`` every entry is the term.
    ``ws``: a Workspace for the (T, width) product, or None (then no view
    overlaps itself, so autograd may record it).
    """
    T = q.shape[-2]
    first = -(q_start + T - 1)  # the distance of column 0
    width = T + Lk - 1
    if not causal:
        width += -width % SKEW_WIDTH_MULTIPLE
        out = take(ws, "rows", q.shape[:-1] + (width,), q.dtype)
        return skew(rows_logits(q, distance_rows(table, first, width, max_len), out), Lk)
    n = min(width, 1 - first)  # distances first .. 0
    r = rows_logits(q, distance_rows(table, first, n, max_len), take(ws, "rows", q.shape[:-1] + (n,), q.dtype))
    if ws is not None and Lk <= n and T > 1:
        # The skew read with row stride n - 1 straight from the (T, n) product: keys after the
        # diagonal read values of the next row, and no padded copy is written. (Only without a
        # recorded gradient: the view overlaps itself.)
        B, H = r.shape[:2]
        return r.as_strided((B, H, T, Lk), (H * T * n, T * n, n - 1, 1), r.storage_offset() + T - 1)
    return skew(F.pad(r, (0, width - n)), Lk)  # zeros after the diagonal


def skew(r: torch.Tensor, Lk: int) -> torch.Tensor:
    """HUANG-4: out[..., i, j] = r[..., i, j - i + T - 1], by reshape and slice.

    r is (B, H, T, W), W >= T + Lk - 1. Element (i, j - i + T - 1) sits at
    flat offset (T - 1) + i (W - 1) + j of each (T, W) block: drop the first
    T - 1 entries, view the rest as rows of W - 1, keep the first Lk columns.
    Views only until the caller adds it.
    """
    B, H, T, W = r.shape
    if T == 1:
        return r[..., :Lk]
    flat = r.reshape(B, H, T * W)[..., T - 1 : T - 1 + T * (W - 1)]
    return flat.reshape(B, H, T, W - 1)[..., :Lk]
