"""Field validation shared by the spec dataclasses: one error wording (INPUT-1)."""

from __future__ import annotations

import numbers


def type_name(value) -> str:
    return type(value).__name__


def require_int(owner: str, field: str, value, minimum: int) -> int:
    # bool is an int subclass; True as a head count is almost surely a bug.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}.{field}: expected an int >= {minimum}, got {value!r} of type {type_name(value)}")
    if value < minimum:
        raise ValueError(f"{owner}.{field}: expected an int >= {minimum}, got {value!r}")
    return int(value)


def require_bool(owner: str, field: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}.{field}: expected a bool, got {value!r} of type {type_name(value)}")
    return value


def require_real(owner: str, field: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}.{field}: expected a real number, got {value!r} of type {type_name(value)}")
    return float(value)
