"""Deliberately wrong adapters: each breaks one rule, and the harness must catch it.

A harness that passes a mutant is broken. Each mutant wraps the reference
and changes one thing — the spec, the parameters, the inputs or the result —
so that it computes exactly one classic mistake. They run in float64 on the
CPU and declare every feature, so every case can expose them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

import numpy_ref
from spec import Shaw

from .adapters.base import Capabilities
from .adapters.numpy_ref_adapter import KWARGS, NumpyRefAdapter


def _scheme(spec) -> str:
    """The name of the spec's position scheme, or "" (schemes are told apart by name, REL-3)."""
    return "" if spec.relative is None else spec.relative.name


def _defaults(spec, inputs):
    B, Lq, _ = inputs["query"].shape
    Lk = inputs.get("key", inputs["query"]).shape[1]
    return B, spec.num_heads, Lq, Lk


class Mutant(NumpyRefAdapter):
    """The reference with one mistake; subclasses override one of the hooks."""

    rule = ""
    description = ""
    scheme = ""  # the position scheme whose rule this mutant breaks, "" for the core rules

    def capabilities(self):
        return Capabilities(dtypes=("float64",), gradients=False)

    def mutate_spec(self, spec):
        return spec

    def mutate_params(self, spec, params):
        return params

    def mutate_inputs(self, spec, inputs):
        return inputs

    def mutate_result(self, spec, params, inputs, result):
        return result

    def forward(self, spec, params, inputs, *, device, need_weights):
        mspec = self.mutate_spec(spec)
        mparams = self.mutate_params(spec, dict(params))
        minputs = self.mutate_inputs(spec, dict(inputs))
        result = super().forward(mspec, mparams, minputs, device=device, need_weights=True)
        result = self.mutate_result(spec, params, inputs, result)
        return result if need_weights else {"out": result["out"]}


class WrongScale(Mutant):
    rule = "SCALE-1"
    description = "scale 1/d instead of 1/sqrt(d)"

    def mutate_spec(self, spec):
        return replace(spec, scale=1.0 / spec.head_dim) if spec.scale is None else spec


class RelativeSignFlipped(Mutant):
    rule = "POS-2"
    description = "relative distance query minus key (tables read mirrored)"

    def mutate_params(self, spec, params):
        for n in ("rel_k", "rel_v"):
            if n in params:
                params[n] = np.flip(params[n], axis=-2).copy()
        return params


class ShawClipOffByOne(Mutant):
    rule = "SHAW-2"
    description = "Shaw distances clipped at k - 1 instead of k"
    scheme = "shaw"

    def mutate_params(self, spec, params):
        if _scheme(spec) == "shaw" and spec.relative.max_distance >= 1:
            for n in ("rel_k", "rel_v"):
                if n in params:
                    t = params[n].copy()
                    t[..., 0, :], t[..., -1, :] = t[..., 1, :], t[..., -2, :]
                    params[n] = t
        return params


class RelativeKeyUnscaled(Mutant):
    rule = "SCALE-3"
    description = "relative key term added without the scale (or scaled when it should not be)"

    def mutate_spec(self, spec):
        return replace(spec, scale_relative=not spec.scale_relative) if spec.relative is not None else spec


class MaskPolarityInverted(Mutant):
    rule = "MASK-1"
    description = "boolean mask read as True = ignore"

    def mutate_inputs(self, spec, inputs):
        if inputs.get("mask") is not None:
            inputs["mask"] = ~np.asarray(inputs["mask"])
        return inputs


class MaskAfterSoftmax(Mutant):
    rule = "MASK-4"
    description = "softmax over every key, then the masked weights zeroed (no renormalisation)"

    def forward(self, spec, params, inputs, *, device, need_weights):
        if inputs.get("mask") is None:
            return super().forward(spec, params, inputs, device=device, need_weights=need_weights)
        B, H, Lq, Lk = _defaults(spec, inputs)
        keep = np.broadcast_to(np.asarray(inputs["mask"]), (B, H, Lq, Lk))
        unmasked = {n: a for n, a in inputs.items() if n != "mask"}
        # dropout with keep = mask and p = 1/2 zeroes masked weights and doubles the rest;
        # halving wo undoes the doubling (the output bias is unaffected).
        p = {**params, "wo": params["wo"] * 0.5}
        kw = {n: unmasked[n] for n in KWARGS if n in unmasked and n != "dropout_keep"}
        out, w = numpy_ref.attention(
            replace(spec, dropout=0.5),
            p,
            unmasked["query"],
            unmasked.get("key"),
            unmasked.get("value"),
            **kw,
            dropout_keep=keep.copy(),
            return_weights=True,
        )
        return {"out": out, "weights": w * keep} if need_weights else {"out": out}


class NaNOnFullyMaskedRows(Mutant):
    rule = "MASK-5"
    description = "NaN on fully masked rows (softmax of all -inf)"

    def mutate_result(self, spec, params, inputs, result):
        w = result["weights"]
        empty = ~(w != 0).any(-1)  # (B, H, Lq)
        out = result["out"].copy()
        out[empty.any(1)] = np.nan
        w = np.where(empty[..., None], np.nan, w)
        return {"out": out, "weights": w}


class FullyMaskedRowsAverage(Mutant):
    rule = "MASK-5"
    description = "fully masked rows average the values (a -1e30 fill instead of exact zeros)"

    def mutate_spec(self, spec):
        return replace(spec, mask_fill=-1e30) if spec.mask_fill is None else spec


