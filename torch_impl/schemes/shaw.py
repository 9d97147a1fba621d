"""Shaw et al. 2018 in PyTorch: a key term, a key-side term and a value term by clipped distance
(SHAW-1..SHAW-7).

Every term looks table rows up by ``idx = clip(delta, -k, k) + k`` (SHAW-2),
R = 2k + 1 rows. The key term is ``q @ rel_k.T`` (B, H, Lq, R) then a
gather (SHAW-3); the key-side term ``k @ table.T`` (B, H, Lk, R) then a
gather per key (SHAW-6); the value term sums the weights per row, then
``@ rel_v`` (SHAW-4). Nothing of shape (Lq, Lk, d) is built.

Two sets of hooks (the protocol is in ``torch_impl.schemes``):

- the eager hooks ``key_term`` / ``key_side_term`` / ``value_term``: the
  plain algorithms, gathers and a scatter by the (1|B, Lq, Lk) index;
- the tile hooks ``tile_state`` / ``tile_key_term`` / ``tile_value_term``:
  with default positions (delta = j - i) the index of a tile depends on
  j - i only, so the key term is two broadcast edge regions and a narrow
  gathered band, and the value sums are two triangles and a band
  (``key_term_banded``, ``bucket_sums_banded``): no (Lq, Lk) index is read.
  With explicit positions the tiles gather and scatter like the eager hooks.

Axis legend (AXES-1): B, H, Lq, Lk, d; a tile holds the queries q0 .. q1 - 1
(T of them) and the keys 0 .. k1 - 1.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .._workspace import take
from ._bias_tables import call_positions, pair_positions
from ._tables import (
    ScoreState,
    bucket_sums,
    gather_key_rows,
    gather_rows,
    head_rows,
    key_rows,
    key_score_state,
    rows_logits,
    rows_sum,
)


def shaw_index(delta: torch.Tensor, max_distance: int) -> torch.Tensor:
    """SHAW-2: clip(delta, -k, k) + k, in [0, 2k]; same shape as delta."""
    return delta.clamp(-max_distance, max_distance).add_(max_distance)  # clamp's result is new: add in place


# ---------------------------------------------------------------- eager hooks
def key_term(scheme, params: dict, q: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """SHAW-3: term[b, h, i, j] = q_i . rel_k[idx[b, i, j]], before s_rel (SCALE-3).

    q (B, H, Lq, d), delta (1|B, Lq, Lk) -> (B, H, Lq, Lk).
    """
    return gather_rows(rows_logits(q, params["rel_k"]), shaw_index(delta, scheme.max_distance))


def key_side_table(scheme) -> str:
    """SHAW-6: the table the key-side term reads: ``rel_k`` (``key_side="shared"``) or ``rel_q`` (``"own"``)."""
    return "rel_k" if scheme.key_side == "shared" else "rel_q"


def key_side_term(scheme, params: dict, k: torch.Tensor, delta: torch.Tensor, *, group: int) -> torch.Tensor:
    """SHAW-6: term[b, h, i, j] = k_j . table[idx[b, i, j]], before its factor (SHAW-7).

    k (B, Hkv, Lk, d) with ``group`` = G query heads per key head (HEAD-3), delta (1|B, Lq, Lk) ->
    (B, H, Lq, Lk).
    """
    rk_t = key_rows(k, params[key_side_table(scheme)], group).transpose(-1, -2)  # (B, H, R, Lk)
    return gather_key_rows(rk_t, shaw_index(delta, scheme.max_distance))


def value_term(scheme, params: dict, w: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """SHAW-4: o_add[b, h, i] = sum_j w'_ij rel_v[idx_ij], from the weights after dropout (DROP-4).

    w' (B, H, Lq, Lk), delta (1|B, Lq, Lk) -> (B, H, Lq, dv) in the table's dtype; rel_v (R, dv) | (H, R, dv)
    (HEAD-4).
    """
    buckets = bucket_sums(w, shaw_index(delta, scheme.max_distance), scheme.num_rows)
    return rows_sum(buckets, params["rel_v"])


# ---------------------------------------------------------------- tile hooks
class TileState(NamedTuple):
    """What every tile of one call reads, built once (``tile_state``)."""

    max_distance: int
    num_rows: int
    rows: Optional[torch.Tensor]  # SHAW-3: q @ rel_k.T (B, H, Lq, R), with keys
    rel_v: Optional[torch.Tensor]  # the value table, with values
    index: Optional[torch.Tensor]  # SHAW-2 (1|B, Lq, Lk), explicit positions only
    key_band: Optional[torch.Tensor]  # default positions: ``key_band_index`` of the longest tile
    value_band: Optional[torch.Tensor]  # default positions: ``value_band_index`` of every query (k > 0)
    triangles: Optional[tuple]  # default positions: ``edge_masks`` of the longest tile


def tile_state(scheme, params: dict, q: torch.Tensor, call, *, causal: bool, rows: int, stat: torch.dtype) -> TileState:
    """The per-call state of the tile hooks.

    q (B, H, Lq, d): the queries as the key term sees them (times s_rel,
    SCALE-3); ``call``: the positions (``call.default_positions``,
    ``call.delta``); ``rows``: the most queries of a tile; ``stat``: the
    dtype of the weights (PREC-4). ``causal`` is not needed: every key's
    term is computed.
    """
    k = scheme.max_distance
    default = call.default_positions
    return TileState(
        max_distance=k,
        num_rows=scheme.num_rows,
        rows=rows_logits(q, params["rel_k"]) if scheme.keys else None,
        # PREC-4: every tile adds its share of the table's gradient: kept in the stat dtype, they are summed in
        # float32 for 16-bit inputs and rounded once (in bfloat16, 32 tiles' shares summed in bfloat16 missed
        # grad/rel_v's budget by 1.2x)
        rel_v=params["rel_v"].to(stat) if scheme.values else None,
        index=None if default else shaw_index(call.delta, k),
        key_band=key_band_index(rows, k, q.device) if default and scheme.keys else None,
        value_band=value_band_index(call.Lq, k, q.device) if default and scheme.values and k > 0 else None,
        triangles=edge_masks(rows, stat, q.device) if default and scheme.values else None,
    )


def tile_key_term(state: TileState, tile, ws=None) -> torch.Tensor:
    """SHAW-3 for one tile: (b, h, T, k1), s_rel included (folded into q); ``ws``: a Workspace or None."""
    r = state.rows[tile.part]
    if state.index is not None:
        return gather_rows(r, tile.cut(state.index, lead=1))
    out = take(ws, "logits", r.shape[:-1] + (tile.k1,), r.dtype)
    return key_term_banded(r, tile.q0, tile.k1, state.max_distance, state.key_band, out)


class KeySideState(NamedTuple):
    """What every tile's key-side term reads, built once (``key_side_state``)."""

    max_distance: int
    rows_t: torch.Tensor  # (k @ table.T).T (B, H, R, Lk), its factor folded into k (SHAW-7)
    index: Optional[torch.Tensor]  # SHAW-2 (1|B, Lq, Lk), explicit positions only


