"""The catalog-coverage review: which cases vary which input dimension, per position scheme, and which
cases cross every scheme and option with the axes along which a rule can hold in one setting and not another.

Each *dimension* is a predicate over a case and its stored inputs (masks,
bias, positions and the exact-check data are read from the goldens, so the
table says what the cases really contain, not what their names promise).
``python -m conformance coverage`` prints the tables (``--write`` stores them); ``conformance/COVERAGE.md``
is their stored form, and a test keeps the two equal. A dimension marked
*every scheme* must have a case in each scheme column (vanilla, Shaw,
Huang, ...): the mistakes it exposes are written once per scheme in real code.

The second table, *combinations*, has a row per scheme and per option (a *subject*) and a column per
*axis*: causal and not, default and explicit positions, a decode step and a sequence past every kernel's
first query tile, and each dtype. A rule exercised only with ``causal=True``, only at default positions,
only at one length or only in float32 is untested in the others; so every cell needs a case, or the
subject names the one-line reason why the combination means nothing.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .cases import ALL_DTYPES, Case
from .catalog import CASES
from .checks import ERROR_INPUTS
from .store import load_case, load_manifest

SCHEMES = ("vanilla", "shaw", "huang", "rope", "alibi", "t5", "swin")
STORED = pathlib.Path(__file__).resolve().with_name("COVERAGE.md")


def scheme_of(case: Case) -> str:
    return "vanilla" if case.spec.relative is None else case.spec.relative.name


@dataclass(frozen=True)
class Dimension:
    group: str
    name: str
    test: Callable  # (case, View) -> bool
    every_scheme: bool = False
    schemes: tuple = SCHEMES  # the columns where the dimension means something


class View:
    """A case's stored inputs, as the predicates need them (B, H, Lq, Lk resolved)."""

    def __init__(self, case: Case, tensors: dict):
        self.case, self.t = case, tensors
        self.B, self.H, self.Lq, self.Lk = case.dims.B, case.spec.num_heads, case.dims.Lq, case.dims.Lk

    def get(self, name):
        return self.t.get(name)

    def positions(self):
        qp = self.t.get("q_positions", np.arange(self.Lq))
        kp = self.t.get("k_positions", np.arange(self.Lk))
        return np.asarray(qp).reshape(-1, self.Lq), np.asarray(kp).reshape(-1, self.Lk)

    def delta(self) -> np.ndarray:
        qp, kp = self.positions()
        return kp[:, None, :] - qp[:, :, None]

    def bias(self):
        return self.t.get(f"{self.case.dtypes[0]}/inputs/bias")  # float64 where stored

    def full_mask(self):
        m = self.t.get("mask")
        return None if m is None else np.broadcast_to(m, (self.B, self.H, self.Lq, self.Lk))

    def rows(self):
        return self.t.get("exact/fully_masked_rows")  # (B, H, Lq)

    def dead(self):
        return self.t.get("exact/dead_keys")  # (B, Lk)


def _beyond_table(case: Case, v: View) -> bool:
    r = case.spec.relative
    if r is None or r.name not in REL_ONLY:
        return False
    reach = r.max_distance if r.name == "shaw" else r.max_len - 1
    return bool(np.abs(v.delta()).max() > reach)


def _offsets_differ(v: View) -> bool:
    d = v.delta()
    return d.shape[0] > 1 and not np.all(d == d[:1])


def _keys_masked_in_some_heads(v: View) -> bool:
    m = v.full_mask()
    if m is None or v.H < 2:
        return False
    column_off = ~m.any(axis=2)  # (B, H, Lk): key masked for every query of that head
    return bool((column_off.any(axis=1) & ~column_off.all(axis=1)).any())


def _rows_empty_in_some_heads(v: View) -> bool:
    rows = v.rows()
    return rows is not None and bool((rows.any(axis=1) & ~rows.all(axis=1)).any())


def _bias_only_dead(v: View) -> bool:
    dead, b = v.dead(), v.bias()
    if dead is None or b is None or not dead.any():
        return False
    m = v.full_mask()
    if m is None:
        return True
    return bool((dead & m.any(axis=(1, 2))).any())  # dead, though the mask lets some query attend it


def _bias_singleton(v: View, axis: int) -> bool:
    b = v.bias()
    return b is not None and b.ndim >= -axis and b.shape[axis] == 1 and (v.Lq if axis == -2 else v.Lk) > 1


def _error(argument: str):
    return lambda c, v: c.expect_error is not None and ERROR_INPUTS[c.error_inputs][0] == argument