class HeadSplitInterleaved(Mutant):
    rule = "HEAD-1"
    description = "feature f goes to head f % H instead of f // d"

    def mutate_params(self, spec, params):
        H, d = spec.num_heads, spec.head_dim
        perm = np.arange(H * d).reshape(d, H).T.reshape(-1)  # contiguous slot -> interleaved feature
        for n in ("wq", "wk", "wv"):
            params[n] = params[n][:, perm]
        for n in ("bq", "bk", "bv"):
            if n in params:
                params[n] = params[n][perm]
        params["wo"] = params["wo"][perm, :]
        return params


class BiasScaled(Mutant):
    rule = "SCALE-4"
    description = "additive bias multiplied by the scale"

    def mutate_inputs(self, spec, inputs):
        if inputs.get("bias") is not None:
            inputs["bias"] = np.asarray(inputs["bias"], np.float64) * spec.effective_scale
        return inputs


class CausalAlignmentFlipped(Mutant):
    rule = "POS-3"
    description = "causal mask aligned bottom-right when positions say top-left (and back)"

    def mutate_inputs(self, spec, inputs):
        if spec.causal:
            B, H, Lq, Lk = _defaults(spec, inputs)
            qp = inputs.get("q_positions")
            inputs["q_positions"] = np.arange(Lk - Lq, Lk) if qp is None else np.asarray(qp) - (Lk - Lq)
        return inputs


class ShawValueTermNotDropped(Mutant):
    rule = "DROP-4"
    description = "dropout applied to the content value term only, not the Shaw value term"
    scheme = "shaw"

    def forward(self, spec, params, inputs, *, device, need_weights):
        keep = inputs.get("dropout_keep")
        if keep is None or not (_scheme(spec) == "shaw" and spec.relative.values):
            return super().forward(spec, params, inputs, device=device, need_weights=need_weights)
        kw = {n: inputs[n] for n in KWARGS if n in inputs}
        zero_rel_v = {**params, "rel_v": np.zeros_like(params["rel_v"])}
        content, w = numpy_ref.attention(
            spec, zero_rel_v, inputs["query"], inputs.get("key"), inputs.get("value"), **kw, return_weights=True
        )
        no_drop = {n: a for n, a in kw.items() if n != "dropout_keep"}
        zero_v = {**params, "wv": np.zeros_like(params["wv"])}
        if "bv" in zero_v:
            zero_v["bv"] = np.zeros_like(params["bv"])
        relative = numpy_ref.attention(
            replace(spec, dropout=0.0), zero_v, inputs["query"], inputs.get("key"), inputs.get("value"), **no_drop
        )
        out = content + relative - params.get("bo", 0.0)  # both terms carry bo once
        return {"out": out, "weights": w} if need_weights else {"out": out}


class HuangClipped(Mutant):
    rule = "HUANG-3"
    description = "Huang distances beyond the table clipped to the edge rows (Shaw's rule) instead of zero"
    scheme = "huang"

    def mutate_spec(self, spec):
        r = spec.relative
        if _scheme(spec) == "huang":
            return replace(spec, relative=Shaw(r.max_len - 1, values=False, per_head=r.per_head))
        return spec


class DeadKeysLeak(Mutant):
    rule = "MASK-7"
    description = "values of dead keys multiplied by zero weights (0 * NaN = NaN)"

    def mutate_result(self, spec, params, inputs, result):
        out = result["out"].copy()
        for name in ("key", "value"):
            a = inputs.get(name)
            if a is not None:
                bad = ~np.isfinite(np.asarray(a, np.float64)).all(axis=(1, 2))
                out[bad] = np.nan
        return {**result, "out": out}


class WeightsAfterDropout(Mutant):
    rule = "SOFTMAX-2"
    description = "returned weights taken after dropout"

    def mutate_result(self, spec, params, inputs, result):
        keep = inputs.get("dropout_keep")
        if keep is None:
            return result
        return {**result, "weights": np.where(keep, result["weights"] / (1 - spec.dropout), 0.0)}


class WeightsNotTransposed(Mutant):
    rule = "PARAM-1"
    description = "PyTorch (out, in) weights used as canonical (in, out) without transposing"

    def mutate_params(self, spec, params):
        for n in ("wq", "wk", "wv", "wo"):
            params[n] = params[n].T.copy()
        return params


class ValueDefaultsToQuery(Mutant):
    rule = "SHAPE-2"
    description = "value omitted taken as the query instead of the key"

    def mutate_inputs(self, spec, inputs):
        if "value" not in inputs and "key" in inputs:
            inputs["value"] = inputs["query"]
        return inputs

    def forward(self, spec, params, inputs, *, device, need_weights):
        # exercised on cross cases by dropping the value argument
        inputs = {n: a for n, a in inputs.items() if n != "value"}
        return super().forward(spec, params, inputs, device=device, need_weights=need_weights)


def killed_by_rule(rule: str, results: list) -> list:
    """The (case, check) pairs that failed and claim ``rule``: what kills a mutant of that rule.

    A failure of a check that does not claim the rule does not count: the
    harness promises that a check claiming rule X fails when X is broken.
    """
    return sorted({(r.case, r.check) for r in results if r.failed and rule in r.rules})


def _name(cls) -> str:
    import re

    return re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower().replace("na-n", "nan")


MUTANTS = {
    _name(c): c
    for c in (
        WrongScale,
        RelativeSignFlipped,
        ShawClipOffByOne,
        RelativeKeyUnscaled,
        MaskPolarityInverted,
        MaskAfterSoftmax,
        NaNOnFullyMaskedRows,
        FullyMaskedRowsAverage,
        HeadSplitInterleaved,
        BiasScaled,
        CausalAlignmentFlipped,
        ShawValueTermNotDropped,
        HuangClipped,
        DeadKeysLeak,
        WeightsAfterDropout,
        WeightsNotTransposed,
        ValueDefaultsToQuery,
    )
}
for _n, _c in MUTANTS.items():
    _c.name = f"mutant/{_n}"
