"""Table-row gather, its adjoint (scatter-add) and sum-to-shape, for the naive emulation.

Rules REL-1, REL-2, SHAW-3, SHAW-4. Axis legend: B batch, H heads, Lq query
length, Lk key length, R table rows, d head dim. A relative term is one logit
per query and table row, ``rows = q @ table.T`` (B, H, Lq, R), then a
per-(b, i, j) row choice; the value side goes the other way round.

Independent of ``numpy_ref.relative`` on purpose (the naive emulation is the
unit of the budgets and the reference's second implementation): the gather
is explicit fancy indexing over an open grid, not ``take_along_axis``; the
scatter is ``np.add.at``, not a flattened ``bincount``; ``sum_to`` checks
that its target broadcasts to the input. Only integer indexing may differ
from the reference: the floating-point sums (float64, one key after another,
and the two-step reduction of ``sum_to``) are those the stored budgets were
made with.
"""

from __future__ import annotations

import numpy as np


def as_4d(table: np.ndarray) -> np.ndarray:
    """A shared (R, d) or per-head (H, R, d) table as (1, 1|H, R, d), for broadcasting (REL-2)."""
    return table.reshape((1,) * (4 - table.ndim) + table.shape)


def _grid(B: int, H: int, Lq: int):
    """Open index grids b (B, 1, 1, 1), h (1, H, 1, 1), i (1, 1, Lq, 1)."""
    b, h, i, _ = np.ogrid[:B, :H, :Lq, :1]
    return b, h, i


def gather(rows: np.ndarray, index: np.ndarray) -> np.ndarray:
    """out[b, h, i, j] = rows[b, h, i, index[b, i, j]].

    rows (B, H, Lq, R), index (1|B, Lq, Lk) int -> (B, H, Lq, Lk).
    """
    b, h, i = _grid(*rows.shape[:3])
    return rows[b, h, i, index[:, np.newaxis]]


def scatter_add(g: np.ndarray, index: np.ndarray, num_rows: int) -> np.ndarray:
    """out[b, h, i, r] = sum_j g[b, h, i, j] * [index[b, i, j] == r]: the adjoint of ``gather``.

    g (B, H, Lq, Lk), index (1|B, Lq, Lk) int -> (B, H, Lq, R), float64. Also
    the Shaw value-side bucket sum (SHAW-4). ``np.add.at`` is unbuffered and
    goes through the indices in C order, so each bucket is a float64 sum of
    its terms in key order starting from 0: the sum the budgets were made with.
    """
    B, H, Lq, _ = g.shape
    out = np.zeros((B, H, Lq, num_rows), dtype=np.float64)
    b, h, i = _grid(B, H, Lq)
    np.add.at(out, (b, h, i, index[:, np.newaxis]), np.asarray(g, dtype=np.float64))
    return out


def sum_to(x: np.ndarray, shape) -> np.ndarray:
    """The adjoint of broadcasting ``shape`` up to ``x.shape``: sum x back down to ``shape``.

    One reduction over the axes broadcasting prepended, then one (keeping
    them) over the axes it stretched from 1; that grouping of the sums is
    part of the floating-point sequence the budgets were made with.
    """
    shape = tuple(shape)
    # broadcasting aligns from the right; each target axis is 1 or the full size
    if len(shape) > x.ndim or any(want not in (1, have) for want, have in zip(shape[::-1], x.shape[::-1])):
        raise ValueError(f"sum_to: expected a shape that broadcasts to {x.shape}, got {shape}")
    prepended = tuple(range(x.ndim - len(shape)))
    y = np.add.reduce(x, axis=prepended) if prepended else x
    stretched = tuple(a for a, (want, have) in enumerate(zip(shape, y.shape)) if want == 1 and have != 1)
    y = np.add.reduce(y, axis=stretched, keepdims=True) if stretched else y
    assert y.shape == shape, (y.shape, shape)
    return y


def gather_keys(rows: np.ndarray, index: np.ndarray) -> np.ndarray:
    """out[b, h, i, j] = rows[b, h, j, index[b, i, j]]: a key-side term (SHAW-6).

    rows (B, H, Lk, R) (one logit per key and table row), index (1|B, Lq, Lk) int -> (B, H, Lq, Lk).
    """
    B, H, Lk, _ = rows.shape
    b, h, _, j = np.ogrid[:B, :H, :1, :Lk]
    return rows[b, h, j, index[:, np.newaxis]]


def scatter_keys(g: np.ndarray, index: np.ndarray, num_rows: int) -> np.ndarray:
    """out[b, h, j, r] = sum_i g[b, h, i, j] * [index[b, i, j] == r]: the adjoint of ``gather_keys``.

    g (B, H, Lq, Lk) -> (B, H, Lk, R), float64, each bucket summed in query order by ``np.add.at``.
    """
    B, H, _, Lk = g.shape
    out = np.zeros((B, H, Lk, num_rows), dtype=np.float64)
    b, h, _, j = np.ogrid[:B, :H, :1, :Lk]
    np.add.at(out, (b, h, j, index[:, np.newaxis]), np.asarray(g, dtype=np.float64))
    return out
