"""The vocabulary of conformance cases: what a case is and how its inputs are drawn.

A case is declarative: a spec, sizes, and a few *recipes* for the optional
inputs (mask, bias, positions, keep mask). Inputs are drawn once, from a
seed derived from the case id, by ``python -m conformance generate``, and
stored; nothing here runs at test time except to describe the case.

Axis letters in recipe patterns follow AXES-1: B, H, Q (= Lq), K (= Lk), and
1 for a broadcast axis, aligned from the right as in MASK-1.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from spec import AttentionSpec

ALL_DTYPES = ("float64", "float32", "bfloat16", "float16")

#: Rules every case exercises by construction: inputs are judged against the
#: float64 truth (PREC-1) with stored budgets (PREC-2) and exact checks
#: (PREC-3); the manifest pins the spec version (VER-1) and the report states
#: claims by version and rule ids (VER-2); shapes use the legend (AXES-1).
#: Every kernel of an implementation is judged by the same cases (KERN-1), and
#: against the stored goldens, never a recomputation (PREC-5).
HARNESS_RULES = ("AXES-1", "PREC-1", "PREC-2", "PREC-3", "PREC-5", "PREC-6", "KERN-1", "VER-1", "VER-2")


@dataclass(frozen=True)
class Dims:
    B: int
    Lq: int
    Lk: int


def _shape(pattern: str, dims: Dims, H: int) -> tuple:
    sizes = {"B": dims.B, "H": H, "Q": dims.Lq, "K": dims.Lk, "1": 1}
    return tuple(sizes[c] for c in pattern)


@dataclass(frozen=True)
class Mask:
    """A boolean mask, True = attend (MASK-1), of the given broadcast pattern.

    ``dead_keys`` trailing keys are masked for every query (padding, MASK-7);
    ``empty_rows`` leading query rows attend nothing (MASK-5). The explicit
    cells vary across batch elements and heads (the pattern must be BHQK):
    ``empty_cells`` (b, h, i) empties query row i in batch element b and head
    h only; ``dead_cells`` (b, h, j) masks key j for every query of (b, h)
    only, so a key masked in every head of one batch element is dead there
    and alive in the others.
    """

    pattern: str = "BHQK"
    density: float = 0.75
    dead_keys: int = 0
    empty_rows: int = 0
    empty_cells: tuple = ()
    dead_cells: tuple = ()

    def draw(self, rng, dims: Dims, H: int) -> dict:
        mask = rng.random(_shape(self.pattern, dims, H)) < self.density
        if self.dead_keys:
            assert self.pattern[-1] == "K"
            mask[..., dims.Lk - self.dead_keys :] = False
        if self.empty_rows:
            assert self.pattern[-2:] == "QK"
            mask[..., : self.empty_rows, :] = False
        if self.empty_cells or self.dead_cells:
            assert self.pattern == "BHQK", "cells address (b, h) of a full-rank mask"
            for b, h, i in self.empty_cells:
                mask[b, h, i, :] = False
            for b, h, j in self.dead_cells:
                mask[b, h, :, j] = False
        return {"mask": mask}

    @property
    def features(self):
        return {"mask"}


@dataclass(frozen=True)
class Bias:
    """A float bias (BIAS-1) of the given pattern; ``neg_inf`` of its entries are -inf (BIAS-2).

    ``empty_rows`` leading query rows are entirely -inf; ``dead_keys`` (b, j)
    makes key j -inf for every head and query of batch element b (the pattern
    must have a B axis), so the bias alone removes it (MASK-7). ``offset`` is
    added to every entry: logits of +-1000 overflow ``exp`` in float64 unless
    the row maximum is subtracted first (SOFTMAX-1), while the weights stay
    those of the N(0, 1) part (a constant per row changes nothing).
    """

    pattern: str = "BHQK"
    neg_inf: float = 0.0
    empty_rows: int = 0
    dead_keys: tuple = ()
    offset: float = 0.0
    shift_groups: int = 0  # > 0: Swin's shifted-window mask, 0 within a group of tokens, -100 across (SWIN-5)

    def draw(self, rng, dims: Dims, H: int) -> dict:
        if self.shift_groups:
            q = np.arange(dims.Lq) * self.shift_groups // dims.Lq
            k = np.arange(dims.Lk) * self.shift_groups // dims.Lk
            bias = np.where(q[:, None] == k[None, :], 0.0, -100.0)
            return {"bias": np.broadcast_to(bias, _shape(self.pattern, dims, H)).copy()}
        bias = rng.normal(0.0, 1.0, size=_shape(self.pattern, dims, H))
        if self.offset:
            bias += self.offset
        if self.neg_inf:
            bias[rng.random(bias.shape) < self.neg_inf] = -np.inf
        if self.empty_rows:
            bias[..., : self.empty_rows, :] = -np.inf
        if self.dead_keys:
            assert len(self.pattern) == 4 and self.pattern[0] == "B" and self.pattern[-1] == "K"
            for b, j in self.dead_keys:
                bias[b, ..., j] = -np.inf
        return {"bias": bias}

    @property
    def features(self):
        return {"bias"}


def _runs_per_batch(rng, dims: Dims, step: int) -> dict:
    """(B, L) runs of positions ``step`` apart whose key-minus-query offset differs in every batch element."""
    start = rng.integers(-4, 5, size=(dims.B, 1))
    offset = 3 * np.arange(dims.B)[:, None] - dims.B
    return {
        "q_positions": (step * np.arange(dims.Lq) + start).astype(np.int64),
        "k_positions": (step * np.arange(dims.Lk) + start + offset).astype(np.int64),
    }


@dataclass(frozen=True)
class Positions:
    """Explicit positions (POS-1).

    kinds: ``bottom-right`` (queries are the last Lq of Lk positions, POS-3);
    ``shifted`` (default positions plus a constant, POS-4); ``random``
    (unsorted integers with repeats, shape (L,)); ``per-batch`` (contiguous
    runs with a different offset per batch element, shape (B, L));
    ``per-batch-offsets`` (contiguous runs, shape (B, L), whose key-minus-query
    offset differs between every two batch elements); ``random-per-batch``
    (unsorted integers with repeats, shape (B, L), different in every batch
    element); ``random-queries`` (unsorted query positions, keys left at their
    default ``arange(Lk)``); ``spread`` (keys three apart, so distances
    outgrow small tables); ``strided-per-batch`` (queries and keys two apart,
    shape (B, L), offsets differing per batch element: no step of 1
    anywhere); ``gapped-queries`` (runs of consecutive queries with one gap
    of 3, default keys); ``constant`` (every query at one position, every key
    at another); ``unsigned`` (unsorted uint8 positions, shape (L,): POS-1
    allows any integer dtype, and ``k - q`` must not wrap around); ``far``
    (contiguous runs starting near 2**17, keys a few positions off the
    queries: where angles made in float32 or positions held in 16 bits go
    wrong, ROPE-9); ``spread-queries`` (Lq queries evenly over the default
    keys' range, first and last included: every distance from -(Lk - 1) to
    Lk - 1 occurs); ``permuted`` (queries and keys at one permutation of
    ``arange(L)``, self-attention: the tokens of a window in another order,
    POS-5); ``zigzag`` (self-attention, the tokens in the load-balanced causal
    order of 2 shards: the 4 chunks of L / 4 tokens as 0, 3, 1, 2, BLOCK-5).
    """

    kind: str

    KINDS = (
        "bottom-right",
        "shifted",
        "random",
        "per-batch",
        "per-batch-offsets",
        "random-per-batch",
        "random-queries",
        "spread",
        "strided-per-batch",
        "gapped-queries",
        "constant",
        "unsigned",
        "far",
        "spread-queries",
        "permuted",
        "zigzag",
    )

    def draw(self, rng, dims: Dims, H: int) -> dict:
        Lq, Lk, B = dims.Lq, dims.Lk, dims.B
        if self.kind == "bottom-right":
            return {"q_positions": np.arange(Lk - Lq, Lk, dtype=np.int64)}
        if self.kind == "shifted":
            shift = int(rng.integers(50, 150))
            return {
                "q_positions": np.arange(Lq, dtype=np.int64) + shift,
                "k_positions": np.arange(Lk, dtype=np.int64) + shift,
            }
        if self.kind == "random":
            return {
                "q_positions": rng.integers(-3, Lk + 3, size=Lq).astype(np.int64),
                "k_positions": rng.integers(-3, Lk + 3, size=Lk).astype(np.int64),
            }
        if self.kind == "per-batch":
            off = rng.integers(-4, 5, size=(B, 1))
            return {
                "q_positions": (np.arange(Lq) + off).astype(np.int64),
                "k_positions": (np.arange(Lk) + off + rng.integers(-2, 3, size=(B, 1))).astype(np.int64),
            }
        if self.kind == "per-batch-offsets":
            return _runs_per_batch(rng, dims, step=1)
        if self.kind == "random-per-batch":
            return {
                "q_positions": rng.integers(-3, Lk + 3, size=(B, Lq)).astype(np.int64),
                "k_positions": rng.integers(-3, Lk + 3, size=(B, Lk)).astype(np.int64),
            }
        if self.kind == "random-queries":
            return {"q_positions": rng.permutation(Lk + 3)[:Lq].astype(np.int64) - 1}
        if self.kind == "spread":
            return {"k_positions": 3 * np.arange(Lk, dtype=np.int64)}
        if self.kind == "strided-per-batch":
            return _runs_per_batch(rng, dims, step=2)
        if self.kind == "gapped-queries":
            q = np.arange(Lq, dtype=np.int64)
            q[Lq // 2 :] += 2
            return {"q_positions": q}
        if self.kind == "unsigned":
            return {
                "q_positions": rng.integers(0, Lk + 3, size=Lq).astype(np.uint8),
                "k_positions": rng.integers(0, Lk + 3, size=Lk).astype(np.uint8),
            }
        if self.kind == "far":
            start = 2**17 + int(rng.integers(0, 64))
            return {
                "q_positions": np.arange(Lq, dtype=np.int64) + start,
                "k_positions": np.arange(Lk, dtype=np.int64) + start + int(rng.integers(-3, 4)),
            }
        if self.kind == "spread-queries":
            return {"q_positions": (np.arange(Lq) * (Lk - 1) // max(Lq - 1, 1)).astype(np.int64)}
        if self.kind == "permuted":
            order = rng.permutation(Lq).astype(np.int64)
            return {"q_positions": order, "k_positions": order.copy()}
        if self.kind == "zigzag":
            chunks = np.array_split(np.arange(Lq, dtype=np.int64), 4)
            order = np.concatenate([chunks[i] for i in (0, 3, 1, 2)])
            return {"q_positions": order, "k_positions": order.copy()}
        if self.kind == "constant":
            return {"q_positions": np.full(Lq, 1, dtype=np.int64), "k_positions": np.full(Lk, 4, dtype=np.int64)}
        raise ValueError(f"Positions.kind: expected one of {', '.join(self.KINDS)}, got {self.kind!r}")

    @property
    def features(self):
        return {"positions"}


@dataclass(frozen=True)
class Keep:
    """A dropout keep mask (B, H, Lq, Lk), True with probability 1 - p (DROP-1)."""

    def draw(self, rng, dims: Dims, H: int, p: float = 0.5) -> dict:
        return {"dropout_keep": rng.random((dims.B, H, dims.Lq, dims.Lk)) >= p}

    @property
    def features(self):
        return {"dropout-keep"}


@dataclass(frozen=True)
class Twin:
    """Another way of calling the same layer that must give the same result.

    ``spec`` replaces the case's spec; ``inputs`` names a transformation of
    the drawn inputs and ``params`` one of the parameters (see
    ``conformance.checks.twin_inputs`` and ``twin_params``). Used for
    equivalences the rules imply (HUANG-5, POS-4, CAUSAL-1, MASK-1, BIAS-2,
    ROPE-8).
    """

    name: str
    rules: tuple
    spec: Optional[AttentionSpec] = None
    inputs: str = "same"
    params: str = "same"


@dataclass(frozen=True)
class Case:
    id: str
    rules: tuple
    spec: AttentionSpec
    dims: Dims
    self_attention: bool = False
    value_omitted: bool = False  # cross-attention called with key and without value (SHAPE-2: value = key)
    recipes: tuple = ()
    dtypes: tuple = ALL_DTYPES
    store_weights: bool = True
    twins: tuple = ()
    expect_error: Optional[str] = None  # an error case: "TypeError" / "ValueError"
    error_inputs: Optional[str] = None  # which bad input (see checks.ERROR_INPUTS)
    notes: str = ""
    extra_features: frozenset = field(default_factory=frozenset)
    # ROPE-10, POS-3: a causal self-attention case also decoded as a prefill of this many queries, then one
    # query per step, against a static cache of Lk slots (unwritten slots zero and beyond every query)
    decode_from: Optional[int] = None

    @property
    def seed(self) -> int:
        """A stable seed from the id: the same inputs on every machine and version."""
        return int(hashlib.sha256(self.id.encode()).hexdigest()[:8], 16)

    @property
    def all_rules(self) -> tuple:
        extra = HARNESS_RULES + (("PREC-4",) if {"bfloat16", "float16"} & set(self.dtypes) else ())
        return tuple(dict.fromkeys(self.rules + extra))

    def features(self) -> frozenset:
        """What an adapter must support to run this case (its capabilities)."""
        s = self.spec
        f = set(self.extra_features)
        for r in self.recipes:
            f |= r.features
        if s.relative is not None:
            f |= s.relative.features  # the scheme states what it needs (REL-3)
        if s.relative is not None and not s.scale_relative:
            f.add("unscaled-relative")
        if s.causal:
            f.add("causal")
        if s.mask_fill is not None:
            f.add("mask-fill")
        if s.scale is not None:
            f.add("custom-scale")
        if not s.bias:
            f.add("no-projection-bias")
        if s.dropout > 0:
            f.add("dropout-spec")
        if s.kv_heads != s.num_heads:
            f.add("grouped-kv-heads")
        if s.v_head_dim != s.head_dim:
            f.add("value-head-dim")
        if s.softcap is not None:
            f.add("softcap")
        if s.window is not None:
            f.add("window")
        if not self.self_attention:
            f.add("cross-attention")
        if self.expect_error:
            f.add("validates-input")
        return frozenset(f)

    def decoding_features(self) -> frozenset:
        """What the prefill-and-steps check (``decode_from``) needs besides the case's own features."""
        return self.features() | {"cross-attention", "positions"}

    def draw(self, rng) -> dict:
        """Draw the optional inputs of this case (not the dense ones)."""
        out: dict = {}
        for r in self.recipes:
            if isinstance(r, Keep):
                out.update(r.draw(rng, self.dims, self.spec.num_heads, self.spec.dropout))
            else:
                out.update(r.draw(rng, self.dims, self.spec.num_heads))
        return out
