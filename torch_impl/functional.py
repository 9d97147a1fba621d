"""The functional core: multi-head attention with relative positions in PyTorch.

    logits[b,h,i,j] = s * q_i . k_j  +  s_rel * rel_key(i, j)  +  bias[b,h,i,j]
    w               = softmax over allowed keys (exact zeros elsewhere)
    o_i             = sum_j w'_ij v_j  +  sum_j w'_ij rel_v[idx_ij]        w' = dropout(w)
    out             = merge(o) @ wo + bo

Axis legend (AXES-1): B, H, Lq, Lk, D, d. Device-agnostic: every tensor is
created on the query's device. Two paths:

- fused: ``F.scaled_dot_product_attention`` when there is no relative term,
  no ``mask_fill``, no keep mask and no weights to return; the spec's masks,
  bias and positions become its ``attn_mask`` (it returns exact zeros for
  rows with no allowed key, MASK-5);
- explicit: everything else, tile by tile (a few (batch, head) pairs and a
  range of queries per tile, each with all the keys it may attend, so every
  softmax row is whole and exact), with the softmax statistics in float32 for
  the 16-bit dtypes (PREC-4). A tile's (Lq, Lk) buffers stay in cache; under a
  top-left causal rule a tile skips the keys after its last query.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from spec import AttentionSpec, Shaw

from . import _checks
from . import relative as rel
from ._workspace import Workspace, take


def _split(x: torch.Tensor, H: int) -> torch.Tensor:
    """HEAD-1: (B, L, D) -> (B, H, L, d), feature f to head f // d."""
    B, L, D = x.shape
    return x.view(B, L, H, D // H).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    """HEAD-2: (B, H, L, d) -> (B, L, D)."""
    B, H, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, H * d)


def _project(x, w, b):
    """PROJ-1 / OUT-1: x @ W + b, W stored (in, out); one fused multiply-add (addmm) with the bias."""
    return F.linear(x, w.t(), b)


def _positions(p: Optional[torch.Tensor], L: int, device) -> torch.Tensor:
    """POS-1: (1|B, L) int64 positions, default arange."""
    if p is None:
        return torch.arange(L, device=device).unsqueeze(0)
    p = p.to(torch.int64)
    return p.unsqueeze(0) if p.dim() == 1 else p


def allowed_keys(spec: AttentionSpec, delta: Optional[torch.Tensor], mask, bias) -> Optional[torch.Tensor]:
    """MASK-4: mask AND causal AND bias != -inf, at its broadcast shape; None when all allowed."""
    allowed = None
    if spec.causal:
        allowed = (delta <= 0).unsqueeze(1)  # CAUSAL-1, (1|B, 1, Lq, Lk)
    for part in (mask, None if bias is None else bias != float("-inf")):
        if part is not None:
            allowed = part if allowed is None else allowed & part
    return allowed


def _as4d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))


def _dead_keys(allowed: torch.Tensor, B: int, Lk: int) -> torch.Tensor:
    """MASK-7: keys no query of any head may attend, (B, Lk)."""
    return ~_as4d(allowed).any(dim=2).any(dim=1).expand(B, Lk)


class _Indices(NamedTuple):
    """Index tensors of the relative terms, (1|B, Lq, Lk), built once per call and cut per tile."""

    index: Optional[torch.Tensor] = None  # SHAW-2 or HUANG-2 table row of every (query, key)
    valid: Optional[torch.Tensor] = None  # HUANG-3: |delta| <= max_len - 1
    band: Optional[torch.Tensor] = None  # SHAW-2, default positions: the index near the diagonal of any tile


def _indices(spec, delta, default_positions: bool, rows: int, device) -> _Indices:
    """The index tensors the relative terms read; ``rows``: the most queries of a tile."""
    r = spec.relative
    if isinstance(r, Shaw):
        if default_positions:  # SHAW-3 by broadcasts and a small gather, SHAW-4 banded: no (Lq, Lk) index
            return _Indices(band=rel.shaw_band_index(rows, r.max_distance, device) if r.keys else None)
        return _Indices(index=rel.shaw_index(delta, r.max_distance))
    if r is not None and not default_positions:  # Huang with explicit positions: the gather
        index, valid = rel.huang_index(delta, r.max_len)
        return _Indices(index=index, valid=valid)
    return _Indices()


