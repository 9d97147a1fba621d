"""Deliberately wrong adapters: each breaks one rule, and the harness must catch it.

A harness that passes a mutant is broken. Each mutant wraps the reference
and changes one thing — the spec, the parameters, the inputs or the result —
so that it computes exactly one classic mistake. They run in float64 on the
CPU and declare every feature, so every case can expose them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

import numpy_ref
from numpy_ref import blockwise, schemes
from numpy_ref._inputs import Call, prepare
from numpy_ref.backward import backward_heads, in_order
from numpy_ref.forward import context, project
from numpy_ref.heads import merge_heads, split_heads
from numpy_ref.masking import allowed_keys, dead_keys, masked_softmax, relative_distance, softcap
from numpy_ref.relative import as_4d, gather_logits
from spec import Shaw
from spec.biases import alibi_slopes
from spec.rope import base_frequencies

from .adapters.base import Capabilities
from .adapters.numpy_ref_adapter import KWARGS, NumpyRefAdapter
from .checks import index_window


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
        for n in ("rel_k", "rel_q", "rel_v"):
            if n in params:
                params[n] = np.flip(params[n], axis=-2).copy()
        return params


class ShawClipOffByOne(Mutant):
    rule = "SHAW-2"
    description = "Shaw distances clipped at k - 1 instead of k"
    scheme = "shaw"

    def mutate_params(self, spec, params):
        if _scheme(spec) == "shaw" and spec.relative.max_distance >= 1:
            for n in ("rel_k", "rel_q", "rel_v"):
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
        def perm(heads, size):  # contiguous slot -> interleaved feature
            return np.arange(heads * size).reshape(size, heads).T.reshape(-1)

        H, Hkv, d, dv = spec.num_heads, spec.kv_heads, spec.head_dim, spec.v_head_dim
        for n, order in (("q", perm(H, d)), ("k", perm(Hkv, d)), ("v", perm(Hkv, dv))):
            params["w" + n] = params["w" + n][:, order]
            if "b" + n in params:
                params["b" + n] = params["b" + n][order]
        params["wo"] = params["wo"][perm(H, dv), :]
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
    value_scheme = "shaw"

    def forward(self, spec, params, inputs, *, device, need_weights):
        keep = inputs.get("dropout_keep")
        if keep is None or not (_scheme(spec) == self.value_scheme and spec.relative.values):
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


class HuangValueTermNotDropped(ShawValueTermNotDropped):
    rule = "DROP-4"
    description = "dropout applied to the content value term only, not the Huang value term"
    scheme = "huang"
    value_scheme = "huang"


class HuangClipped(Mutant):
    rule = "HUANG-3"
    description = "Huang distances beyond the table clipped to the edge rows (Shaw's rule) instead of zero"
    scheme = "huang"

    def mutate_spec(self, spec):
        r = spec.relative
        if _scheme(spec) == "huang":
            return replace(spec, relative=Shaw(r.max_len - 1, values=r.values, per_head=r.per_head))
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


# ------------------------------------------------ a forward pass with one step changed
@dataclass
class _Logits:
    """The reference's forward pass up to the softmax, in pieces a mutant can recombine."""

    call: Call
    hooks: schemes.Bound
    ctx: schemes.Context
    delta: np.ndarray  # (1|B, Lq, Lk)
    allowed: np.ndarray  # (B, H, Lq, Lk)
    q: np.ndarray  # (B, H, Lq, d)
    v: np.ndarray  # (B, H, Lk, d)
    content: np.ndarray  # s * q @ k.T
    term: object  # s_rel * the scheme's key term, or 0.0
    bias: object  # the scheme's bias plus the bias input, or 0.0
    cap: object  # spec.softcap (SOFTCAP-1), or None

    def capped(self, score):
        """SOFTCAP-1 on a score (content plus key term); the identity without a cap."""
        return score if self.cap is None else softcap(score, self.cap)[0]

    @property
    def logits(self):
        return self.capped(self.content + self.term) + self.bias


def _logits(spec, params, inputs, dead=None, kv_head=None) -> _Logits:
    """The reference's steps up to the logits; ``dead(spec, call, delta, allowed) -> (B, Lk)`` picks the zeroed
    keys, ``kv_head`` (H,) the key/value head each query head reads (HEAD-3: h // G)."""
    kw = {n: inputs.get(n) for n in KWARGS}
    call = prepare(spec, params, inputs["query"], inputs.get("key"), inputs.get("value"), **kw)
    p, (B, Lq, Lk), H = call.params, call.dims, spec.num_heads
    hooks = schemes.bind(spec.relative)
    delta = relative_distance(call.q_positions, call.k_positions)
    ctx = context(spec, call, delta)
    allowed = allowed_keys(
        (B, H, Lq, Lk), delta, causal=spec.causal, mask=call.mask, bias=call.bias, window=spec.window
    )
    key, value = call.key, call.value
    if spec.mask_fill is None:
        gone = dead_keys(allowed) if dead is None else dead(spec, call, delta, allowed)
        key = np.where(gone[..., None], 0.0, key)
        value = np.where(gone[..., None], 0.0, value)
    kv_head = np.arange(H) // spec.group_size if kv_head is None else kv_head
    q = split_heads(project(call.query, p["wq"], p.get("bq")), H)
    k = split_heads(project(key, p["wk"], p.get("bk")), spec.kv_heads)[:, kv_head]
    v = split_heads(project(value, p["wv"], p.get("bv")), spec.kv_heads)[:, kv_head]
    if hooks.uses("qk_transform"):
        q, k, _ = hooks.call("qk_transform", p, q, k, ctx)
    content = spec.effective_scale * (q @ k.swapaxes(-1, -2))
    term = 0.0
    if hooks.uses("key_term"):
        term = spec.relative_scale * hooks.call("key_term", p, q, ctx)[0]
    bias = 0.0
    if hooks.uses("bias"):
        bias = hooks.call("bias", p, ctx)[0]
    if call.bias is not None:
        bias = bias + call.bias
    return _Logits(call, hooks, ctx, delta, allowed, q, v, content, term, bias, spec.softcap)