def _numeric(test):
    return lambda c, v: c.expect_error is None and test(c, v)


REL_ONLY = ("shaw", "huang")
ROPE_ONLY = ("rope",)


def _rope(case: Case, field: str):
    """A field of the case's Rope, or None without one."""
    r = case.spec.relative
    return getattr(r, field) if r is not None and r.name == "rope" else None


def _rope_partial(case: Case) -> bool:
    r = case.spec.relative
    return r is not None and r.name == "rope" and r.rotated(case.spec.head_dim) < case.spec.head_dim


DIMENSIONS = (
    # shapes and call forms
    Dimension("call", "self-attention (key omitted)", _numeric(lambda c, v: c.self_attention), True),
    Dimension("call", "cross-attention, Lq < Lk", _numeric(lambda c, v: not c.self_attention and v.Lq < v.Lk), True),
    Dimension("call", "cross-attention, Lq > Lk", _numeric(lambda c, v: v.Lq > v.Lk)),
    Dimension("call", "a single query (Lq = 1)", _numeric(lambda c, v: v.Lq == 1)),
    Dimension("call", "value omitted (value = key, SHAPE-2)", _numeric(lambda c, v: c.value_omitted)),
    Dimension("call", "a prime length (L = 37: no tile divides it)", _numeric(lambda c, v: v.Lq == 37)),
    Dimension("call", "long sequence (L >= 512: several query tiles)", _numeric(lambda c, v: v.Lq >= 512), True),
    # positions
    Dimension("positions", "default positions", _numeric(lambda c, v: "positions" not in c.features()), True),
    Dimension("positions", "bottom-right queries (POS-3)", _numeric(lambda c, v: _bottom_right(v)), True),
    Dimension("positions", "explicit query and key positions, shape (L,)", _numeric(lambda c, v: _pos_rank(v, 1))),
    Dimension("positions", "positions per batch element, shape (B, L)", _numeric(lambda c, v: _pos_rank(v, 2)), True),
    Dimension(
        "positions", "key-minus-query offsets differ across batch", _numeric(lambda c, v: _offsets_differ(v)), True
    ),
    Dimension("positions", "unsorted or repeated positions", _numeric(lambda c, v: _unsorted(v)), True),
    Dimension("positions", "non-consecutive queries, default keys", _numeric(lambda c, v: _queries_only(v)), True),
    Dimension("positions", "distances beyond the table", _numeric(_beyond_table), True, REL_ONLY),
    Dimension(
        "positions",
        "causal with explicit key positions",
        _numeric(lambda c, v: c.spec.causal and "k_positions" in v.t),
        True,
    ),
    # causality and masks
    Dimension("masks", "causal", _numeric(lambda c, v: c.spec.causal), True),
    Dimension(
        "masks", "mask of rank 1 or 2", _numeric(lambda c, v: v.get("mask") is not None and v.get("mask").ndim <= 2)
    ),
    Dimension(
        "masks",
        "mask of rank 3 or 4",
        _numeric(lambda c, v: v.get("mask") is not None and v.get("mask").ndim >= 3),
        True,
    ),
    Dimension(
        "masks",
        "mask and causal together (MASK-2)",
        _numeric(lambda c, v: c.spec.causal and v.get("mask") is not None),
        True,
    ),
    Dimension(
        "masks",
        "rows empty in every head (MASK-5)",
        _numeric(lambda c, v: v.rows() is not None and bool(v.rows().all(axis=1).any())),
        True,
    ),
    Dimension("masks", "rows empty in some heads only", _numeric(lambda c, v: _rows_empty_in_some_heads(v)), True),
    Dimension("masks", "dead keys (MASK-7), cross-attention", _numeric(lambda c, v: _dead(c, v)), True),
    Dimension(
        "masks",
        "dead-key set differs across batch",
        _numeric(lambda c, v: _dead(c, v) and not np.all(v.dead() == v.dead()[:1])),
        True,
    ),
    Dimension("masks", "keys masked in some heads only", _numeric(lambda c, v: _keys_masked_in_some_heads(v)), True),
    Dimension("masks", "a key removed by a -inf bias alone", _numeric(lambda c, v: _bias_only_dead(v)), True),
    # bias
    Dimension(
        "bias",
        "bias of full rank (B, H, Lq, Lk)",
        _numeric(lambda c, v: v.bias() is not None and v.bias().shape == (v.B, v.H, v.Lq, v.Lk)),
    ),
    Dimension("bias", "bias broadcast over batch or heads", _numeric(lambda c, v: _bias_broadcast(v)), True),
    Dimension("bias", "bias with a singleton query axis", _numeric(lambda c, v: _bias_singleton(v, -2)), True),
    Dimension("bias", "bias with a singleton key axis", _numeric(lambda c, v: _bias_singleton(v, -1))),
    Dimension(
        "bias",
        "-inf bias entries (BIAS-2)",
        _numeric(lambda c, v: v.bias() is not None and bool(np.isneginf(v.bias()).any())),
        True,
    ),
    # options
    Dimension("options", "custom scale", _numeric(lambda c, v: c.spec.scale is not None), True),
    Dimension(
        "options",
        "unscaled relative term (SCALE-3)",
        _numeric(lambda c, v: c.spec.relative is not None and not c.spec.scale_relative),
        True,
        REL_ONLY,
    ),
    Dimension("options", "no projection biases", _numeric(lambda c, v: not c.spec.bias)),
    Dimension(
        "options",
        "mask_fill far below the logits (-1e9)",
        _numeric(lambda c, v: c.spec.mask_fill is not None and c.spec.mask_fill <= -100),
    ),
    Dimension(
        "options",
        "mask_fill near the logits",
        _numeric(lambda c, v: c.spec.mask_fill is not None and c.spec.mask_fill > -100),
        True,
    ),
    Dimension("options", "dropout with a keep mask", _numeric(lambda c, v: v.get("dropout_keep") is not None)),
    Dimension(
        "options",
        "dropout spec without a keep mask (DROP-3)",
        _numeric(lambda c, v: c.spec.dropout > 0 and v.get("dropout_keep") is None),
    ),
    Dimension(
        "options",
        "per-head tables",
        _numeric(lambda c, v: getattr(c.spec.relative, "per_head", None) is True),
        True,
        REL_ONLY,
    ),
    Dimension(
        "options",
        "tables shared by heads",
        _numeric(lambda c, v: getattr(c.spec.relative, "per_head", None) is False),
        True,
        REL_ONLY,
    ),
    # peer options (HEAD-3, HEAD-4, SOFTCAP-1, WINDOW-1)
    Dimension("peer options", "grouped key/value heads (HEAD-3)", _numeric(lambda c, v: c.spec.group_size > 1), True),
    Dimension("peer options", "one key/value head (multi-query)", _numeric(lambda c, v: c.spec.kv_heads == 1 < v.H)),
    Dimension(
        "peer options",
        "a value head size of its own (HEAD-4)",
        _numeric(lambda c, v: c.spec.v_head_dim != c.spec.head_dim),
        True,
    ),
    Dimension(
        "peer options", "soft-capped scores (SOFTCAP-1)", _numeric(lambda c, v: c.spec.softcap is not None), True
    ),
    Dimension(
        "peer options",
        "soft cap with -inf bias entries",
        _numeric(
            lambda c, v: c.spec.softcap is not None and v.bias() is not None and bool(np.isneginf(v.bias()).any())
        ),
    ),
    Dimension("peer options", "sliding window (WINDOW-1)", _numeric(lambda c, v: c.spec.window is not None), True),
    Dimension(
        "peer options", "window and causal together", _numeric(lambda c, v: c.spec.window is not None and c.spec.causal)
    ),
    Dimension(
        "peer options",
        "window with explicit positions",
        _numeric(lambda c, v: c.spec.window is not None and "positions" in c.features()),
        True,
    ),
    Dimension(
        "peer options",
        "rows left empty by the window",
        _numeric(lambda c, v: c.spec.window is not None and v.rows() is not None and bool(v.rows().any())),
    ),
    # RoPE (ROPE-1..ROPE-16): what only a rotation can get wrong
    Dimension(
        "rope",
        "interleaved layout (ROPE-3)",
        _numeric(lambda c, v: _rope(c, "layout") == "interleaved"),
        schemes=ROPE_ONLY,
    ),
    Dimension("rope", "partial rotation, r < d (ROPE-2)", _numeric(lambda c, v: _rope_partial(c)), schemes=ROPE_ONLY),
    Dimension(
        "rope",
        "explicit frequencies (a constructor, ROPE-12..ROPE-16)",
        _numeric(lambda c, v: _rope(c, "inv_freq") is not None),
        schemes=ROPE_ONLY,
    ),
    Dimension(
        "rope",
        "zero frequencies (ROPE-4, ROPE-16)",
        _numeric(lambda c, v: 0.0 in (_rope(c, "inv_freq") or ())),
        schemes=ROPE_ONLY,
    ),
    Dimension(
        "rope",
        "an attention factor (ROPE-7)",
        _numeric(lambda c, v: _rope(c, "attention_factor") not in (None, 1.0)),
        schemes=ROPE_ONLY,
    ),
    Dimension(
        "rope",
        "positions near 2**17 (ROPE-9)",
        _numeric(
            lambda c, v: bool(np.abs(v.delta()).max() < 64 and max(np.abs(p).max() for p in v.positions()) >= 2**17)
        ),
        schemes=ROPE_ONLY,
    ),
    Dimension(
        "rope",
        "the other layout with permuted weights (ROPE-8)",
        _numeric(lambda c, v: any(t.params == "rope-layout" for t in c.twins)),
        schemes=ROPE_ONLY,
    ),
    Dimension(
        "rope", "prefill then steps (ROPE-10)", _numeric(lambda c, v: c.decode_from is not None), schemes=ROPE_ONLY
    ),
    # extreme values and paths
    Dimension(
        "values",
        "logits near +-1000 (SOFTMAX-1)",
        _numeric(lambda c, v: v.bias() is not None and float(np.abs(v.bias()[np.isfinite(v.bias())]).min()) > 100),
        True,
    ),
    Dimension("values", "16-bit dtypes", _numeric(lambda c, v: "bfloat16" in c.dtypes), True),
    Dimension(
        "paths", "out also judged without weights (out/no-weights)", _numeric(lambda c, v: c.store_weights), True
    ),
    Dimension("paths", "poisoned gradients of dead keys", _numeric(lambda c, v: _dead(c, v)), True),
    # argument checks (the checks are shared by every scheme: spec.validation)
    Dimension("arguments", "rejects a bad mask", _error("mask")),
    Dimension("arguments", "rejects a bad keep mask", _error("dropout_keep")),
    Dimension("arguments", "rejects bad parameters", _error("params")),
    Dimension(
        "arguments", "rejects bad positions", lambda c, v: _error("q_positions")(c, v) or _error("k_positions")(c, v)
    ),
)