def _relative_key_term(spec, params, q, shaw_rows, default_positions: bool, ix: _Indices, q_start: int, Lk: int,
                       ws=None):
    """REL-1: the relative key logits (B, H, Lq, Lk) from a query already scaled by s_rel.

    With default positions (delta = j - i) the Huang term is the skew, which
    reads no index tensor; when causal its keys after the diagonal hold
    arbitrary finite values, masked later. ``ws``: a Workspace, when no
    gradient is recorded.
    """
    r = spec.relative
    table = params["rel_k"]
    if isinstance(r, Shaw):  # SHAW-3
        if default_positions:
            out = take(ws, "logits", shaw_rows.shape[:-1] + (Lk,), shaw_rows.dtype)
            return rel.shaw_key_term_banded(shaw_rows, q_start, Lk, r.max_distance, ix.band, out)
        return rel.gather_rows(shaw_rows, ix.index)
    if default_positions:  # HUANG-4: skew over the reachable rows
        return rel.huang_skew_term(q, table, q_start, Lk, r.max_len, causal=spec.causal, ws=ws)
    term = rel.gather_rows(rel.rows_logits(q, table), ix.index)  # HUANG-4: gather
    return term.masked_fill(~ix.valid.unsqueeze(1), 0.0)


def _content_logits(q_s, k, term, stat, ws=None):
    """s * q @ k.T (+ the relative term), in the statistics dtype.

    In the input dtype the relative term is the accumulator of one batched
    matmul (baddbmm), which saves a pass over the (Lq, Lk) logits. With a
    Workspace (no gradient recorded) the result goes to its "logits" slot,
    or accumulates into the term where the term already lives there.
    """
    B, H, Lq, d = q_s.shape
    Lk = k.shape[2]
    if term is not None and term.dtype == stat:
        q3, k3 = q_s.reshape(B * H, Lq, d), k.reshape(B * H, Lk, d).transpose(1, 2)
        if ws is not None and term.is_contiguous():  # accumulate into the term itself
            return term.view(B * H, Lq, Lk).baddbmm_(q3, k3).view(B, H, Lq, Lk)
        out = take(ws, "logits", (B * H, Lq, Lk), stat)
        if out is not None:
            return torch.baddbmm(term.reshape(B * H, Lq, Lk), q3, k3, out=out).view(B, H, Lq, Lk)
        return torch.baddbmm(term.reshape(B * H, Lq, Lk), q3, k3).view(B, H, Lq, Lk)
    logits = (q_s @ k.transpose(-1, -2)).to(stat)
    return logits if term is None else logits + term.to(stat)