def _softmax(z):
    """A plain softmax over the key axis (every key counts, as with a mask_fill)."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _finish(spec, lg: _Logits, weights, value_term_mask=None) -> dict:
    """The reference's steps after the softmax: dropout, both value terms, merge, output projection."""
    p, keep = lg.call.params, lg.call.dropout_keep
    dropped = weights if keep is None else np.where(keep, weights / (1.0 - spec.dropout), 0.0)
    o = dropped @ lg.v
    if lg.hooks.uses("value_term"):
        w = dropped if value_term_mask is None else np.where(value_term_mask, dropped, 0.0)
        o = o + lg.hooks.call("value_term", p, w, lg.ctx)[0]
    return {"out": project(merge_heads(o), p["wo"], p.get("bo")), "weights": weights}


class _RecombinedMutant(Mutant):
    """A mutant that computes the weights (or the value terms) its own way from the reference's logits."""

    def applies(self, spec, inputs) -> bool:
        return True

    def dead(self, spec, call, delta, allowed):
        return dead_keys(allowed)

    def weights(self, spec, lg: _Logits):
        return masked_softmax(lg.logits, lg.allowed, spec.mask_fill)

    def value_term_mask(self, spec, lg: _Logits):
        return None

    def kv_head(self, spec):
        return None

    def forward(self, spec, params, inputs, *, device, need_weights):
        if not self.applies(spec, inputs):
            return super().forward(spec, params, inputs, device=device, need_weights=need_weights)
        lg = _logits(spec, params, inputs, self.dead, self.kv_head(spec))
        with np.errstate(invalid="ignore", divide="ignore"):
            result = _finish(spec, lg, self.weights(spec, lg), self.value_term_mask(spec, lg))
        return result if need_weights else {"out": result["out"]}


def _positions_2d(inputs, name: str, L: int) -> np.ndarray:
    """Positions as (1 or B, L), the default arange(L) when omitted (POS-1)."""
    p = inputs.get(name)
    return np.arange(L, dtype=np.int64)[None] if p is None else np.asarray(p, np.int64).reshape(-1, L)


def _and_mask(inputs, extra) -> dict:
    """The inputs with ``extra`` combined into the mask by AND."""
    mask = inputs.get("mask")
    return {**inputs, "mask": extra if mask is None else np.logical_and(mask, extra)}


# --------------------------------------------------- positions that vary per batch element
class _PositionsFromFirstBatch(Mutant):
    """(B, L) positions named in ``names`` read from batch element 0 for every batch element."""

    names: tuple = ()

    def mutate_inputs(self, spec, inputs):
        for name in self.names:
            p = inputs.get(name)
            if p is not None and np.ndim(p) == 2:
                inputs[name] = np.asarray(p)[0]
        return inputs


class QueryPositionsFromFirstBatch(_PositionsFromFirstBatch):
    rule = "POS-1"
    description = "(B, Lq) query positions read from batch element 0 for every batch element"
    names = ("q_positions",)


class KeyPositionsFromFirstBatch(_PositionsFromFirstBatch):
    rule = "POS-1"
    description = "(B, Lk) key positions read from batch element 0 for every batch element"
    names = ("k_positions",)


class DistancesFromFirstBatch(_PositionsFromFirstBatch):
    rule = "POS-2"
    description = "relative distances computed once from batch element 0's positions and used for every element"
    names = ("q_positions", "k_positions")


class CausalFromIndices(Mutant):
    rule = "POS-3"
    description = "with k_positions given, causality from indices (tril) instead of positions"

    def forward(self, spec, params, inputs, *, device, need_weights):
        if spec.causal and inputs.get("k_positions") is not None:
            B, H, Lq, Lk = _defaults(spec, inputs)
            spec, inputs = replace(spec, causal=False), _and_mask(inputs, np.tril(np.ones((Lq, Lk), dtype=bool)))
        return super().forward(spec, params, inputs, device=device, need_weights=need_weights)


class CausalIgnoresKeyPositions(Mutant):
    rule = "CAUSAL-1"
    description = "causality from the query positions against arange(Lk): k_positions ignored"

    def forward(self, spec, params, inputs, *, device, need_weights):
        if spec.causal:
            B, H, Lq, Lk = _defaults(spec, inputs)
            qp = _positions_2d(inputs, "q_positions", Lq)
            causal = (np.arange(Lk)[None, None, :] <= qp[:, :, None])[:, None]  # (1|B, 1, Lq, Lk)
            spec, inputs = replace(spec, causal=False), _and_mask(inputs, causal)
        return super().forward(spec, params, inputs, device=device, need_weights=need_weights)


class HuangSkewAssumesConsecutiveQueries(_RecombinedMutant):
    rule = "HUANG-4"
    description = "Huang's skew used whenever the keys are default, as if the queries were consecutive from q_pos[0]"
    scheme = "huang"

    def applies(self, spec, inputs):
        return _scheme(spec) == "huang" and inputs.get("k_positions") is None

    def weights(self, spec, lg):
        c = lg.ctx
        qp = c.q_positions[:, :1] + np.arange(c.Lq)  # what the skew assumes
        delta = relative_distance(qp, c.k_positions)
        skewed = schemes.Context(qp, c.k_positions, delta, c.batch, c.num_heads, c.head_dim, c.Lq, c.Lk)
        term = spec.relative_scale * lg.hooks.call("key_term", lg.call.params, lg.q, skewed)[0]
        return masked_softmax(lg.capped(lg.content + term) + lg.bias, lg.allowed, spec.mask_fill)


