"""A naive attention computed in a given dtype, emulated in NumPy (PREC-2).

This is what a straightforward implementation in dtype ``t`` would compute:
every stored tensor rounded to ``t``, matmuls accumulated in float32 for the
16-bit types (in ``t`` otherwise), the softmax in float32 (in float64 for
float64). Its error against the float64 truth is ``e_base``, the unit of the
tolerance budgets. Two operation orders (``ORDERS``) are provided: order 0
scales the logits after ``q @ k.T`` and sums every contraction front to back;
order 1 scales the query first (as Flax and ONNX do) and sums every
contraction back to front. ``e_base`` is the larger of their errors, so it
measures rounding that depends on the order of operations, as a different
implementation's would.

It is a second implementation of the rules, independent of ``numpy_ref``:
it imports nothing from it (``tests/test_naive.py`` enforces that), so a bug
in the reference cannot move the budgets the same way; at float64 the test
suite checks the two against each other.

Layout: ``precision`` (rounding, ORDERS), ``keys`` (distances, allowed and
dead keys), ``tables`` (gather, scatter-add, sum-to-shape), ``core`` (forward
and backward), ``schemes/`` (one module of hooks per position scheme, found
by ``scheme.name``).
"""

from __future__ import annotations

from .core import backward, forward, logit_magnitude, summands
from .precision import ORDERS, Precision, storage_dtype

__all__ = ["forward", "backward", "summands", "logit_magnitude", "ORDERS", "storage_dtype", "Precision"]