def key_side_state(scheme, params: dict, k: torch.Tensor, call, *, group: int) -> KeySideState:
    """The per-call state of ``tile_key_side_term``: k (B, Hkv, Lk, d) times the term's factor (SHAW-7),
    ``group`` = G (HEAD-3); one (B, H, R, Lk) product for every tile."""
    rows_t = key_rows(k, params[key_side_table(scheme)], group).transpose(-1, -2)
    index = None if call.default_positions else shaw_index(call.delta, scheme.max_distance)
    return KeySideState(scheme.max_distance, rows_t, index)


def tile_key_side_term(state: KeySideState, tile) -> torch.Tensor:
    """SHAW-6 for one tile: (b, h, T, k1), its factor included. With default positions the tile's index
    is clip(j - i) of its own queries and keys, (T, k1), built here."""
    r = state.rows_t[tile.b, tile.h, :, : tile.k1]
    if state.index is not None:
        return gather_key_rows(r, tile.cut(state.index, lead=1))
    delta = torch.arange(tile.k1, device=r.device) - torch.arange(tile.q0, tile.q1, device=r.device).unsqueeze(1)
    return gather_key_rows(r, shaw_index(delta, state.max_distance).unsqueeze(0))


def tile_value_term(state: TileState, w: torch.Tensor, tile) -> torch.Tensor:
    """SHAW-4 for one tile from its weights after dropout (DROP-4): (b, h, T, k1) -> (b, h, T, dv) (HEAD-4)."""
    if state.index is not None:
        buckets = bucket_sums(w, tile.cut(state.index, lead=1), state.num_rows)
    else:
        band = None if state.value_band is None else state.value_band[tile.q0 : tile.q1]
        buckets = bucket_sums_banded(w, state.max_distance, tile.q0, state.triangles, band)
    return rows_sum(buckets, head_rows(state.rel_v, tile.h))