class HuangWrapsBeyondTable(_RecombinedMutant):
    rule = "HUANG-3"
    description = "causal Huang: a distance beyond the table reads row (delta + M - 1) mod R instead of adding zero"
    scheme = "huang"

    def applies(self, spec, inputs):
        return _scheme(spec) == "huang" and spec.causal

    def weights(self, spec, lg):
        table4 = as_4d(lg.call.params["rel_k"])
        row = (lg.delta + spec.relative.max_len - 1) % spec.relative.num_rows
        term = spec.relative_scale * gather_logits(lg.q, table4, row)
        return masked_softmax(lg.capped(lg.content + term) + lg.bias, lg.allowed, spec.mask_fill)


# ------------------------------------------------------------------- options in combination
class CustomScaleNotOnRelativeTerm(Mutant):
    rule = "SCALE-3"
    description = "relative key term scaled by 1/sqrt(d) while the content logits use a custom spec.scale"

    def mutate_params(self, spec, params):
        if spec.scale is not None and spec.scale_relative and "rel_k" in params:
            params["rel_k"] = params["rel_k"] * (1.0 / math.sqrt(spec.head_dim) / spec.scale)
        return params


# --------------------------------------------------------- variation across heads and batch
class FullyMaskedRowsFromHeadZero(_RecombinedMutant):
    rule = "MASK-5"
    description = "fully masked rows found in head 0 only: zeroed in every head; rows empty elsewhere give 0 / 0"

    def applies(self, spec, inputs):
        return spec.mask_fill is None

    def weights(self, spec, lg):
        z = np.where(lg.allowed, lg.logits, -np.inf)
        empty = ~lg.allowed[:, :1].any(axis=-1, keepdims=True)  # (B, 1, Lq, 1), from head 0
        e = np.where(lg.allowed, np.exp(z - np.where(empty, 0.0, z.max(axis=-1, keepdims=True))), 0.0)
        return np.where(empty, 0.0, e / e.sum(axis=-1, keepdims=True))


class DeadKeysFromHeadZero(_RecombinedMutant):
    rule = "MASK-4"
    description = "keys no query of head 0 may attend zeroed as dead, though other heads attend them"

    def dead(self, spec, call, delta, allowed):
        return ~allowed[:, 0].any(axis=1)


class DeadKeysFromBatchZero(_RecombinedMutant):
    rule = "MASK-7"
    description = "the dead keys of batch element 0 zeroed in every batch element (others' dead keys kept)"

    def dead(self, spec, call, delta, allowed):
        return np.broadcast_to(dead_keys(allowed)[:1], (allowed.shape[0], allowed.shape[-1]))


class DeadKeysFromMaskOnly(_RecombinedMutant):
    rule = "MASK-7"
    description = "dead keys found from the mask and the causal rule only, not from -inf bias entries"

    def dead(self, spec, call, delta, allowed):
        return dead_keys(
            allowed_keys(allowed.shape, delta, causal=spec.causal, mask=call.mask, bias=None, window=spec.window)
        )


# ---------------------------------------------------------------------- mask_fill moderate
class MaskFillScaled(Mutant):
    rule = "MASK-6"
    description = "mask_fill written into the logits before the scale, so the fill is multiplied by it"

    def mutate_spec(self, spec):
        return replace(spec, mask_fill=spec.mask_fill * spec.effective_scale) if spec.mask_fill is not None else spec


class MaskFillBeforeBias(_RecombinedMutant):
    rule = "MASK-6"
    description = "mask_fill written before the bias is added (a filled key's logit is fill + bias)"

    def applies(self, spec, inputs):
        return spec.mask_fill is not None and inputs.get("bias") is not None

    def weights(self, spec, lg):
        unbiased = allowed_keys(
            lg.allowed.shape, lg.delta, causal=spec.causal, mask=lg.call.mask, bias=None, window=spec.window
        )
        return _softmax(np.where(unbiased, lg.capped(lg.content + lg.term), spec.mask_fill) + lg.bias)


class MaskFillBeforeRelativeTerm(_RecombinedMutant):
    rule = "MASK-6"
    description = "mask_fill written before the relative key term is added (a filled key's logit is fill + term)"

    def applies(self, spec, inputs):
        return spec.mask_fill is not None and spec.relative is not None and "key_term" in spec.relative.hooks

    def weights(self, spec, lg):
        return _softmax(np.where(lg.allowed, lg.capped(lg.content) + lg.bias, spec.mask_fill) + lg.term)


class CausalFillMinusInf(_RecombinedMutant):
    rule = "MASK-6"
    description = "keys the causal rule disallows get -inf; only masked and -inf-biased keys get mask_fill"

    def applies(self, spec, inputs):
        return spec.mask_fill is not None and spec.causal

    def weights(self, spec, lg):
        z = np.where(lg.allowed, lg.logits, spec.mask_fill)
        return _softmax(np.where((lg.delta <= 0)[:, None], z, -np.inf))


class ShawValueBucketsAllowedOnly(_RecombinedMutant):
    rule = "MASK-6"
    description = "with a mask_fill, the Shaw value buckets sum the weights of allowed keys only"
    scheme = "shaw"

    def applies(self, spec, inputs):
        return spec.mask_fill is not None and _scheme(spec) == "shaw" and spec.relative.values

    def value_term_mask(self, spec, lg):
        return lg.allowed


