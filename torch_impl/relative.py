"""Relative-position terms in PyTorch: table matmuls, gathers, bucket sums, the skew.

Rules SHAW-2..SHAW-4, HUANG-2..HUANG-4. Every relative term is ``q @ table.T``
(one logit per query and table row) followed by an index operation on the
last axis; the Shaw value term sums weights per table row first. Nothing of
shape (Lq, Lk, d) is built, and there is no Python loop over positions.

Shapes (AXES-1): q (B, H, Lq, d); a table (R, d) shared or (H, R, d) per head;
an index (1|B, Lq, Lk).
"""

from __future__ import annotations

import torch


def rows_logits(q: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """q @ table.T per head: (B, H, Lq, d) x (R, d) | (H, R, d) | (b, 1|H, R, d) -> (B, H, Lq, R)."""
    if table.dim() == 3:
        table = table.unsqueeze(0)
    return q @ table.transpose(-1, -2)


def gather_rows(r: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """out[b, h, i, j] = r[b, h, i, index[b, i, j]]  (B, H, Lq, R) -> (B, H, Lq, Lk)."""
    B, H, Lq, _ = r.shape
    return torch.gather(r, -1, index.unsqueeze(1).expand(B, H, Lq, index.shape[-1]))


def bucket_sums(w: torch.Tensor, index: torch.Tensor, num_rows: int) -> torch.Tensor:
    """SHAW-4: S[b, h, i, r] = sum over j with index[b, i, j] == r of w[b, h, i, j]."""
    B, H, Lq, Lk = w.shape
    out = w.new_zeros(B, H, Lq, num_rows)
    return out.scatter_add(-1, index.unsqueeze(1).expand(B, H, Lq, Lk), w)


def shaw_index(delta: torch.Tensor, max_distance: int) -> torch.Tensor:
    """SHAW-2: clip(delta, -k, k) + k."""
    return delta.clamp(-max_distance, max_distance) + max_distance


def huang_index(delta: torch.Tensor, max_len: int):
    """HUANG-2/3: (row, valid) with row = delta + M - 1 where |delta| <= M - 1."""
    valid = delta.abs() <= max_len - 1
    return torch.where(valid, delta + max_len - 1, torch.zeros_like(delta)), valid


def distance_rows(table: torch.Tensor, first: int, count: int, max_len: int) -> torch.Tensor:
    """HUANG-2/3: the table rows of distances first .. first + count - 1, zero rows beyond the table.

    (R, d) -> (count, d) or (H, R, d) -> (H, count, d). Built by slicing and
    zero padding: no index tensor, no loop.
    """
    R = 2 * max_len - 1
    lo, hi = first + max_len - 1, first + count - 1 + max_len - 1  # table rows wanted, may overhang
    a, b = max(lo, 0), min(hi, R - 1)
    if a > b:  # no distance of the range is in the table
        return table.new_zeros(table.shape[:-2] + (count, table.shape[-1]))
    rows = table[..., a: b + 1, :]
    return torch.nn.functional.pad(rows, (0, 0, a - lo, hi - b)) if (a - lo or hi - b) else rows


def huang_skew_term(q: torch.Tensor, table: torch.Tensor, q_start: int, Lk: int, max_len: int,
                    causal: bool) -> torch.Tensor:
    """HUANG-4 with default positions for queries q_start .. q_start + Lq - 1 and keys 0 .. Lk - 1.

    One matmul of the queries with the table rows of every distance they can
    meet, then the skew. Column m of that product holds distance
    m - (q_start + Lq - 1). ``causal``: only distances <= 0 are computed; the
    columns of positive distances are -inf, so the term itself carries the
    causal rule (CAUSAL-1) and the matmul covers only distances <= 0.
    """
    Lq = q.shape[-2]
    first = -(q_start + Lq - 1)  # the distance of column 0
    width = Lq + Lk - 1
    if not causal:
        width += -width % 16  # zero rows up to a multiple of 16: never read, and the matmul is faster
        return skew(rows_logits(q, distance_rows(table, first, width, max_len)), Lk)
    n = min(width, 1 - first)  # distances first .. 0
    r = rows_logits(q, distance_rows(table, first, n, max_len))
    if width > n:
        r = torch.cat([r, r.new_full(r.shape[:-1] + (width - n,), float("-inf"))], dim=-1)
    return skew(r, Lk)


def skew(r: torch.Tensor, Lk: int) -> torch.Tensor:
    """HUANG-4: out[..., i, j] = r[..., i, j - i + Lq - 1], by reshape and slice.

    r is (B, H, Lq, W), W >= Lq + Lk - 1. Element (i, j - i + Lq - 1) sits at
    flat offset (Lq - 1) + i (W - 1) + j of each (Lq, W) block: drop the first
    Lq - 1 entries, view the rest as rows of W - 1, keep the first Lk columns.
    Views only until the caller adds it.
    """
    B, H, Lq, W = r.shape
    if Lq == 1:
        return r[..., :Lk]
    flat = r.reshape(B, H, Lq * W)[..., Lq - 1: Lq - 1 + Lq * (W - 1)]
    return flat.reshape(B, H, Lq, W - 1)[..., :Lk]


def bucket_sums_banded(w: torch.Tensor, max_distance: int, left_mask=None, q_start: int = 0) -> torch.Tensor:
    """SHAW-4 for default positions (delta = j - i), without a scatter over (Lq, Lk).

    Interior rows (|c| < k) are the entries w[i, i + c]: one gather of
    (Lq, 2k - 1) columns. The left edge S[i, 0] = sum_{j - i <= -k} w_ij is a
    row dot product with a 0/1 mask (one read of w, no cumulative sum); the
    right edge is the rest of the row total. ``left_mask``: that mask,
    (1, Lq, Lk) in w's dtype, when the caller has it. ``q_start``: the position of
    w's first query (w holds queries q_start .. q_start + Lq - 1).
    """
    B, H, Lq, Lk = w.shape
    k = max_distance
    total = w.sum(dim=-1, keepdim=True)
    if k == 0:
        return total
    i = torch.arange(q_start, q_start + Lq, device=w.device).unsqueeze(1)
    cols = i + torch.arange(-k + 1, k, device=w.device)  # (Lq, 2k - 1) key of each interior bucket
    inside = (cols >= 0) & (cols < Lk)
    interior = torch.gather(w, -1, cols.clamp(0, Lk - 1).expand(B, H, Lq, 2 * k - 1)).masked_fill(~inside, 0.0)
    if left_mask is None:
        left_mask = (torch.arange(Lk, device=w.device) - i <= -k).to(w.dtype)
    left = torch.linalg.vecdot(w, left_mask).unsqueeze(-1)
    right = total - left - interior.sum(dim=-1, keepdim=True)
    return torch.cat([left, interior, right], dim=-1)
