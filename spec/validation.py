"""Framework-neutral argument checks: one wording for every implementation.

Each implementation describes its arguments as ``ArrayInfo`` (shape, dtype
kind, dtype name, device) and calls ``check_call`` / ``check_params`` at its
public entry point. The checks read shapes and dtypes only, never values, so
they run at trace time under ``jax.jit``. Every message has the form

    <argument>: expected <what the rule asks>, got <what came>

``ValueError`` for shapes and values, ``TypeError`` for dtypes (rule INPUT-1).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from .core import AttentionSpec

__all__ = [
    "ArrayInfo",
    "Dims",
    "check_call",
    "check_params",
    "check_arguments",
    "require_plain_attention",
    "fail_value",
    "fail_type",
]

#: dtype kinds an implementation reports: "float", "int", "bool", "complex" or "other".
KINDS = ("float", "int", "bool", "complex", "other")


class ArrayInfo(NamedTuple):
    """What the checks need to know about one array argument."""

    shape: tuple
    kind: str  # one of KINDS
    dtype: str  # the framework's own dtype name, for messages
    device: Optional[str] = None  # None where the framework has one memory space


class Dims(NamedTuple):
    """The sizes a call resolves to (axis legend AXES-1)."""

    B: int
    Lq: int
    Lk: int


def fail_value(arg: str, expected: str, got) -> ValueError:
    return ValueError(f"{arg}: expected {expected}, got {got}")


def fail_type(arg: str, expected: str, got) -> TypeError:
    return TypeError(f"{arg}: expected {expected}, got {got}")


def _shape(shape) -> str:
    return "(" + ", ".join(str(int(n)) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def _check_float(arg: str, info: ArrayInfo) -> None:
    if info.kind != "float":
        raise fail_type(arg, "a floating-point array", f"dtype {info.dtype}")


def _check_broadcastable(arg: str, info: ArrayInfo, full: tuple) -> None:
    """MASK-1 / BIAS-1: rank 1..4, aligned from the right, each axis 1 or full size."""
    shape = tuple(info.shape)
    ok = 1 <= len(shape) <= len(full) and all(n == 1 or n == f for n, f in zip(shape[::-1], full[::-1]))
    if not ok:
        raise fail_value(
            arg,
            f"a shape broadcastable to (B, H, Lq, Lk) = {_shape(full)} (rank 1 to 4, "
            "aligned from the right, each axis 1 or the full size; a key-padding mask "
            "is (B, 1, 1, Lk))",
            _shape(shape),
        )


def _check_positions(arg: str, info: ArrayInfo, B: int, L: int, axis: str) -> None:
    """POS-1: integer positions of shape (L,) or (B, L)."""
    if info.kind != "int":
        raise fail_type(arg, "an integer array of positions", f"dtype {info.dtype}")
    shape = tuple(info.shape)
    if shape not in ((L,), (B, L)):
        raise fail_value(arg, f"shape ({axis},) = {_shape((L,))} or (B, {axis}) = {_shape((B, L))}", _shape(shape))


def _check_device(arg: str, info: ArrayInfo, device: Optional[str]) -> None:
    if device is not None and info.device is not None and info.device != device:
        raise fail_value(arg, f"an array on the query's device {device}", f"device {info.device}")


def check_call(
    spec: AttentionSpec,
    query: ArrayInfo,
    key: Optional[ArrayInfo] = None,
    value: Optional[ArrayInfo] = None,
    *,
    mask: Optional[ArrayInfo] = None,
    bias: Optional[ArrayInfo] = None,
    q_positions: Optional[ArrayInfo] = None,
    k_positions: Optional[ArrayInfo] = None,
    dropout_keep: Optional[ArrayInfo] = None,
    same_float_dtype: bool = False,
) -> Dims:
    """Check one attention call's arguments (rules INPUT-1, SHAPE-1, MASK-1, MASK-3,
    BIAS-1, POS-1, DROP-2) and return its sizes.

    ``key=None`` means key = query, ``value=None`` means value = key (SHAPE-2).
    With ``same_float_dtype`` (frameworks that compute in the input dtype),
    key, value and bias must share the query's dtype: nothing is cast silently.
    """
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"spec: expected an AttentionSpec, got {type(spec).__name__}")
    D = spec.model_dim
    _check_float("query", query)
    if len(query.shape) != 3 or query.shape[2] != D:
        raise fail_value("query", f"shape (B, Lq, D) with D = model_dim = {D}", _shape(query.shape))
    B, Lq = int(query.shape[0]), int(query.shape[1])
    if B < 1 or Lq < 1:
        raise fail_value("query", "B >= 1 and Lq >= 1", _shape(query.shape))
    device = query.device
    key = query if key is None else key
    value = key if value is None else value
    for name, info in (("key", key), ("value", value)):
        _check_float(name, info)
        _check_device(name, info, device)
        if same_float_dtype and info.dtype != query.dtype:
            raise fail_type(name, f"the query's dtype {query.dtype} (no implicit casting)", f"dtype {info.dtype}")
    if len(key.shape) != 3 or key.shape[0] != B or key.shape[2] != D or key.shape[1] < 1:
        raise fail_value("key", f"shape (B, Lk, D) with B = {B}, D = {D}, Lk >= 1", _shape(key.shape))
    Lk = int(key.shape[1])
    if tuple(value.shape) != (B, Lk, D):
        raise fail_value("value", f"shape (B, Lk, D) = {_shape((B, Lk, D))} (the key's)", _shape(value.shape))

    full = (B, spec.num_heads, Lq, Lk)
    if mask is not None:
        if mask.kind != "bool":
            raise fail_type(
                "mask",
                "a boolean array (True = attend); for an additive float mask use bias=",
                f"dtype {mask.dtype}",
            )
        _check_device("mask", mask, device)
        _check_broadcastable("mask", mask, full)
    if bias is not None:
        _check_float("bias", bias)
        _check_device("bias", bias, device)
        if same_float_dtype and bias.dtype != query.dtype:
            raise fail_type("bias", f"the query's dtype {query.dtype} (no implicit casting)", f"dtype {bias.dtype}")
        _check_broadcastable("bias", bias, full)
    if q_positions is not None:
        _check_device("q_positions", q_positions, device)
        _check_positions("q_positions", q_positions, B, Lq, "Lq")
    if k_positions is not None:
        _check_device("k_positions", k_positions, device)
        _check_positions("k_positions", k_positions, B, Lk, "Lk")
    if dropout_keep is not None:
        if spec.dropout == 0.0:
            raise fail_value(
                "dropout_keep",
                "None because spec.dropout == 0 (no dropout to apply)",
                f"an array of shape {_shape(dropout_keep.shape)}",
            )
        if dropout_keep.kind != "bool":
            raise fail_type("dropout_keep", "a boolean keep mask (True = keep)", f"dtype {dropout_keep.dtype}")
        _check_device("dropout_keep", dropout_keep, device)
        if tuple(dropout_keep.shape) != full:
            raise fail_value("dropout_keep", f"shape (B, H, Lq, Lk) = {_shape(full)}", _shape(dropout_keep.shape))
    return Dims(B, Lq, Lk)


def check_params(spec: AttentionSpec, params: dict) -> None:
    """PARAM-1 / PARAM-2: exactly the canonical names, each with its canonical shape.

    ``params`` maps name -> ArrayInfo.
    """
    if not isinstance(params, dict):
        raise TypeError(f"params: expected a dict of arrays, got {type(params).__name__}")
    expected = spec.param_shapes()
    missing = [n for n in expected if n not in params]
    extra = sorted(n for n in params if n not in expected)
    if missing:
        raise fail_value("params", f"entries {list(expected)} for this spec", f"missing {missing}")
    if extra:
        raise fail_value("params", f"entries {list(expected)} for this spec (no others)", f"unexpected {extra}")
    for name, shape in expected.items():
        info = params[name]
        if info.kind != "float":
            raise fail_type(f"params[{name!r}]", "a floating-point array", f"dtype {info.dtype}")
        if tuple(info.shape) != shape:
            raise fail_value(f"params[{name!r}]", f"shape {_shape(shape)}", _shape(info.shape))


def check_arguments(
    spec: AttentionSpec, describe, params, query, key, value, mask, bias, q_positions, k_positions, dropout_keep
) -> Dims:
    """Every check of a framework implementation's entry point (INPUT-1, PARAM-2).

    ``describe(name, x)`` turns one framework array into an ``ArrayInfo`` (and
    raises ``TypeError`` for something that is not an array). Beyond
    ``check_call``: parameters must share the query's dtype and device.
    """
    dims = check_call(
        spec,
        describe("query", query),
        describe("key", key),
        describe("value", value),
        mask=describe("mask", mask),
        bias=describe("bias", bias),
        q_positions=describe("q_positions", q_positions),
        k_positions=describe("k_positions", k_positions),
        dropout_keep=describe("dropout_keep", dropout_keep),
        same_float_dtype=True,
    )
    if not isinstance(params, dict):
        raise TypeError(f"params: expected a dict of arrays, got {type(params).__name__}")
    infos = {n: describe(f"params[{n!r}]", a) for n, a in params.items()}
    check_params(spec, infos)
    q = describe("query", query)
    for n, info in infos.items():
        if info.dtype != q.dtype:
            raise fail_type(
                f"params[{n!r}]", f"the query's dtype {q.dtype} (no implicit casting)", f"dtype {info.dtype}"
            )
        if q.device is not None and info.device is not None and info.device != q.device:
            raise fail_value(f"params[{n!r}]", f"a tensor on the query's device {q.device}", f"device {info.device}")
    return dims


def require_plain_attention(spec: AttentionSpec, target: str, *, lacks: Optional[dict] = None, has=()) -> None:
    """For conversions to a framework's own layer: no relative scheme, default scale, no mask_fill,
    none of the peer options (HEAD-3, HEAD-4, SOFTCAP-1, WINDOW-1).

    ``lacks`` maps a field to ``(rule, why)``, the target's own reason (checked
    first); ``has`` names the fields the target expresses itself (Flax's
    ``num_kv_heads``).
    """
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"spec: expected an AttentionSpec, got {type(spec).__name__}")
    lacks = lacks or {}
    fields = ("relative", "scale", "mask_fill", "num_kv_heads", "value_head_dim", "softcap", "window")
    for field in [*lacks, *(f for f in fields if f not in lacks and f not in has)]:
        value = getattr(spec, field)
        if value is None:
            continue
        rule, why = lacks.get(field, (None, None))
        expected = f"None ({why}; {rule})" if why else f"None ({target} cannot express it)"
        raise fail_value(f"spec.{field}", expected, repr(value))
