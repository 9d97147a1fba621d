"""Relative-position table machinery: lookups, the skew, bucket sums, and their VJPs.

The scheme modules (``numpy_ref/schemes/``) build their hooks from these
units (REL-3); the index helpers are also what the conformance checks use.
Rules SHAW-1..SHAW-7, HUANG-1..HUANG-6, REL-1, REL-2. Nothing here builds an
array of shape (Lq, Lk, d): a relative term is always ``q @ table.T`` (one
logit per query and table row) followed by an index operation on the last
axis, and the Shaw value term goes the other way round (weights summed per
table row, then ``@ table``).

Shapes: q (B, H, Lq, d); a table is (R, d) shared by heads or (H, R, d) per
head; ``delta`` is (1 or B, Lq, Lk).
"""

from __future__ import annotations

import numpy as np


# ----------------------------------------------------------------- table matmuls
def as_4d(table: np.ndarray) -> np.ndarray:
    """A shared (R, d) or per-head (H, R, d) table as (1, 1 or H, R, d), for broadcasting."""
    return table.reshape((1,) * (4 - table.ndim) + table.shape)


def sum_to(x: np.ndarray, shape) -> np.ndarray:
    """GRAD-1: sum x over the axes that broadcasting added or stretched, back to ``shape``.

    The gradient of an input that broadcasting widened."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def rows_logits(q: np.ndarray, table4: np.ndarray) -> np.ndarray:
    """q @ table.T per (batch, head): (B, H, Lq, d), (1|B, 1|H, R, d) -> (B, H, Lq, R)."""
    return q @ table4.swapaxes(-1, -2)


def rows_logits_vjp(q: np.ndarray, table4: np.ndarray, g: np.ndarray):
    """GRAD-1, the VJP of ``rows_logits``: (dq, dtable4) from g (B, H, Lq, R)."""
    return g @ table4, sum_to(g.swapaxes(-1, -2) @ q, table4.shape)


# ------------------------------------------------------- gather / scatter buckets
def gather_buckets(r: np.ndarray, index: np.ndarray) -> np.ndarray:
    """out[b, h, i, j] = r[b, h, i, index[b, i, j]].   (B, H, Lq, R) -> (B, H, Lq, Lk)."""
    return np.take_along_axis(r, index[:, None], axis=-1)


def scatter_buckets(g: np.ndarray, index: np.ndarray, num_rows: int) -> np.ndarray:
    """out[b, h, i, r] = sum_j g[b, h, i, j] * [index[b, i, j] == r].

    The adjoint of ``gather_buckets``, and the Shaw value-side bucket sum
    (SHAW-4). (B, H, Lq, Lk) -> (B, H, Lq, R), one ``bincount``.
    """
    B, H, Lq, Lk = g.shape
    index = np.broadcast_to(index[:, None], g.shape)
    rows = np.arange(B * H * Lq, dtype=np.int64).reshape(B, H, Lq, 1) * num_rows
    flat = (rows + index).ravel()
    out = np.bincount(flat, weights=g.ravel(), minlength=B * H * Lq * num_rows)
    return out.reshape(B, H, Lq, num_rows)


def gather_logits(q: np.ndarray, table4: np.ndarray, index: np.ndarray) -> np.ndarray:
    """SHAW-3 / HUANG-4: out[b, h, i, j] = q_i . table[index[b, i, j]], as ``q @ table.T`` then a gather.

    q (B, H, Lq, d), table4 (1|B, 1|H, R, d), index (1|B, Lq, Lk) -> (B, H, Lq, Lk).
    """
    return gather_buckets(rows_logits(q, table4), index)


def gather_logits_vjp(q: np.ndarray, table4: np.ndarray, index: np.ndarray, g: np.ndarray):
    """VJP of ``gather_logits``: (dq, dtable4) from g (B, H, Lq, Lk) (GRAD-1)."""
    return rows_logits_vjp(q, table4, scatter_buckets(g, index, table4.shape[-2]))


def gather_key_side(k: np.ndarray, table4: np.ndarray, index: np.ndarray) -> np.ndarray:
    """SHAW-6: out[b, h, i, j] = k_j . table[index[b, i, j]], as ``k @ table.T`` (B, H, Lk, R) then a
    gather along the rows for each key.

    k (B, H, Lk, d), table4 (1|B, 1|H, R, d), index (1|B, Lq, Lk) -> (B, H, Lq, Lk).
    """
    return np.take_along_axis(rows_logits(k, table4).swapaxes(-1, -2), index[:, None], axis=-2)


def gather_key_side_vjp(k: np.ndarray, table4: np.ndarray, index: np.ndarray, g: np.ndarray):
    """VJP of ``gather_key_side``: (dk (B, H, Lk, d), dtable4) from g (B, H, Lq, Lk) (GRAD-1).

    Key j's row gradients sum g over the queries that read each row: the bucket sum of the
    transposed problem.
    """
    g_rows = scatter_buckets(g.swapaxes(-1, -2), index.swapaxes(-1, -2), table4.shape[-2])  # (B, H, Lk, R)
    return rows_logits_vjp(k, table4, g_rows)


# ------------------------------------------------------------------------- Shaw
def shaw_index(delta: np.ndarray, max_distance: int) -> np.ndarray:
    """SHAW-2: index = clip(delta, -k, k) + k, in [0, 2k]."""
    return np.clip(delta, -max_distance, max_distance) + max_distance


# ------------------------------------------------------------------------ Huang
def huang_index(delta: np.ndarray, max_len: int):
    """HUANG-2: (row, valid): row = delta + M - 1 where |delta| <= M - 1 (HUANG-3: else no term)."""
    valid = np.abs(delta) <= max_len - 1
    return np.where(valid, delta + max_len - 1, 0), valid


def contiguous_offset(q_positions: np.ndarray, k_positions: np.ndarray):
    """The per-batch offset c = k_pos[0] - q_pos[0] when both position rows are
    runs of consecutive integers (then delta[i, j] = j - i + c), else None."""
    for p in (q_positions, k_positions):
        if p.shape[1] > 1 and not np.all(np.diff(p, axis=1) == 1):
            return None
    return k_positions[:, 0] - q_positions[:, 0]  # (1 or B,)


def reachable_rows(table4: np.ndarray, offset: np.ndarray, Lq: int, Lk: int, max_len: int):
    """The table rows for distances c-(Lq-1) .. c+(Lk-1), zero beyond the table (HUANG-3).

    ``table4`` is the table as ``as_4d`` gives it. Returns (rows (1|B, 1|H, W, d),
    table_row (1|B, W), valid (1|B, W)), W = Lq + Lk - 1. Only these rows
    enter the matmul (HUANG-4).
    """
    W = Lq + Lk - 1
    dist = offset[:, None] - (Lq - 1) + np.arange(W)  # (1 or B, W)
    row = dist + max_len - 1
    valid = (row >= 0) & (row <= 2 * max_len - 2)
    row = np.where(valid, row, 0)
    rows = table4[0][:, row].transpose(1, 0, 2, 3)  # (1|H, b, W, d) -> (b, 1|H, W, d)
    return np.where(valid[:, None, :, None], rows, 0.0), row, valid


def skew(r: np.ndarray, Lk: int) -> np.ndarray:
    """HUANG-4: out[..., i, j] = r[..., i, j - i + Lq - 1] as a zero-copy strided view.

    r is (B, H, Lq, W) with W = Lq + Lk - 1, column m holding distance
    c - (Lq - 1) + m. Element (i, j - i + Lq - 1) sits at flat offset
    (Lq - 1) + i * (W - 1) + j of each (Lq, W) block, so the view starts at
    Lq - 1 and steps W - 1 per query and 1 per key: no copy, no loop.
    """
    r = np.ascontiguousarray(r)
    B, H, Lq, W = r.shape
    item = r.itemsize
    base = r.reshape(B, H, Lq * W)[..., Lq - 1 :]
    return np.lib.stride_tricks.as_strided(
        base,
        shape=(B, H, Lq, Lk),
        strides=(r.strides[0], r.strides[1], (W - 1) * item, item),
        writeable=False,
    )


def unskew(g: np.ndarray, W: int) -> np.ndarray:
    """GRAD-1, the adjoint of ``skew``: scatter g (B, H, Lq, Lk) back to (B, H, Lq, W).

    The skew maps distinct (i, j) to distinct columns, so a write through the
    same strided view is an exact scatter.
    """
    B, H, Lq, Lk = g.shape
    out = np.zeros((B, H, Lq, W))
    item = out.itemsize
    view = np.lib.stride_tricks.as_strided(
        out.reshape(B, H, Lq * W)[..., Lq - 1 :],
        shape=(B, H, Lq, Lk),
        strides=(out.strides[0], out.strides[1], (W - 1) * item, item),
    )
    view[...] = g
    return out


def scatter_rows(shape, row: np.ndarray, valid: np.ndarray, g_rows: np.ndarray) -> np.ndarray:
    """GRAD-1, the adjoint of ``reachable_rows``: add per-distance gradients back into table rows.

    g_rows is (1|B, 1|H, W, d) as ``reachable_rows`` returned it; the result
    is the 4-d table (1, 1|H, R, d).
    """
    out = np.zeros(shape)
    g = g_rows.transpose(1, 0, 2, 3)  # (1|H, b, W, d)
    np.add.at(out[0], (slice(None), row[valid]), g[:, valid])
    return out