class NoKeyProjectionBias(Mutant):
    rule = "PROJ-1"
    description = "key projection without its bias bk (invisible except where mask_fill replaces logits)"

    def mutate_params(self, spec, params):
        if "bk" in params:
            params["bk"] = np.zeros_like(params["bk"])
        return params


# ------------------------------------------------------------------ gradients under poison
class _GradientMutant(Mutant):
    """A mutant whose mistake is in the gradients: it declares them."""

    def capabilities(self):
        return Capabilities(dtypes=("float64",), gradients=True)


class DeadKeyRowsReachWeightGradients(_GradientMutant):
    rule = "MASK-7"
    description = "vjp of wk and wv from the raw key and value rows: 0 * NaN of dead keys reaches them"

    def vjp(self, spec, params, inputs, grad_out, *, device):
        grads = super().vjp(spec, params, inputs, grad_out, device=device)
        if spec.mask_fill is not None:
            return grads
        lg = _logits(spec, params, inputs)
        dead = dead_keys(lg.allowed)[..., None]
        for name, w in (("key", "wk"), ("value", "wv")):
            raw = np.where(dead, np.asarray(inputs[name], np.float64), 0.0)
            # x.T @ dy over the dead rows too: their dy rows are 0, but 0 * NaN is NaN
            grads[w] = grads[w] + np.einsum("bli,blo->io", raw, np.zeros_like(raw))
        return grads


class BroadcastBiasGradientOneRow(_GradientMutant):
    rule = "GRAD-1"
    description = "gradient of a bias broadcast over queries or keys taken from one row instead of the sum"

    def vjp(self, spec, params, inputs, grad_out, *, device):
        bias = inputs.get("bias")
        if bias is None:
            return super().vjp(spec, params, inputs, grad_out, device=device)
        B, H, Lq, Lk = _defaults(spec, inputs)
        shape = (1,) * (4 - np.ndim(bias)) + np.shape(bias)
        full = {**inputs, "bias": np.broadcast_to(bias, (B, H, Lq, Lk)).copy()}
        grads = super().vjp(spec, params, full, grad_out, device=device)
        g = grads["bias"].sum(axis=tuple(a for a in (0, 1) if shape[a] == 1), keepdims=True)
        g = g[:, :, : shape[2], : shape[3]]  # singleton query / key axes: row 0, not the sum
        grads["bias"] = g.reshape(np.shape(bias))
        return grads


# ------------------------------------------------------------------------ argument checks
class IntegerMaskAccepted(Mutant):
    rule = "MASK-3"
    description = "an integer mask cast to bool instead of rejected"

    def mutate_inputs(self, spec, inputs):
        m = inputs.get("mask")
        if m is not None and np.asarray(m).dtype.kind in "iu":
            inputs["mask"] = np.asarray(m).astype(bool)
        return inputs


class KeyPaddingMaskGuessed(Mutant):
    rule = "MASK-1"
    description = "a (B, Lk) mask reinterpreted as key padding (B, 1, 1, Lk) instead of rejected"

    def mutate_inputs(self, spec, inputs):
        B, H, Lq, Lk = _defaults(spec, inputs)
        m = inputs.get("mask")
        if m is not None and np.ndim(m) == 2 and np.shape(m) == (B, Lk):
            inputs["mask"] = np.asarray(m)[:, None, None, :]
        return inputs


class FloatKeepMaskAccepted(Mutant):
    rule = "DROP-1"
    description = "a float keep mask cast to bool instead of rejected"

    def mutate_inputs(self, spec, inputs):
        keep = inputs.get("dropout_keep")
        if keep is not None and np.asarray(keep).dtype != bool:
            inputs["dropout_keep"] = np.asarray(keep).astype(bool)
        return inputs


class KeepMaskBroadcast(Mutant):
    rule = "DROP-1"
    description = "a keep mask of shape (Lq, Lk) broadcast to (B, H, Lq, Lk) instead of rejected"

    def mutate_inputs(self, spec, inputs):
        keep = inputs.get("dropout_keep")
        full = _defaults(spec, inputs)
        if keep is not None and np.shape(keep) != full:
            inputs["dropout_keep"] = np.broadcast_to(keep, full).copy()
        return inputs


class ExtraParamsIgnored(Mutant):
    rule = "PARAM-2"
    description = "parameter entries that are not canonical silently dropped"

    def mutate_params(self, spec, params):
        return {n: a for n, a in params.items() if n in spec.param_shapes()}


class MisshapedParamsSliced(Mutant):
    rule = "PARAM-2"
    description = "a parameter larger than its canonical shape sliced to it instead of rejected"

    def mutate_params(self, spec, params):
        for n, shape in spec.param_shapes().items():
            a = params.get(n)
            if a is not None and a.shape != shape and a.ndim == len(shape):
                params[n] = a[tuple(slice(0, s) for s in shape)]
        return params


class PositionsTruncated(Mutant):
    rule = "POS-1"
    description = "positions longer than their axis truncated to it instead of rejected"

    def mutate_inputs(self, spec, inputs):
        B, H, Lq, Lk = _defaults(spec, inputs)
        for name, L in (("q_positions", Lq), ("k_positions", Lk)):
            p = inputs.get(name)
            if p is not None and np.shape(p)[-1] > L:
                inputs[name] = np.asarray(p)[..., :L]
        return inputs


class ErrorMessageUnnamed(Mutant):
    rule = "INPUT-1"
    description = "errors raised without the argument's name at the start of the message"

    def forward(self, spec, params, inputs, *, device, need_weights):
        try:
            return super().forward(spec, params, inputs, device=device, need_weights=need_weights)
        except (TypeError, ValueError) as e:
            raise type(e)(f"invalid attention call ({str(e).split(': ', 1)[-1]})") from None


