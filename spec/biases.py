"""Position biases: ``Alibi``, ``T5Bias`` and ``Swin`` (rules ALIBI-*, T5-*, SWIN-*; ``spec/biases.md``).

Each adds to the logits a per-head scalar that depends on positions only
(REL-3, the ``bias`` hook), unscaled like the ``bias`` input (SCALE-4):
ALiBi a slope times the distance (no tables), T5 a learned table ``rel_b``
``(H, num_buckets)`` read by a log-spaced bucket of the distance, Swin a
learned table ``(H, R)`` read by the 2-D offset of two tokens of a window.

Everything here is exact Python arithmetic: the slopes in float64, the T5
buckets and the Swin rows in integers. The backends take their slopes,
bucket thresholds and coordinate maps from these objects and never derive
them again.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

from ._fields import require_bool, require_int, require_real, type_name
from .schemes import Scheme, register

__all__ = ["Alibi", "T5Bias", "Swin", "alibi_slopes", "t5_bucket", "swin_positions"]


# ------------------------------------------------------------------- ALiBi
def alibi_slopes(num_heads: int, max_bias: float = 8.0) -> tuple:
    """ALIBI-2: the slopes of Press et al. (2022) for ``num_heads`` heads, as float64.

    With ``c = 2 ** floor(log2(H))``: ``m_k = 2 ** (-max_bias * k / c)`` for
    k = 1 .. c, then for H > c the slopes of the rule for 2c at the odd k =
    1, 3, 5, ... (the first H - c of them).

    >>> alibi_slopes(4)
    (0.25, 0.0625, 0.015625, 0.00390625)
    >>> alibi_slopes(3)
    (0.0625, 0.00390625, 0.25)
    """
    H = require_int("alibi_slopes", "num_heads", num_heads, 1)
    bias = _require_positive("alibi_slopes", "max_bias", max_bias)
    c = 1 << (H.bit_length() - 1)  # the largest power of two <= H
    slopes = [2.0 ** (-bias * k / c) for k in range(1, c + 1)]
    slopes += [2.0 ** (-bias * k / (2 * c)) for k in range(1, 2 * (H - c), 2)]
    return tuple(slopes)


@register
@dataclass(frozen=True)
class Alibi(Scheme):
    """Attention with linear biases (Press et al. 2022; rules ALIBI-1..ALIBI-5).

    Fields:
      slopes: None (the schedule of ``alibi_slopes(H, max_bias)``, ALIBI-2) or
        one finite slope >= 0 per query head, a tuple of H floats.
      max_bias: the schedule's exponent scale, finite > 0 (8 in the paper);
        used only when ``slopes`` is None.
      symmetric: True adds ``-m_h * |delta|`` (ALIBI-3); False the linear
        form ``m_h * delta`` of BLOOM, MPT and keras-hub, the same under a
        causal mask and not otherwise (ALIBI-4).

    No tables (PARAM-1); one hook, the bias (REL-3), never scaled (SCALE-4).
    """

    name = "alibi"
    rule_prefix = "ALIBI"

    slopes: Optional[tuple] = None
    max_bias: float = 8.0
    symmetric: bool = True

    def __post_init__(self):
        object.__setattr__(self, "max_bias", _require_positive("Alibi", "max_bias", self.max_bias))
        require_bool("Alibi", "symmetric", self.symmetric)
        if self.slopes is not None:
            object.__setattr__(self, "slopes", _require_slopes(self.slopes))

    def slopes_for(self, num_heads: int) -> tuple:
        """The H float64 slopes of the query heads (ALIBI-2)."""
        return self.slopes if self.slopes is not None else alibi_slopes(num_heads, self.max_bias)

    def check_sizes(self, num_heads: int, head_dim: int, value_head_dim: int) -> None:
        """ALIBI-2: one slope per query head."""
        if self.slopes is not None and len(self.slopes) != num_heads:
            raise ValueError(
                f"Alibi.slopes: expected one slope per query head, num_heads = {num_heads} (ALIBI-2), "
                f"got {len(self.slopes)}"
            )

    def param_shapes(self, num_heads: int, head_dim: int, value_head_dim: int) -> dict[str, tuple[int, ...]]:
        """ALIBI-1: no tables."""
        return {}

    @property
    def hooks(self) -> frozenset:
        return frozenset({"bias"})

    @property
    def features(self) -> frozenset:
        return frozenset({"alibi"} if self.symmetric else {"alibi", "alibi-linear"})

    def to_json(self) -> dict:
        d = super().to_json()
        if self.slopes is not None:
            d["slopes"] = list(self.slopes)
        return d


# ---------------------------------------------------------------------- T5
@register
@dataclass(frozen=True)
class T5Bias(Scheme):
    """T5's bucketed relative position bias (Raffel et al. 2020; rules T5-1..T5-5).

    Fields:
      num_buckets: N, the rows of the table ``rel_b`` (H, N); even when
        bidirectional (half the buckets per sign, T5-2).
      max_distance: the distance from which every bucket saturates (T5-3);
        greater than ``max_exact`` (the exactly represented distances).
      bidirectional: True for encoders (keys after the query get the upper
        half of the buckets), False for decoders (every key after the query
        falls into bucket 0, T5-2).

    One table (PARAM-1), one hook, the bias (REL-3), never scaled (SCALE-4).
    """

    name = "t5"
    rule_prefix = "T5"

    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True

    def __post_init__(self):
        N = require_int("T5Bias", "num_buckets", self.num_buckets, 2)
        M = require_int("T5Bias", "max_distance", self.max_distance, 1)
        require_bool("T5Bias", "bidirectional", self.bidirectional)
        if self.bidirectional and (N % 2 or N < 4):
            raise ValueError(
                "T5Bias.num_buckets: expected an even int >= 4 when bidirectional (half the buckets per sign "
                f"of the distance, T5-2), got {N}"
            )
        object.__setattr__(self, "num_buckets", N)
        object.__setattr__(self, "max_distance", M)
        if M <= self.max_exact:
            raise ValueError(
                f"T5Bias.max_distance: expected an int > max_exact = {self.max_exact} (the distances that keep "
                f"a bucket of their own, T5-3), got {M}"
            )

    @property
    def side_buckets(self) -> int:
        """The buckets of one sign of the distance: N / 2 when bidirectional, else N (T5-2)."""
        return self.num_buckets // 2 if self.bidirectional else self.num_buckets

    @property
    def max_exact(self) -> int:
        """The distances 0 .. max_exact - 1 that have a bucket each (T5-3): half the side's buckets."""
        return self.side_buckets // 2

    def thresholds(self) -> tuple:
        """T5-3 as integers: t_b, the least distance n whose log bucket is max_exact + b, for b = 1 ..
        side_buckets - max_exact - 1 (increasing). The bucket of n >= max_exact is max_exact + the
        number of thresholds <= n; the backends look buckets up by these, never by a logarithm."""
        e, M, S = self.max_exact, self.max_distance, self.side_buckets - self.max_exact
        out = []
        for b in range(1, S):
            # the least n with n^S * e^b >= M^b * e^S, i.e. floor(S * ln(n / e) / ln(M / e)) >= b
            target = M**b * e ** (S - b)
            n = max(e, int(target ** (1.0 / S)))  # an estimate; exact integer steps settle it
            while n**S < target:
                n += 1
            while n > e and (n - 1) ** S >= target:
                n -= 1
            out.append(n)
        return tuple(out)

    def bucket(self, delta: int) -> int:
        """T5-2, T5-3: the row of ``rel_b`` for the distance delta = k_pos - q_pos (POS-2)."""
        return t5_bucket(delta, self.num_buckets, self.max_distance, self.bidirectional)

    def param_shapes(self, num_heads: int, head_dim: int, value_head_dim: int) -> dict[str, tuple[int, ...]]:
        """T5-1: ``rel_b``, (H, num_buckets)."""
        return {"rel_b": (num_heads, self.num_buckets)}

    @property
    def hooks(self) -> frozenset:
        return frozenset({"bias"})

    @property
    def features(self) -> frozenset:
        return frozenset({"t5"} if self.bidirectional else {"t5", "t5-causal"})


