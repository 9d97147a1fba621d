"""Argument checking and exact conversion to float64 for the reference.

The reference accepts any floating dtype (float16, bfloat16, float32,
float64) and converts it to float64, which is exact (PREC-1). Everything else
about the arguments is checked by ``spec.validation`` so that every
implementation words its errors the same way (INPUT-1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from spec import AttentionSpec
from spec.validation import ArrayInfo, Dims, check_call, check_params, fail_value

# 16-bit float types that NumPy itself does not classify as floating.
_EXTRA_FLOAT_NAMES = frozenset({"bfloat16"})


def dtype_kind(dtype: np.dtype) -> str:
    """The ``spec.validation`` kind of a NumPy dtype."""
    if dtype.kind == "f" or dtype.name in _EXTRA_FLOAT_NAMES:
        return "float"
    return {"i": "int", "u": "int", "b": "bool", "c": "complex"}.get(dtype.kind, "other")


def describe(x) -> Optional[ArrayInfo]:
    if x is None:
        return None
    a = np.asarray(x)
    return ArrayInfo(tuple(a.shape), dtype_kind(a.dtype), a.dtype.name)


def as_f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


@dataclass(frozen=True)
class Call:
    """One validated call: float64 arrays, integer positions, resolved sizes."""

    dims: Dims
    params: dict
    query: np.ndarray  # (B, Lq, D)
    key: np.ndarray  # (B, Lk, D)
    value: np.ndarray  # (B, Lk, D)
    mask: Optional[np.ndarray]  # bool, as given (broadcastable)
    bias: Optional[np.ndarray]  # float64, as given (broadcastable)
    q_positions: np.ndarray  # int64 (1 or B, Lq)
    k_positions: np.ndarray  # int64 (1 or B, Lk)
    dropout_keep: Optional[np.ndarray]  # bool (B, H, Lq, Lk)


def _positions(x, L: int) -> np.ndarray:
    """POS-1: None -> arange(L); (L,) and (B, L) -> int64 (1 or B, L)."""
    if x is None:
        return np.arange(L, dtype=np.int64)[None, :]
    p = np.asarray(x).astype(np.int64)
    return p[None, :] if p.ndim == 1 else p


def prepare(
    spec: AttentionSpec, params, query, key, value, *, mask, bias, q_positions, k_positions, dropout_keep
) -> Call:
    """Validate every argument (INPUT-1) and convert to the reference's types: the default positions (POS-1),
    no keep mask without one (DROP-3: no dropout)."""
    if not isinstance(params, dict):
        raise TypeError(f"params: expected a dict of arrays, got {type(params).__name__}")
    info = {n: describe(a) for n, a in params.items()}
    dims = check_call(
        spec,
        describe(query),
        describe(key),
        describe(value),
        mask=describe(mask),
        bias=describe(bias),
        q_positions=describe(q_positions),
        k_positions=describe(k_positions),
        dropout_keep=describe(dropout_keep),
    )
    check_params(spec, info)
    key = query if key is None else key
    value = key if value is None else value
    bias64 = None
    if bias is not None:
        bias64 = as_f64(bias)
        bad = np.isnan(bias64) | (bias64 == np.inf)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise fail_value(
                "bias", "finite values or -inf (which disallows a key) [BIAS-2]", f"{bias64[at]} at index {at}"
            )
    return Call(
        dims=dims,
        params={n: as_f64(a) for n, a in params.items()},
        query=as_f64(query),
        key=as_f64(key),
        value=as_f64(value),
        mask=None if mask is None else np.asarray(mask),
        bias=bias64,
        q_positions=_positions(q_positions, dims.Lq),
        k_positions=_positions(k_positions, dims.Lk),
        dropout_keep=None if dropout_keep is None else np.asarray(dropout_keep),
    )
