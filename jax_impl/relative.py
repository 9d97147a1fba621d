"""The former home of the relative-position helpers, kept as an import path for existing callers.

The algorithms live in ``jax_impl.schemes`` (one module per scheme, REL-4;
the shared table operations in ``schemes/_tables.py``); this module only
re-exports them (SHAW-2..SHAW-4, HUANG-2..HUANG-4), under the names
torch_impl.relative uses for the same contracts.
"""

from .schemes._tables import bucket_sums, gather_rows, rows_logits, rows_sum
from .schemes.huang import distance_rows, huang_index, huang_skew_term, skew
from .schemes.shaw import bucket_sums_banded, shaw_index

__all__ = [
    "bucket_sums",
    "bucket_sums_banded",
    "distance_rows",
    "gather_rows",
    "huang_index",
    "huang_skew_term",
    "rows_logits",
    "rows_sum",
    "shaw_index",
    "skew",
]
