"""ONNX's own ``Attention`` node tests, mapped onto ``numpy_ref.attention`` (an outside suite).

``python -m conformance onnx-node-tests`` regenerates the node test cases of
the installed onnx package (its generators in
``onnx/backend/test/case/node/attention.py``: inputs, attributes and the
expected outputs of ONNX's reference), states each one as an attnspec call
and compares. Each case is reported as

    agree            every output within its budget (present_key / present_value: exactly)
    disagree         an output beyond its budget, or not equal where it must be
    not expressible  attnspec has no such output (with the reason)

The mapping (``map_case``), rule by rule:

- Heads. ONNX's per-head ``Q (B, H, Lq, d)``, ``K (B, Hkv, Lk, d)``,
  ``V (B, Hkv, Lk, dv)`` (a 3-D input is first split by ``q_num_heads`` /
  ``kv_num_heads``, contiguous and head-major, HEAD-1) become one layer
  ``(B, L, D)``, ``D = H * d``, with ``bias=False`` (PROJ-1) and exact
  identity-like projections: ``query`` is Q merged (HEAD-2), ``key`` is K
  merged and zero-padded to D with ``wk = eye(D, Hkv * d)``. Query head h
  reads key/value head h // G (HEAD-3, ONNX's interleave-repeat); the value
  head size is dv (HEAD-4); the scale stays 1/sqrt(d) (SCALE-1).
- Value chunks. One layer call has D value inputs and D outputs, but the
  merged output has H * dv columns and the value Hkv * dv features. Output
  column f = (h, c) depends only on value feature (h // G, c), so the output
  is computed in chunks of D columns: per chunk, the value input carries
  exactly the value features those columns need, ``wv`` has a one-hot column
  per carried feature (zero columns elsewhere) and ``wo`` one-hot columns
  that place column f of the chunk. Each run is exact: ``x @ one-hot`` adds
  only exact zeros.
- Masks. A boolean ``attn_mask`` is attnspec's ``mask`` (True = attend,
  MASK-1), a float one is ``bias`` (-inf disallows, BIAS-1, BIAS-2). ONNX pads
  a mask whose last axis is shorter than the total key length with False /
  -inf; the mapping does that padding explicitly.
- Caches. ``past_key`` / ``past_value`` (internal cache): the keys are
  ``concat(past, new)`` and ``q_positions = arange(Lq) + past_length``, since
  ONNX's causal rule and window are ``j <= i + past_length`` (CAUSAL-1,
  WINDOW-1 on those positions, POS-3; this is bottom-right alignment only when
  the new block holds exactly Lq tokens). ``present_key`` / ``present_value``
  must equal the concatenations exactly. ``nonpad_kv_seqlen`` (external
  cache): a key-padding mask ``(B, 1, 1, Lk)`` and per-batch
  ``q_positions = arange(Lq) + nonpad_kv_seqlen[b] - Lq``.
- ``softcap`` > 0 is SOFTCAP-1; ``left_window_size`` / ``right_window_size``
  are WINDOW-1 with -1 as None; ``softmax_precision`` only changes ONNX's
  arithmetic. ``qk_matmul_output_mode=3`` (post-softmax) is the weights
  (``return_weights=True``, SOFTMAX-2); modes 0..2 expose pre-softmax logits,
  which attnspec has no output for: such a case is not expressible (its other
  outputs are still compared, and a disagreement there still counts).

Budgets (PREC-1, PREC-2). The inputs are converted exactly to float64 and
``numpy_ref`` is the truth. An output ``Y`` or weights of dtype ``t`` is
judged against the harness's own rule, ``k * e_base + floor`` with ``k = 2``,
``floor = 4 * eps(t) * max|truth|`` and ``e_base`` the larger error of the
naive same-dtype emulation (``conformance.naive``, both operation orders) on
the same (spec, params, inputs). Where the emulation cannot run a call (it
raises), the budget is the floor plus ``k * 8 * eps(t) * max|truth|``
(``FALLBACK_ULPS``, the rounding of the few dependent operations of one
attention output: the two matmuls, the scale, the exponential and the
division) and the report says so. No budget depends on the case.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from spec import AttentionSpec

from . import tolerance

#: Attention's inputs and outputs by position (ONNX operator schema).
INPUTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
OUTPUTS = ("Y", "present_key", "present_value", "qk_matmul_output")
#: qk_matmul_output_mode that exposes the post-softmax weights; 0..2 are logits before it.
WEIGHTS_MODE = 3
#: e_base in ulps of max|truth| when the naive emulation cannot run a call (see the module docstring).
FALLBACK_ULPS = 8.0
GENERATORS = "onnx.backend.test.case.node.attention"


@dataclass
class NodeCase:
    """One regenerated ONNX node test: the node, its opset, its inputs and expected outputs by role."""

    name: str
    node: object  # onnx.NodeProto
    opset: Optional[int]
    inputs: dict  # role (INPUTS) -> array
    outputs: dict  # role (OUTPUTS) -> expected array

    @property
    def attributes(self) -> dict:
        from onnx import helper

        return {a.name: helper.get_attribute_value(a) for a in self.node.attribute}


@dataclass
class Mapping:
    """A node case as attnspec calls: one spec, one ``numpy_ref.attention`` call per output chunk."""

    spec: AttentionSpec
    calls: list  # [(params, kwargs, (c0, c1))]: output columns c0..c1 of the merged (B, Lq, H * dv)
    dtype: str  # the case's float dtype name
    four_d: bool  # whether Y is (B, H, Lq, dv) (else (B, Lq, H * dv))
    present: dict = field(default_factory=dict)  # role -> the exact concatenation (the input dtype)
    not_expressible: Optional[str] = None


@dataclass
class Outcome:
    name: str
    status: str  # agree, disagree, not expressible
    reason: str = ""
    outputs: dict = field(default_factory=dict)  # output role -> {"error", "budget", "margin", "budget_from"}

    @property
    def margin(self) -> float:
        return max((o["margin"] for o in self.outputs.values() if o.get("margin") is not None), default=0.0)


# --------------------------------------------------------------- collection
def collect() -> list:
    """The ``Attention`` node tests as ONNX's generators make them (seed 0 before each, as ONNX does).

    Each generator ends in ``expect(node, inputs, outputs, name, ...)``; the
    generators are re-run with ``expect`` recording its arguments instead of
    building models. NumPy's global random state is restored afterwards.
    """
    import importlib

    module = importlib.import_module(GENERATORS)
    recorded: list = []

    def record(node, inputs, outputs, name, **kwargs):
        opsets = kwargs.get("opset_imports") or []
        opset = next((o.version for o in opsets if o.domain in ("", "ai.onnx")), None)
        ins = dict(zip([INPUTS[i] for i, n in enumerate(node.input) if n], [_array(a) for a in inputs]))
        outs = dict(zip([OUTPUTS[i] for i, n in enumerate(node.output) if n], [_array(a) for a in outputs]))
        recorded.append(NodeCase(name, node, opset, ins, outs))

    state = np.random.get_state()
    original = module.expect
    module.expect = record
    try:
        for attr in sorted(vars(module.Attention)):
            if attr.startswith("export"):
                np.random.seed(0)
                getattr(module.Attention, attr)()
    finally:
        module.expect = original
        np.random.set_state(state)
    return sorted(recorded, key=lambda c: c.name)


def _array(a) -> np.ndarray:
    from onnx import numpy_helper

    return a if isinstance(a, np.ndarray) else numpy_helper.to_array(a)


# ------------------------------------------------------------------ mapping
def split_heads_onnx(x: np.ndarray, heads: int) -> np.ndarray:
    """ONNX's 3-D -> 4-D split, (B, L, heads * c) -> (B, heads, L, c): contiguous and head-major (HEAD-1)."""
    B, L, F = x.shape
    return x.reshape(B, L, heads, F // heads).transpose(0, 2, 1, 3)


def merge(x: np.ndarray) -> np.ndarray:
    """(B, heads, L, c) -> (B, L, heads * c), the exact inverse of the split (HEAD-2)."""
    B, n, L, c = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, L, n * c)