def t5_bucket(delta: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True) -> int:
    """T5-2, T5-3: the bucket of one distance delta = k_pos - q_pos (POS-2), in exact integer arithmetic.

    With S the side's buckets (N / 2 bidirectional, else N) and e = S // 2:
    a bidirectional key after the query (delta > 0) starts at bucket S, and
    n = |delta|; a causal one (bidirectional False) has n = max(-delta, 0), so
    every later key is bucket 0. Then n < e is its own bucket, and beyond,
    ``min(S - 1, e + floor((S - e) * ln(n / e) / ln(max_distance / e)))``
    computed without a logarithm: the largest b with ``max_distance^b * e^(S-e)
    <= n^(S-e) * e^b``.

    >>> [t5_bucket(d) for d in (-3, 0, 3, 8, 12, 16, 127, 128, 10**6)]
    [3, 0, 19, 24, 25, 26, 31, 31, 31]
    >>> [t5_bucket(d, bidirectional=False) for d in (5, 0, -3, -16, -127, -128)]
    [0, 0, 3, 16, 31, 31]
    """
    if isinstance(delta, bool) or not isinstance(delta, numbers.Integral):
        raise TypeError(
            f"t5_bucket: expected delta to be an int (one distance; numpy_ref.t5_buckets maps arrays), "
            f"got {delta!r} of type {type_name(delta)}"
        )
    scheme = T5Bias(num_buckets, max_distance, bidirectional)  # validates the configuration
    delta = int(delta)
    S, e, M = scheme.side_buckets, scheme.max_exact, scheme.max_distance
    if bidirectional:
        base, n = (S if delta > 0 else 0), abs(delta)
    else:
        base, n = 0, max(-delta, 0)
    if n < e:
        return base + n
    span = S - e
    b = 0
    while b < span - 1 and M ** (b + 1) * e**span <= n**span * e ** (b + 1):
        b += 1
    return base + e + b


