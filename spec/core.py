"""The shared vocabulary: ``AttentionSpec`` and the relative-position schemes.

Every class here is a frozen, hashable dataclass, so a spec can be a static
argument of ``jax.jit`` and a dictionary key. Construction validates every
field and raises ``ValueError`` (bad value) or ``TypeError`` (bad type) naming
the field, the expected and the actual value. No numerics live here.

Axis legend (rule AXES-1): B batch, H heads, Lq query length, Lk key length,
D model dim (= H * d), d head dim.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional, Union

__all__ = ["AttentionSpec", "Shaw", "Huang", "SPEC_VERSION"]

SPEC_VERSION = "1.0.0"


def _type_name(value) -> str:
    return type(value).__name__


def _require_int(owner: str, field: str, value, minimum: int) -> int:
    # bool is an int subclass; True as a head count is almost surely a bug.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{owner}.{field}: expected an int >= {minimum}, got {value!r} "
            f"of type {_type_name(value)}"
        )
    if value < minimum:
        raise ValueError(f"{owner}.{field}: expected an int >= {minimum}, got {value!r}")
    return int(value)


def _require_bool(owner: str, field: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(
            f"{owner}.{field}: expected a bool, got {value!r} of type {_type_name(value)}"
        )
    return value


def _require_real(owner: str, field: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{owner}.{field}: expected a real number, got {value!r} "
            f"of type {_type_name(value)}"
        )
    return float(value)


@dataclass(frozen=True)
class Shaw:
    """Clipped relative positions of Shaw et al. 2018 (rules SHAW-1..SHAW-5).

    Tables ``rel_k`` and ``rel_v`` have ``2 * max_distance + 1`` rows
    (``(R, d)``, or ``(H, R, d)`` with ``per_head``). The distance
    ``delta = k_pos - q_pos`` selects row ``clip(delta, -k, k) + k``.
    """

    max_distance: int
    keys: bool = True
    values: bool = True
    per_head: bool = False

    def __post_init__(self):
        object.__setattr__(
            self, "max_distance", _require_int("Shaw", "max_distance", self.max_distance, 0)
        )
        _require_bool("Shaw", "keys", self.keys)
        _require_bool("Shaw", "values", self.values)
        _require_bool("Shaw", "per_head", self.per_head)
        if not (self.keys or self.values):
            raise ValueError(
                "Shaw: expected keys=True or values=True (a scheme with neither term "
                "adds nothing; use relative=None), got keys=False, values=False"
            )

    @property
    def num_rows(self) -> int:
        """R = 2k + 1, the number of table rows (one per clipped distance)."""
        return 2 * self.max_distance + 1


@dataclass(frozen=True)
class Huang:
    """Unclipped relative key logits of Huang et al. 2018 (rules HUANG-1..HUANG-5).

    Table ``rel_k`` has ``2 * max_len - 1`` rows (``(R, d)``, or ``(H, R, d)``
    with ``per_head``); row ``r`` holds distance ``r - (max_len - 1)``. A
    distance with ``|delta| > max_len - 1`` contributes zero.
    """

    max_len: int
    per_head: bool = True

    def __post_init__(self):
        object.__setattr__(self, "max_len", _require_int("Huang", "max_len", self.max_len, 1))
        _require_bool("Huang", "per_head", self.per_head)

    @property
    def num_rows(self) -> int:
        """R = 2M - 1, the number of table rows (distances -(M-1) .. M-1)."""
        return 2 * self.max_len - 1


@dataclass(frozen=True)
class AttentionSpec:
    """The static description of one multi-head attention layer.

    Fields (rule ids in brackets):
        num_heads: H >= 1 [HEAD-1].
        head_dim: d >= 1 [HEAD-1]; the model dim is D = H * d.
        bias: whether the projections carry biases bq, bk, bv, bo [PROJ-1, OUT-1].
        scale: the logit scale s; None means 1 / sqrt(d) [SCALE-1].
        relative: None, a ``Shaw`` or a ``Huang`` scheme [REL-1].
        scale_relative: whether the relative key term is multiplied by s [SCALE-3].
        causal: key j is allowed for query i iff k_pos[j] - q_pos[i] <= 0 [CAUSAL-1].
        mask_fill: None for exact zeros at disallowed keys [MASK-5]; a finite
            float replaces disallowed logits by that value [MASK-6].
        dropout: probability p in [0, 1) of dropping an attention weight [DROP-1].
    """

    num_heads: int
    head_dim: int
    bias: bool = True
    scale: Optional[float] = None
    relative: Union[Shaw, Huang, None] = None
    scale_relative: bool = True
    causal: bool = False
    mask_fill: Optional[float] = None
    dropout: float = 0.0

    def __post_init__(self):
        S = "AttentionSpec"
        object.__setattr__(self, "num_heads", _require_int(S, "num_heads", self.num_heads, 1))
        object.__setattr__(self, "head_dim", _require_int(S, "head_dim", self.head_dim, 1))
        _require_bool(S, "bias", self.bias)
        if self.scale is not None:
            scale = _require_real(S, "scale", self.scale)
            if not (math.isfinite(scale) and scale > 0):
                raise ValueError(f"{S}.scale: expected a finite number > 0 or None, got {scale!r}")
            object.__setattr__(self, "scale", scale)
        if self.relative is not None and not isinstance(self.relative, (Shaw, Huang)):
            raise TypeError(
                f"{S}.relative: expected None, Shaw(...) or Huang(...), "
                f"got {self.relative!r} of type {_type_name(self.relative)}"
            )
        _require_bool(S, "scale_relative", self.scale_relative)
        _require_bool(S, "causal", self.causal)
        if self.mask_fill is not None:
            fill = _require_real(S, "mask_fill", self.mask_fill)
            if not math.isfinite(fill):
                raise ValueError(
                    f"{S}.mask_fill: expected a finite float or None (None gives disallowed "
                    f"keys weight exactly 0), got {fill!r}"
                )
            object.__setattr__(self, "mask_fill", fill)
        p = _require_real(S, "dropout", self.dropout)
        if not (0.0 <= p < 1.0):
            raise ValueError(f"{S}.dropout: expected a probability in [0, 1), got {p!r}")
        object.__setattr__(self, "dropout", p)

    @property
    def model_dim(self) -> int:
        """D = H * d [HEAD-1]."""
        return self.num_heads * self.head_dim

    @property
    def effective_scale(self) -> float:
        """s: ``scale`` if given, else 1 / sqrt(d) [SCALE-1]."""
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def relative_scale(self) -> float:
        """The factor on the relative key term: s, or 1 without scale_relative [SCALE-3]."""
        return self.effective_scale if self.scale_relative else 1.0

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """The canonical parameter names and shapes [PARAM-1], in canonical order."""
        D, H, d = self.model_dim, self.num_heads, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D),
        }
        if self.bias:
            shapes.update({"bq": (D,), "bk": (D,), "bv": (D,), "bo": (D,)})
        rel = self.relative
        if rel is not None:
            table = (H, rel.num_rows, d) if rel.per_head else (rel.num_rows, d)
            if isinstance(rel, Huang) or rel.keys:
                shapes["rel_k"] = table
            if isinstance(rel, Shaw) and rel.values:
                shapes["rel_v"] = table
        return shapes
