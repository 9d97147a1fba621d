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

from ._workspace import take


def rows_logits(q: torch.Tensor, table: torch.Tensor, out=None) -> torch.Tensor:
    """q @ table.T per head: (B, H, Lq, d) x (R, d) | (H, R, d) | (b, 1|H, R, d) -> (B, H, Lq, R)."""
    if table.dim() == 3:
        table = table.unsqueeze(0)
    if out is None:
        return q @ table.transpose(-1, -2)
    return torch.matmul(q, table.transpose(-1, -2), out=out)


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
    return delta.clamp(-max_distance, max_distance).add_(max_distance)  # clamp's result is new: add in place


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
                    causal: bool, ws=None) -> torch.Tensor:
    """HUANG-4 with default positions for queries q_start .. q_start + Lq - 1 and keys 0 .. Lk - 1.

    One matmul of the queries with the table rows of every distance they can
    meet, then the skew. Column m of that product holds distance
    m - (q_start + Lq - 1). ``causal``: only distances <= 0 are computed, and
    the term at keys after the diagonal holds some finite value: the caller
    masks those keys (CAUSAL-1).
    ``ws``: a Workspace for the (Lq, width) products, or None.
    """
    Lq = q.shape[-2]
    first = -(q_start + Lq - 1)  # the distance of column 0
    width = Lq + Lk - 1
    if not causal:
        width += -width % 16  # zero rows up to a multiple of 16: never read, and the matmul is faster
        out = take(ws, "rows", q.shape[:-1] + (width,), q.dtype)
        return skew(rows_logits(q, distance_rows(table, first, width, max_len), out), Lk)
    n = min(width, 1 - first)  # distances first .. 0
    r = rows_logits(q, distance_rows(table, first, n, max_len), take(ws, "rows", q.shape[:-1] + (n,), q.dtype))
    if ws is not None and Lk <= n and Lq > 1:
        # The skew read with row stride n - 1 straight from the (Lq, n) product: keys after the
        # diagonal read values of the next row, and no padded copy is written. (Only without a
        # recorded gradient: the view overlaps itself.)
        B, H = r.shape[:2]
        return r.as_strided((B, H, Lq, Lk), (H * Lq * n, Lq * n, n - 1, 1), r.storage_offset() + Lq - 1)
    return skew(torch.nn.functional.pad(r, (0, width - n)), Lk)


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


def shaw_band_index(rows: int, max_distance: int, device) -> torch.Tensor:
    """SHAW-2 for a tile of queries q0 .. q0 + rows - 1 and keys q0 - k + 1 .. q0 + rows + k - 2.

    (rows, rows + 2k - 2): entry [i', c] is clip(c - i' - k + 1, -k, k) + k,
    the same for every q0 (the index depends on j - i only).
    """
    k = max_distance
    c = torch.arange(max(rows + 2 * k - 2, 0), device=device) - torch.arange(rows, device=device).unsqueeze(1) - k + 1
    return c.clamp_(-k, k).add_(k)


def shaw_key_term_banded(r: torch.Tensor, q_start: int, Lk: int, max_distance: int, band: torch.Tensor,
                         out=None) -> torch.Tensor:
    """SHAW-3 for default positions: the (B, H, R, Lk) key term of queries q_start .. q_start + R - 1.

    r: (B, H, R, 2k + 1) table logits. Keys up to q_start - k are at distance
    <= -k from every query of the tile (row 0 of the table), keys from
    q_start + R + k - 1 on at distance >= k (row 2k): both are broadcast
    copies. Only the R + 2k - 2 keys between them need a gather, through
    ``band = shaw_band_index(R_max, k)``. No (Lq, Lk) index is read.
    ``out``: where to write the term, or None.
    """
    B, H, R, _ = r.shape
    k = max_distance
    a, b = q_start - k + 1, q_start + R + k - 1  # the keys between the two clipped regions
    lo = min(max(a, 0), Lk)
    hi = max(min(b, Lk), lo)  # (with k = 0, a > b: no keys between)
    parts = []
    if lo > 0:
        parts.append(r[..., :1].expand(B, H, R, lo))
    if hi > lo:
        parts.append(torch.gather(r, -1, band[:R, lo - a: hi - a].expand(B, H, R, hi - lo)))
    if Lk > hi:
        parts.append(r[..., -1:].expand(B, H, R, Lk - hi))
    if out is not None:
        return out.copy_(parts[0]) if len(parts) == 1 else torch.cat(parts, dim=-1, out=out)
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts, dim=-1)


