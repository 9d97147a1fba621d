"""Hugging Face's BERT-family relative_key attention (transformers 4.x) against the reference (SHAW-1..3): the
adapter of conformance/adapters/hf_bert.py and the findings in spec/comparison.md.

transformers 5 removed relative_key, so these tests need an environment of their own (the `hf4` extra; `.ci/run`
makes it and runs this file there); elsewhere they skip with the adapter's reason. Expected values come from
numpy_ref (float64).
"""

import numpy as np
import pytest

import numpy_ref
from conformance.adapters.hf_bert import HFBertRelativeKeyAdapter
from spec import AttentionSpec, Shaw

BERT = HFBertRelativeKeyAdapter()
pytestmark = pytest.mark.skipif(bool(BERT.unavailable()), reason=str(BERT.unavailable()))
SPEC = AttentionSpec(2, 4, relative=Shaw(8, values=False))


def _rel(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert np.isfinite(actual).all(), "NaN or Inf where the truth is finite"
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def _call(L=7, seed=0):
    rng = np.random.default_rng(seed)
    params = numpy_ref.init_params(SPEC, seed=seed)
    params["rel_k"] = rng.normal(size=params["rel_k"].shape)  # distinct rows: a wrong row shows
    return params, rng.normal(size=(2, L, 8))


def test_relative_key_is_shaw_keys_with_the_table_reversed():
    """SHAW-1..3, SCALE-3: BertSelfAttention(relative_key) with max_position_embeddings = k + 1 is Shaw(k,
    values=False) with rel_k = distance_embedding.weight[::-1], in float64; loaded unreversed it is not."""
    params, x = _call()
    out = BERT.forward(SPEC, params, {"query": x}, device="cpu", need_weights=False)["out"]
    assert _rel(out, numpy_ref.attention(SPEC, params, x)) < 1e-13
    unreversed = {**params, "rel_k": params["rel_k"][::-1].copy()}
    assert _rel(BERT.forward(SPEC, unreversed, {"query": x}, device="cpu", need_weights=False)["out"], out) > 1e-2


def test_a_cached_prefill_puts_every_query_at_the_last_key():
    """The finding in spec/comparison.md: with past_key_values given, relative_key places every query at
    position Lk - 1 (position_ids_l = key_length - 1), so a prefill of several queries into an empty cache is the
    spec's call with q_positions all Lk - 1, not the uncached call (which is the spec's with default positions)."""
    import torch
    from transformers import DynamicCache

    params, x = _call(L=5)
    m = BERT.layer(SPEC, params, "cpu")
    with torch.no_grad():
        context, _ = m(torch.from_numpy(x), past_key_values=DynamicCache())
        out = m.out_proj(context).numpy()
    at_last = numpy_ref.attention(SPEC, params, x, x, x, q_positions=np.full(5, 4))
    assert _rel(out, at_last) < 1e-13
    assert _rel(out, numpy_ref.attention(SPEC, params, x)) > 0.1


def test_esm_relative_key_is_the_same_shaw_term_with_a_float32_softmax():
    """ESM scales the query by d ** -0.5 before both products, which is the same scaled relative term (SCALE-3):
    in float32 EsmSelfAttention(relative_key) equals numpy_ref to float32 rounding; in float64 it stays at
    float32's (its softmax is float32)."""
    from conformance.adapters.hf_bert import HFEsmRelativeKeyAdapter

    esm = HFEsmRelativeKeyAdapter()
    params, x = _call()
    want = numpy_ref.attention(SPEC, params, x)
    f32 = {n: a.astype(np.float32) for n, a in params.items()}
    out32 = esm.forward(SPEC, f32, {"query": x.astype(np.float32)}, device="cpu", need_weights=False)["out"]
    assert _rel(out32, want) < 200 * 2.0**-24
    out64 = esm.forward(SPEC, params, {"query": x}, device="cpu", need_weights=False)["out"]
    assert 1e-12 < _rel(out64, want) < 1e-5


KQ = AttentionSpec(2, 4, relative=Shaw(8, values=False, key_side="shared"))


def test_relative_key_query_adds_the_shared_key_side_term_scaled():
    """SHAW-6, SHAW-7: BertSelfAttention(relative_key_query) is Shaw(k, values=False, key_side="shared") with
    the same reversed table, its key-side term k_j . rel_k[idx] scaled with the rest; without the key-side term
    (relative_key's spec) or with it unscaled (ESM's) the reference is elsewhere."""
    from conformance.adapters.hf_bert import HFBertRelativeKeyQueryAdapter

    params, x = _call()
    out = HFBertRelativeKeyQueryAdapter().forward(KQ, params, {"query": x}, device="cpu", need_weights=False)["out"]
    assert _rel(out, numpy_ref.attention(KQ, params, x)) < 1e-13
    assert _rel(out, numpy_ref.attention(SPEC, params, x)) > 1e-2
    unscaled = AttentionSpec(2, 4, relative=Shaw(8, values=False, key_side="shared", key_side_scaled=False))
    assert _rel(out, numpy_ref.attention(unscaled, params, x)) > 1e-2


def test_esm_relative_key_query_leaves_the_key_side_term_unscaled():
    """SHAW-7: ESM scales the query before its three products, so its key-side term k_j . E[idx] is unscaled:
    Shaw(k, values=False, key_side="shared", key_side_scaled=False), to float32 rounding (its softmax is
    float32); BERT's scaled mapping is elsewhere."""
    from conformance.adapters.hf_bert import HFEsmRelativeKeyQueryAdapter

    esm = HFEsmRelativeKeyQueryAdapter()
    unscaled = AttentionSpec(2, 4, relative=Shaw(8, values=False, key_side="shared", key_side_scaled=False))
    params, x = _call()
    f32 = {n: a.astype(np.float32) for n, a in params.items()}
    out = esm.forward(unscaled, f32, {"query": x.astype(np.float32)}, device="cpu", need_weights=False)["out"]
    assert _rel(out, numpy_ref.attention(unscaled, params, x)) < 200 * 2.0**-24
    assert _rel(out, numpy_ref.attention(KQ, params, x)) > 1e-2


def test_relative_key_query_adapters_take_only_their_own_key_side():
    """The adapters say which Shaw configurations they are (key_side='shared', scaled or not) and skip the rest."""
    from conformance.adapters.hf_bert import HFBertRelativeKeyQueryAdapter, HFEsmRelativeKeyQueryAdapter
    from conformance.catalog import CASES

    by_id = {c.id: c for c in CASES}
    bert, esm = HFBertRelativeKeyQueryAdapter(), HFEsmRelativeKeyQueryAdapter()
    scaled, unscaled = (
        by_id["shaw-key-side/k8/self/shared-within-reach-padding"],
        by_id["shaw-key-side/k8/self/shared-unscaled"],
    )
    assert bert.unsupported_case(scaled) is None and esm.unsupported_case(unscaled) is None
    assert "does not scale its key-side term" in esm.unsupported_case(scaled)
    assert "scales its key-side term" in bert.unsupported_case(unscaled)
    own = by_id["shaw-key-side/k2/cross/own-only-causal-bottom-right"]
    assert "key_side='shared'" in bert.unsupported_case(own)
    assert bert.capabilities().requires == frozenset({"shaw", "shaw-key-side"})


ALBERT_SPEC = AttentionSpec(2, 4, relative=Shaw(8, values=False), scale_relative=False)


def test_albert_adds_the_relative_term_after_the_scale():
    """SCALE-3: AlbertAttention(relative_key) is BERT's reversed table with the relative term added after
    1/sqrt(d): Shaw(k, values=False) with scale_relative=False, its output the dense linear's (before ALBERT's
    residual and LayerNorm), gradients included; BERT's scaled mapping is elsewhere."""
    from conformance.adapters.hf_bert import HFAlbertRelativeKeyAdapter

    albert = HFAlbertRelativeKeyAdapter()
    params, x = _call()
    g = np.random.default_rng(3).normal(size=x.shape)
    out = albert.forward(ALBERT_SPEC, params, {"query": x}, device="cpu", need_weights=False)["out"]
    assert _rel(out, numpy_ref.attention(ALBERT_SPEC, params, x)) < 1e-13
    assert _rel(out, numpy_ref.attention(SPEC, params, x)) > 1e-2
    grads = albert.vjp(ALBERT_SPEC, params, {"query": x, "key": x, "value": x}, g, device="cpu")
    truth = numpy_ref.attention_vjp(ALBERT_SPEC, params, x, x, x, grad_out=g)
    for n in ("query", "key", "value", "wq", "wk", "wv", "wo", "bo", "rel_k"):
        assert _rel(grads[n], truth[n]) < 1e-12, n


def test_albert_relative_key_query_leaves_both_relative_terms_unscaled():
    """SHAW-6, SHAW-7: ALBERT's relative_key_query adds q_i . E[idx] and k_j . E[idx] after the scale:
    Shaw(k, values=False, key_side="shared") with scale_relative=False (the key-side term's factor is s_rel = 1);
    the adapter runs only the cases with the relative terms unscaled."""
    from conformance.adapters.hf_bert import HFAlbertRelativeKeyQueryAdapter
    from conformance.catalog import BY_ID

    albert = HFAlbertRelativeKeyQueryAdapter()
    spec = AttentionSpec(2, 4, relative=Shaw(8, values=False, key_side="shared"), scale_relative=False)
    params, x = _call()
    out = albert.forward(spec, params, {"query": x}, device="cpu", need_weights=False)["out"]
    assert _rel(out, numpy_ref.attention(spec, params, x)) < 1e-13
    assert _rel(out, numpy_ref.attention(KQ, params, x)) > 1e-2
    assert albert.capabilities().requires == frozenset({"shaw", "shaw-key-side", "unscaled-relative"})
    assert albert.unsupported_case(BY_ID["shaw-key-side/k8/self/shared-unscaled-relative-padding"]) is None
