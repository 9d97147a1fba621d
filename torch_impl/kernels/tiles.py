"""``"tiles"``: the fast explicit kernel, cut into cache-sized tiles (KERN-1).

Each tile is a few (batch, head) pairs and a range of queries with all the
keys they may attend, so every softmax row is whole and exact (SOFTMAX-1);
the logits and the softmax are in float32 for the 16-bit dtypes (PREC-4).
What makes it fast, all measured on the CPU (benchmarks/):

- a tile's (queries, keys) buffers stay in the last-level cache, and
  without a recorded gradient they are views of a few reused buffers
  (``Workspace``);
- under a top-left causal rule (CAUSAL-1 with default positions) a tile
  reads only the keys up to its last query, and masks only its diagonal block;
  a window's right bound r (WINDOW-1) likewise stops it r keys after its last
  query (the window's left bound is applied by the mask only);
- with default positions the scheme's tile hooks use the Huang skew and the
  banded Shaw key term and value sums (``torch_impl.schemes``), whose cost
  grows with the tile's queries: such calls get short query tiles.

Grouped key/value heads (HEAD-3) are read in place: a tile holds whole groups
of query heads, or part of one group, and stacks a group's queries against
its key/value head (``_core.grouped_scores``); values may have their own head
size dv (HEAD-4). The soft cap (SOFTCAP-1) applies to the score of each tile
before its biases and its masks. A scheme's q/k transform (RoPE, REL-3 (1))
rotates the whole q and k once per call, before the first tile; the tiles
then run as for vanilla attention. A scheme's bias (ALiBi, T5, Swin,
REL-3 (3)) is computed per tile from the tile's positions by the scheme's
``tile_bias``, in the stat dtype, after the cap and before the bias input:
no (B, H, Lq, Lk) bias is built.

The knobs live in the frozen ``Tiles`` object; the defaults are the measured ones.
Axis legend (AXES-1): B, H, Lq, Lk, d; Hkv, G = H / Hkv (HEAD-3); dv (HEAD-4);
a tile has T queries and k1 keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Optional

import torch

from spec._fields import require_int

from .. import _core, schemes
from .._workspace import Workspace, take
from ._base import Kernel, transform_qk

#: Logits per tile on the CPU: 1 Mi elements (4 MiB in float32) keep a tile's
#: logits, weights and relative term in the last-level cache and in reused
#: heap memory. Measured on 2 CPU cores at L = 1024: tiles of one (batch,
#: head) pair are 2x faster than the whole (B, H, Lq, Lk) at once.
CPU_ELEMENTS = 1 << 20
#: Queries per tile on the CPU where fewer queries mean less work: under a
#: top-left causal rule a tile only reads the keys up to its last query (at
#: L = 1024 that skips 3/8 of the work), and the Huang skew of a tile of T
#: queries multiplies by T + Lk - 1 table rows, not Lq + Lk - 1 (1.25 L^2 d
#: instead of 2 L^2 d multiply-adds at L = 1024).
CPU_QUERY_ROWS = 256
#: Logits per tile on any other device (a GPU): one tile for everything up to
#: 2^28 elements, no short query tiles. Many small tiles would be many small
#: kernel launches there; this value is not tuned by a measurement yet.
ACCELERATOR_ELEMENTS = 1 << 28
#: The hook kinds a scheme's tile hooks serve (``tile_state``, ``tile_key_term``, ``tile_bias``,
#: ``tile_value_term``); the q/k transform runs once on the whole q and k before the tiles.
TILE_HOOKS = frozenset({"key_term", "bias", "value_term"})
#: The tile hooks whose cost grows with the tile's queries (the Huang skew, the banded Shaw sums): with
#: default positions they get short query tiles. A bias costs the same per element in any tile.
SHORT_TILE_HOOKS = frozenset({"key_term", "value_term"})


@dataclass(frozen=True)
class Tiles(Kernel):
    """The tiled kernel and its knobs (KERN-1); it runs every call.

    Fields:
      elements: logits per tile; None: CPU_ELEMENTS on the CPU, ACCELERATOR_ELEMENTS elsewhere.
      query_rows: queries per tile where short tiles are cheaper (causal
        prefix, skew, bands); None: CPU_QUERY_ROWS on the CPU, no short tiles elsewhere.
      min_rows: the fewest queries per tile, however long the keys.
    """

    name: ClassVar[str] = "tiles"
    scheme_hooks: ClassVar[frozenset] = frozenset({"qk_transform", "key_term", "key_side_term", "bias", "value_term"})

    elements: Optional[int] = None
    query_rows: Optional[int] = None
    min_rows: int = 16

    def __post_init__(self):
        for field in ("elements", "query_rows"):
            if getattr(self, field) is not None:
                object.__setattr__(self, field, require_int("Tiles", field, getattr(self, field), 1))
        object.__setattr__(self, "min_rows", require_int("Tiles", "min_rows", self.min_rows, 1))

    def grid(
        self,
        B: int,
        H: int,
        Lq: int,
        Lk: int,
        *,
        causal_prefix: bool,
        short_rows: bool,
        device_type: str,
        reach: int = 0,
        group: int = 1,
    ) -> list:
        """Tiles covering (B, H, Lq), as [batch group][head group][query range].

        ``causal_prefix``: every allowed key of query i is <= i + ``reach``
        (CAUSAL-1: reach 0; WINDOW-1: its right bound), so a tile of queries
        q0 .. q1 - 1 reads keys 0 .. q1 + reach - 1 only. ``short_rows``:
        tiles of ``query_rows`` queries are cheaper. ``group``: G, the query
        heads that share a key/value head (HEAD-3); a tile holds whole groups
        or a part of one group. Tile sizes come from the element budget and
        the rows, never one query per tile.
        """
        on_cpu = device_type == "cpu"
        budget = self.elements if self.elements is not None else (CPU_ELEMENTS if on_cpu else ACCELERATOR_ELEMENTS)
        query_rows = self.query_rows if self.query_rows is not None else (CPU_QUERY_ROWS if on_cpu else None)
        rows = min(Lq, query_rows) if short_rows and query_rows is not None else Lq
        if rows * Lk > budget:  # one (batch, head) pair is over the budget: fewer queries per tile
            rows = max(self.min_rows, budget // Lk)
        pairs = max(1, budget // (rows * Lk))
        if pairs >= H:
            nb = pairs // H
            groups = [(slice(b, b + nb), [slice(None)]) for b in range(0, B, nb)]
        else:
            n = _heads_per_tile(pairs, group)
            groups = [(slice(b, b + 1), [slice(h, h + n) for h in range(0, H, n)]) for b in range(B)]
        ranges = [(a, min(a + rows, Lq)) for a in range(0, Lq, rows)]
        return [
            [[Tile(bs, hs, a, z, min(z + reach, Lk) if causal_prefix else Lk) for a, z in ranges] for hs in heads]
            for bs, heads in groups
        ]


def _heads_per_tile(pairs: int, group: int) -> int:
    """At most ``pairs`` query heads per tile that never split two groups of ``group`` heads (HEAD-3):
    a multiple of the group, or a divisor of it."""
    if pairs >= group:
        return pairs - pairs % group
    return max(n for n in range(1, pairs + 1) if group % n == 0)


class Tile(NamedTuple):
    """Batches b, heads h, queries q0 .. q1 - 1 and keys 0 .. k1 - 1."""

    b: slice
    h: slice
    q0: int
    q1: int
    k1: int

    def kv_heads(self, group: int) -> slice:
        """HEAD-3: the key/value heads this tile's query heads read, query head h reading h // G (the grid
        keeps a tile inside whole groups or one group)."""
        if group == 1 or self.h.start is None:
            return self.h
        return slice(self.h.start // group, (self.h.stop - 1) // group + 1)

    @property
    def part(self) -> tuple:
        """The index of this tile's (batches, heads, queries) block of a (B, H, Lq, ...) tensor."""
        return self.b, self.h, slice(self.q0, self.q1)

    def cut(self, t: Optional[torch.Tensor], lead: int = 2) -> Optional[torch.Tensor]:
        """t, broadcastable to (B, H, Lq, Lk) (lead = 2) or (B, Lq, Lk) (lead = 1), sliced to this tile;
        size-1 axes stay."""
        if t is None:
            return None
        t = t.reshape((1,) * (lead + 2 - t.dim()) + tuple(t.shape))
        cuts = (self.b, self.h)[:lead] + (slice(self.q0, self.q1), slice(0, self.k1))
        return t[tuple(c if n > 1 else slice(None) for c, n in zip(cuts, t.shape))]