# -------------------------------------------------------------------- the no-weights path
class _FastPathMutant(Mutant):
    """Correct when the weights are requested; the mistake is in the path that does not return them."""

    def forward(self, spec, params, inputs, *, device, need_weights):
        if need_weights:
            return NumpyRefAdapter.forward(self, spec, params, inputs, device=device, need_weights=True)
        return super().forward(spec, params, inputs, device=device, need_weights=False)


class FastPathDropsShawValues(_FastPathMutant):
    rule = "SHAW-4"
    description = "without weights requested, a fused path that leaves out the Shaw value term"
    scheme = "shaw"

    def mutate_params(self, spec, params):
        if "rel_v" in params:
            params["rel_v"] = np.zeros_like(params["rel_v"])
        return params


class FastPathIgnoresBias(_FastPathMutant):
    rule = "BIAS-1"
    description = "without weights requested, a fused path that ignores the bias input"

    def mutate_inputs(self, spec, inputs):
        inputs.pop("bias", None)
        return inputs


class FastPathMaskInverted(_FastPathMutant):
    rule = "MASK-1"
    description = "without weights requested, a fused path that reads the mask as True = ignore"

    def mutate_inputs(self, spec, inputs):
        m = inputs.get("mask")
        if m is not None and np.asarray(m).dtype == bool:
            inputs["mask"] = ~np.asarray(m)
        return inputs


# ------------------------------------------------- peer options (HEAD-3, HEAD-4, SOFTCAP-1, WINDOW-1)
class KvHeadsTiled(_RecombinedMutant):
    rule = "HEAD-3"
    description = "query head h reads key/value head h % Hkv (tiling) instead of h // G (contiguous groups)"

    def applies(self, spec, inputs):
        return spec.kv_heads not in (1, spec.num_heads)

    def kv_head(self, spec):
        return np.arange(spec.num_heads) % spec.kv_heads


class KvGradientsAveraged(_GradientMutant):
    rule = "GRAD-1"  # HEAD-3's last sentence; the gradient checks claim GRAD-1
    description = "a key/value head's gradient averaged over the query heads of its group instead of summed"

    def vjp(self, spec, params, inputs, grad_out, *, device):
        grads = super().vjp(spec, params, inputs, grad_out, device=device)
        if spec.group_size > 1:
            for name in ("key", "value", "wk", "wv", "bk", "bv"):
                if name in grads:
                    grads[name] = grads[name] / spec.group_size
        return grads


class ScaleFromValueHeadDim(Mutant):
    rule = "HEAD-4"
    description = "scale 1/sqrt(dv) from the value head size instead of 1/sqrt(d)"

    def mutate_spec(self, spec):
        dv = spec.v_head_dim
        return replace(spec, scale=1.0 / math.sqrt(dv)) if spec.scale is None and dv != spec.head_dim else spec


class SoftcapIgnored(Mutant):
    rule = "SOFTCAP-1"
    description = "spec.softcap ignored: logits not capped"

    def mutate_spec(self, spec):
        return replace(spec, softcap=None)


class SoftcapAfterBias(_RecombinedMutant):
    rule = "SOFTCAP-1"
    description = "the cap applied after the bias input and the scheme bias are added, not to the score alone"

    def applies(self, spec, inputs):
        return spec.softcap is not None

    def weights(self, spec, lg):
        with np.errstate(invalid="ignore"):
            return masked_softmax(lg.capped(lg.content + lg.term + lg.bias), lg.allowed, spec.mask_fill)


class SoftcapContentOnly(_RecombinedMutant):
    rule = "SOFTCAP-1"
    description = "the cap applied to the content logits only, the relative key term added after it"

    def applies(self, spec, inputs):
        return spec.softcap is not None and spec.relative is not None and "key_term" in spec.relative.hooks

    def weights(self, spec, lg):
        return masked_softmax(lg.capped(lg.content) + lg.term + lg.bias, lg.allowed, spec.mask_fill)


class WindowSignFlipped(Mutant):
    rule = "WINDOW-1"
    description = "window bounds read on query minus key: (left, right) swapped"

    def mutate_spec(self, spec):
        return replace(spec, window=spec.window[::-1]) if spec.window is not None else spec


class WindowBoundsExclusive(Mutant):
    rule = "WINDOW-1"
    description = "window bounds exclusive (-left < delta < right) for bounds >= 1"

    def mutate_spec(self, spec):
        if spec.window is None:
            return spec
        return replace(spec, window=tuple(b - 1 if b else b for b in spec.window))


class WindowFromIndices(Mutant):
    rule = "WINDOW-1"
    description = "window applied to key index minus query index instead of the positions' distance"

    def forward(self, spec, params, inputs, *, device, need_weights):
        if spec.window is not None:
            B, H, Lq, Lk = _defaults(spec, inputs)
            spec, inputs = replace(spec, window=None), _and_mask(inputs, index_window(spec.window, Lq, Lk))
        return super().forward(spec, params, inputs, device=device, need_weights=need_weights)


# --------------------------------------------------------------------------- RoPE (ROPE-1..ROPE-9)
def _rope(spec):
    """The spec's Rope, or None."""
    return spec.relative if _scheme(spec) == "rope" else None


def _pair_swap(spec, heads: int) -> np.ndarray:
    """The column permutation that swaps the two channels of every rotated pair (ROPE-3), per head."""
    rope, d = spec.relative, spec.head_dim
    half = rope.rotated(d) // 2
    within = np.arange(d)
    c = np.arange(half)
    first, second = (c, c + half) if rope.layout == "half" else (2 * c, 2 * c + 1)
    within[first], within[second] = second, first
    return (np.arange(heads)[:, None] * d + within).ravel()