# ---------------------------------------------------------------- score hooks (FlexAttention)
def score_state(scheme, params: dict, q: torch.Tensor, call, *, stat: torch.dtype) -> ScoreState:
    """q (B, H, Lq, d) as the key term sees it (times s_rel, SCALE-3): its table logits and the positions."""
    return key_score_state(scheme.max_distance, params["rel_k"], q, call, stat)


def score_term(state: ScoreState, b, h, i, j) -> torch.Tensor:
    """SHAW-3 of one pair (0-d tensors b, h, i, j): q_i . rel_k[idx], s_rel included, 0-d in the stat dtype."""
    q_pos, k_pos = pair_positions(state.q_pos, state.k_pos, b, i, j)
    return state.rows[b, h, i, shaw_index(k_pos - q_pos, state.extent)]


def key_side_score_state(scheme, params: dict, k: torch.Tensor, call, *, group: int, stat: torch.dtype) -> ScoreState:
    """k (B, Hkv, Lk, d) times the key-side factor (SHAW-7), G = ``group`` (HEAD-3): its (B, H, Lk, R) table
    logits in the stat dtype (PREC-4) and the positions."""
    rows = key_rows(k, params[key_side_table(scheme)], group).to(stat)
    return ScoreState(scheme.max_distance, rows, *call_positions(call))


def key_side_score_term(state: ScoreState, b, h, i, j) -> torch.Tensor:
    """SHAW-6 of one pair (0-d tensors b, h, i, j): k_j . table[idx], its factor included, 0-d in the stat dtype."""
    q_pos, k_pos = pair_positions(state.q_pos, state.k_pos, b, i, j)
    return state.rows[b, h, j, shaw_index(k_pos - q_pos, state.extent)]


def value_distances(scheme) -> tuple:
    """SHAW-2, SHAW-4 as the flex kernel computes the value term from FlexAttention's log-sum-exp (its weights
    never leave the kernel): at default positions (delta = j - i) each distance lo .. hi has one key per query
    and its own table row, in order from row 1; with ``edges``, row 0 takes every distance < lo and row R - 1
    every distance > hi (the clipped ones). (lo, hi, edges) = (-(k - 1), k - 1, True): for k = 0 the band is
    empty and both edges are the one row."""
    k = scheme.max_distance
    return -(k - 1), k - 1, True


# ---------------------------------------------------------------- fused hooks (the triton kernel)
def fused_unsupported(scheme) -> Optional[str]:
    """Why the triton kernel cannot fuse this Shaw scheme, or None: it has the key and value terms (SHAW-3,
    SHAW-4), not the key side (SHAW-6)."""
    return None if scheme.key_side is None else "triton has no key-side term (SHAW-6)"


def fused_rows(scheme) -> int:
    """The rows of the tables ``fused_tables`` gives: 2k + 1 (SHAW-2)."""
    return 2 * scheme.max_distance + 1


def fused_tables(scheme, params: dict) -> tuple:
    """(rel_k or None, rel_v or None, k): the tables the triton kernel reads, (R, c) or (H, R, c) (REL-2)."""
    return params["rel_k"] if scheme.keys else None, params["rel_v"] if scheme.values else None, scheme.max_distance


# ---------------------------------------------------------------- banded algorithms (default positions)
def key_band_index(rows: int, max_distance: int, device) -> torch.Tensor:
    """SHAW-2 for a tile of queries q0 .. q0 + rows - 1 and keys q0 - k + 1 .. q0 + rows + k - 2.

    (rows, rows + 2k - 2): entry [i', c] is clip(c - i' - k + 1, -k, k) + k,
    the same for every q0 (with default positions the index depends on j - i only).
    """
    k = max_distance
    c = torch.arange(max(rows + 2 * k - 2, 0), device=device) - torch.arange(rows, device=device).unsqueeze(1) - k + 1
    return c.clamp_(-k, k).add_(k)


