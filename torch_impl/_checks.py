"""Argument checks at the public entry points, worded by ``spec.validation``.

Shapes, dtypes and devices only: nothing here reads tensor values, so the
checks cost no device synchronisation.
"""

from __future__ import annotations

from typing import Optional

import torch

from spec import AttentionSpec
from spec.validation import ArrayInfo, Dims, check_call, check_params, fail_type, fail_value

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


def check(spec: AttentionSpec, params, query, key, value, mask, bias, q_positions, k_positions,
          dropout_keep) -> Dims:
    """INPUT-1 at ``torch_impl.attention``: shapes, dtypes, devices; no implicit casts."""
    dims = check_call(
        spec, describe("query", query), describe("key", key), describe("value", value),
        mask=describe("mask", mask), bias=describe("bias", bias),
        q_positions=describe("q_positions", q_positions), k_positions=describe("k_positions", k_positions),
        dropout_keep=describe("dropout_keep", dropout_keep), same_float_dtype=True,
    )
    if not isinstance(params, dict):
        raise TypeError(f"params: expected a dict of tensors, got {type(params).__name__}")
    infos = {n: describe(f"params[{n!r}]", a) for n, a in params.items()}
    check_params(spec, infos)
    for n, info in infos.items():
        if info.dtype != str(query.dtype):
            raise fail_type(f"params[{n!r}]", f"the query's dtype {query.dtype} (no implicit casting)",
                            f"dtype {info.dtype}")
        if info.device != str(query.device):
            raise fail_value(f"params[{n!r}]", f"a tensor on the query's device {query.device}",
                             f"device {info.device}")
    return dims
