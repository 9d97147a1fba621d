"""The former home of the relative-position helpers, kept as an import path for existing callers.

The algorithms live in ``torch_impl.schemes`` (one module per scheme,
REL-4; the shared table operations in ``schemes/_tables.py``); this module
only re-exports them under their old names (SHAW-2..SHAW-4, HUANG-2..HUANG-4).
"""

from .schemes._tables import bucket_sums, gather_rows, rows_logits
from .schemes.huang import distance_rows, huang_index, huang_skew_term, skew
from .schemes.shaw import bucket_sums_banded, edge_masks, shaw_index
from .schemes.shaw import key_band_index as shaw_band_index
from .schemes.shaw import key_term_banded as shaw_key_term_banded
from .schemes.shaw import value_band_index as band_index

__all__ = [
    "band_index",
    "bucket_sums",
    "bucket_sums_banded",
    "distance_rows",
    "edge_masks",
    "gather_rows",
    "huang_index",
    "huang_skew_term",
    "rows_logits",
    "shaw_band_index",
    "shaw_index",
    "shaw_key_term_banded",
    "skew",
]
