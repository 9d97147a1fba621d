"""Build (``generate``) and re-check (``verify``) the stored golden vectors.

For each case: inputs, parameters and an upstream gradient are drawn once
with NumPy from the case's seed, rounded to each test dtype, and stored; the
goldens are the float64 reference's outputs, weights and gradients on those
rounded inputs; the budgets come from the naive same-dtype emulation.
"""

from __future__ import annotations

import fnmatch
import pathlib
import shutil
import tempfile
from dataclasses import asdict
from importlib import metadata

import numpy as np

import numpy_ref
from numpy_ref.masking import allowed_keys, dead_keys, relative_distance
from spec import SPEC_VERSION, AttentionSpec, scheme_from_json

from . import naive, tolerance
from .cases import Case
from .catalog import CASES
from .store import (
    FORMAT,
    GOLDEN_DIR,
    MANIFEST,
    GoldenError,
    case_file,
    describe,
    dump_manifest,
    load_case,
    load_manifest,
    save_case,
)

DENSE_INPUTS = ("query", "key", "value", "bias")
#: PREC-5: how far a recomputation on another machine may move, as noise of its
#: arithmetic (another BLAS, another summation order), before `verify` calls it
#: drift of the semantics. Goldens: float64 ulps of the largest entry.
VERIFY_ULPS = 8
#: Budgets: a factor either way. e_base is a maximum over a few rounding events
#: (one ulp more or less at the worst element moves it by a binade or two; a
#: factor of exactly 2 was measured between two x86-64 machines).
BUDGET_NOISE = 4.0


def spec_to_json(spec: AttentionSpec) -> dict:
    """The manifest form of a spec; the scheme writes its own (REL-3: ``{"scheme": name, ...}``)."""
    d = asdict(spec)
    d["relative"] = None if spec.relative is None else spec.relative.to_json()
    if spec.window is not None:  # WINDOW-1: the pair as JSON stores it, so that stored and fresh compare equal
        d["window"] = list(spec.window)
    return d


def spec_from_json(d: dict) -> AttentionSpec:
    d = dict(d)
    r = d.pop("relative")
    return AttentionSpec(relative=None if r is None else scheme_from_json(r), **d)


def draw(case: Case) -> dict:
    """The float64 master draw of a case (before rounding to the test dtypes)."""
    rng = np.random.default_rng(case.seed)
    spec, (B, Lq, Lk) = case.spec, (case.dims.B, case.dims.Lq, case.dims.Lk)
    D = spec.model_dim
    params = numpy_ref.init_params(spec, seed=int(rng.integers(0, 2**31)))
    query = rng.normal(size=(B, Lq, D))
    dense = {"query": query}
    if not case.self_attention:
        dense["key"] = rng.normal(size=(B, Lk, D))
        if not case.value_omitted:
            dense["value"] = rng.normal(size=(B, Lk, D))
    grad_out = rng.normal(size=(B, Lq, D))
    optional = case.draw(rng)
    if "bias" in optional:
        dense["bias"] = optional.pop("bias")
    return {"params": params, "dense": dense, "grad_out": grad_out, "optional": optional}


def rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    """A float64 draw as stored in ``dtype``: rounded to nearest, ties to even (PREC-1, PREC-5).

    bfloat16 goes through float32 (two roundings), written out here because
    ml_dtypes 0.6 did so implicitly and 0.7 rounds float64 directly: the two
    differ on rare ties (one element of 2048 in huang/M512), and stored
    inputs must be reproducible with any version.
    """
    a = np.asarray(a)
    if dtype == "bfloat16":
        a = a.astype(np.float32)
    return a.astype(naive.storage_dtype(dtype))


def call_inputs(case: Case, dense: dict, optional: dict, *, explicit_kv: bool) -> dict:
    """Keyword inputs of one call; omitted key/value (SHAPE-2) are passed only when asked."""
    inputs = {**optional, **dense}
    if explicit_kv:
        inputs.setdefault("key", inputs["query"].copy())
        inputs.setdefault("value", inputs["key"].copy())
    return inputs