def _masked_softmax(logits: torch.Tensor, allowed: Optional[torch.Tensor], mask_fill,
                    every_row_has_a_key: bool = False, out=None) -> torch.Tensor:
    """SOFTMAX-1 with MASK-5 (exact zeros) or MASK-6 (replace by mask_fill).

    ``every_row_has_a_key``: the caller knows no row is fully masked (only a
    top-left causal rule with default positions: key 0 is always allowed), so
    the plain softmax of -inf-filled logits is exact and NaN-free. ``out``:
    where the plain softmax may write (a Workspace slot), or None.
    """
    if allowed is None:
        return torch.softmax(logits, dim=-1) if out is None else torch.softmax(logits, dim=-1, out=out)
    if every_row_has_a_key and mask_fill is None:
        return torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    if mask_fill is not None:
        return torch.softmax(logits.masked_fill(~allowed, mask_fill), dim=-1)
    z = logits.masked_fill(~allowed, float("-inf"))
    m = z.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()  # rows with no allowed key
    e = torch.exp(z - m)  # exp(-inf) = 0 at disallowed keys
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def attention(spec: AttentionSpec, params: dict, query: torch.Tensor, key: Optional[torch.Tensor] = None,
              value: Optional[torch.Tensor] = None, *, mask=None, bias=None, q_positions=None,
              k_positions=None, dropout_keep=None, return_weights: bool = False):
    """Multi-head attention (spec/attention.md) over tensors; autograd through everything.

    Args:
      spec: the layer's ``AttentionSpec``.
      params: canonical tensors, ``spec.param_shapes()``, in the query's dtype and device.
      query: [B, Lq, D]; key: [B, Lk, D] or None (= query); value: [B, Lk, D] or None (= key).
      mask: bool, True = attend, broadcastable to [B, H, Lq, Lk] (MASK-1).
      bias: float, broadcastable to [B, H, Lq, Lk], unscaled; -inf disallows (BIAS-1, BIAS-2).
      q_positions / k_positions: int [L] or [B, L] (POS-1).
      dropout_keep: bool [B, H, Lq, Lk] keep mask, only with spec.dropout > 0 (DROP-1..3).
      return_weights: also return the post-softmax, pre-dropout weights [B, H, Lq, Lk].

    Returns:
      out [B, Lq, D] in the query's dtype, or (out, weights).
    """
    B, Lq, Lk = _checks.check(spec, params, query, key, value, mask, bias, q_positions, k_positions, dropout_keep)
    key = query if key is None else key
    value = key if value is None else value
    H = spec.num_heads
    device = query.device
    p = params

    default_positions = q_positions is None and k_positions is None
    # the distances feed the causal rule, and index tables where the positions are explicit
    need_delta = spec.causal or (spec.relative is not None and not default_positions)
    q_pos = _positions(q_positions, Lq, device) if need_delta else None
    k_pos = _positions(k_positions, Lk, device) if need_delta else None
    delta = (k_pos.unsqueeze(1) - q_pos.unsqueeze(2)) if need_delta else None  # POS-2, (1|B, Lq, Lk)
    allowed = allowed_keys(spec, delta, mask, bias)
    if allowed is not None and spec.mask_fill is None:  # MASK-7
        dead = _dead_keys(allowed, B, Lk).unsqueeze(-1)
        key, value = key.masked_fill(dead, 0.0), value.masked_fill(dead, 0.0)

    q = _split(_project(query, p["wq"], p.get("bq")), H)  # (B, H, Lq, d)
    k = _split(_project(key, p["wk"], p.get("bk")), H)  # (B, H, Lk, d)
    v = _split(_project(value, p["wv"], p.get("bv")), H)  # (B, H, Lk, d)

    fused = spec.relative is None and spec.mask_fill is None and dropout_keep is None and not return_weights
    if fused:
        o = _fused(spec, q, k, v, allowed, bias,
                   default_causal=spec.causal and default_positions and mask is None and bias is None)
        return _project(_merge(o), p["wo"], p.get("bo"))

    # explicit path: tiles whose (queries, keys) buffers stay in cache
    o, weights = _explicit(spec, p, q, k, v, mask=mask, bias=bias, delta=delta, allowed=allowed,
                           default_positions=default_positions, dropout_keep=dropout_keep,
                           return_weights=return_weights)
    out = _project(_merge(o), p["wo"], p.get("bo"))
    return (out, weights) if return_weights else out


#: Logits per tile of the explicit path: 1 Mi elements (4 MiB in float32) keep a
#: tile's logits, weights and relative term in the last-level cache and in
#: reused heap memory. Measured on 2 CPU cores at L = 1024 (benchmarks/): tiles
#: of one (batch, head) pair are 2x faster than the whole (B, H, Lq, Lk) at once.
TILE_ELEMENTS = 1 << 20
#: Queries per tile where fewer queries mean less work: under a top-left causal
#: rule with default positions a tile only reads the keys up to its last query
#: (at L = 1024 that skips 3/8 of the work), and the Huang skew of a tile of T
#: queries multiplies by T + Lk - 1 table rows, not Lq + Lk - 1 (1.25 L^2 d
#: instead of 2 L^2 d multiply-adds at L = 1024).
QUERY_TILE_ROWS = 256
#: The fewest queries per tile, however long the keys.
MIN_TILE_ROWS = 16
#: Logits per tile on any other device (a GPU): one tile for everything up to
#: 2^28 elements, no short query tiles. Many small tiles would be many small
#: kernel launches there; this value is not tuned by a measurement yet.
ACCELERATOR_TILE_ELEMENTS = 1 << 28


class _Tile(NamedTuple):
    b: slice  # batches
    h: slice  # heads
    q0: int  # queries q0 .. q1 - 1
    q1: int
    k1: int  # keys 0 .. k1 - 1


