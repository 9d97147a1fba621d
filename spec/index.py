"""Framework-neutral index arithmetic that several backends share (plain Python ints, no arrays).

Only integer bookkeeping lives here, so that torch_impl and jax_impl (which
depend on ``spec`` alone) compute the same ranges with the same code.
"""

from __future__ import annotations

from typing import NamedTuple, Optional


class RowSpan(NamedTuple):
    """Table rows ``first_row .. last_row`` (inclusive), padded by zero rows before and after."""

    first_row: int
    last_row: int
    pad_before: int
    pad_after: int


def distance_row_span(first: int, count: int, max_len: int) -> Optional[RowSpan]:
    """The Huang table rows (HUANG-2) of the distances ``first .. first + count - 1``.

    Row ``r`` of a ``2M - 1``-row table holds distance ``r - (M - 1)``; a
    distance beyond the table contributes zero (HUANG-3), i.e. a zero row.
    Returns the slice of real rows and how many zero rows pad it on each
    side, or None when no distance of the range is in the table.
    """
    R = 2 * max_len - 1
    lo, hi = first + max_len - 1, first + count - 1 + max_len - 1  # wanted rows, may overhang
    a, b = max(lo, 0), min(hi, R - 1)
    if a > b:
        return None
    return RowSpan(a, b, a - lo, hi - b)
