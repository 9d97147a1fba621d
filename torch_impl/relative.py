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


def reachable_rows(table: torch.Tensor, Lq: int, Lk: int, max_len: int) -> torch.Tensor:
    """HUANG-4 with default positions: table rows for distances -(Lq-1) .. Lk-1, zero beyond.

    (R, d) -> (W, d) or (H, R, d) -> (H, W, d), W = Lq + Lk - 1. Built by
    slicing and zero padding: no index tensor, no loop.
    """
    lo, hi = -(Lq - 1) + max_len - 1, (Lk - 1) + max_len - 1  # table rows wanted, may overhang
    R = 2 * max_len - 1
    pad_lo, pad_hi = max(0, -lo), max(0, hi - (R - 1))
    rows = table[..., max(lo, 0): min(hi, R - 1) + 1, :]
    # Extra zero rows at the end round W up to a multiple of 16: the skew only needs
    # W >= Lq + Lk - 1, and an aligned width makes the matmul measurably faster.
    pad_hi += -(Lq + Lk - 1) % 16
    if pad_lo or pad_hi:
        rows = torch.nn.functional.pad(rows, (0, 0, pad_lo, pad_hi))
    return rows


def skew(r: torch.Tensor, Lk: int) -> torch.Tensor:
    """HUANG-4: out[..., i, j] = r[..., i, j - i + Lq - 1], by reshape and slice.

    r is (B, H, Lq, W), W >= Lq + Lk - 1, column m holding distance m - (Lq - 1).
    Element (i, j - i + Lq - 1) sits at flat offset (Lq - 1) + i (W - 1) + j of
    each (Lq, W) block: drop the first Lq - 1 entries, view the rest as rows
    of W - 1, keep the first Lk columns. Views only until the caller adds it.
    """
    B, H, Lq, W = r.shape
    if Lq == 1:
        return r[..., :Lk]
    flat = r.reshape(B, H, Lq * W)[..., Lq - 1: Lq - 1 + Lq * (W - 1)]
    return flat.reshape(B, H, Lq, W - 1)[..., :Lk]


def reachable_rows_causal(table: torch.Tensor, Lq: int, max_len: int) -> torch.Tensor:
    """HUANG-4 with causal default positions: only distances -(Lq-1) .. 0 can be allowed.

    (R, d) -> (Lq, d) or (H, R, d) -> (H, Lq, d), zero rows beyond the table.
    """
    lo, hi = max_len - Lq, max_len - 1  # table rows of distances -(Lq-1) and 0
    rows = table[..., max(lo, 0): hi + 1, :]
    return torch.nn.functional.pad(rows, (0, 0, max(0, -lo), 0)) if lo < 0 else rows


def skew_causal(r: torch.Tensor, Lk: int) -> torch.Tensor:
    """The Music Transformer skew for causal attention: out[..., i, j] = r[..., i, j - i + Lq - 1] for j <= i.

    r is (B, H, Lq, Lq), column m holding distance m - (Lq - 1). Pad one zero
    column on the left, read the (Lq, Lq + 1) block as (Lq + 1, Lq), drop the
    first row: entry (i, j) is then padded[i, Lq - i + j]. Entries with j > i
    are not defined (the causal mask removes them); keys past Lq are zero.
    """
    B, H, Lq, _ = r.shape
    padded = torch.nn.functional.pad(r, (1, 0))  # (B, H, Lq, Lq + 1)
    out = padded.reshape(B, H, Lq + 1, Lq)[:, :, 1:, :]
    return out[..., :Lk] if Lk <= Lq else torch.nn.functional.pad(out, (0, Lk - Lq))


def bucket_sums_banded(w: torch.Tensor, max_distance: int) -> torch.Tensor:
    """SHAW-4 for default positions (delta = j - i), without a scatter over (Lq, Lk).

    Interior rows (|c| < k) are the entries w[i, i + c]: one gather of
    (Lq, 2k - 1) columns. The edge rows are prefix sums over the keys:
    S[i, 0] = sum_{j <= i-k} w_ij = cumsum[i, i-k] and
    S[i, 2k] = sum_{j >= i+k} w_ij = total_i - cumsum[i, i+k-1], reading the
    cumulative sum at clamped columns (it saturates at the row total).
    """
    B, H, Lq, Lk = w.shape
    k = max_distance
    total = w.sum(dim=-1, keepdim=True)  # (B, H, Lq, 1)
    if k == 0:
        return total
    i = torch.arange(Lq, device=w.device).unsqueeze(1)
    cols = i + torch.arange(-k + 1, k, device=w.device)  # (Lq, 2k - 1) key of each interior bucket
    inside = (cols >= 0) & (cols < Lk)
    interior = torch.gather(w, -1, cols.clamp(0, Lk - 1).expand(B, H, Lq, 2 * k - 1)).masked_fill(~inside, 0.0)
    csum = w.cumsum(dim=-1)
    edge_cols = torch.cat([i - k, i + k - 1], dim=1)  # (Lq, 2)
    edges = torch.gather(csum, -1, edge_cols.clamp(0, Lk - 1).expand(B, H, Lq, 2))
    left = edges[..., :1].masked_fill(i - k < 0, 0.0)
    right = total - edges[..., 1:]
    return torch.cat([left, interior, right], dim=-1)
