"""Random attention calls covering every option (the peer options included), for property-based tests.

``random_call(seed)`` draws a spec, parameters and every optional input from
one integer, so hypothesis only has to search over integers and a failure
reproduces from the seed it prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import numpy_ref
from spec import Alibi, AttentionSpec, Huang, Rope, Shaw, Swin, T5Bias


@dataclass
class RandomCall:
    spec: AttentionSpec
    params: dict
    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    kwargs: dict = field(default_factory=dict)

    def args(self):
        return self.spec, self.params, self.query, self.key, self.value


def broadcast_shape(rng, full):
    """A random shape broadcastable to ``full`` under MASK-1 (rank 1..4, axes 1 or full)."""
    rank = int(rng.integers(1, len(full) + 1))
    return tuple(int(n) if rng.random() < 0.6 else 1 for n in full[len(full) - rank :])


def positions(rng, B, L, contiguous):
    start = int(rng.integers(-4, 8))
    if contiguous:
        row = np.arange(start, start + L)
        return row if rng.random() < 0.5 else np.stack([row + int(rng.integers(-3, 4)) for _ in range(B)])
    shape = (L,) if rng.random() < 0.5 else (B, L)
    return rng.integers(-6, 10, size=shape)


def random_spec(rng) -> AttentionSpec:
    H, d = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    kind = rng.choice(["none", "shaw", "huang", "rope", "alibi", "t5", "swin"])
    relative = None
    if kind == "shaw":
        keys = bool(rng.random() < 0.8)
        relative = Shaw(
            int(rng.integers(0, 6)),
            keys=keys,
            values=(not keys) or bool(rng.random() < 0.7),
            per_head=bool(rng.random() < 0.5),
        )
    elif kind == "huang":
        relative = Huang(int(rng.integers(1, 6)), per_head=bool(rng.random() < 0.5))
    elif kind == "rope":
        d = 2 * int(rng.integers(1, 3))  # ROPE-2: pairs
        relative = random_rope(rng, d)
    elif kind == "alibi":  # ALIBI-2..ALIBI-4: the schedule or explicit slopes (zeros too), both forms
        slopes = None
        if rng.random() < 0.3:
            slopes = tuple(float(m) if rng.random() < 0.8 else 0.0 for m in rng.uniform(0.05, 1.0, size=H))
        relative = Alibi(slopes, max_bias=float(rng.choice([8.0, 4.0])), symmetric=bool(rng.random() < 0.6))
    elif kind == "t5":  # T5-2..T5-4: both directions, small tables that saturate within a few positions
        bidirectional = bool(rng.random() < 0.6)
        N = 2 * int(rng.integers(2, 6)) if bidirectional else int(rng.integers(2, 9))
        side = N // 2 if bidirectional else N
        relative = T5Bias(N, side // 2 + int(rng.integers(1, 6)), bidirectional)
    elif kind == "swin":  # SWIN-2..SWIN-4: square and non-square windows, prefix tokens
        relative = Swin((int(rng.integers(1, 4)), int(rng.integers(1, 4))), prefix_tokens=int(rng.integers(0, 3)))
    return AttentionSpec(
        num_heads=H,
        head_dim=d,
        bias=bool(rng.random() < 0.7),
        scale=None if rng.random() < 0.6 else float(rng.uniform(0.1, 2.0)),
        relative=relative,
        scale_relative=bool(rng.random() < 0.7),
        causal=bool(rng.random() < 0.4),
        mask_fill=None if rng.random() < 0.75 else float(rng.choice([-1e9, -30.0, -2.5])),
        dropout=0.0 if rng.random() < 0.7 else float(rng.uniform(0.05, 0.6)),
        **peer_options(rng, H),
    )


def random_rope(rng, d: int) -> Rope:
    """ROPE-2..ROPE-7: a layout, a rotary dim, a base or explicit frequencies (zeros too), an attention factor."""
    r = d if rng.random() < 0.6 else 2 * int(rng.integers(1, d // 2 + 1))
    inv_freq = None
    if rng.random() < 0.3:
        inv_freq = tuple(float(f) if rng.random() < 0.8 else 0.0 for f in rng.uniform(0.01, 1.5, size=r // 2))
    return Rope(
        theta=float(rng.choice([10.0, 500.0, 10000.0])),
        rotary_dim=None if r == d and rng.random() < 0.5 else r,
        layout=str(rng.choice(["half", "interleaved"])),
        inv_freq=inv_freq,
        attention_factor=1.0 if rng.random() < 0.7 else float(rng.uniform(0.7, 1.5)),
    )


def peer_options(rng, H: int) -> dict:
    """HEAD-3, HEAD-4, SOFTCAP-1, WINDOW-1: each option drawn on its own, most calls without it."""
    divisors = [k for k in range(1, H) if H % k == 0]
    window = None
    if rng.random() < 0.3:
        left, right = (None if rng.random() < 0.3 else int(rng.integers(0, 4)) for _ in range(2))
        window = (left, right) if (left, right) != (None, None) else (int(rng.integers(0, 4)), None)
    return {
        "num_kv_heads": int(rng.choice(divisors)) if divisors and rng.random() < 0.4 else None,
        "value_head_dim": int(rng.integers(1, 5)) if rng.random() < 0.3 else None,
        "softcap": float(rng.uniform(0.5, 5.0)) if rng.random() < 0.25 else None,
        "window": window,
    }


def random_call(
    seed: int, *, max_len: int = 4, spec: AttentionSpec | None = None, cross: bool | None = None
) -> RandomCall:
    rng = np.random.default_rng(seed)
    spec = random_spec(rng) if spec is None else spec
    H, D = spec.num_heads, spec.model_dim
    B, Lq = int(rng.integers(1, 3)), int(rng.integers(1, max_len + 1))
    cross = bool(rng.random() < 0.6) if cross is None else cross
    Lk = int(rng.integers(1, max_len + 1)) if cross else Lq
    params = numpy_ref.init_params(spec, seed=int(rng.integers(0, 2**31)))
    query = rng.normal(size=(B, Lq, D))
    key = rng.normal(size=(B, Lk, D)) if cross else query
    value = rng.normal(size=(B, Lk, D)) if cross else query
    full = (B, H, Lq, Lk)
    kw: dict = {}
    if rng.random() < 0.5:
        kw["mask"] = rng.random(broadcast_shape(rng, full)) < 0.75
    if rng.random() < 0.4:
        bias = rng.normal(size=broadcast_shape(rng, full))
        bias[rng.random(bias.shape) < 0.15] = -np.inf
        kw["bias"] = bias
    if rng.random() < 0.5:
        contiguous = bool(rng.random() < 0.5)
        kw["q_positions"] = positions(rng, B, Lq, contiguous)
        kw["k_positions"] = positions(rng, B, Lk, contiguous)
    if spec.dropout > 0 and rng.random() < 0.8:
        kw["dropout_keep"] = rng.random(full) >= spec.dropout
    return RandomCall(spec, params, query, key, value, kw)
