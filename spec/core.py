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
from .rope import Rope
from .schemes import Scheme, scheme_classes
from .shaw import Shaw

__all__ = ["AttentionSpec", "Shaw", "Huang", "Rope", "SPEC_VERSION"]

SPEC_VERSION = "1.7.0"


@dataclass(frozen=True)
class AttentionSpec:
    """The static description of one multi-head attention layer.

    Fields (rule ids in brackets):
        num_heads: H >= 1 [HEAD-1].
        head_dim: d >= 1 [HEAD-1]; the model dim is D = H * d.
        bias: whether the projections carry biases bq, bk, bv, bo [PROJ-1, OUT-1].
        scale: the logit scale s; None means 1 / sqrt(d) [SCALE-1].
        relative: None or a registered position scheme (``Shaw``, ``Huang``, ``Rope``) [REL-1, REL-3].
        scale_relative: whether the relative key term is multiplied by s [SCALE-3].
        causal: key j is allowed for query i iff k_pos[j] - q_pos[i] <= 0 [CAUSAL-1].
        mask_fill: None for exact zeros at disallowed keys [MASK-5]; a finite
            float replaces disallowed logits by that value [MASK-6].
        dropout: probability p in [0, 1) of dropping an attention weight [DROP-1].
        num_kv_heads: Hkv key/value heads, H % Hkv == 0; None means H. Query
            head h uses key/value head h // (H / Hkv) [HEAD-3].
        value_head_dim: dv, the value heads' size; None means d. The scale
            stays 1 / sqrt(d) [HEAD-4].
        softcap: None, or c > 0: the score becomes c * tanh(score / c) before
            biases and masks [SOFTCAP-1].
        window: None, or (left, right), each an int >= 0 or None (unbounded):
            key j is allowed for query i iff -left <= k_pos[j] - q_pos[i] <= right [WINDOW-1].
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
    num_kv_heads: Optional[int] = None
    value_head_dim: Optional[int] = None
    softcap: Optional[float] = None
    window: Optional[tuple] = None

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
        if self.num_kv_heads is not None:
            kv = _require_int(S, "num_kv_heads", self.num_kv_heads, 1)
            if self.num_heads % kv:
                raise ValueError(
                    f"{S}.num_kv_heads: expected None or a divisor of num_heads = {self.num_heads} "
                    f"(each key/value head serves num_heads / num_kv_heads query heads), got {kv}"
                )
            object.__setattr__(self, "num_kv_heads", kv)
        if self.value_head_dim is not None:
            object.__setattr__(self, "value_head_dim", _require_int(S, "value_head_dim", self.value_head_dim, 1))
        if self.softcap is not None:
            cap = _require_real(S, "softcap", self.softcap)
            if not (math.isfinite(cap) and cap > 0):
                raise ValueError(f"{S}.softcap: expected a finite number > 0 or None, got {cap!r}")
            object.__setattr__(self, "softcap", cap)
        if self.window is not None:
            object.__setattr__(self, "window", _require_window(S, self.window))
        if self.relative is not None:
            self.relative.check_sizes(self.num_heads, self.head_dim, self.v_head_dim)  # REL-3 (e.g. ROPE-2)

    @property
    def model_dim(self) -> int:
        """D = H * d [HEAD-1]."""
        return self.num_heads * self.head_dim

    @property
    def kv_heads(self) -> int:
        """Hkv: ``num_kv_heads``, or H when it is None [HEAD-3]."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def group_size(self) -> int:
        """G = H / Hkv, the query heads that share one key/value head [HEAD-3]."""
        return self.num_heads // self.kv_heads

    @property
    def v_head_dim(self) -> int:
        """dv: ``value_head_dim``, or d when it is None [HEAD-4]."""
        return self.head_dim if self.value_head_dim is None else self.value_head_dim

    @property
    def effective_scale(self) -> float:
        """s: ``scale`` if given, else 1 / sqrt(d) [SCALE-1]."""
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def relative_scale(self) -> float:
        """The factor on the relative key term: s, or 1 without scale_relative [SCALE-3]."""
        return self.effective_scale if self.scale_relative else 1.0

    @property
    def key_side_scale(self) -> float:
        """The factor on a key-side term: s_rel, or 1 when the scheme's ``key_side_scaled`` is False [SHAW-7]."""
        return self.relative_scale if getattr(self.relative, "key_side_scaled", True) else 1.0

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """The canonical parameter names and shapes [PARAM-1, HEAD-3, HEAD-4], in canonical order."""
        D, H, d = self.model_dim, self.num_heads, self.head_dim
        K, V, M = self.kv_heads * d, self.kv_heads * self.v_head_dim, H * self.v_head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "wq": (D, D),
            "wk": (D, K),
            "wv": (D, V),
            "wo": (M, D),
        }
        if self.bias:
            shapes.update({"bq": (D,), "bk": (K,), "bv": (V,), "bo": (D,)})
        if self.relative is not None:
            shapes.update(self.relative.param_shapes(H, d, self.v_head_dim))  # PARAM-1, REL-3
        return shapes


def _require_window(owner: str, window) -> tuple:
    """WINDOW-1: a pair (left, right), each an int >= 0 or None, not both None."""
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(
            f"{owner}.window: expected None or a pair (left, right) of ints >= 0 or None, "
            f"got {window!r} of type {_type_name(window)}"
        )
    sides = tuple(None if w is None else _require_int(owner, f"window[{n}]", w, 0) for n, w in enumerate(window))
    if sides == (None, None):
        raise ValueError(
            f"{owner}.window: expected at least one bound (window=(None, None) allows every key; use window=None), "
            f"got {window!r}"
        )
    return sides
