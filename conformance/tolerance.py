"""Tolerance budgets (PREC-2): ``budget = k * e_base + floor``.

``e_base`` is the largest error, against the float64 truth, of the naive
same-dtype computation (``conformance.naive``) over its two operation
orders. ``floor = FLOOR_ULPS * eps(dtype) * scale`` covers the rounding of
the result itself: an implementation that computed exactly and rounded once
would still be off by up to half an ulp of the largest entry, and on small
cases errors come in whole ulps, so one naive sample can be luckier than
another correct order by a few of them. FLOOR_ULPS = 4 (still far tighter
than the framework test defaults, e.g. torch.testing's rtol of about 11
float32 ulps). ``scale`` is
max|truth|, except for a projection-bias gradient (grad/bq, bk, bv, bo),
which is a sum over every batch element and position and can cancel to
nearly 0 (grad/bk does, exactly, in theory: softmax ignores a constant added
to every key): its scale is that of its weight's gradient (grad/wq, ...), a
sum of the same terms each multiplied by an input of order 1.

PREC-6 adds two terms to the floor, FLOOR_ULPS ulps each of the accumulation
dtype (float32 for the 16-bit types, PREC-4): ``summands``, the output's
*summand scale* (``naive.summands``: max over its entries of sum |product|
of the products that sum into it, two contractions deep), so that a truth
that cancels to nearly 0 (grad/bk is exactly 0 in theory: softmax ignores a
constant added to every logit of a row) gets the budget of a zero computed
from terms of that size, in any order; and ``logits * scale``, the
association of a logit's terms (``naive.logit_magnitude``: sum |term| of a
logit of several terms, content, relative term and biases): an error of
eps * |logit| in a logit moves its weight by that relative amount, and no
naive order associates the terms otherwise. The float64 battery
(``tests/test_float64_battery.py``: the reference in other summation orders,
torch and jax in float64) passes every check at margin <= 0.5.

The factors ``k`` (written in spec/attention.md, PREC-2, with the reasoning):
- outputs and weights, 2: the rule FlashAttention's tests use against a
  same-dtype reference; a fused kernel reorders sums but should not be more
  than twice as wrong as the plain computation;
- gradients, 3: a backward pass has about twice the depth of rounded
  operations of the forward pass (recomputed weights, two more matmuls per
  input), and implementations legitimately recompute instead of storing.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

K = {"out": 2.0, "weights": 2.0, "grad": 3.0}
FLOOR_ULPS = 4.0

EPS = {
    "float64": float(np.finfo(np.float64).eps),
    "float32": float(np.finfo(np.float32).eps),
    "float16": float(np.finfo(np.float16).eps),
    "bfloat16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps),
}


#: The dtype each test dtype sums in (PREC-2's naive computation; PREC-4 for the 16-bit types).
ACCUMULATION = {"float64": "float64", "float32": "float32", "float16": "float32", "bfloat16": "float32"}


def k_for(output: str) -> float:
    return K["grad"] if output.startswith("grad/") else K[output]


def max_error(actual: np.ndarray, truth: np.ndarray) -> float:
    """max |actual - truth| over the entries where the truth is finite."""
    finite = np.isfinite(truth)
    if not finite.any():
        return 0.0
    return float(np.max(np.abs(np.asarray(actual, np.float64)[finite] - truth[finite])))


def magnitude(truth: np.ndarray) -> float:
    return float(np.max(np.abs(truth[np.isfinite(truth)]), initial=0.0))


def floor_scale(output: str, goldens: dict) -> float:
    """max|truth| of the output, or of its weight's gradient for a bias gradient.

    A gradient whose truth is exactly 0 everywhere is a cancellation the
    rules imply (the query and key gradients of rows with a single allowed
    key: softmax ignores a constant added to every logit). A correct
    implementation whose backward pass is written another way (SDPA's
    ``dS = P * (dP - rowsum(dO * O))``) leaves rounding of the cancelled
    terms there, so such a gradient takes the largest gradient magnitude
    of the case as its scale instead of 0 (a budget of 0 would demand the
    same formula, not the same function).
    """
    scale = magnitude(goldens[output])
    if output in ("grad/bq", "grad/bk", "grad/bv", "grad/bo"):
        scale = max(scale, magnitude(goldens["grad/w" + output[-1]]))
    if scale == 0.0 and output.startswith("grad/"):
        scale = max(magnitude(t) for n, t in goldens.items() if n.startswith("grad/"))
    return scale


def budget(output: str, dtype: str, e_base: float, scale: float, summands: float = 0.0, logits: float = 0.0) -> dict:
    """PREC-2's ``k * e_base + floor``, the floor with PREC-6's terms: ``summands`` the output's summand scale
    (``naive.summands``), ``logits`` the case's largest allowed |logit| (``naive.logit_magnitude``)."""
    k = k_for(output)
    acc = EPS[ACCUMULATION[dtype]]
    floor = FLOOR_ULPS * (EPS[dtype] * scale + acc * (summands + logits * scale))
    entry = {"e_base": e_base, "k": k, "floor": floor, "budget": k * e_base + floor}
    if summands or logits:
        entry.update(scale=scale, summands=summands, logits=logits)
    return entry