# -------------------------------------------------------------------- Swin
@register
@dataclass(frozen=True)
class Swin(Scheme):
    """The 2-D relative position bias of Swin Transformer windows (Liu et al. 2021; rules SWIN-1..SWIN-6).

    Fields:
      window: (Wh, Ww), the window's rows and columns, ints >= 1.
      prefix_tokens: P >= 0 tokens before the window's tokens (BEiT's class
        token); with P > 0 the table has 3 more rows (SWIN-4).

    Positions carry 2-D coordinates (POS-5): p < P is a prefix token, p >= P
    the window token at row (p - P) // Ww, column (p - P) % Ww. One table
    ``rel_b`` (H, R), R = (2Wh - 1)(2Ww - 1) (+ 3 with prefix tokens), read at
    the key-minus-query offset (SWIN-3); one hook, the bias, never scaled.
    """

    name = "swin"
    rule_prefix = "SWIN"

    window: tuple = (7, 7)
    prefix_tokens: int = 0

    def __post_init__(self):
        w = self.window
        if not isinstance(w, (tuple, list)) or len(w) != 2:
            raise TypeError(f"Swin.window: expected a pair (Wh, Ww) of ints >= 1, got {w!r} of type {type_name(w)}")
        object.__setattr__(
            self, "window", (require_int("Swin", "window[0]", w[0], 1), require_int("Swin", "window[1]", w[1], 1))
        )
        object.__setattr__(self, "prefix_tokens", require_int("Swin", "prefix_tokens", self.prefix_tokens, 0))

    @property
    def offset_rows(self) -> int:
        """(2Wh - 1)(2Ww - 1): the rows indexed by 2-D offsets (SWIN-3)."""
        Wh, Ww = self.window
        return (2 * Wh - 1) * (2 * Ww - 1)

    @property
    def num_rows(self) -> int:
        """R: the offset rows, plus 3 prefix rows when prefix_tokens > 0 (SWIN-4)."""
        return self.offset_rows + (3 if self.prefix_tokens else 0)

    def coordinates(self, position: int) -> Optional[tuple]:
        """POS-5: (row, column) of the token at ``position`` (floor division), or None for a prefix
        token (position < P; none when P = 0)."""
        P, Ww = self.prefix_tokens, self.window[1]
        return None if P and position < P else divmod(position - P, Ww)

    def row(self, q_pos: int, k_pos: int) -> int:
        """SWIN-3, SWIN-4: the row of ``rel_b`` for query position q_pos and key position k_pos."""
        qc, kc = self.coordinates(q_pos), self.coordinates(k_pos)
        if qc is None or kc is None:
            base = self.offset_rows
            return base + 2 if qc is None and kc is None else base + (0 if qc is None else 1)
        Wh, Ww = self.window
        dh = min(max(kc[0] - qc[0], 1 - Wh), Wh - 1)
        dw = min(max(kc[1] - qc[1], 1 - Ww), Ww - 1)
        return (dh + Wh - 1) * (2 * Ww - 1) + (dw + Ww - 1)

    def param_shapes(self, num_heads: int, head_dim: int, value_head_dim: int) -> dict[str, tuple[int, ...]]:
        """SWIN-1: ``rel_b``, (H, R)."""
        return {"rel_b": (num_heads, self.num_rows)}

    @property
    def hooks(self) -> frozenset:
        return frozenset({"bias"})

    @property
    def features(self) -> frozenset:
        return frozenset({"swin", "swin-prefix"} if self.prefix_tokens else {"swin"})

    def to_json(self) -> dict:
        return {"scheme": self.name, "window": list(self.window), "prefix_tokens": self.prefix_tokens}


