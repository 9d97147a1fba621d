"""Table operations the scheme modules share: a table matmul, a gather by row, a sum per row.

Every relative term is ``q @ table.T`` (one logit per query and table row)
followed by an index operation on the last axis; a value term sums the
weights per table row first, then multiplies by the table. Nothing of
shape (Lq, Lk, d) is built (SHAW-3, SHAW-4, HUANG-4).

Shapes (AXES-1): q (B, H, Lq, d); a table (R, d) shared by heads or
(H, R, d) per head (REL-2), a tile's (H', R, d); an index (1|B, Lq, Lk).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ._bias_tables import call_positions


def rows_logits(q: torch.Tensor, table: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q @ table.T per head (REL-2): (B, H, Lq, d) x (R, d) | (H, R, d) -> (B, H, Lq, R)."""
    if table.dim() == 3:
        table = table.unsqueeze(0)
    if out is None:
        return q @ table.transpose(-1, -2)
    return torch.matmul(q, table.transpose(-1, -2), out=out)


def rows_sum(buckets: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """S @ table per head (REL-2): (B, H, Lq, R) x (R, c) | (H, R, c) -> (B, H, Lq, c), in the table's dtype
    (c = dv for a value table, HEAD-4)."""
    return buckets.to(table.dtype) @ (table if table.dim() == 2 else table.unsqueeze(0))


def gather_rows(r: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """out[b, h, i, j] = r[b, h, i, index[b, i, j]]:  (B, H, Lq, R), (1|B, Lq, Lk) -> (B, H, Lq, Lk)."""
    B, H, Lq, _ = r.shape
    return torch.gather(r, -1, index.unsqueeze(1).expand(B, H, Lq, index.shape[-1]))


def bucket_sums(w: torch.Tensor, index: torch.Tensor, num_rows: int) -> torch.Tensor:
    """S[b, h, i, r] = sum over j with index[b, i, j] == r of w[b, h, i, j]:  (B, H, Lq, Lk) -> (B, H, Lq, R)."""
    B, H, Lq, Lk = w.shape
    out = w.new_zeros(B, H, Lq, num_rows)
    return out.scatter_add(-1, index.unsqueeze(1).expand(B, H, Lq, Lk), w)


def key_rows(k: torch.Tensor, table: torch.Tensor, group: int) -> torch.Tensor:
    """k @ table.T per query head (REL-2, HEAD-3): k (B, Hkv, Lk, d) with G = ``group`` query heads per key
    head, table (R, d) | (H, R, d) -> (B, H, Lk, R), one logit per key and table row."""
    if table.dim() == 2:
        return rows_logits(k, table).repeat_interleave(group, dim=1) if group > 1 else rows_logits(k, table)
    return rows_logits(k.repeat_interleave(group, dim=1) if group > 1 else k, table)


def gather_key_rows(rk_t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """out[b, h, i, j] = rk_t[b, h, index[b, i, j], j]: rk_t (B, H, R, Lk) (``key_rows`` transposed),
    index (1|B, Lq, Lk) -> (B, H, Lq, Lk): a key-side term (SHAW-6)."""
    B, H = rk_t.shape[:2]
    return torch.gather(rk_t, -2, index.unsqueeze(1).expand(B, H, *index.shape[-2:]))


def bucket_sums_valid(w: torch.Tensor, index: torch.Tensor, valid: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``bucket_sums`` over the pairs where ``valid`` (1|B, Lq, Lk) holds: the other pairs go to one extra
    bucket, dropped. (B, H, Lq, Lk) -> (B, H, Lq, R)."""
    return bucket_sums(w, torch.where(valid, index, num_rows), num_rows + 1)[..., :num_rows]


def head_rows(table: torch.Tensor, heads: slice) -> torch.Tensor:
    """REL-2: the table of a group of heads: (R, d) stays, (H, R, d) -> (H', R, d)."""
    return table[heads] if table.dim() == 3 else table


class ScoreState(NamedTuple):
    """What a key term's score hook reads for every pair, built once per call (``key_score_state``)."""

    extent: int  # the scheme's size: Shaw's k, Huang's M
    rows: torch.Tensor  # q @ table.T (B, H, Lq, R), s_rel folded into q, in the stat dtype
    q_pos: torch.Tensor  # (1|B, Lq) int64
    k_pos: torch.Tensor  # (1|B, Lk) int64


def key_score_state(extent: int, table: torch.Tensor, q: torch.Tensor, call, stat: torch.dtype) -> ScoreState:
    """The table logits of every query (``rows_logits``, read in the stat dtype like the eager key term, PREC-4)
    and the call's positions, for a FlexAttention ``score_mod``."""
    return ScoreState(extent, rows_logits(q, table).to(stat), *call_positions(call))