def pad_last(a: np.ndarray, size: int, fill) -> np.ndarray:
    """``a`` with its last axis padded to ``size`` with ``fill`` (ONNX's rule for a short attn_mask)."""
    missing = size - a.shape[-1]
    if missing <= 0:
        return a
    return np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, missing)], constant_values=fill)


def value_chunks(H: int, Hkv: int, dv: int, D: int) -> list:
    """Per chunk of at most D merged output columns: (c0, c1, features), HEAD-3, HEAD-4.

    Output column ``f = h * dv + c`` of the merged (B, Lq, H * dv) output
    reads value feature ``(h // G) * dv + c`` of the (B, Lk, Hkv * dv) values,
    G = H / Hkv. ``features`` lists, in order, the distinct value features the
    columns c0..c1-1 need (at most D of them, one per value input column).
    """
    G = H // Hkv
    chunks = []
    for c0 in range(0, H * dv, D):
        c1 = min(c0 + D, H * dv)
        needed = [(f // dv // G) * dv + f % dv for f in range(c0, c1)]
        chunks.append((c0, c1, list(dict.fromkeys(needed))))
    return chunks


def chunk_params(spec: AttentionSpec, c0: int, c1: int, features: list) -> dict:
    """Exact projections for one chunk: wq, wk identities; one-hot wv and wo (PARAM-1, PROJ-1, OUT-1)."""
    D, H, d = spec.model_dim, spec.num_heads, spec.head_dim
    Hkv, dv = spec.kv_heads, spec.v_head_dim
    wv = np.zeros((D, Hkv * dv))
    wv[np.arange(len(features)), features] = 1.0  # value input column k carries value feature features[k]
    wo = np.zeros((H * dv, D))
    wo[np.arange(c0, c1), np.arange(c1 - c0)] = 1.0  # merged column f -> output column f - c0
    return {"wq": np.eye(D), "wk": np.eye(D, Hkv * d), "wv": wv, "wo": wo}


def map_case(case: NodeCase) -> Mapping:
    """The attnspec calls of one node case (see the module docstring for each rule)."""
    a = case.attributes
    Q, K, V = case.inputs["Q"], case.inputs["K"], case.inputs["V"]
    dtype = Q.dtype.name
    four_d = Q.ndim == 4
    if not four_d:  # 3-D: split by q_num_heads / kv_num_heads (HEAD-1)
        Q = split_heads_onnx(Q, a["q_num_heads"])
        K = split_heads_onnx(K, a["kv_num_heads"])
        V = split_heads_onnx(V, a["kv_num_heads"])
    present, offset = {}, None
    if "past_key" in case.inputs:  # internal cache: keys = concat(past, new)
        K = np.concatenate([case.inputs["past_key"], K], axis=2)
        V = np.concatenate([case.inputs["past_value"], V], axis=2)
        offset = case.inputs["past_key"].shape[2]
    present["present_key"], present["present_value"] = K, V
    B, H, Lq, d = Q.shape
    Hkv, Lk, dv = K.shape[1], K.shape[2], V.shape[3]
    D = H * d

    mask = bias = None
    attn_mask = case.inputs.get("attn_mask")
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            mask = pad_last(attn_mask, Lk, False)  # MASK-1
        else:
            bias = pad_last(attn_mask.astype(np.float64), Lk, -np.inf)  # BIAS-1, BIAS-2
    nonpad = case.inputs.get("nonpad_kv_seqlen")
    if nonpad is not None:  # external cache: key padding plus per-batch query positions
        padding = (np.arange(Lk) < nonpad.reshape(B, 1))[:, None, None, :]  # (B, 1, 1, Lk)
        mask = padding if mask is None else np.logical_and(mask, padding)
        offset = nonpad.reshape(B, 1).astype(np.int64) - Lq  # (B, 1)
    kwargs = {"mask": mask, "bias": bias}
    if offset is not None:  # CAUSAL-1 / WINDOW-1 on ONNX's frontier j <= i + offset (POS-3)
        kwargs["q_positions"] = np.arange(Lq) + offset

    softcap = float(a.get("softcap", 0.0))
    left, right = int(a.get("left_window_size", -1)), int(a.get("right_window_size", -1))
    window = None
    if left >= 0 or right >= 0:
        window = (left if left >= 0 else None, right if right >= 0 else None)
    spec = AttentionSpec(
        num_heads=H,
        head_dim=d,
        bias=False,
        scale=a.get("scale"),
        causal=bool(a.get("is_causal", 0)),
        num_kv_heads=None if Hkv == H else Hkv,
        value_head_dim=None if dv == d else dv,
        softcap=softcap if softcap > 0 else None,
        window=window,
    )
    query = merge(Q.astype(np.float64))  # (B, Lq, D), exact (PREC-1)
    key = np.zeros((B, Lk, D))
    key[..., : Hkv * d] = merge(K.astype(np.float64))  # wk = eye(D, Hkv * d) reads these
    values = merge(V.astype(np.float64))  # (B, Lk, Hkv * dv)
    calls = []
    for c0, c1, features in value_chunks(H, Hkv, dv, D):
        value = np.zeros((B, Lk, D))
        value[..., : len(features)] = values[..., features]
        call = dict(kwargs, query=query, key=key, value=value)
        calls.append((chunk_params(spec, c0, c1, features), call, (c0, c1)))
    mapping = Mapping(spec, calls, dtype, four_d, present)
    mode = int(a.get("qk_matmul_output_mode", 0))
    if "qk_matmul_output" in case.outputs and mode != WEIGHTS_MODE:
        mapping.not_expressible = f"pre-softmax logits output (qk_matmul_output_mode={mode})"
    return mapping


# --------------------------------------------------------------- evaluation
def evaluate(mapping: Mapping, dtype: Optional[str] = None) -> dict:
    """{"Y": (B, Lq, H * dv), "qk_matmul_output": (B, H, Lq, Lk)} of the mapped calls.

    ``dtype`` None: ``numpy_ref`` in float64 (the truth); a dtype name: the
    naive emulation in that dtype, for each of its operation orders
    (``{order: {...}}``).
    """
    import numpy_ref

    from . import naive

    def one(run):
        out, weights = None, None
        for params, call, (c0, c1) in mapping.calls:
            o, w = run(params, call)
            if out is None:
                out = np.zeros(o.shape[:-1] + (mapping.spec.num_heads * mapping.spec.v_head_dim,))
            out[..., c0:c1] = o[..., : c1 - c0]
            weights = w if weights is None else weights
        return {"Y": out, "qk_matmul_output": weights}

    if dtype is None:

        def truth(params, call):
            c = dict(call)
            return numpy_ref.attention(
                mapping.spec, params, c.pop("query"), c.pop("key"), c.pop("value"), return_weights=True, **c
            )

        return one(truth)
    results = {}
    for order in naive.ORDERS:

        def emulate(params, call, order=order):
            inputs = {n: v for n, v in call.items() if v is not None}
            out, w, _ = naive.forward(mapping.spec, params, inputs, dtype, order)
            return out, w

        results[order] = one(emulate)
    return results


def as_onnx_y(y: np.ndarray, mapping: Mapping) -> np.ndarray:
    """The merged (B, Lq, H * dv) output in ONNX's layout of Y (4-D inputs: (B, H, Lq, dv))."""
    if not mapping.four_d:
        return y
    return split_heads_onnx(y, mapping.spec.num_heads)


def budget(output: str, dtype: str, truth: np.ndarray, emulated: Optional[list]) -> dict:
    """PREC-2's budget for one output: naive e_base if the emulation ran, else the fallback rule."""
    kind = "weights" if output == "qk_matmul_output" else "out"
    scale = tolerance.magnitude(truth)
    if emulated is not None:
        e_base = max(tolerance.max_error(e, truth) for e in emulated)
        source = "naive"
    else:
        e_base = FALLBACK_ULPS * tolerance.EPS[dtype] * scale
        source = f"fallback ({FALLBACK_ULPS:g} ulps)"
    b = tolerance.budget(kind, dtype, e_base, scale)
    b["budget_from"] = source
    return b


def check(case: NodeCase) -> Outcome:
    """Map one case, compute the truth, judge every output ONNX produced."""
    try:
        mapping = map_case(case)
        truth = evaluate(mapping)
    except Exception as e:  # a mapping that attnspec rejects is a disagreement to explain, not a crash
        return Outcome(case.name, "disagree", f"attnspec rejects the mapped call: {type(e).__name__}: {e}")
    try:
        emulated = evaluate(mapping, mapping.dtype)
        emulation_error = None
    except Exception as e:
        emulated, emulation_error = None, f"{type(e).__name__}: {e}"
    problems, outputs = [], {}
    for role, expected in case.outputs.items():
        if role in ("present_key", "present_value"):  # a concatenation: exact
            exact = np.array_equal(expected, mapping.present[role])
            outputs[role] = {"exact": exact}
            if not exact:
                problems.append(f"{role} is not concat(past, new)")
            continue
        if role == "qk_matmul_output" and mapping.not_expressible:
            continue
        t = truth[role] if role == "qk_matmul_output" else as_onnx_y(truth["Y"], mapping)
        runs = None
        if emulated is not None:
            runs = [r[role] if role == "qk_matmul_output" else as_onnx_y(r["Y"], mapping) for r in emulated.values()]
        b = budget(role, mapping.dtype, t, runs)
        if emulation_error:
            b["budget_from"] += f": the naive emulation raised {emulation_error}"
        actual = np.asarray(expected).astype(np.float64)
        if actual.shape != t.shape:
            problems.append(f"{role}: shape {actual.shape}, attnspec {t.shape}")
            continue
        finite = np.isfinite(t)
        if np.any(finite & ~np.isfinite(actual)) or np.any(~finite):
            problems.append(f"{role}: non-finite values where the other is finite")
            continue
        error = tolerance.max_error(actual, t)
        margin = error / b["budget"] if b["budget"] > 0 else (0.0 if error == 0 else float("inf"))
        outputs[role] = {"error": error, "budget": b["budget"], "margin": margin, "budget_from": b["budget_from"]}
        if margin > 1:
            problems.append(f"{role}: error {error:.3g} exceeds budget {b['budget']:.3g} (margin {margin:.3g})")
    if problems:
        return Outcome(case.name, "disagree", "; ".join(problems), outputs)
    if mapping.not_expressible:
        return Outcome(case.name, "not expressible", mapping.not_expressible, outputs)
    return Outcome(case.name, "agree", "", outputs)


def run(patterns=None) -> list:
    """Outcomes of every regenerated case whose name matches one of ``patterns`` (fnmatch or substring)."""
    cases = collect()
    if patterns:
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c.name, p) or p in c.name for p in patterns)]
    return [check(c) for c in cases]


def summary(outcomes: list) -> str:
    """One line: counts per status and the worst margin."""
    count = {s: sum(o.status == s for o in outcomes) for s in ("agree", "disagree", "not expressible")}
    worst = max(outcomes, key=lambda o: o.margin, default=None)
    tail = f"; worst margin {worst.margin:.3g} ({worst.name})" if worst else ""
    return (
        f"{len(outcomes)} ONNX Attention node tests: {count['agree']} agree, {count['disagree']} disagree, "
        f"{count['not expressible']} not expressible{tail}"
    )


def render(outcome: Outcome) -> str:
    """One report line per case: status, name, margins or reason."""
    margins = ", ".join(
        f"{role} {o['margin']:.3g}" if "margin" in o else f"{role} {'exact' if o['exact'] else 'NOT EQUAL'}"
        for role, o in outcome.outputs.items()
    )
    text = f"{outcome.status:16s} {outcome.name}"
    if margins:
        text += f"  [{margins}]"
    if outcome.reason:
        text += f"  {outcome.reason}"
    return text