def band_index(Lq: int, max_distance: int, device) -> torch.Tensor:
    """The key of each interior bucket of ``bucket_sums_banded`` for queries 0 .. Lq - 1: (Lq, 2k - 1),
    i + c for c = -k + 1 .. k - 1, possibly outside the keys. Tiles slice their rows."""
    return torch.arange(Lq, device=device).unsqueeze(1) + torch.arange(-max_distance + 1, max_distance,
                                                                       device=device)


def edge_masks(rows: int, dtype, device) -> tuple:
    """The 0/1 triangles of ``bucket_sums_banded`` for tiles of up to ``rows`` queries: strictly lower, upper."""
    i = torch.arange(rows, device=device)
    below = i.unsqueeze(0) < i.unsqueeze(1)  # [i', c']: c' < i'
    return below.to(dtype), (~below).to(dtype)


def bucket_sums_banded(w: torch.Tensor, max_distance: int, q_start: int = 0, masks=None, band=None) -> torch.Tensor:
    """SHAW-4 for default positions (delta = j - i), without a scatter and without an (Lq, Lk) index.

    w holds queries i = q_start .. q_start + R - 1 and keys j = 0 .. Lk - 1.
    Interior rows (|c| < k) are the entries w[i, i + c]: a gather of
    (R, 2k - 1) columns. The left edge S[i, 0] sums j <= i - k: keys up to
    q_start - k belong to it for every query (a plain row sum of that
    prefix), the next R keys by a strictly lower triangle. The right edge
    S[i, 2k] sums j >= i + k: keys from q_start + R + k on for every query,
    the R keys before them by an upper triangle. About one read of w for
    both edges and no cancellation; with short tiles the triangles are small.
    ``masks``: ``edge_masks(R_max, ...)`` and ``band``: the rows q_start ..
    q_start + R - 1 of ``band_index``, when the caller has them.
    """
    B, H, R, Lk = w.shape
    k = max_distance
    if k == 0:
        return w.sum(dim=-1, keepdim=True)
    cols = band_index(q_start + R, k, w.device)[q_start:] if band is None else band
    if q_start - k + 1 >= 0 and q_start + R + k - 2 < Lk:  # every interior bucket of this tile has its key
        interior = torch.gather(w, -1, cols.expand(B, H, R, 2 * k - 1))
    else:
        interior = torch.gather(w, -1, cols.clamp(0, Lk - 1).expand(B, H, R, 2 * k - 1))
        interior = interior.masked_fill((cols < 0) | (cols >= Lk), 0.0)
    below, upper = edge_masks(R, w.dtype, w.device) if masks is None else (m[:R, :R] for m in masks)

    def edge(all_rows: slice, tri_start: int, tri: torch.Tensor) -> torch.Tensor:
        """sum of w over the keys of all_rows, plus the triangle tri on keys tri_start .. tri_start + R - 1."""
        a, z = max(all_rows.start, 0), min(all_rows.stop, Lk)
        total = w[..., a:z].sum(dim=-1) if a < z else w.new_zeros(B, H, R)
        a, z = max(tri_start, 0), min(tri_start + R, Lk)
        if a < z:
            total = total + torch.linalg.vecdot(w[..., a:z], tri[:, a - tri_start: z - tri_start])
        return total.unsqueeze(-1)

    left = edge(slice(0, q_start - k + 1), q_start - k + 1, below)
    right = edge(slice(q_start + R + k, Lk), q_start + k, upper)
    return torch.cat([left, interior, right], dim=-1)