class RopeLayoutsSwapped(Mutant):
    rule = "ROPE-3"
    description = "RoPE pairs (c, c + r/2) read as (2c, 2c + 1), or the other way round"
    scheme = "rope"

    def mutate_spec(self, spec):
        rope = _rope(spec)
        if rope is None:
            return spec
        return replace(spec, relative=replace(rope, layout="interleaved" if rope.layout == "half" else "half"))


class RopeConjugateRotation(Mutant):
    rule = "ROPE-5"
    description = "RoPE turns each pair by minus its angle (the conjugate rotation, x sin and y sin signs swapped)"
    scheme = "rope"

    # R(-a) = S R(a) S for the swap S of a pair's two channels, and S is orthogonal: turning S q and S k
    # by +a gives the logits that turning q and k by -a gives. So: the q/k weight columns of each pair swapped.
    def mutate_params(self, spec, params):
        if _rope(spec) is None:
            return params
        for name, heads in (("q", spec.num_heads), ("k", spec.kv_heads)):
            perm = _pair_swap(spec, heads)
            params["w" + name] = params["w" + name][:, perm]
            if "b" + name in params:
                params["b" + name] = params["b" + name][perm]
        return params


class RopeFrequenciesOverHeadDim(Mutant):
    rule = "ROPE-4"
    description = "partial RoPE with frequencies theta^(-2c/d) over the head size, not over the rotated channels"
    scheme = "rope"

    def mutate_spec(self, spec):
        rope = _rope(spec)
        if rope is None or rope.inv_freq is not None or rope.rotated(spec.head_dim) == spec.head_dim:
            return spec
        r = rope.rotated(spec.head_dim)
        return replace(spec, relative=replace(rope, inv_freq=base_frequencies(rope.theta, spec.head_dim)[: r // 2]))


class RopeAttentionFactorOnce(Mutant):
    rule = "ROPE-7"
    description = "RoPE's attention factor applied to q only, so the logits get af instead of af**2"
    scheme = "rope"

    def mutate_params(self, spec, params):
        rope = _rope(spec)
        if rope is None or rope.attention_factor == 1.0:
            return params
        d, r = spec.head_dim, rope.rotated(spec.head_dim)
        rotated = (np.arange(spec.kv_heads)[:, None] * d + np.arange(r)).ravel()
        for name in ("wk", "bk"):
            if name in params:
                t = params[name].copy()
                t[..., rotated] = t[..., rotated] / rope.attention_factor
                params[name] = t
        return params


class RopePositionsInBfloat16(Mutant):
    rule = "ROPE-9"
    description = "RoPE positions held in bfloat16 (positions 256..263 become 256, 256, 258, 260, ...)"
    scheme = "rope"

    def mutate_inputs(self, spec, inputs):
        if _rope(spec) is None:
            return inputs
        import ml_dtypes

        for name in ("q_positions", "k_positions"):
            if inputs.get(name) is not None:
                p = np.asarray(inputs[name])
                inputs[name] = p.astype(np.float64).astype(ml_dtypes.bfloat16).astype(np.float64).astype(p.dtype)
        return inputs


class RopeValuesRotated(_RecombinedMutant):
    rule = "ROPE-1"
    description = "RoPE applied to v as well as to q and k"
    scheme = "rope"

    def applies(self, spec, inputs):
        return _rope(spec) is not None and spec.v_head_dim == spec.head_dim

    def forward(self, spec, params, inputs, *, device, need_weights):
        if not self.applies(spec, inputs):
            return Mutant.forward(self, spec, params, inputs, device=device, need_weights=need_weights)
        lg = _logits(spec, params, inputs)
        _, lg.v, _ = lg.hooks.call(
            "qk_transform", lg.call.params, lg.v, lg.v, replace(lg.ctx, q_positions=lg.ctx.k_positions)
        )
        result = _finish(spec, lg, self.weights(spec, lg))
        return result if need_weights else {"out": result["out"]}


# ------------------------------------------------------------ position biases (ALIBI, T5, SWIN)
class AlibiSlopesOfNextPowerOfTwo(Mutant):
    rule = "ALIBI-2"
    description = "ALiBi slopes of the next power of two, the first H of them, for H not a power of two"
    scheme = "alibi"

    def mutate_spec(self, spec):
        H = spec.num_heads
        if _scheme(spec) != "alibi" or spec.relative.slopes is not None or H & (H - 1) == 0:
            return spec
        wrong = alibi_slopes(1 << H.bit_length(), spec.relative.max_bias)[:H]
        return replace(spec, relative=replace(spec.relative, slopes=wrong))


class AlibiLinearFormBidirectional(Mutant):
    rule = "ALIBI-3"
    description = "the linear form m * delta (BLOOM's m * j) used without a causal mask"
    scheme = "alibi"

    def mutate_spec(self, spec):
        if _scheme(spec) != "alibi" or spec.causal or not spec.relative.symmetric:
            return spec
        return replace(spec, relative=replace(spec.relative, symmetric=False))


class AlibiBiasScaled(Mutant):
    rule = "ALIBI-1"
    description = "the ALiBi bias multiplied by the logit scale s"
    scheme = "alibi"

    def mutate_spec(self, spec):
        if _scheme(spec) != "alibi":
            return spec
        slopes = tuple(m * spec.effective_scale for m in spec.relative.slopes_for(spec.num_heads))
        return replace(spec, relative=replace(spec.relative, slopes=slopes))


class T5SignFlipped(Mutant):
    rule = "T5-2"
    description = "T5 buckets of query minus key (every position negated)"
    scheme = "t5"

    def mutate_inputs(self, spec, inputs):
        if _scheme(spec) == "t5":
            B, _, Lq, Lk = _defaults(spec, inputs)
            inputs["q_positions"] = -np.asarray(inputs.get("q_positions", np.arange(Lq)), np.int64)
            inputs["k_positions"] = -np.asarray(inputs.get("k_positions", np.arange(Lk)), np.int64)
        return inputs


class T5FutureKeysMasked(Mutant):
    rule = "T5-2"
    description = "a unidirectional T5 bias masks the keys after the query instead of putting them in bucket 0"
    scheme = "t5"

    def mutate_spec(self, spec):
        if _scheme(spec) == "t5" and not spec.relative.bidirectional:
            return replace(spec, causal=True)
        return spec


def _swin_rows_permuted(spec, params, row_of) -> dict:
    """rel_b with offset row r holding the row ``row_of(dh, dw)`` (mod the offset rows) reads: a wrong
    index map expressed as a permuted table."""
    if _scheme(spec) != "swin" or "rel_b" not in params:
        return params
    (Wh, Ww), R0 = spec.relative.window, spec.relative.offset_rows
    t = params["rel_b"].copy()
    for dh in range(1 - Wh, Wh):
        for dw in range(1 - Ww, Ww):
            t[:, (dh + Wh - 1) * (2 * Ww - 1) + dw + Ww - 1] = params["rel_b"][:, row_of(dh, dw) % R0]
    return {**params, "rel_b": t}


class SwinMultiplierOfRows(Mutant):
    rule = "SWIN-3"
    description = "Swin row (dh + Wh - 1) * (2Wh - 1) + (dw + Ww - 1): the row count as multiplier"
    scheme = "swin"

    def mutate_params(self, spec, params):
        if _scheme(spec) != "swin":
            return params
        Wh, Ww = spec.relative.window
        return _swin_rows_permuted(spec, params, lambda dh, dw: (dh + Wh - 1) * (2 * Wh - 1) + dw + Ww - 1)


class SwinTableNotReversed(Mutant):
    rule = "SWIN-3"
    description = "a query-minus-key (timm) table read at key-minus-query offsets without reversing it"
    scheme = "swin"

    def mutate_params(self, spec, params):
        if _scheme(spec) != "swin":
            return params
        Wh, Ww = spec.relative.window
        return _swin_rows_permuted(spec, params, lambda dh, dw: (Wh - 1 - dh) * (2 * Ww - 1) + Ww - 1 - dw)


def killed_by_rule(rule: str, results: list) -> list:
    """The (case, check) pairs that failed and claim ``rule``: what kills a mutant of that rule.

    A failure of a check that does not claim the rule does not count: the
    harness promises that a check claiming rule X fails when X is broken.
    """
    return sorted({(r.case, r.check) for r in results if r.failed and rule in r.rules})


def _name(cls) -> str:
    import re

    return re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower().replace("na-n", "nan")


class KeySideReadsQuery(Mutant):
    rule = "SHAW-6"
    description = "Shaw's key-side term computed from the query (a second key term) instead of the key"
    scheme = "shaw"

    def mutate_spec(self, spec):
        r = spec.relative
        if _scheme(spec) == "shaw" and r.key_side:
            return replace(spec, relative=replace(r, keys=True, key_side=None, key_side_scaled=True))
        return spec

    def mutate_params(self, spec, params):
        r = spec.relative
        if _scheme(spec) == "shaw" and r.key_side:  # q . (rel_k + f rel_q): the key-side table read by the query
            f = spec.key_side_scale / spec.relative_scale
            side = params.pop("rel_q") if r.key_side == "own" else params["rel_k"]
            params["rel_k"] = (params["rel_k"] if r.keys else 0.0) + f * side
        return params


class KeySideScaleIgnored(Mutant):
    rule = "SHAW-7"
    description = "Shaw's key-side term scaled when key_side_scaled is False, unscaled when it is True"
    scheme = "shaw"

    def mutate_spec(self, spec):
        r = spec.relative
        if _scheme(spec) == "shaw" and r.key_side:
            return replace(spec, relative=replace(r, key_side_scaled=not r.key_side_scaled))
        return spec


class KeySideDistanceMirrored(Mutant):
    rule = "SHAW-6"
    description = "Shaw's key-side term read at query minus key (its table mirrored), the key term right"
    scheme = "shaw"

    def mutate_spec(self, spec):
        r = spec.relative
        if _scheme(spec) == "shaw" and r.key_side == "shared":
            return replace(spec, relative=replace(r, key_side="own"))
        return spec

    def mutate_params(self, spec, params):
        r = spec.relative
        if _scheme(spec) == "shaw" and r.key_side:
            side = params["rel_k"] if r.key_side == "shared" else params["rel_q"]
            params["rel_q"] = np.flip(side, axis=-2).copy()
        return params


# ---------------------------------------------------------------- blockwise evaluation (BLOCK-1..BLOCK-5)
class _Blockwise(Mutant):
    """The reference over the keys in 2 consecutive blocks (BLOCK-1..BLOCK-3), with one mistake in a hook."""

    def block_positions(self, block_call_, J):
        return block_call_

    def combine(self, stats):
        return blockwise.combine(stats)

    def forward(self, spec, params, inputs, *, device, need_weights):
        kw = {n: inputs.get(n) for n in KWARGS}
        call = prepare(spec, params, inputs["query"], inputs.get("key"), inputs.get("value"), **kw)
        blocks = [J for J in np.array_split(np.arange(call.dims.Lk), 2) if len(J)]
        stats = [
            blockwise.block_statistics(spec, self.block_positions(blockwise.block_call(call, J), J)) for J in blocks
        ]
        _, _, o = self.combine(stats)
        out = project(merge_heads(o), call.params["wo"], call.params.get("bo"))
        x = (inputs["query"], inputs.get("key"), inputs.get("value"))
        return {"out": out, "weights": numpy_ref.attention(spec, params, *x, **kw, return_weights=True)[1]}


class BlockwiseLocalPositions(_Blockwise):
    rule = "BLOCK-1"
    description = "each block of keys at its local positions 0 .. |J| - 1 instead of the keys' global ones"

    def block_positions(self, block_call_, J):
        return replace(block_call_, k_positions=np.broadcast_to(np.arange(len(J)), block_call_.k_positions.shape))


class BlockwiseEmptyBlockNaN(_Blockwise):
    rule = "BLOCK-3"
    description = "a block with no allowed key for a row gives that row NaN (0 / 0), which the combination keeps"

    def combine(self, stats):
        nan = [(m, s, np.where(np.isfinite(m)[..., None], o, np.nan)) for m, s, o in stats]
        m, total, _ = blockwise.combine(stats)
        c = [s * np.exp(mj - np.where(np.isfinite(m), m, 0.0)) for mj, s, _ in nan]
        o = sum((cj / np.where(total == 0, 1.0, total))[..., None] * oj for cj, (_, _, oj) in zip(c, nan))
        return m, total, o


class BlockwiseOwnRowSums(_GradientMutant):
    rule = "BLOCK-6"
    description = (
        "gradients block by block (2 blocks of keys), each block's softmax differentiated with its own row sums, "
        "not the whole row's d_o . o"
    )

    def vjp(self, spec, params, inputs, grad_out, *, device):
        kw = {n: inputs.get(n) for n in KWARGS}
        call = prepare(spec, params, inputs["query"], inputs["key"], inputs["value"], **kw)
        blocks = np.array_split(np.arange(call.dims.Lk), 2)
        own = lambda spec, trace, d_o, rows: backward_heads(spec, trace, d_o)  # noqa: E731
        grads = blockwise.blockwise_backward(spec, call, np.asarray(grad_out, np.float64), blocks, own)
        return in_order(spec, grads, inputs.get("bias") is not None)


class ZigzagPositionsNotMapped(Mutant):
    rule = "BLOCK-5"
    description = "tokens in a load-balanced (zigzag) order read at their local indices: the positions dropped"

    def mutate_inputs(self, spec, inputs):
        for n in ("q_positions", "k_positions"):
            inputs.pop(n, None)
        return inputs


class BiasMergedWithMaskByMin(Mutant):
    rule = "BIAS-1"
    description = "the bias merged with the causal rule or mask by min(bias, 0) (a positive bias lost)"

    def mutate_inputs(self, spec, inputs):
        if inputs.get("bias") is not None and (spec.causal or inputs.get("mask") is not None):
            inputs["bias"] = np.minimum(inputs["bias"], 0.0)
        return inputs


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
        HuangValueTermNotDropped,
        KeySideReadsQuery,
        KeySideScaleIgnored,
        KeySideDistanceMirrored,
        DeadKeysLeak,
        WeightsAfterDropout,
        WeightsNotTransposed,
        ValueDefaultsToQuery,
        QueryPositionsFromFirstBatch,
        KeyPositionsFromFirstBatch,
        DistancesFromFirstBatch,
        CausalFromIndices,
        CausalIgnoresKeyPositions,
        HuangSkewAssumesConsecutiveQueries,
        HuangWrapsBeyondTable,
        CustomScaleNotOnRelativeTerm,
        FullyMaskedRowsFromHeadZero,
        DeadKeysFromHeadZero,
        DeadKeysFromBatchZero,
        DeadKeysFromMaskOnly,
        MaskFillScaled,
        MaskFillBeforeBias,
        MaskFillBeforeRelativeTerm,
        CausalFillMinusInf,
        ShawValueBucketsAllowedOnly,
        NoKeyProjectionBias,
        DeadKeyRowsReachWeightGradients,
        BroadcastBiasGradientOneRow,
        IntegerMaskAccepted,
        KeyPaddingMaskGuessed,
        FloatKeepMaskAccepted,
        KeepMaskBroadcast,
        ExtraParamsIgnored,
        MisshapedParamsSliced,
        PositionsTruncated,
        ErrorMessageUnnamed,
        FastPathDropsShawValues,
        FastPathIgnoresBias,
        FastPathMaskInverted,
        KvHeadsTiled,
        KvGradientsAveraged,
        ScaleFromValueHeadDim,
        SoftcapIgnored,
        SoftcapAfterBias,
        BlockwiseLocalPositions,
        BlockwiseEmptyBlockNaN,
        BlockwiseOwnRowSums,
        ZigzagPositionsNotMapped,
        BiasMergedWithMaskByMin,
        SoftcapContentOnly,
        WindowSignFlipped,
        WindowBoundsExclusive,
        WindowFromIndices,
        RopeLayoutsSwapped,
        RopeConjugateRotation,
        RopeFrequenciesOverHeadDim,
        RopeAttentionFactorOnce,
        RopePositionsInBfloat16,
        RopeValuesRotated,
        AlibiSlopesOfNextPowerOfTwo,
        AlibiLinearFormBidirectional,
        AlibiBiasScaled,
        T5SignFlipped,
        T5FutureKeysMasked,
        SwinMultiplierOfRows,
        SwinTableNotReversed,
    )
}
for _n, _c in MUTANTS.items():
    _c.name = f"mutant/{_n}"