class _Run(NamedTuple):
    """What every tile of one call reads."""

    spec: object
    call: _core.Call
    q_s: torch.Tensor  # (B, H, Lq, d), times s (SCALE-2)
    k: torch.Tensor  # (B, Hkv, Lk, d)
    v: torch.Tensor  # (B, Hkv, Lk, dv)
    group: int  # G = H / Hkv (HEAD-3)
    unit: object  # the scheme's module, or None
    hooks: frozenset  # the hook kinds it uses (REL-3)
    state: object  # its tile state, or None
    side: object  # its key-side state (SHAW-6), or None
    stat: torch.dtype  # PREC-4
    causal_block: bool  # CAUSAL-1 alone (no window, mask or bias), top-left: mask each tile's diagonal block
    future: Optional[torch.Tensor]  # (T_max, T_max) bool, c > r: the keys after the diagonal
    ws: Optional[Workspace]


def attention(plan: Tiles, spec, params: dict, q, k, v, call: _core.Call):
    """q (B, H, Lq, d), k (B, Hkv, Lk, d), v (B, Hkv, Lk, dv) -> (o (B, H, Lq, dv), weights (B, H, Lq, Lk) or None).

    Implements REL-3, SCALE-2..4, REL-1, SOFTCAP-1, MASK-4..6 (through ``call.allowed``:
    CAUSAL-1, WINDOW-1), SOFTMAX-1, DROP-1, DROP-4, HEAD-3, HEAD-4, PREC-4.
    """
    q, k = transform_qk(spec, params, q, k, call)  # REL-3 (1): once per call, before any tile
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    default = call.default_positions
    reach = _key_reach(spec) if default and spec.mask_fill is None else None  # skip keys no query may attend
    hooks = frozenset() if spec.relative is None else spec.relative.hooks
    grid = plan.grid(
        B,
        H,
        Lq,
        Lk,
        causal_prefix=reach is not None,
        # the skew and the bands of the tile hooks cost less in short tiles; a q/k transform is done already
        short_rows=reach is not None or (bool(hooks & SHORT_TILE_HOOKS) and default),
        device_type=q.device.type,
        reach=reach or 0,
        group=spec.group_size,
    )
    longest = max(t.q1 - t.q0 for t in _flat(grid))
    stat = _core.stat_dtype(q.dtype)
    q_s = q * spec.effective_scale  # SCALE-2 folded into the query: a (B, H, Lq, d) pass, not (Lq, Lk)
    unit = state = None
    if hooks & TILE_HOOKS:  # SCALE-3: the relative term sees s * q or q
        unit = schemes.module_for(spec.relative)
        state = unit.tile_state(
            spec.relative,
            params,
            q_s if spec.scale_relative else q,
            call,
            causal=spec.causal and default,
            rows=longest,
            stat=stat,
        )
    side = None
    if "key_side_term" in hooks:  # SHAW-6: one (B, H, R, Lk) product, its factor folded into k (SHAW-7)
        unit = schemes.module_for(spec.relative)
        side = unit.key_side_state(spec.relative, params, k * spec.key_side_scale, call, group=spec.group_size)
    causal_block = (
        spec.causal
        and default
        and spec.window is None
        and call.mask is None
        and call.bias is None
        and spec.mask_fill is None
    )
    future = torch.ones(longest, longest, dtype=torch.bool, device=q.device).triu_(1) if causal_block else None
    records_grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, call.bias, *params.values())
    )
    # returned weights must stay; under torch.compile the compiler plans the memory itself
    ws = None if records_grad or call.return_weights or torch.compiler.is_compiling() else Workspace(q.device)
    run = _Run(spec, call, q_s, k, v, spec.group_size, unit, hooks, state, side, stat, causal_block, future, ws)
    outs, weights = [], []
    for t in _flat(grid):
        o, w = _tile(run, t)
        outs.append(o)
        if call.return_weights:
            weights.append(w if t.k1 == Lk else torch.nn.functional.pad(w, (0, Lk - t.k1)))
    return _join(grid, outs), (_join(grid, weights) if call.return_weights else None)