def _tiles(B: int, H: int, Lq: int, Lk: int, causal_prefix: bool, short_rows: bool, budget: int) -> list:
    """Tiles covering (B, H, Lq), as [batch group][head group][query range].

    ``causal_prefix``: every allowed key of query i is <= i, so a tile of
    queries q0 .. q1 - 1 reads keys 0 .. q1 - 1 only. ``short_rows``: tiles
    of QUERY_TILE_ROWS queries are cheaper (causal prefix, Huang skew, Shaw
    bands).
    ``budget``: logits per tile. Tile sizes come from the budget and
    QUERY_TILE_ROWS, never one query per tile.
    """
    rows = min(Lq, QUERY_TILE_ROWS) if short_rows else Lq
    if rows * Lk > budget:  # one (batch, head) pair is over the budget: fewer queries per tile
        rows = max(MIN_TILE_ROWS, budget // Lk)
    pairs = max(1, budget // (rows * Lk))
    if pairs >= H:
        nb = pairs // H
        groups = [(slice(b, b + nb), [slice(None)]) for b in range(0, B, nb)]
    else:
        groups = [(slice(b, b + 1), [slice(h, h + pairs) for h in range(0, H, pairs)]) for b in range(B)]
    ranges = [(a, min(a + rows, Lq)) for a in range(0, Lq, rows)]
    return [[[_Tile(bs, hs, a, z, min(z, Lk) if causal_prefix else Lk) for a, z in ranges] for hs in heads]
            for bs, heads in groups]


def _cut(t: Optional[torch.Tensor], tile: _Tile, lead: int) -> Optional[torch.Tensor]:
    """Slice t, broadcastable to (B, H, Lq, Lk) (lead = 2) or (B, Lq, Lk) (lead = 1), to a tile; size-1 axes stay."""
    if t is None:
        return None
    t = t.reshape((1,) * (lead + 2 - t.dim()) + tuple(t.shape))
    cuts = (tile.b, tile.h)[:lead] + (slice(tile.q0, tile.q1), slice(0, tile.k1))
    return t[tuple(c if n > 1 else slice(None) for c, n in zip(cuts, t.shape))]


def _explicit(spec, p, q, k, v, *, mask, bias, delta, allowed, default_positions, dropout_keep, return_weights):
    """The non-fused core tile by tile; returns o (B, H, Lq, d) and the weights or None."""
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    stat = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype  # PREC-4
    causal_prefix = spec.causal and default_positions and spec.mask_fill is None
    banded = spec.relative is not None and default_positions  # Huang skew, Shaw banded value buckets
    on_cpu = q.device.type == "cpu"  # a tuning choice only: every tile follows the inputs' device
    grid = _tiles(B, H, Lq, Lk, causal_prefix, short_rows=on_cpu and (causal_prefix or banded),
                  budget=TILE_ELEMENTS if on_cpu else ACCELERATOR_TILE_ELEMENTS)
    longest = max(t.q1 - t.q0 for t in _flat(grid))
    indices = _indices(spec, delta, default_positions, longest, q.device)
    edge_masks = band = None
    if isinstance(spec.relative, Shaw) and spec.relative.values and default_positions:  # SHAW-4, banded
        edge_masks = rel.edge_masks(longest, stat, q.device)
        if spec.relative.max_distance > 0:
            band = rel.band_index(Lq, spec.relative.max_distance, q.device)
    q_s = q * spec.effective_scale  # SCALE-2 folded into the query: a (B, H, Lq, d) pass, not (Lq, Lk)
    q_rel = q_s if spec.scale_relative else q  # SCALE-3: the relative term sees s * q or q
    shaw_rows = None
    if isinstance(spec.relative, Shaw) and "rel_k" in p:  # SHAW-3: q @ rel_k.T is small, (B, H, Lq, 2k + 1)
        shaw_rows = rel.rows_logits(q_rel, p["rel_k"])
    future = None
    if spec.causal and default_positions:
        future = torch.ones(longest, longest, dtype=torch.bool, device=q.device).triu_(1)
    records_grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, bias, p.get("rel_k"), p.get("rel_v")))
    # returned weights must stay; under torch.compile the compiler plans the memory itself
    ws = None if records_grad or return_weights or torch.compiler.is_compiling() else Workspace(q.device)
    outs, weights = [], []
    for t in _flat(grid):
        tables = {n: (x[t.h] if x.dim() == 3 else x) for n, x in p.items() if n in ("rel_k", "rel_v")}
        part = (t.b, t.h, slice(t.q0, t.q1))
        o, w = _explicit_tile(spec, tables, q_s[part], q_rel[part], k[t.b, t.h, :t.k1], v[t.b, t.h, :t.k1],
                              shaw_rows=None if shaw_rows is None else shaw_rows[part], edge_masks=edge_masks,
                              band=None if band is None else band[t.q0:t.q1],
                              future=future, ws=ws,
                              mask=_cut(mask, t, 2), bias=_cut(bias, t, 2), allowed=_cut(allowed, t, 2),
                              dropout_keep=_cut(dropout_keep, t, 2),
                              indices=indices._replace(index=_cut(indices.index, t, 1),
                                                       valid=_cut(indices.valid, t, 1)),
                              default_positions=default_positions, q_start=t.q0, stat=stat,
                              return_weights=return_weights)
        outs.append(o)
        if return_weights:
            weights.append(w if t.k1 == Lk else torch.nn.functional.pad(w, (0, Lk - t.k1)))
    return _join(grid, outs), (_join(grid, weights) if return_weights else None)


