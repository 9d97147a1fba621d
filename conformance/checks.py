"""The checks run for one (case, adapter, dtype, device): budgets and exact rules.

Each check yields a ``CheckResult`` carrying the rule ids it can tell apart
(not every rule of its case: a weights check cannot see the value side, an
output check on clean inputs cannot see what a poisoned key would do), the
largest absolute and relative error, the budget, the margin (error / budget;
<= 1 passes) and where the worst element is. A mutant counts as killed only
by a failing check that claims the mutant's rule, so the claims are what the
harness promises: "passes every check claiming MASK-5" must mean MASK-5 holds.
"""

from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

import numpy as np

from spec import rope_permutation

from .cases import Case, Mask, Positions

POISONS = {"dead-keys/nan": np.nan, "dead-keys/large": 1e4}
#: Rules that only an adapter hook can show (PARAM-3: parameter round trip);
#: the numeric checks of a case do not claim them.
HOOK_RULES = frozenset({"PARAM-3"})
#: Rules only the gradient checks can show (GRAD-1..3; BLOCK-6, the gradients of a blockwise evaluation; T5-5,
#: the gradient of a bias table).
GRAD_RULES = frozenset({"GRAD-1", "GRAD-2", "GRAD-3", "BLOCK-6", "T5-5"})
#: MASK-7 is about what dead keys' rows *could* do: on clean inputs their rows
#: are ordinary numbers, so only the poison checks (and poisoned gradients) see it.
POISON_RULES = frozenset({"MASK-7"})
#: What the returned weights cannot see: they are post-softmax and pre-dropout
#: (SOFTMAX-2), so the value side (projections of v, the Shaw value term, the
#: dropout of DROP-1 / DROP-4, the merge and the output projection) is invisible.
WEIGHTS_BLIND = frozenset({"HEAD-2", "OUT-1", "SHAW-4", "DROP-1", "DROP-4"})
#: What the output cannot see: the returned weights' own contract (SOFTMAX-2).
OUT_BLIND = frozenset({"SOFTMAX-2"})
OPTIONAL = ("mask", "q_positions", "k_positions", "dropout_keep")


@dataclass
class CheckResult:
    case: str
    adapter: str
    dtype: str
    device: str
    check: str
    status: str  # pass, fail, skip, deviation (expected failure), unexpected-pass
    rules: tuple = ()
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    budget: Optional[float] = None
    margin: Optional[float] = None
    where: Optional[list] = None
    message: str = ""
    environment: dict = field(default_factory=dict)
    #: on the first check of a cell: the cell's wall time in seconds (its programs compiled, its checks run)
    seconds: Optional[float] = None

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "unexpected-pass")

    def record(self) -> dict:
        d = asdict(self)
        d["rules"] = list(self.rules)
        return d


# ------------------------------------------------------------------- inputs
def stored_call(case: Case, tensors: dict, dtype: str):
    """(params, inputs, grad_out) of a case in one dtype, from the stored tensors."""
    params = {n.rsplit("/", 1)[1]: a for n, a in tensors.items() if n.startswith(f"{dtype}/params/")}
    inputs = {n.rsplit("/", 1)[1]: a for n, a in tensors.items() if n.startswith(f"{dtype}/inputs/")}
    inputs.update({n: tensors[n] for n in OPTIONAL if n in tensors})
    return params, inputs, tensors[f"{dtype}/grad_out"]


def with_explicit_kv(inputs: dict) -> dict:
    """Separate key and value arrays (copies of the query for self-attention)."""
    out = dict(inputs)
    out.setdefault("key", inputs["query"].copy())
    out.setdefault("value", out["key"].copy())
    return out


def index_window(window: tuple, Lq: int, Lk: int) -> np.ndarray:
    """WINDOW-1 on indices (the default positions, delta = j - i): the (Lq, Lk) band -left <= j - i <= right,
    a None bound unbounded."""
    left, right = window
    d = np.arange(Lk)[None, :] - np.arange(Lq)[:, None]
    return (d >= -(Lq + Lk if left is None else left)) & (d <= (Lq + Lk if right is None else right))