def _key_reach(spec) -> Optional[int]:
    """With default positions, the most keys after its own that a query may attend: 0 under CAUSAL-1, the
    right bound under WINDOW-1; None when unbounded."""
    if spec.causal:
        return 0
    return None if spec.window is None else spec.window[1]


def _tile(run: _Run, t: Tile):
    """One tile: (o (b, h, T, dv), weights (b, h, T, k1) or None)."""
    spec, call, ws, hooks = run.spec, run.call, run.ws, run.hooks
    q_s = run.q_s[t.part]
    kv = t.kv_heads(run.group)  # HEAD-3
    term = run.unit.tile_key_term(run.state, t, ws) if "key_term" in hooks else None  # REL-1
    if run.side is not None:  # SHAW-6: the key-side term, in the stat dtype (PREC-4)
        side = run.unit.tile_key_side_term(run.side, t).to(run.stat)
        term = side if term is None else term.to(run.stat) + side
    logits = _content_logits(q_s, run.k[t.b, kv, : t.k1], term, run.stat, ws)
    logits = _core.softcap(logits, spec.softcap, in_place=ws is not None)  # SOFTCAP-1: before biases and masks
    if "bias" in hooks:  # REL-3 (3): the tile's scheme bias, unscaled, in the stat dtype (PREC-4)
        logits = logits + run.unit.tile_bias(run.state, t)
    bias = t.cut(call.bias)
    if bias is not None:
        logits = logits + bias.to(run.stat)  # BIAS-1, SCALE-4
    allowed = t.cut(call.allowed)
    if run.causal_block:  # the only disallowed keys are after the diagonal
        _disallow_after_diagonal(logits, t.q0, run.future)
        allowed = None
    weights = _core.masked_softmax(logits, allowed, spec.mask_fill, out=take(ws, "weights", logits.shape, logits.dtype))
    del logits, term  # free the (T, k1) buffers before the value side (autograd keeps what it needs)
    dropped = _core.dropout(weights, t.cut(call.dropout_keep), spec.dropout)  # DROP-1
    o = _core.grouped_values(dropped.to(q_s.dtype), run.v[t.b, kv, : t.k1])  # (b, h, T, dv), HEAD-3, HEAD-4
    if "value_term" in hooks:  # DROP-4
        o = o + run.unit.tile_value_term(run.state, dropped, t).to(o.dtype)  # the term is in the stat dtype
    return o, (weights.to(q_s.dtype) if call.return_weights else None)