def swin_positions(coords, window: tuple, prefix_tokens: int = 0) -> list:
    """POS-5: integer positions for ``prefix_tokens`` prefix tokens followed by window tokens at
    ``coords`` (a sequence of (row, column) pairs inside the window), for ``q_positions`` / ``k_positions``.

    >>> swin_positions([(0, 0), (1, 2), (2, 3)], (3, 4), prefix_tokens=1)
    [0, 1, 7, 12]
    """
    swin = Swin(tuple(window) if isinstance(window, list) else window, prefix_tokens)
    Wh, Ww = swin.window
    out = list(range(swin.prefix_tokens))
    for n, c in enumerate(coords):
        if not isinstance(c, (tuple, list)) or len(c) != 2:
            raise TypeError(f"swin_positions: expected coords[{n}] to be a (row, column) pair, got {c!r}")
        h = require_int("swin_positions", f"coords[{n}][0]", c[0], 0)
        w = require_int("swin_positions", f"coords[{n}][1]", c[1], 0)
        if h >= Wh or w >= Ww:
            raise ValueError(f"swin_positions: expected coords[{n}] inside the window {Wh} x {Ww}, got {(h, w)}")
        out.append(swin.prefix_tokens + h * Ww + w)
    return out


# ------------------------------------------------------------------ fields
def _require_positive(owner: str, field: str, value) -> float:
    v = require_real(owner, field, value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{owner}.{field}: expected a finite number > 0, got {value!r}")
    return v


def _require_slopes(values) -> tuple:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or not len(values):
        raise TypeError(
            f"Alibi.slopes: expected None or a non-empty sequence of finite numbers >= 0, got {values!r} "
            f"of type {type_name(values)}"
        )
    out = []
    for n, v in enumerate(values):
        f = require_real("Alibi", f"slopes[{n}]", v)
        if not (math.isfinite(f) and f >= 0):
            raise ValueError(f"Alibi.slopes[{n}]: expected a finite number >= 0 (ALIBI-2), got {v!r}")
        out.append(f)
    return tuple(out)
