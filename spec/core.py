"""The shared vocabulary: ``AttentionSpec`` (the schemes live in their own modules).

Every class here is a frozen, hashable dataclass, so a spec can be a static
argument of ``jax.jit`` and a dictionary key. Construction validates every
field and raises ``ValueError`` (bad value) or ``TypeError`` (bad type) naming
the field, the expected and the actual value. No numerics live here.

Axis legend (rule AXES-1): B batch, H heads, Lq query length, Lk key length,
D model dim (= H * d), d head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ._fields import require_bool as _require_bool
from ._fields import require_int as _require_int
from ._fields import require_real as _require_real
from ._fields import type_name as _type_name
from .huang import Huang
from .schemes import Scheme, scheme_classes
from .shaw import Shaw

__all__ = ["AttentionSpec", "Shaw", "Huang", "SPEC_VERSION"]

SPEC_VERSION = "1.2.0"


@dataclass(frozen=True)
class AttentionSpec:
    """The static description of one multi-head attention layer.

    Fields (rule ids in brackets):
        num_heads: H >= 1 [HEAD-1].
        head_dim: d >= 1 [HEAD-1]; the model dim is D = H * d.
        bias: whether the projections carry biases bq, bk, bv, bo [PROJ-1, OUT-1].
        scale: the logit scale s; None means 1 / sqrt(d) [SCALE-1].
        relative: None or a registered position scheme (``Shaw``, ``Huang``) [REL-1, REL-3].
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
    relative: Optional[Scheme] = None
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
        known = scheme_classes()
        if self.relative is not None and known.get(getattr(self.relative, "name", None)) is not type(self.relative):
            names = ", ".join(f"{c.__name__}(...)" for c in known.values())
            raise TypeError(
                f"{S}.relative: expected None or a registered scheme ({names}), "
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
            "wq": (D, D),
            "wk": (D, D),
            "wv": (D, D),
            "wo": (D, D),
        }
        if self.bias:
            shapes.update({"bq": (D,), "bk": (D,), "bv": (D,), "bo": (D,)})
        if self.relative is not None:
            shapes.update(self.relative.param_shapes(H, d))  # PARAM-1, REL-3
        return shapes