def _content_logits(q_s, k, term, stat, ws=None):
    """s * q @ k.T (+ the relative term) of one tile, in the statistics dtype: q_s (b, h, T, d), k (b, hkv, k1, d)
    -> (b, h, T, k1), query head h reading key head h // (h / hkv) (HEAD-3).

    In the input dtype the relative term is the accumulator of one batched
    matmul (baddbmm), which saves a pass over the (T, k1) logits. With a
    Workspace (no gradient recorded) the result goes to its "logits" slot,
    or accumulates into the term where the term already lives there. The
    queries of a group are stacked, (b * hkv, G * T, d), as in ``_core.grouped_scores``.
    """
    B, H, Lq, d = q_s.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if term is not None and term.dtype == stat == q_s.dtype:
        rows = (H // Hkv) * Lq  # G * T stacked queries per key/value head
        q3, k3 = q_s.reshape(B * Hkv, rows, d), k.reshape(B * Hkv, Lk, d).transpose(1, 2)
        if ws is not None and term.is_contiguous():  # accumulate into the term itself
            return term.view(B * Hkv, rows, Lk).baddbmm_(q3, k3).view(B, H, Lq, Lk)
        out = take(ws, "logits", (B * Hkv, rows, Lk), stat)
        if out is not None:
            return torch.baddbmm(term.reshape(B * Hkv, rows, Lk), q3, k3, out=out).view(B, H, Lq, Lk)
        return torch.baddbmm(term.reshape(B * Hkv, rows, Lk), q3, k3).view(B, H, Lq, Lk)
    logits = _core.grouped_scores(q_s, k).to(stat)
    return logits if term is None else logits + term.to(stat)


def _disallow_after_diagonal(logits: torch.Tensor, q_start: int, future: torch.Tensor) -> None:
    """CAUSAL-1 with default positions, in place: logits of keys j > i become -inf.

    logits hold queries i = q_start .. q_start + T - 1; only keys q_start + 1 ..
    q_start + T - 1 can lie after some query's diagonal (every earlier key is
    allowed for all of them), so only the (T, k1 - q_start) block is touched.
    """
    T, Lk = logits.shape[-2:]
    if q_start + 1 < Lk:
        logits[..., q_start:].masked_fill_(future[:T, : Lk - q_start], float("-inf"))


def _flat(grid: list):
    return (tile for group in grid for heads in group for tile in heads)


def _join(grid: list, parts: list) -> torch.Tensor:
    """Reassemble per-tile results, in the order of the flattened grid, along queries, heads, batches."""
    parts = iter(parts)

    def cat(xs, dim):
        xs = list(xs)
        return xs[0] if len(xs) == 1 else torch.cat(xs, dim=dim)

    return cat((cat((cat((next(parts) for _ in heads), 2) for heads in group), 1) for group in grid), 0)
