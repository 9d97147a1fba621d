"""Rounding and accumulation of the naive emulation (PREC-2).

What a straightforward implementation in dtype ``t`` does: every stored
tensor is rounded to ``t``; matmuls accumulate in float32 for the 16-bit
types (in ``t`` otherwise); the softmax runs in that same accumulation dtype.
Two operation orders (ORDERS) differ in where the logit scale is applied (in
``core``) and in the direction of every contraction (here).

The stored budgets (``conformance/goldens/manifest.json``) were made with
exactly this sequence of roundings: change nothing here without regenerating
them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

#: Order 0 scales the logits after ``q @ k.T`` and sums front to back; order 1
#: scales the query first (as Flax and ONNX do) and sums back to front.
ORDERS = (0, 1)


def storage_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a test dtype name ("float64", "float32", "float16", "bfloat16")."""
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


class Precision:
    """Rounding to the storage dtype ``t`` and arithmetic in the accumulation dtype ``acc``."""

    def __init__(self, name: str, order: int = 0):
        self.t = storage_dtype(name)
        self.acc = np.dtype(np.float64 if name == "float64" else np.float32)
        self.reverse = order == 1

    def rnd(self, x) -> np.ndarray:
        """Store in t (round), compute on in acc."""
        return np.asarray(x).astype(self.acc).astype(self.t).astype(self.acc)

    def dot(self, a, b) -> np.ndarray:
        """a @ b in acc, contracting front to back or (order 1) back to front."""
        a, b = a.astype(self.acc), b.astype(self.acc)
        if self.reverse:
            a, b = a[..., ::-1], b[..., ::-1, :]
        return a @ b

    def mm(self, a, b) -> np.ndarray:
        """A matmul of t-valued operands, accumulated in acc, rounded to t."""
        return self.rnd(self.dot(a, b))

    def rowsum(self, x) -> np.ndarray:
        """Sum over the last (key) axis, one term after another, in acc (keeps the axis)."""
        x = np.asarray(x, self.acc)
        return np.cumsum(x[..., ::-1] if self.reverse else x, axis=-1)[..., -1:]

    def lin(self, x, w, b) -> np.ndarray:
        """x @ w (+ b) in acc, rounded to t once (PROJ-1)."""
        y = self.dot(x, w)
        return self.rnd(y if b is None else y + b)