def key_term_banded(
    r: torch.Tensor, q_start: int, Lk: int, max_distance: int, band: torch.Tensor, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """SHAW-3 for default positions: the (B, H, T, Lk) key term of queries q_start .. q_start + T - 1.

    r: (B, H, T, 2k + 1) table logits of those queries. Keys up to
    q_start - k are at distance <= -k from every query of the tile (row 0 of
    the table), keys from q_start + T + k - 1 on at distance >= k (row 2k):
    both are broadcast copies. Only the T + 2k - 2 keys between them need a
    gather, through ``band = key_band_index(T_max, k)``, T_max >= T.
    ``out``: where to write the term, or None.
    """
    B, H, T, _ = r.shape
    k = max_distance
    a, b = q_start - k + 1, q_start + T + k - 1  # the keys between the two clipped regions
    lo = min(max(a, 0), Lk)
    hi = max(min(b, Lk), lo)  # (with k = 0, a > b: no keys between)
    parts = []
    if lo > 0:
        parts.append(r[..., :1].expand(B, H, T, lo))
    if hi > lo:
        parts.append(torch.gather(r, -1, band[:T, lo - a : hi - a].expand(B, H, T, hi - lo)))
    if Lk > hi:
        parts.append(r[..., -1:].expand(B, H, T, Lk - hi))
    if out is not None:
        return out.copy_(parts[0]) if len(parts) == 1 else torch.cat(parts, dim=-1, out=out)
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts, dim=-1)


def value_band_index(Lq: int, max_distance: int, device) -> torch.Tensor:
    """The key of each interior bucket of ``bucket_sums_banded`` for queries 0 .. Lq - 1: (Lq, 2k - 1).

    Entry [i, c + k - 1] is i + c for c = -k + 1 .. k - 1 (SHAW-2 row c + k),
    possibly outside the keys. Tiles slice their rows.
    """
    return torch.arange(Lq, device=device).unsqueeze(1) + torch.arange(-max_distance + 1, max_distance, device=device)


def edge_masks(rows: int, dtype: torch.dtype, device) -> tuple:
    """The 0/1 triangles of ``bucket_sums_banded`` for tiles of up to ``rows`` queries: strictly lower, upper."""
    i = torch.arange(rows, device=device)
    below = i.unsqueeze(0) < i.unsqueeze(1)  # [i', c']: c' < i'
    return below.to(dtype), (~below).to(dtype)


def bucket_sums_banded(
    w: torch.Tensor,
    max_distance: int,
    q_start: int = 0,
    masks: Optional[tuple] = None,
    band: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """SHAW-4 for default positions (delta = j - i), without a scatter and without an (Lq, Lk) index.

    w (B, H, T, Lk) holds queries i = q_start .. q_start + T - 1 and keys
    j = 0 .. Lk - 1; returns S (B, H, T, 2k + 1). Interior rows (|c| < k)
    are the entries w[i, i + c]: a gather of (T, 2k - 1) columns. The left
    edge S[i, 0] sums j <= i - k: keys up to q_start - k belong to it for
    every query (a plain row sum of that prefix), the next T keys by a
    strictly lower triangle. The right edge S[i, 2k] sums j >= i + k: keys
    from q_start + T + k on for every query, the T keys before them by an
    upper triangle. About one read of w for both edges and no cancellation;
    with short tiles the triangles are small. ``masks``: ``edge_masks(T_max,
    ...)`` and ``band``: the rows q_start .. q_start + T - 1 of
    ``value_band_index``, when the caller has them.
    """
    B, H, T, Lk = w.shape
    k = max_distance
    if k == 0:
        return w.sum(dim=-1, keepdim=True)
    cols = value_band_index(q_start + T, k, w.device)[q_start:] if band is None else band
    if q_start - k + 1 >= 0 and q_start + T + k - 2 < Lk:  # every interior bucket of this tile has its key
        interior = torch.gather(w, -1, cols.expand(B, H, T, 2 * k - 1))
    else:
        interior = torch.gather(w, -1, cols.clamp(0, Lk - 1).expand(B, H, T, 2 * k - 1))
        interior = interior.masked_fill((cols < 0) | (cols >= Lk), 0.0)
    below, upper = edge_masks(T, w.dtype, w.device) if masks is None else (m[:T, :T] for m in masks)

    def edge(all_rows: slice, tri_start: int, tri: torch.Tensor) -> torch.Tensor:
        """The sum of w over the keys of all_rows, plus the triangle tri on keys tri_start .. tri_start + T - 1."""
        a, z = max(all_rows.start, 0), min(all_rows.stop, Lk)
        total = w[..., a:z].sum(dim=-1) if a < z else w.new_zeros(B, H, T)
        a, z = max(tri_start, 0), min(tri_start + T, Lk)
        if a < z:
            total = total + torch.linalg.vecdot(w[..., a:z], tri[:, a - tri_start : z - tri_start])
        return total.unsqueeze(-1)

    left = edge(slice(0, q_start - k + 1), q_start - k + 1, below)
    right = edge(slice(q_start + T + k, Lk), q_start + k, upper)
    return torch.cat([left, interior, right], dim=-1)