def _flat(grid: list):
    return (tile for group in grid for heads in group for tile in heads)


def _join(grid: list, parts: list) -> torch.Tensor:
    """Reassemble per-tile results, in the order of the flattened grid, along queries, heads, batches."""
    parts = iter(parts)

    def cat(xs, dim):
        xs = list(xs)
        return xs[0] if len(xs) == 1 else torch.cat(xs, dim=dim)

    return cat((cat((cat((next(parts) for _ in heads), 2) for heads in group), 1) for group in grid), 0)


def _explicit_tile(spec, tables, q_s, q_rel, k, v, *, shaw_rows, edge_masks, band, future, ws, mask, bias, allowed,
                   dropout_keep, indices, default_positions, q_start, stat, return_weights):
    """One tile: logits and softmax in float32 for the 16-bit dtypes (PREC-4).

    q_s: the scaled queries; q_rel: the queries the relative term sees
    (SCALE-3); shaw_rows: their Shaw table logits, when there are any;
    edge_masks, band: the triangles and interior index of the banded Shaw value buckets;
    future: ``c > r`` for r, c < the longest tile (the keys after the diagonal);
    ws: a Workspace for the (queries, keys) intermediates, or None where a gradient is recorded;
    stat: the dtype of the logits and the softmax.
    """
    Lk = k.shape[2]
    dtype = q_s.dtype
    every_row_has_a_key = mask is None and bias is None and default_positions
    # CAUSAL-1 alone, top-left: only the keys after the diagonal of this tile's last
    # queries are disallowed, in the block of keys q_start .. Lk - 1
    causal_block = spec.causal and every_row_has_a_key and spec.mask_fill is None
    term = None
    if "rel_k" in tables:
        term = _relative_key_term(spec, tables, q_rel, shaw_rows, default_positions, indices, q_start, Lk, ws)
    logits = _content_logits(q_s, k, term, stat, ws)
    if bias is not None:
        logits = logits + bias.to(stat)  # BIAS-1, SCALE-4
    if causal_block:
        _disallow_after_diagonal(logits, q_start, future)
        allowed = None
    weights = _masked_softmax(logits, allowed, spec.mask_fill, every_row_has_a_key,
                              out=take(ws, "weights", logits.shape, logits.dtype))
    del logits, term  # free the (Lq, Lk) buffers before the value side (autograd keeps what it needs)
    dropped = weights
    if dropout_keep is not None:  # DROP-1
        dropped = weights.masked_fill(~dropout_keep, 0.0) / (1.0 - spec.dropout)
    o = dropped.to(dtype) @ v
    if isinstance(spec.relative, Shaw) and spec.relative.values:  # SHAW-4, DROP-4
        if default_positions:
            buckets = rel.bucket_sums_banded(dropped, spec.relative.max_distance, q_start, edge_masks, band)
        else:
            buckets = rel.bucket_sums(dropped, indices.index, spec.relative.num_rows)
        table = tables["rel_v"]
        o = o + buckets.to(dtype) @ (table if table.dim() == 2 else table.unsqueeze(0))
    return o, (weights.to(dtype) if return_weights else None)


def _disallow_after_diagonal(logits: torch.Tensor, q_start: int, future: torch.Tensor) -> None:
    """CAUSAL-1 with default positions, in place: logits of keys j > i become -inf.

    logits hold queries i = q_start .. q_start + R - 1; only keys q_start + 1 ..
    q_start + R - 1 can lie after some query's diagonal (every earlier key is
    allowed for all of them), so only the (R, Lk - q_start) block is touched.
    """
    R, Lk = logits.shape[-2:]
    if q_start + 1 < Lk:
        logits[..., q_start:].masked_fill_(future[:R, : Lk - q_start], float("-inf"))


def _fused(spec, q, k, v, allowed, bias, default_causal: bool) -> torch.Tensor:
    """The vanilla core through F.scaled_dot_product_attention (MASK-5 holds: it zeroes empty rows)."""
    s = spec.effective_scale
    if default_causal:  # top-left, which is CAUSAL-1 with default positions
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=s)
    if bias is not None:
        attn_mask = bias.to(q.dtype) if allowed is None else bias.to(q.dtype).masked_fill(~allowed, float("-inf"))
    else:
        attn_mask = allowed
    attn_mask = None if attn_mask is None else _as4d(attn_mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=s)
