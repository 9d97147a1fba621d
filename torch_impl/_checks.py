"""Argument checks at the public entry points (INPUT-1), worded by ``spec.validation``.

Shapes, dtypes and devices only: nothing here reads tensor values, so the
checks cost no device synchronisation.
"""

from __future__ import annotations

from typing import Optional

import torch

from spec import AttentionSpec
from spec.validation import ArrayInfo, Dims, check_arguments, fail_type

_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
_INTS = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}


def kind(dtype: torch.dtype) -> str:
    if dtype in _FLOATS:
        return "float"
    if dtype == torch.bool:
        return "bool"
    if dtype in _INTS:
        return "int"
    return "complex" if dtype.is_complex else "other"


def describe(name: str, x) -> Optional[ArrayInfo]:
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise fail_type(name, "a torch.Tensor", type(x).__name__)
    return ArrayInfo(tuple(x.shape), kind(x.dtype), str(x.dtype), str(x.device))


def check(spec: AttentionSpec, params, query, key, value, mask, bias, q_positions, k_positions, dropout_keep) -> Dims:
    """INPUT-1 at ``torch_impl.attention``: shapes, dtypes, devices; no implicit casts."""
    return check_arguments(
        spec, describe, params, query, key, value, mask, bias, q_positions, k_positions, dropout_keep
    )
