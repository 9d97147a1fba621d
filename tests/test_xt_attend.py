"""x-transformers' Attend between the canonical projections (conformance/adapters/xt_attend.py) against the
reference, and the findings behind its entries in conformance/deviations.json: where Attend departs from the spec,
the test shows which other spec call it equals.

x-transformers is optional: the tests skip with the pip command when it is missing. Expected values come from
numpy_ref (float64).
"""

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is not installed; pip install attnspec[torch]")
pytest.importorskip("x_transformers", reason="x-transformers is not installed; pip install x-transformers==2.31.10")

import numpy_ref  # noqa: E402
from conformance.adapters import load_adapter  # noqa: E402
from spec import Alibi, AttentionSpec  # noqa: E402

F32 = 2.0**-24
ATTEND = load_adapter("xt-attend")


def _rel(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert np.isfinite(actual).all(), "NaN or Inf where the truth is finite"
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def _call(spec, Lq, Lk, seed=0):
    rng = np.random.default_rng(seed)
    params = numpy_ref.init_params(spec, seed=seed)
    x = {"query": rng.normal(size=(2, Lq, spec.model_dim))}
    x["key"], x["value"] = rng.normal(size=(2, Lk, spec.model_dim)), rng.normal(size=(2, Lk, spec.model_dim))
    return params, x


def _f32(arrays):
    return {n: a.astype(np.float32) if a.dtype.kind == "f" else a for n, a in arrays.items()}


def test_attend_is_the_spec_for_a_square_causal_call_with_mask_bias_and_alibi():
    """SCALE-2, CAUSAL-1, MASK-1, BIAS-1, ALIBI-3: with Lq = Lk and one key/value head per head, Attend (with
    x-transformers' AlibiPositionalBias as attn_bias) equals numpy_ref in float32."""
    spec = AttentionSpec(4, 4, causal=True, relative=Alibi())
    params, x = _call(spec, 7, 7)
    rng = np.random.default_rng(3)
    x["mask"] = rng.random((2, 1, 7, 7)) < 0.8
    x["mask"][..., 0] = True  # every row keeps its first key
    x["bias"] = rng.normal(size=(1, 4, 7, 7))
    out = ATTEND.forward(spec, _f32(params), _f32(x), device="cpu", need_weights=False)["out"]
    assert _rel(out, numpy_ref.attention(spec, params, **x)) < 200 * F32


def test_attend_causal_is_bottom_right():
    """xt-attend-causal-bottom-right: with Lq < Lk, Attend's causal call equals numpy_ref's with the queries at
    arange(Lk - Lq, Lk) (POS-3), not at the default positions."""
    spec = AttentionSpec(2, 4, causal=True)
    params, x = _call(spec, 3, 7)
    out = ATTEND.forward(spec, _f32(params), _f32(x), device="cpu", need_weights=False)["out"]
    end = numpy_ref.attention(spec, params, **x, q_positions=np.arange(4, 7))
    assert _rel(out, end) < 200 * F32
    assert _rel(out, numpy_ref.attention(spec, params, **x)) > 0.1


def test_attend_groups_heads_by_remainder():
    """xt-attend-grouped-heads-interleaved: with H = 4 query heads and 2 key/value heads, Attend equals numpy_ref
    without grouping whose key/value head h holds the canonical head h % 2 (not h // 2)."""
    spec = AttentionSpec(4, 4, num_kv_heads=2)
    params, x = _call(spec, 5, 7)
    out = ATTEND.forward(spec, _f32(params), _f32(x), device="cpu", need_weights=False)["out"]
    d = spec.head_dim
    by_remainder = [h % 2 for h in range(4)]
    expanded = dict(params)
    for w, b in (("wk", "bk"), ("wv", "bv")):
        expanded[w] = np.concatenate([params[w][:, g * d : (g + 1) * d] for g in by_remainder], axis=1)
        expanded[b] = np.concatenate([params[b][g * d : (g + 1) * d] for g in by_remainder])
    ungrouped = AttentionSpec(4, 4)
    assert _rel(out, numpy_ref.attention(ungrouped, expanded, **x)) < 200 * F32
    assert _rel(out, numpy_ref.attention(spec, params, **x)) > 0.1