def twin_inputs(kind: str, case: Case, inputs: dict) -> dict:
    """TWIN inputs: another way of passing the same layer's inputs."""
    B, H, Lq, Lk = case.dims.B, case.spec.num_heads, case.dims.Lq, case.dims.Lk
    out = dict(inputs)
    if kind == "same":
        return out
    if kind == "shift-positions":  # POS-4
        out["q_positions"] = np.asarray(inputs.get("q_positions", np.arange(Lq))) + 37
        out["k_positions"] = np.asarray(inputs.get("k_positions", np.arange(Lk))) + 37
        return out
    if kind == "causal-as-mask":  # CAUSAL-1 with default positions
        tril = np.tril(np.ones((Lq, Lk), dtype=bool))
        out["mask"] = tril if "mask" not in inputs else np.logical_and(inputs["mask"], tril)
        return out
    if kind == "window-as-mask":  # WINDOW-1 with default positions
        band = index_window(case.spec.window, Lq, Lk)
        out["mask"] = band if "mask" not in inputs else np.logical_and(inputs["mask"], band)
        return out
    if kind == "mask-full-rank":  # MASK-1
        out["mask"] = np.broadcast_to(inputs["mask"], (B, H, Lq, Lk)).copy()
        return out
    if kind == "mask-as-bias":  # BIAS-2
        dtype = inputs["query"].dtype
        out["bias"] = np.where(out.pop("mask"), 0.0, -np.inf).astype(dtype)
        return out
    raise ValueError(
        "twin inputs: expected same, shift-positions, causal-as-mask, window-as-mask, mask-full-rank or "
        f"mask-as-bias, got {kind!r}"
    )


def twin_params(kind: str, case: Case, twin, params: dict) -> dict:
    """TWIN parameters: the same layer's parameters in another form."""
    if kind == "same":
        return params
    if kind == "rope-layout":  # ROPE-8: q/k weights permuted within each head's rotary channels
        old, new = case.spec, twin.spec
        r = old.relative.rotated(old.head_dim)
        out = dict(params)
        for name, heads in (("q", old.num_heads), ("k", old.kv_heads)):
            perm = np.asarray(rope_permutation(heads, old.head_dim, r))
            if new.relative.layout == "interleaved":  # half -> interleaved is the inverse permutation
                perm = np.argsort(perm)
            out["w" + name] = params["w" + name][:, perm]
            if "b" + name in params:
                out["b" + name] = params["b" + name][perm]
        return out
    raise ValueError(f"twin params: expected same or rope-layout, got {kind!r}")


def decoding_calls(case: Case, inputs: dict) -> list:
    """ROPE-10, POS-3: a prefill of ``case.decode_from`` queries, then one query per step, each against a
    static cache of Lk slots whose unwritten rows are zero (beyond every query: causality removes them)."""
    x, L = inputs["query"], case.dims.Lq
    calls, start = [], 0
    for stop in [case.decode_from] + list(range(case.decode_from + 1, L + 1)):
        cache = x.copy()
        cache[:, stop:] = 0
        calls.append(
            {
                "query": x[:, start:stop],
                "key": cache,
                "value": cache,
                "q_positions": np.arange(start, stop, dtype=np.int64),
                "k_positions": np.arange(L, dtype=np.int64),
            }
        )
        start = stop
    return calls


def twin_case(case: Case, twin) -> Case:
    """The case as the twin calls it (for its feature set)."""
    recipes = tuple(case.recipes)
    extra = set(case.extra_features)
    if twin.inputs == "shift-positions":
        recipes += (Positions("shifted"),)
    elif twin.inputs in ("causal-as-mask", "window-as-mask"):
        recipes += (Mask("QK"),)
    elif twin.inputs == "mask-as-bias":
        recipes = tuple(r for r in recipes if not isinstance(r, Mask))
        extra.add("bias")
    return replace(case, spec=twin.spec or case.spec, recipes=recipes, twins=(), extra_features=frozenset(extra))