def _pos_rank(v: View, rank: int) -> bool:
    p = [v.get(n) for n in ("q_positions", "k_positions")]
    return any(x is not None and np.asarray(x).ndim == rank for x in p)


def _bottom_right(v: View) -> bool:
    qp = v.get("q_positions")
    return qp is not None and v.get("k_positions") is None and np.array_equal(qp, np.arange(v.Lk - v.Lq, v.Lk))


def _unsorted(v: View) -> bool:
    for n in ("q_positions", "k_positions"):
        x = v.get(n)
        if x is not None and (np.diff(np.asarray(x), axis=-1) != 1).any():
            return True
    return False


def _queries_only(v: View) -> bool:
    qp = v.get("q_positions")
    return qp is not None and v.get("k_positions") is None and (np.diff(np.asarray(qp), axis=-1) != 1).any()


def _dead(c: Case, v: View) -> bool:
    return v.dead() is not None and bool(v.dead().any()) and not c.self_attention


def _bias_broadcast(v: View) -> bool:
    b = v.bias()
    if b is None:
        return False
    full = (v.B, v.H, v.Lq, v.Lk)[4 - b.ndim :]
    return b.ndim < 4 or any(s == 1 and f > 1 for s, f in zip(b.shape[:2], full[:2]))


# ------------------------------------------------------------ combinations

