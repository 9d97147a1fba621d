"""``Rope``: rotary position embedding (rules ROPE-1..ROPE-16), and its layout permutation.

RoPE rotates pairs of q and k channels by angles proportional to each
token's position, so that a query-key product depends on positions only
through their distance (ROPE-6). The normative text is ``spec/rope.md``.
The frequency constructors (``Rope.linear``, ``Rope.ntk``, ``Rope.yarn``,
``Rope.llama3``, ``Rope.proportional``) compute their frequencies here, in
float64 Python arithmetic, once: a ``Rope`` always carries the frequencies
it uses, and the backends never recompute them.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

from ._fields import require_int, require_real, type_name
from .schemes import Scheme, register

__all__ = ["Rope", "LAYOUTS", "rope_permutation", "dynamic_ntk_alpha"]

#: ROPE-3: which channels form a rotated pair.
LAYOUTS = ("half", "interleaved")


@register
@dataclass(frozen=True)
class Rope(Scheme):
    """Rotary position embedding (RoFormer, Su et al. 2021; rules ROPE-1..ROPE-16).

    Fields:
      theta: the base of the frequencies f_c = theta ** (-2c / r) (ROPE-4),
        a finite number > 1; ignored when ``inv_freq`` is given.
      rotary_dim: r, the number of rotated channels of each head, even, 2 <= r <= d;
        None means the whole head (r = d), or ``2 * len(inv_freq)`` (ROPE-2).
      layout: ``"half"`` pairs channel c with c + r/2 (GPT-NeoX, Hugging Face
        LLaMA, Gemma); ``"interleaved"`` pairs 2c with 2c + 1 (RoFormer, Meta's
        LLaMA, GPT-J) (ROPE-3).
      inv_freq: None, or the r/2 frequencies as a tuple of finite floats >= 0
        (0 leaves its pair unrotated), overriding ``theta`` (ROPE-4).
      attention_factor: af > 0 multiplies the rotated channels of q and k, so
        the rotated part of every logit is multiplied by af ** 2 (ROPE-7).

    No tables (PARAM-1); one hook, the q/k transform (REL-3).
    """

    name = "rope"
    rule_prefix = "ROPE"

    theta: float = 10000.0
    rotary_dim: Optional[int] = None
    layout: str = "half"
    inv_freq: Optional[tuple] = None
    attention_factor: float = 1.0

    def __post_init__(self):
        R = "Rope"
        theta = require_real(R, "theta", self.theta)
        if not (math.isfinite(theta) and theta > 1.0):
            raise ValueError(f"{R}.theta: expected a finite number > 1, got {theta!r}")
        object.__setattr__(self, "theta", theta)
        if self.rotary_dim is not None:
            r = require_int(R, "rotary_dim", self.rotary_dim, 2)
            if r % 2:
                raise ValueError(
                    f"{R}.rotary_dim: expected an even int >= 2 (channels rotate in pairs, ROPE-2), got {r}"
                )
            object.__setattr__(self, "rotary_dim", r)
        if self.layout not in LAYOUTS:
            raise ValueError(f"{R}.layout: expected one of {LAYOUTS} (ROPE-3), got {self.layout!r}")
        if self.inv_freq is not None:
            object.__setattr__(self, "inv_freq", _require_frequencies(self.inv_freq))
            if self.rotary_dim is not None and 2 * len(self.inv_freq) != self.rotary_dim:
                raise ValueError(
                    f"{R}.inv_freq: expected rotary_dim / 2 = {self.rotary_dim // 2} frequencies (ROPE-4), "
                    f"got {len(self.inv_freq)}"
                )
        af = require_real(R, "attention_factor", self.attention_factor)
        if not (math.isfinite(af) and af > 0):
            raise ValueError(f"{R}.attention_factor: expected a finite number > 0 (ROPE-7), got {af!r}")
        object.__setattr__(self, "attention_factor", af)

    # ------------------------------------------------------------------ sizes
    def rotated(self, head_dim: int) -> int:
        """r for a head of ``head_dim`` channels (ROPE-2)."""
        if self.rotary_dim is not None:
            return self.rotary_dim
        return head_dim if self.inv_freq is None else 2 * len(self.inv_freq)

    def frequencies(self, head_dim: int) -> tuple:
        """The r/2 float64 frequencies f_c for a head of ``head_dim`` channels (ROPE-4)."""
        if self.inv_freq is not None:
            return self.inv_freq
        return base_frequencies(self.theta, self.rotated(head_dim))

    def check_sizes(self, num_heads: int, head_dim: int, value_head_dim: int) -> None:
        """ROPE-2: the rotated channels fit in a head and pair up."""
        r = self.rotated(head_dim)
        if r > head_dim:
            raise ValueError(f"Rope.rotary_dim: expected an even int <= head_dim = {head_dim} (ROPE-2), got {r}")
        if r % 2:
            raise ValueError(
                f"Rope.rotary_dim: expected an even number of rotated channels (ROPE-2), got head_dim = {head_dim} "
                "with rotary_dim=None; give an even rotary_dim"
            )

    def param_shapes(self, num_heads: int, head_dim: int, value_head_dim: int) -> dict[str, tuple[int, ...]]:
        """ROPE-1: no tables."""
        return {}

    @property
    def hooks(self) -> frozenset:
        return frozenset({"qk_transform"})

    @property
    def features(self) -> frozenset:
        f = {"rope"}
        if self.layout == "interleaved":
            f.add("rope-interleaved")
        if self.rotary_dim is not None or self.inv_freq is not None:
            f.add("rope-partial")  # r may differ from d: the adapter must be told r
        if self.attention_factor != 1.0:
            f.add("rope-attention-factor")
        return frozenset(f)

    def to_json(self) -> dict:
        d = super().to_json()
        if self.inv_freq is not None:
            d["inv_freq"] = list(self.inv_freq)
        return d

    # ---------------------------------------------------------- constructors
    @classmethod
    def linear(cls, factor: float, *, rotary_dim: int, theta: float = 10000.0, layout: str = "half") -> "Rope":
        """ROPE-12, position interpolation (Chen et al. 2023; HF ``"linear"``): f_c = theta^(-2c/r) / factor."""
        factor = _require_factor("Rope.linear", "factor", factor)
        r = _require_rotary_dim("Rope.linear", rotary_dim)
        return cls(theta, r, layout, tuple(f / factor for f in base_frequencies(theta, r)))

    @classmethod
    def ntk(cls, alpha: float, *, rotary_dim: int, theta: float = 10000.0, layout: str = "half") -> "Rope":
        """ROPE-13, NTK-aware scaling: the base becomes theta * alpha ** (r / (r - 2)), r >= 4."""
        alpha = _require_factor("Rope.ntk", "alpha", alpha)
        r = _require_rotary_dim("Rope.ntk", rotary_dim)
        if r < 4:
            raise ValueError(f"Rope.ntk: expected rotary_dim >= 4 (the exponent is r / (r - 2), ROPE-13), got {r}")
        base = theta * alpha ** (r / (r - 2))
        return cls(theta, r, layout, base_frequencies(base, r))

    @classmethod
    def yarn(
        cls,
        factor: float,
        original_max_positions: int,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        truncate: bool = True,
        *,
        rotary_dim: int,
        theta: float = 10000.0,
        layout: str = "half",
        attention_factor: Optional[float] = None,
    ) -> "Rope":
        """ROPE-14, YaRN (Peng et al. 2023; HF ``"yarn"``): a ramp between interpolated and original frequencies.

        attention_factor None means ``0.1 * ln(factor) + 1`` (1 for factor <= 1).
        """
        where = "Rope.yarn"
        factor = _require_factor(where, "factor", factor)
        n = require_int(where, "original_max_positions", original_max_positions, 1)
        fast, slow = require_real(where, "beta_fast", beta_fast), require_real(where, "beta_slow", beta_slow)
        if not (math.isfinite(fast) and math.isfinite(slow) and fast > slow > 0):
            raise ValueError(f"{where}: expected beta_fast > beta_slow > 0, got beta_fast={fast!r}, beta_slow={slow!r}")
        if not isinstance(truncate, bool):
            raise TypeError(f"{where}.truncate: expected a bool, got {truncate!r} of type {type_name(truncate)}")
        r = _require_rotary_dim(where, rotary_dim)

        def correction_dim(rotations: float) -> float:  # the channel whose wavelength fits `rotations` times into n
            return r * math.log(n / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        low, high = correction_dim(fast), correction_dim(slow)
        if truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, r - 1)
        if low == high:
            high += 0.001  # HF's guard against a zero-width ramp
        base = base_frequencies(theta, r)
        inv_freq = []
        for c, f in enumerate(base):
            keep = 1.0 - min(max((c - low) / (high - low), 0.0), 1.0)  # 1: original frequency, 0: interpolated
            inv_freq.append((f / factor) * (1.0 - keep) + f * keep)
        if attention_factor is None:
            attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        return cls(theta, r, layout, tuple(inv_freq), attention_factor)

    @classmethod
    def llama3(
        cls,
        factor: float,
        low_freq_factor: float,
        high_freq_factor: float,
        original_max_positions: int,
        *,
        rotary_dim: int,
        theta: float = 500000.0,
        layout: str = "half",
    ) -> "Rope":
        """ROPE-15, Llama 3.1 scaling (HF ``"llama3"``): long wavelengths / factor, short ones kept, a band between."""
        where = "Rope.llama3"
        factor = _require_factor(where, "factor", factor)
        low = _require_factor(where, "low_freq_factor", low_freq_factor)
        high = _require_factor(where, "high_freq_factor", high_freq_factor)
        if not high > low:
            raise ValueError(f"{where}: expected high_freq_factor > low_freq_factor, got {high!r} <= {low!r}")
        n = require_int(where, "original_max_positions", original_max_positions, 1)
        r = _require_rotary_dim(where, rotary_dim)
        low_wavelen, high_wavelen = n / low, n / high
        inv_freq = []
        for f in base_frequencies(theta, r):
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:
                inv_freq.append(f)
            elif wavelen > low_wavelen:
                inv_freq.append(f / factor)
            else:
                smooth = (n / wavelen - low) / (high - low)
                inv_freq.append((1 - smooth) * f / factor + smooth * f)
        return cls(theta, r, layout, tuple(inv_freq))

    @classmethod
    def proportional(cls, fraction: float, *, rotary_dim: int, theta: float = 10000.0, layout: str = "half") -> "Rope":
        """ROPE-16, Gemma's partial rotation: every channel pairs over r, only the first pairs turn.

        The first floor(fraction * r / 2) pairs get theta^(-2c/r) (frequencies over
        r, not over the rotated channels), the others frequency 0.
        """
        where = "Rope.proportional"
        fraction = require_real(where, "fraction", fraction)
        if not (0.0 < fraction <= 1.0):
            raise ValueError(f"{where}.fraction: expected a number in (0, 1], got {fraction!r}")
        r = _require_rotary_dim(where, rotary_dim)
        turning = int(fraction * r // 2)
        base = base_frequencies(theta, r)
        return cls(theta, r, layout, tuple(f if c < turning else 0.0 for c, f in enumerate(base)))


def base_frequencies(theta: float, rotary_dim: int) -> tuple:
    """ROPE-4: f_c = 1 / theta ** (2c / r), c = 0 .. r/2 - 1, in float64."""
    return tuple(1.0 / theta ** (2 * c / rotary_dim) for c in range(rotary_dim // 2))


def dynamic_ntk_alpha(factor: float, original_max_positions: int, context_length: int) -> float:
    """ROPE-11: the NTK alpha that dynamic NTK scaling uses at ``context_length`` tokens (HF ``"dynamic"``).

    ``Rope.ntk(dynamic_ntk_alpha(f, n, L), ...)`` is dynamic NTK's Rope for
    context length L (1.0, the unscaled Rope, when L <= n).
    """
    factor = _require_factor("dynamic_ntk_alpha", "factor", factor)
    n = require_int("dynamic_ntk_alpha", "original_max_positions", original_max_positions, 1)
    L = require_int("dynamic_ntk_alpha", "context_length", context_length, 1)
    return max(1.0, factor * L / n - (factor - 1))


def rope_permutation(num_heads: int, head_dim: int, rotary_dim: Optional[int] = None) -> tuple:
    """ROPE-8: the column order that turns interleaved-layout q/k weights into half-layout ones.

    ``perm`` has one entry per projected feature (num_heads * head_dim):
    ``w_half = w_interleaved[:, perm]`` and ``b_half = b_interleaved[perm]``
    (for ``wq``/``bq`` with H heads, ``wk``/``bk`` with Hkv heads) give with
    ``Rope(layout="half")`` exactly the attention that the originals give
    with ``Rope(layout="interleaved")``. Within each head, half channel c
    (c < r/2) is interleaved channel 2c, half channel c + r/2 is 2c + 1, and
    channels r .. d - 1 stay. The inverse (half to interleaved) is
    ``argsort(perm)``.
    """
    H = require_int("rope_permutation", "num_heads", num_heads, 1)
    d = require_int("rope_permutation", "head_dim", head_dim, 1)
    r = d if rotary_dim is None else require_int("rope_permutation", "rotary_dim", rotary_dim, 2)
    if r % 2 or r > d:
        raise ValueError(f"rope_permutation.rotary_dim: expected an even int <= head_dim = {d} (ROPE-2), got {r}")
    within = [2 * c for c in range(r // 2)] + [2 * c + 1 for c in range(r // 2)] + list(range(r, d))
    return tuple(h * d + c for h in range(H) for c in within)


# --------------------------------------------------------------------- fields
def _require_frequencies(values) -> tuple:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(
            f"Rope.inv_freq: expected None or a sequence of floats >= 0, got {values!r} of type {type_name(values)}"
        )
    out = []
    for c, f in enumerate(values):
        if isinstance(f, bool) or not isinstance(f, numbers.Real):
            raise TypeError(f"Rope.inv_freq[{c}]: expected a real number >= 0, got {f!r} of type {type_name(f)}")
        f = float(f)
        if not (math.isfinite(f) and f >= 0):
            raise ValueError(f"Rope.inv_freq[{c}]: expected a finite number >= 0 (ROPE-4), got {f!r}")
        out.append(f)
    if not out:
        raise ValueError("Rope.inv_freq: expected at least one frequency (ROPE-4), got an empty sequence")
    return tuple(out)


def _require_factor(where: str, field: str, value) -> float:
    value = require_real(where, field, value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{where}.{field}: expected a finite number > 0, got {value!r}")
    return value


def _require_rotary_dim(where: str, rotary_dim) -> int:
    r = require_int(where, "rotary_dim", rotary_dim, 2)
    if r % 2:
        raise ValueError(f"{where}.rotary_dim: expected an even int >= 2 (channels rotate in pairs, ROPE-2), got {r}")
    return r