#: name: (the argument the error must name (INPUT-1), what the bad input is)
ERROR_INPUTS = {
    "float-mask": ("mask", "a float mask of ones instead of a boolean mask (MASK-3)"),
    "int-mask": ("mask", "an integer mask of ones instead of a boolean mask (MASK-3)"),
    "mask-B-Lk": ("mask", "a (B, Lk) key-padding mask without its singleton axes, B != Lq (MASK-1)"),
    "mask-wrong-size": ("mask", "a (Lq, Lk + 1) mask (MASK-1)"),
    "keep-without-dropout": ("dropout_keep", "a keep mask while spec.dropout == 0 (DROP-2)"),
    "keep-not-boolean": ("dropout_keep", "a float keep mask of ones (DROP-1, INPUT-1)"),
    "keep-broadcast": ("dropout_keep", "a boolean keep mask of shape (Lq, Lk), not (B, H, Lq, Lk) (DROP-1)"),
    "params-missing": ("params", "a parameter dict without rel_v (PARAM-2)"),
    "params-extra": ("params", "a parameter dict with an extra entry (PARAM-2)"),
    "params-misshaped": ("params", "bq of shape (D + 1,) (PARAM-2)"),
    "params-kv-heads-square": ("params", "wk of shape (D, D) under num_kv_heads < num_heads (PARAM-2, HEAD-3)"),
    "float-positions": ("q_positions", "float q_positions (POS-1)"),
    "positions-wrong-length": ("k_positions", "k_positions of length Lk + 1 (POS-1)"),
    "bias-nan": ("bias", "one NaN among finite bias entries (BIAS-2, the reference)"),
    "bias-plus-inf": ("bias", "one +inf among finite bias entries (BIAS-2, the reference)"),
    "grad-out-integer": ("grad_out", "an integer grad_out for the gradient call (INPUT-1, the reference's vjp)"),
    "grad-out-misshaped": ("grad_out", "a grad_out of shape (B, Lq, D + 1) (INPUT-1, the reference's vjp)"),
}


def bad_call(kind: str, case: Case, params: dict, inputs: dict, grad_out: np.ndarray):
    """(params, inputs, grad_out) of a call with one bad argument."""
    B, H, Lq, Lk = case.dims.B, case.spec.num_heads, case.dims.Lq, case.dims.Lk
    params, inputs = dict(params), dict(inputs)
    if kind == "float-mask":
        inputs["mask"] = np.ones((Lq, Lk), dtype=inputs["query"].dtype)
    elif kind == "int-mask":
        inputs["mask"] = np.ones((Lq, Lk), dtype=np.int64)
    elif kind == "mask-B-Lk":
        assert B not in (1, Lq), "a (B, Lk) mask is only misread when B is neither 1 nor Lq"
        inputs["mask"] = np.ones((B, Lk), dtype=bool)
    elif kind == "mask-wrong-size":
        inputs["mask"] = np.ones((Lq, Lk + 1), dtype=bool)
    elif kind == "keep-without-dropout":
        inputs["dropout_keep"] = np.ones((B, H, Lq, Lk), dtype=bool)
    elif kind == "keep-not-boolean":
        inputs["dropout_keep"] = np.ones((B, H, Lq, Lk), dtype=inputs["query"].dtype)
    elif kind == "keep-broadcast":
        inputs["dropout_keep"] = np.ones((Lq, Lk), dtype=bool)
    elif kind == "params-missing":
        params.pop("rel_v")
    elif kind == "params-extra":
        params["rel_q"] = params["wq"].copy()
    elif kind == "params-misshaped":
        params["bq"] = np.zeros(params["bq"].shape[0] + 1, dtype=params["bq"].dtype)
    elif kind == "params-kv-heads-square":
        params["wk"] = np.zeros((params["wq"].shape[0],) * 2, dtype=params["wk"].dtype)
    elif kind == "float-positions":
        inputs["q_positions"] = np.arange(Lq, dtype=np.float64)
    elif kind == "positions-wrong-length":
        inputs["k_positions"] = np.arange(Lk + 1, dtype=np.int64)
    elif kind in ("bias-nan", "bias-plus-inf"):
        bias = np.zeros((Lq, Lk), dtype=inputs["query"].dtype)
        bias[Lq // 2, Lk // 2] = np.nan if kind == "bias-nan" else np.inf
        inputs["bias"] = bias
    elif kind == "grad-out-integer":
        grad_out = np.ones(grad_out.shape, dtype=np.int64)
    elif kind == "grad-out-misshaped":
        grad_out = np.zeros(grad_out.shape[:-1] + (grad_out.shape[-1] + 1,), dtype=grad_out.dtype)
    else:
        raise ValueError(f"error inputs: expected one of {sorted(ERROR_INPUTS)}, got {kind!r}")
    return params, inputs, grad_out


# -------------------------------------------------------------- comparisons
def compare(actual, truth: np.ndarray, budget: float) -> dict:
    """Errors of ``actual`` against ``truth`` and whether they fit ``budget``."""
    if actual is None:
        return {"ok": False, "message": "no value returned"}
    a = np.asarray(actual)
    if a.shape != truth.shape:
        return {"ok": False, "message": f"shape {a.shape}, expected {truth.shape}"}
    a = a.astype(np.float64)
    finite = np.isfinite(truth)
    bad = finite & ~np.isfinite(a)
    if bad.any():
        at = [int(i) for i in np.argwhere(bad)[0]]
        return {
            "ok": False,
            "where": at,
            "message": f"{a[tuple(at)]} where the truth is finite ({truth[tuple(at)]:.6g})",
        }
    err = np.where(finite, np.abs(a - truth), 0.0)
    at = [int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape)] if err.size else []
    max_abs = float(err.max(initial=0.0))
    scale = float(np.max(np.abs(truth[finite]), initial=0.0))
    margin = max_abs / budget if budget > 0 else (0.0 if max_abs == 0 else float("inf"))
    return {
        "ok": max_abs <= budget,
        "max_abs": max_abs,
        "max_rel": max_abs / scale if scale else max_abs,
        "budget": budget,
        "margin": margin,
        "where": at,
        "message": "" if max_abs <= budget else f"error {max_abs:.3g} exceeds budget {budget:.3g} at {at}",
    }