#: Queries and keys past the first query tile of every kernel at its default knobs: torch tiles' and jax tiles'
#: short tiles of 256 queries (jax tiles' causal tiling from Lq = 512 on), flex's 128-row blocks, triton's
#: 64 x 64 blocks, pallas' 16 x 16. (torch tiles' element budget splits a (batch, head) pair only past
#: 1 Mi logits; the mutation campaign reaches that boundary with small knobs.)
LONG = 512


@dataclass(frozen=True)
class Axis:
    """A column of the combinations table: a setting every scheme and option must also be tested in."""

    group: str
    name: str
    test: Callable  # (case, View) -> bool


@dataclass(frozen=True)
class Subject:
    """A row of the combinations table: a scheme, a scheme's term, or an option of the spec or the call."""

    kind: str  # "scheme" or "option"
    name: str
    test: Callable  # (case, View) -> bool
    meaningless: tuple = ()  # ((axis name, the one-line reason the combination means nothing), ...)


def _decode_step(case: Case, v: View) -> bool:
    """One query after a cache of keys (POS-3): Lq = 1, Lk > 1, the query at or after every key's position;
    or a case the harness also decodes step by step (``decode_from``, ROPE-10)."""
    if case.decode_from is not None:
        return True
    if v.Lq != 1 or v.Lk < 2 or "q_positions" not in v.t:
        return False
    qp, kp = v.positions()
    return bool((qp.max(axis=-1) >= kp.max(axis=-1)).all())