def truth(case: Case, params64: dict, inputs64: dict, grad_out64):
    kw = {n: inputs64[n] for n in ("mask", "bias", "q_positions", "k_positions", "dropout_keep") if n in inputs64}
    out, weights = numpy_ref.attention(
        case.spec, params64, inputs64["query"], inputs64.get("key"), inputs64.get("value"), **kw, return_weights=True
    )
    key = inputs64.get("key", inputs64["query"]).copy()  # SHAPE-2: key = query, value = key
    value = inputs64.get("value", key).copy()
    grads = numpy_ref.attention_vjp(case.spec, params64, inputs64["query"], key, value, grad_out64, **kw)
    return out, weights, grads


def exact_data(case: Case, master: dict) -> dict:
    """The exact-check masks (PREC-3): fully masked rows (MASK-5) and dead keys (MASK-7)."""
    if case.spec.mask_fill is not None:
        return {}
    B, H, Lq, Lk = case.dims.B, case.spec.num_heads, case.dims.Lq, case.dims.Lk
    opt = master["optional"]
    qp = opt.get("q_positions", np.arange(Lq))
    kp = opt.get("k_positions", np.arange(Lk))
    qp, kp = np.asarray(qp, np.int64).reshape(-1, Lq), np.asarray(kp, np.int64).reshape(-1, Lk)  # no wrap
    delta = relative_distance(qp, kp)
    allowed = allowed_keys(
        (B, H, Lq, Lk),
        delta,
        causal=case.spec.causal,
        mask=opt.get("mask"),
        bias=master["dense"].get("bias"),
        window=case.spec.window,
    )
    return {"exact/fully_masked_rows": ~allowed.any(-1), "exact/dead_keys": dead_keys(allowed)}


def summand_scales(case: Case, params64: dict, inputs64: dict, grad_out64) -> tuple[dict, float]:
    """PREC-6: (summand scale by output, largest allowed |logit|) of one dtype's stored inputs, in float64."""
    _, _, cache = naive.forward(case.spec, params64, inputs64, "float64")
    return naive.summands(case.spec, cache, grad_out64), naive.logit_magnitude(cache)


def build_case(case: Case) -> tuple[dict, dict]:
    """(tensors, budgets) of one case."""
    master = draw(case)
    tensors = {n: a for n, a in master["optional"].items()}
    tensors.update(exact_data(case, master))
    budgets: dict = {}
    for dtype in case.dtypes:
        params = {n: rounded(a, dtype) for n, a in master["params"].items()}
        dense = {n: rounded(a, dtype) for n, a in master["dense"].items()}
        grad_out = rounded(master["grad_out"], dtype)
        tensors.update({f"{dtype}/params/{n}": a for n, a in params.items()})
        tensors.update({f"{dtype}/inputs/{n}": a for n, a in dense.items()})
        tensors[f"{dtype}/grad_out"] = grad_out
        if case.expect_error:
            continue
        p64 = {n: a.astype(np.float64) for n, a in params.items()}
        d64 = {n: a.astype(np.float64) for n, a in dense.items()}
        g64 = grad_out.astype(np.float64)
        inputs64 = call_inputs(case, d64, master["optional"], explicit_kv=False)
        out, weights, grads = truth(case, p64, inputs64, g64)
        goldens = {
            "out": out,
            **({"weights": weights} if case.store_weights else {}),
            **{f"grad/{n}": g for n, g in grads.items()},
        }
        tensors.update({f"{dtype}/golden/{n}": a for n, a in goldens.items()})
        errors = {n: 0.0 for n in goldens}
        emu_inputs = call_inputs(case, d64, master["optional"], explicit_kv=True)
        for order in naive.ORDERS:
            n_out, n_w, cache = naive.forward(case.spec, p64, emu_inputs, dtype, order)
            n_grads = naive.backward(case.spec, cache, g64, order)
            produced = {"out": n_out, "weights": n_w, **{f"grad/{n}": g for n, g in n_grads.items()}}
            for n in goldens:
                errors[n] = max(errors[n], tolerance.max_error(produced[n], goldens[n]))
        summands, logits = summand_scales(case, p64, emu_inputs, g64)
        budgets[dtype] = {
            n: tolerance.budget(n, dtype, errors[n], tolerance.floor_scale(n, goldens), summands.get(n, 0.0), logits)
            for n in goldens
        }
    return tensors, budgets