def _exception(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
    return f"raised {type(e).__name__}: {e}{where}"


class CaseRun:
    """Runs every check of one case for one adapter, dtype and device."""

    def __init__(self, case: Case, entry: dict, tensors: dict, adapter, caps, dtype: str, device: str):
        self.case, self.entry, self.tensors = case, entry, tensors
        self.adapter, self.caps, self.dtype, self.device = adapter, caps, dtype, device
        self.results: list[CheckResult] = []

    def add(self, check: str, status: str, rules, **kw):
        self.results.append(
            CheckResult(self.case.id, self.adapter.name, self.dtype, self.device, check, status, tuple(rules), **kw)
        )

    def judge(self, check: str, rules, actual, golden: str, budget_key: Optional[str] = None):
        truth = self.tensors[f"{self.dtype}/golden/{golden}"]
        budget = self.entry["budgets"][self.dtype][budget_key or golden]["budget"]
        r = compare(actual, truth, budget)
        ok = r.pop("ok")
        self.add(check, "pass" if ok else "fail", rules, **r)

    def forward(self, inputs, params=None, spec=None, need_weights=None):
        need = self.caps.weights and self.case.store_weights if need_weights is None else need_weights
        return self.adapter.forward(
            spec or self.case.spec,
            params if params is not None else self.params,
            inputs,
            device=self.device,
            need_weights=need,
        )

    def forward_only(self, inputs, params=None, spec=None):
        """``out`` of a call whose gradients are never asked for (the adapter's ``forward_only`` if it has one)."""
        spec, params = spec or self.case.spec, params if params is not None else self.params
        only = getattr(self.adapter, "forward_only", None)
        if only is not None:
            return only(spec, params, inputs, device=self.device)
        return self.adapter.forward(spec, params, inputs, device=self.device, need_weights=False)

    def run(self) -> list[CheckResult]:
        case = self.case
        self.params, self.inputs, self.grad_out = stored_call(case, self.tensors, self.dtype)
        if case.expect_error:
            self.run_error()
            return self.results
        forward_rules = tuple(r for r in case.all_rules if r not in HOOK_RULES | GRAD_RULES | POISON_RULES)
        try:
            result = self.forward(self.inputs)
        except Exception as e:  # a declared capability that fails is a failure
            self.add("forward", "fail", forward_rules, message=_exception(e))
            return self.results
        out_rules = tuple(r for r in forward_rules if r not in OUT_BLIND)
        self.judge("out", out_rules, result.get("out"), "out")
        weights = result.get("weights")
        if self.caps.weights and case.store_weights:
            self.judge("weights", tuple(r for r in forward_rules if r not in WEIGHTS_BLIND), weights, "weights")
            self.run_without_weights(out_rules)
        self.run_exact(result)
        self.run_poison(result)
        self.run_twins()
        self.run_decoding()
        if self.caps.gradients:
            self.run_gradients()
        self.run_hooks()
        return self.results

    def run_error(self):
        """INPUT-1: the bad input is rejected with the expected type, and the message names the argument."""
        kind = self.case.error_inputs
        argument, what = ERROR_INPUTS[kind]
        params, inputs, grad_out = bad_call(kind, self.case, self.params, self.inputs, self.grad_out)
        expected = {"TypeError": TypeError, "ValueError": ValueError}[self.case.expect_error]
        check, rules = f"rejects/{kind}", self.case.all_rules
        try:
            if argument == "grad_out":  # an argument of the gradient call only
                self.adapter.vjp(self.case.spec, params, with_explicit_kv(inputs), grad_out, device=self.device)
            else:
                self.forward(inputs, params=params, need_weights=False)
        except expected as e:
            named = str(e).startswith(argument)
            message = f"{type(e).__name__}: {e}"
            if not named:
                message = f"expected a message starting with the argument {argument!r} (INPUT-1), got {message}"
            self.add(check, "pass" if named else "fail", rules, message=message)
            return
        except Exception as e:
            self.add(check, "fail", rules, message=f"expected {expected.__name__} for {what}, {_exception(e)}")
            return
        self.add(check, "fail", rules, message=f"expected {expected.__name__} for {what}, but the call returned")

    def run_without_weights(self, rules):
        """The output of a call that does not ask for weights: often another code path (a fused kernel)."""
        try:
            result = self.forward(self.inputs, need_weights=False)
        except Exception as e:
            self.add("out/no-weights", "fail", rules, message=_exception(e))
            return
        self.judge("out/no-weights", rules, result.get("out"), "out")

    def poisoned(self, inputs: dict, value: float) -> dict:
        """The inputs with the key and value rows of dead keys (MASK-7) set to ``value``."""
        dead = self.tensors["exact/dead_keys"]
        inputs = dict(inputs)
        for name in ("key", "value"):  # an omitted value is the key, poisoned with it (SHAPE-2)
            if name not in inputs:
                continue
            a = inputs[name].copy()
            a[dead] = value
            inputs[name] = a
        return inputs

    def has_dead_keys(self) -> bool:
        dead = self.tensors.get("exact/dead_keys")
        return dead is not None and bool(dead.any()) and not self.case.self_attention

    def run_exact(self, result):
        """MASK-5 / PREC-3: fully masked rows give weights exactly 0 and out exactly bo."""
        rows = self.tensors.get("exact/fully_masked_rows")
        if rows is None or not rows.any():
            return
        rules = ("MASK-5", "PREC-3")
        problems = []
        w = result.get("weights")
        if w is not None:
            w = np.asarray(w).astype(np.float64)
            if not np.all(w[rows] == 0.0):
                problems.append(
                    f"weights of fully masked rows are not exactly 0 (max |w| {np.max(np.abs(w[rows])):.3g})"
                )
        all_heads = rows.all(axis=1)  # (B, Lq): the row is empty in every head
        if all_heads.any():
            bo = self.params.get("bo")
            expected = np.zeros(self.case.spec.model_dim) if bo is None else bo.astype(np.float64)
            out = np.asarray(result["out"]).astype(np.float64)[all_heads]
            if not np.array_equal(out, np.broadcast_to(expected, out.shape)):
                problems.append(
                    f"out of fully masked rows is not exactly bo (max |out - bo| {np.max(np.abs(out - expected)):.3g})"
                )
        self.add("fully-masked-rows", "fail" if problems else "pass", rules, message="; ".join(problems))

    def run_poison(self, clean):
        """MASK-7: key/value rows of dead keys cannot change anything, NaN included."""
        if not self.has_dead_keys():
            return
        for check, value in POISONS.items():
            try:
                poisoned = self.forward(self.poisoned(self.inputs, value))
            except Exception as e:
                self.add(check, "fail", ("MASK-7", "PREC-3"), message=_exception(e))
                continue
            same = all(np.array_equal(np.asarray(clean[k]), np.asarray(poisoned.get(k))) for k in clean)
            diff = float(np.max(np.abs(np.asarray(poisoned["out"], np.float64) - np.asarray(clean["out"], np.float64))))
            self.add(
                check,
                "pass" if same else "fail",
                ("MASK-7", "PREC-3"),
                max_abs=None if same else diff,
                message="" if same else f"poisoned dead keys changed the result (max |diff| {diff:.3g})",
            )

    def run_poisoned_gradients(self, clean: dict):
        """MASK-7 covers every gradient: poisoned dead keys leave each one exactly as it was."""
        explicit = with_explicit_kv(self.inputs)
        for poison, value in POISONS.items():
            check = f"grad/{poison}"
            try:
                grads = self.adapter.vjp(
                    self.case.spec, self.params, self.poisoned(explicit, value), self.grad_out, device=self.device
                )
            except Exception as e:
                self.add(check, "fail", ("MASK-7", "PREC-3"), message=_exception(e))
                continue
            changed = sorted(n for n in clean if not np.array_equal(np.asarray(clean[n]), np.asarray(grads.get(n))))
            self.add(
                check,
                "fail" if changed else "pass",
                ("MASK-7", "PREC-3"),
                message=f"poisoned dead keys changed the gradients of {', '.join(changed)}" if changed else "",
            )

    def run_twins(self):
        for twin in self.case.twins:
            called = twin_case(self.case, twin)
            missing = called.features() - self.caps.features
            check = f"twin/{twin.name}"
            if missing:
                self.add(check, "skip", twin.rules, message=f"needs {', '.join(sorted(missing))}")
                continue
            unsupported = getattr(self.adapter, "unsupported_case", None)  # what the features cannot say
            reason = unsupported(called) if unsupported is not None else None
            if reason:
                self.add(check, "skip", twin.rules, message=reason)
                continue
            try:
                inputs = twin_inputs(twin.inputs, self.case, self.inputs)
                params = twin_params(twin.params, self.case, twin, self.params)
                result = self.forward_only(inputs, params=params, spec=twin.spec)
            except Exception as e:
                self.add(check, "fail", twin.rules, message=_exception(e))
                continue
            self.judge(check, twin.rules, result.get("out"), "out")

    def run_decoding(self):
        """ROPE-10, POS-3: prefill then one query per step against a static cache equals the full forward."""
        case = self.case
        if case.decode_from is None:
            return
        check, rules = "decode/prefill-then-steps", ("ROPE-10", "POS-3", "CAUSAL-1", "MASK-7")
        missing = case.decoding_features() - self.caps.features
        if missing:
            self.add(check, "skip", rules, message=f"needs {', '.join(sorted(missing))}")
            return
        try:
            rows = [self.forward_only(c)["out"] for c in decoding_calls(case, self.inputs)]
        except Exception as e:
            self.add(check, "fail", rules, message=_exception(e))
            return
        self.judge(check, rules, np.concatenate([np.asarray(r) for r in rows], axis=1), "out")

    def run_gradients(self):
        # gradients of clean inputs: GRAD-1..3 and the exact zeros of fully masked rows (MASK-5)
        rules = ("GRAD-1",) + tuple(r for r in self.case.all_rules if r in GRAD_RULES or r == "MASK-5")
        if self.device in self.caps.no_gradients:  # the rest of the cell runs; this part is a visible skip
            self.add(
                "gradients",
                "skip",
                rules,
                message=f"no gradients on {self.device}: {self.caps.no_gradients[self.device]}",
            )
            return
        try:
            grads = self.adapter.vjp(
                self.case.spec, self.params, with_explicit_kv(self.inputs), self.grad_out, device=self.device
            )
        except Exception as e:
            self.add("gradients", "fail", rules, message=_exception(e))
            return
        prefix = f"{self.dtype}/golden/grad/"
        for name in sorted(n[len(prefix) :] for n in self.tensors if n.startswith(prefix)):
            self.judge(f"grad/{name}", rules, grads.get(name), f"grad/{name}")
        if self.has_dead_keys():
            self.run_poisoned_gradients(grads)

    def run_hooks(self):
        spec = self.case.spec
        roundtrip = getattr(self.adapter, "roundtrip_params", None)
        if roundtrip is not None and "PARAM-3" in self.case.rules:
            try:
                back = roundtrip(spec, self.params)
                exact = sorted(back) == sorted(self.params) and all(
                    np.asarray(back[n]).dtype == a.dtype and np.array_equal(np.asarray(back[n]), a)
                    for n, a in self.params.items()
                )
                self.add(
                    "param-roundtrip",
                    "pass" if exact else "fail",
                    ("PARAM-3",),
                    message="" if exact else "canonical -> module -> canonical is not exact",
                )
            except Exception as e:
                self.add("param-roundtrip", "fail", ("PARAM-3",), message=_exception(e))