AXES = (
    Axis("causality", "causal", lambda c, v: c.spec.causal),
    Axis("causality", "not causal", lambda c, v: not c.spec.causal),
    Axis("positions", "default positions", lambda c, v: "positions" not in c.features()),
    Axis("positions", "explicit positions", lambda c, v: "positions" in c.features()),
    Axis("length", "decode step (Lq = 1 after a cache)", _decode_step),
    Axis("length", f"long (Lq, Lk >= {LONG})", lambda c, v: min(v.Lq, v.Lk) >= LONG),
    *(Axis("dtype", dtype, (lambda dt: lambda c, v: dt in c.dtypes)(dtype)) for dtype in ALL_DTYPES),
)

_NO_SWIN_DECODING = (
    "decode step (Lq = 1 after a cache)",
    "Swin attends within the windows of an image encoded at once; no model decodes a window token by token",
)


def _has(feature: str):
    return lambda c, v: feature in c.features()


SUBJECTS = (
    Subject("scheme", "vanilla (no position scheme)", lambda c, v: c.spec.relative is None),
    Subject("scheme", "shaw keys (SHAW-1..5)", _has("shaw")),
    Subject("scheme", "shaw values (SHAW-4)", _has("shaw-values")),
    Subject("scheme", "shaw key-side term (SHAW-6, SHAW-7)", _has("shaw-key-side")),
    Subject("scheme", "huang (HUANG-1..5)", _has("huang")),
    Subject("scheme", "huang values (HUANG-6)", _has("huang-values")),
    Subject("scheme", "rope (ROPE-1..16)", _has("rope")),
    Subject("scheme", "alibi (ALIBI-1..5)", _has("alibi")),
    Subject("scheme", "t5 (T5-1..5)", _has("t5")),
    Subject("scheme", "swin (SWIN-1..6)", _has("swin"), (_NO_SWIN_DECODING,)),
    Subject("option", "boolean mask (MASK-1..3)", _has("mask")),
    Subject("option", "additive bias (BIAS-1, BIAS-2)", _has("bias")),
    Subject("option", "mask_fill (MASK-6)", _has("mask-fill")),
    Subject("option", "dropout keep mask (DROP-1)", _has("dropout-keep")),
    Subject("option", "grouped key/value heads (HEAD-3)", _has("grouped-kv-heads")),
    Subject("option", "value head size (HEAD-4)", _has("value-head-dim")),
    Subject("option", "soft cap (SOFTCAP-1)", _has("softcap")),
    Subject("option", "window (WINDOW-1)", _has("window")),
    Subject("option", "custom scale (SCALE-1)", _has("custom-scale")),
    Subject("option", "unscaled relative term (SCALE-3)", _has("unscaled-relative")),
    Subject("option", "no projection biases (PROJ-1)", _has("no-projection-bias")),
    Subject("option", "per-head tables", _has("per-head-tables")),
)


def combinations(cases=CASES) -> list:
    """[(subject, {axis name: [case ids]})] in the order of SUBJECTS, over the cases with numeric results."""
    views = _views([c for c in cases if c.expect_error is None])
    rows = []
    for subject in SUBJECTS:
        having = [(case, view) for case, view in views if subject.test(case, view)]
        rows.append((subject, {axis.name: [c.id for c, w in having if axis.test(c, w)] for axis in AXES}))
    return rows


def combination_gaps(rows, cases=CASES) -> list:
    """The (subject, axis) pairs without a case and without a reason why the combination means nothing, and
    (case id, "dtypes") for a numeric case judged in fewer than every dtype whose notes do not say why."""
    missing = [
        (subject.name, axis.name)
        for subject, cells in rows
        for axis in AXES
        if not cells[axis.name] and axis.name not in dict(subject.meaningless)
    ]
    return missing + [(c.id, "dtypes") for c in fewer_dtypes(cases) if not c.notes]