def manifest_entry(case: Case, tensors: dict, budgets: dict) -> dict:
    return {
        "file": case_file(case.id),
        "rules": list(case.all_rules),
        "spec": spec_to_json(case.spec),
        "dims": asdict(case.dims),
        "self_attention": case.self_attention,
        "value_omitted": case.value_omitted,
        "dtypes": list(case.dtypes),
        "features": sorted(case.features()),
        "twins": [
            {
                "name": t.name,
                "rules": list(t.rules),
                "inputs": t.inputs,
                "params": t.params,
                "spec": None if t.spec is None else spec_to_json(t.spec),
            }
            for t in case.twins
        ],
        "decode_from": case.decode_from,
        "expect_error": case.expect_error,
        "error_inputs": case.error_inputs,
        "seed": case.seed,
        "notes": case.notes,
        "tensors": describe(tensors),
        "budgets": budgets,
    }


def generator_versions() -> dict:
    versions = {"attnspec": SPEC_VERSION}
    for dist in ("numpy", "ml_dtypes", "safetensors"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "unknown"
    return versions


def generate(directory: pathlib.Path = GOLDEN_DIR, cases=CASES, progress=None, only=None, budgets_only=False) -> dict:
    """Rebuild the golden files and the manifest (written last, atomically).

    ``only``: fnmatch patterns of case ids; the other cases keep their stored files and manifest entries
    (a change that touches a few cases regenerates those, not every golden). ``budgets_only``: keep every
    stored file and input and recompute the budgets and the rule claims alone (a change of the tolerance
    rules, PREC-2, PREC-6, or of the rules every case claims).
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    partial = only is not None or budgets_only
    stored = load_manifest(directory)["cases"] if partial else {}
    chosen = [c for c in cases if only is None or any(fnmatch.fnmatchcase(c.id, p) for p in only)]
    if only is not None and not chosen:
        raise ValueError(f"only: expected patterns matching case ids, got {list(only)!r}: no case matches")
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        entries = {}
        for case in cases:
            if case not in chosen and case.id in stored:
                entries[case.id] = stored[case.id]
                continue
            tensors, budgets = build_case(case)
            if budgets_only and case.id in stored:
                entries[case.id] = {**stored[case.id], "budgets": budgets, "rules": list(case.all_rules)}
            else:
                save_case(pathlib.Path(tmp), case.id, tensors)
                entries[case.id] = manifest_entry(case, tensors, budgets)
            if progress:
                progress(case.id)
        manifest = {
            "format": FORMAT,
            "spec_version": SPEC_VERSION,
            "generator": generator_versions(),
            "tolerance": {"k": tolerance.K, "floor_ulps": tolerance.FLOOR_ULPS},
            "cases": entries,
        }
        fresh = list(pathlib.Path(tmp).glob("*.safetensors"))
        if not partial:
            for old in directory.glob("*.safetensors"):
                old.unlink()
        for new in fresh:
            shutil.move(str(new), directory / new.name)
        (directory / MANIFEST).write_text(dump_manifest(manifest), encoding="utf-8")
    return manifest


def golden_change(fresh: np.ndarray, stored: np.ndarray, scale: float = 0.0) -> tuple[str, float, float]:
    """PREC-5: ("same" | "noise" | "drift", change, bound) of a recomputed float64 golden; the bound is
    VERIFY_ULPS ulps of the largest of 1, max|fresh| and ``scale`` (a bias gradient's: its weight gradient's,
    ``tolerance.floor_scale``)."""
    largest = max(1.0, float(np.max(np.abs(fresh), initial=0.0)), scale)
    bound = VERIFY_ULPS * float(np.finfo(np.float64).eps) * largest
    same_nan = np.array_equal(np.isnan(fresh), np.isnan(stored))
    change = float(np.max(np.abs(np.where(np.isnan(fresh), 0.0, fresh - stored)), initial=0.0))
    if same_nan and change == 0.0:
        return "same", 0.0, bound
    return ("noise" if same_nan and change <= bound else "drift"), change, bound


def budget_change(old: float, new: float) -> str:
    """PREC-5: "same" | "noise" (within a factor BUDGET_NOISE) | "drift" of a recomputed budget."""
    if new == old:
        return "same"
    return "noise" if old / BUDGET_NOISE <= new <= old * BUDGET_NOISE else "drift"


def verify(directory: pathlib.Path = GOLDEN_DIR, cases=CASES, progress=None, noise=None) -> list[str]:
    """Recompute every case and list the drift of the semantics from the stored goldens (PREC-5).

    Drift: any change of structure (cases, tensors, shapes, dtypes, rules,
    specs) or inputs; a golden that moves by more than VERIFY_ULPS float64
    ulps of its largest entry; a budget that moves by more than a factor
    BUDGET_NOISE. Smaller moves are the noise of this machine's arithmetic:
    they are appended to ``noise`` (a list, when given), not returned.
    """
    problems: list[str] = []
    noise = [] if noise is None else noise
    manifest = load_manifest(directory)
    if manifest["spec_version"] != SPEC_VERSION:
        problems.append(f"manifest is for spec {manifest['spec_version']}, this is {SPEC_VERSION}")
    stored_ids, catalog_ids = set(manifest["cases"]), {c.id for c in cases}
    for missing in sorted(catalog_ids - stored_ids):
        problems.append(f"{missing}: in the catalog but not in the goldens")
    for extra in sorted(stored_ids - catalog_ids):
        problems.append(f"{extra}: in the goldens but not in the catalog")
    for case in cases:
        if case.id not in manifest["cases"]:
            continue
        entry = manifest["cases"][case.id]
        try:
            stored = load_case(case.id, entry, directory)
        except GoldenError as e:
            problems.append(str(e))
            continue
        tensors, budgets = build_case(case)
        fresh = manifest_entry(case, tensors, budgets)
        for key in (
            "file",
            "rules",
            "spec",
            "dims",
            "self_attention",
            "value_omitted",
            "dtypes",
            "features",
            "twins",
            "decode_from",
            "expect_error",
            "error_inputs",
            "seed",
        ):
            if fresh[key] != entry[key]:
                problems.append(f"{case.id}: {key} changed: stored {entry[key]!r}, catalog {fresh[key]!r}")
        if sorted(tensors) != sorted(stored):
            problems.append(f"{case.id}: tensor set changed")
            continue
        for name, a in tensors.items():
            b = stored[name]
            if a.shape != b.shape or a.dtype != b.dtype:
                problems.append(f"{case.id}: {name} changed shape or dtype")
            elif "/golden/" in name:
                dtype, output = name.split("/golden/")
                goldens = {n.split("/golden/")[1]: t for n, t in tensors.items() if n.startswith(f"{dtype}/golden/")}
                kind, change, bound = golden_change(a, b, tolerance.floor_scale(output, goldens))
                if kind != "same":
                    (problems if kind == "drift" else noise).append(
                        f"{case.id}: {name} moved by {change:.3g} ({'>' if kind == 'drift' else '<='} {bound:.3g})"
                    )
            elif not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
                problems.append(f"{case.id}: input {name} changed")
        for dtype, outs in budgets.items():
            for out, new in outs.items():
                old = entry["budgets"].get(dtype, {}).get(out)
                kind = "drift" if old is None else budget_change(old["budget"], new["budget"])
                if kind != "same":
                    (problems if kind == "drift" else noise).append(
                        f"{case.id}: budget {dtype}/{out} moved from "
                        f"{'nothing' if old is None else format(old['budget'], '.3g')} to {new['budget']:.3g}"
                    )
        if progress:
            progress(case.id)
    return problems
