"""The ``tiles`` kernel: the fast algorithms (KERN-1), the automatic choice for every call.

The same per-block math as ``xla`` (``xla.attend``) with the schemes'
tiled hooks (with default positions: the Huang skew over the reachable
table rows, the causal half-width skew, the banded Shaw value sums; see
``jax_impl.schemes``). Under a plain top-left causal rule (CAUSAL-1 alone:
default positions, no mask, no bias, no mask_fill) and from two tiles on,
the queries are cut into tiles of ``query_rows``, and a tile of queries
q0 .. q1 - 1 attends the keys 0 .. q1 - 1 only: XLA never computes the
keys after its last query (3/8 of the work at L = 1024 with 256 rows).
Python unrolls this fixed tiling at trace time; there is no loop over
positions at run time.

A window (WINDOW-1) only narrows what causality allows, so the cut after a
tile's last query stays exact; the keys before a window's left edge are
masked, not skipped. Grouped key/value heads, a value head size and the
cap (HEAD-3, HEAD-4, SOFTCAP-1) are ``attend``'s, the same in every tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import jax.numpy as jnp

from spec import AttentionSpec

from .. import schemes
from ..masking import cut
from ._base import Call, Inputs, Kernel
from .xla import attend


@dataclass(frozen=True)
class Tiles(Kernel):
    """Query tiles under a plain causal rule, and the schemes' tiled hooks.

    Fields (tuning knobs; results do not depend on them beyond rounding):
      query_rows: queries per tile of the causal tiling (from Lq = 2 * query_rows on).
    """

    name: ClassVar[str] = "tiles"
    query_rows: int = 256

    def __post_init__(self):
        rows = self.query_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"Tiles.query_rows: expected an int >= 1, got {rows!r}")

    def unsupported(self, spec: AttentionSpec, call: Call) -> Optional[str]:
        missing = schemes.missing_tiled(spec.relative)
        if missing:
            return f"the jax_impl module of scheme {spec.relative.name!r} has no tiled hooks ({', '.join(missing)})"
        return None

    @staticmethod
    def plain_causal(spec: AttentionSpec, call: Call) -> bool:
        """CAUSAL-1 top-left (default positions, no mask, bias or mask_fill), a window (WINDOW-1) allowed.

        Every key after query i is disallowed, so a tile of queries needs no key after its last query.
        """
        return spec.causal and call.default_positions and not call.mask and not call.bias and spec.mask_fill is None

    @classmethod
    def rows_nonempty(cls, spec: AttentionSpec, call: Call) -> bool:
        """A plain causal rule under which every query keeps an allowed key: no empty-row guard is needed.

        Query i keeps key min(i, Lk - 1) unless a window's left bound cuts it
        off: with window (left, _), query i has a key iff i - left <= Lk - 1
        (MASK-5: the rows after that are empty and must give exact zeros).
        """
        if not cls.plain_causal(spec, call):
            return False
        left = None if spec.window is None else spec.window[0]
        return left is None or call.Lq - 1 - left <= call.Lk - 1

    def cuts_queries(self, spec: AttentionSpec, call: Call) -> bool:
        """Whether the call is cut into query tiles: a plain causal rule and at least two tiles."""
        return self.plain_causal(spec, call) and call.Lq >= 2 * self.query_rows

    def __call__(self, spec: AttentionSpec, params: dict, x: Inputs, call: Call):
        scheme = spec.relative
        hooks = schemes.tiled_hooks(scheme, schemes.Tile(0, call.default_positions, spec.causal))
        if hooks.qk_transform is not None:  # REL-3 (1): once, before any tile
            q, k = hooks.qk_transform(params, x.q, x.k, x.q_positions, x.k_positions)
            x = x._replace(q=q, k=k)
        nonempty = self.rows_nonempty(spec, call)  # no row can be empty: no guard in the softmax
        if not self.cuts_queries(spec, call):
            return attend(spec, params, x, hooks, nonempty)
        parts = []
        for q0 in range(0, call.Lq, self.query_rows):
            q1 = min(q0 + self.query_rows, call.Lq)
            k1 = min(q1, call.Lk)  # CAUSAL-1, top-left: the keys after q1 - 1 are disallowed for the whole tile
            tile = Inputs(
                q=x.q[:, :, q0:q1],
                k=x.k[:, :, :k1],
                v=x.v[:, :, :k1],
                q_positions=x.q_positions[:, q0:q1],
                k_positions=x.k_positions[:, :k1],
                delta=x.delta[:, q0:q1, :k1],
                allowed=cut(x.allowed, q0, q1, k1),
                bias=None,
                dropout_keep=cut(x.dropout_keep, q0, q1, k1),
            )
            tile_hooks = schemes.tiled_hooks(scheme, schemes.Tile(q0, True, True))
            parts.append(attend(spec, params, tile, tile_hooks, nonempty))
        o = jnp.concatenate([o for o, _ in parts], axis=2)
        weights = jnp.concatenate([jnp.pad(w, [(0, 0)] * 3 + [(0, call.Lk - w.shape[-1])]) for _, w in parts], axis=2)
        return o, weights