def fewer_dtypes(cases=CASES) -> list:
    """The numeric cases judged in fewer than every dtype (each says why in its notes)."""
    return [c for c in cases if c.expect_error is None and set(c.dtypes) != set(ALL_DTYPES)]


def _views(cases) -> list:
    manifest = load_manifest()
    return [(c, View(c, load_case(c.id, manifest["cases"][c.id]))) for c in cases]


def table(cases=CASES) -> list:
    """[(dimension, {scheme: [case ids]})] in the order of DIMENSIONS."""
    views = _views(cases)
    rows = []
    for dim in DIMENSIONS:
        cells = {s: [] for s in SCHEMES}
        for case, view in views:
            if dim.test(case, view):
                cells[scheme_of(case)].append(case.id)
        rows.append((dim, cells))
    return rows


def gaps(rows) -> list:
    """The (dimension, scheme) pairs a dimension marked every-scheme leaves empty."""
    return [(dim.name, s) for dim, cells in rows if dim.every_scheme for s in dim.schemes if not cells[s]]


def _cell(ids: list) -> str:
    shown = ", ".join(f"`{i}`" for i in ids[:4])
    return shown + (f" (+{len(ids) - 4})" if len(ids) > 4 else "")


def render(rows, combination_rows=None) -> str:
    """COVERAGE.md: the dimensions table, then the combinations table (``combinations()`` when not given)."""
    combination_rows = combinations() if combination_rows is None else combination_rows
    lines = [
        "# Catalog coverage",
        "",
        "Which cases vary which input dimension, per position scheme; generated by",
        "`python -m conformance coverage` from the catalog and the stored inputs",
        "(a test keeps this file equal to its output). Dimensions marked * must",
        "have a case in every scheme column where they apply; n/a: the dimension",
        "means nothing for that scheme. Cell entries are case ids; long cells are",
        "cut at four ids with the count.",
        "",
        "| group | dimension | " + " | ".join(SCHEMES) + " |",
        "|---|---|" + "---|" * len(SCHEMES),
    ]
    for dim, cells in rows:
        out = []
        for s in SCHEMES:
            ids = cells[s]
            if s not in dim.schemes:
                out.append("n/a")
            elif not ids:
                out.append("**none**")
            else:
                out.append(_cell(ids))
        star = " *" if dim.every_scheme else ""
        lines.append(f"| {dim.group} | {dim.name}{star} | " + " | ".join(out) + " |")
    missing = gaps(rows)
    lines += ["", f"Gaps in dimensions marked *: {len(missing)}."]
    lines += [f"- {name}: {scheme}" for name, scheme in missing]
    lines += _render_combinations(combination_rows)
    return "\n".join(lines) + "\n"


def _render_combinations(rows) -> list:
    lines = [
        "",
        "## Combinations",
        "",
        "Every scheme and every option (rows) crossed with the settings a rule can hold in one of and",
        "not the other (columns): causal and not; default and explicit positions; a decode step (one",
        "query at or after every key of a cache, POS-3, or a case also decoded step by step, ROPE-10)",
        f"and a sequence past every kernel's first query tile (Lq, Lk >= {LONG}); every dtype. Each",
        "cell needs a case; n/a cells give the reason the combination means nothing. Cells are cut at",
        "two ids with the count.",
        "",
        "| subject | " + " | ".join(axis.name for axis in AXES) + " |",
        "|---|" + "---|" * len(AXES),
    ]
    reasons = []
    for subject, cells in rows:
        out = []
        why = dict(subject.meaningless)
        for axis in AXES:
            ids = cells[axis.name]
            if axis.name in why and not ids:
                reasons.append(f"- {subject.name}, {axis.name}: {why[axis.name]}")
                out.append(f"n/a ({len(reasons)})")
            elif not ids:
                out.append("**none**")
            else:
                out.append(", ".join(f"`{i}`" for i in ids[:2]) + (f" (+{len(ids) - 2})" if len(ids) > 2 else ""))
        lines.append(f"| {subject.name} | " + " | ".join(out) + " |")
    lines += ["", *[f"({i}) {r[2:]}" for i, r in enumerate(reasons, 1)]] if reasons else []
    lines += ["", "Numeric cases judged in fewer than every dtype, and why:", ""]
    lines += [f"- `{c.id}` ({', '.join(c.dtypes)}): {c.notes or '**no reason given**'}" for c in fewer_dtypes()]
    missing = combination_gaps(rows)
    lines += ["", f"Gaps in the combinations: {len(missing)}."]
    lines += [f"- {name}: {axis}" for name, axis in missing]
    return lines
