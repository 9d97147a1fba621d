"""Hugging Face's Wav2Vec2-BERT relative_key and DeBERTa-v2's disentangled attention against the reference
(SHAW-1..3, SHAW-6, SHAW-7): the adapters of conformance/adapters/hf_relative.py and the findings in
spec/comparison.md. Expected values come from numpy_ref (float64) and from hand-written table rows.
"""

import numpy as np
import pytest

import numpy_ref
from conformance.adapters import _hf_layers
from conformance.adapters.hf_relative import (
    W2V_PROJECTIONS,
    HFDebertaV2AttentionAdapter,
    HFWav2Vec2BertRelativeKeyAdapter,
    asymmetric_table,
    deberta_table,
    shaw_table,
)
from spec import AttentionSpec, Shaw

W2V, DEBERTA = HFWav2Vec2BertRelativeKeyAdapter(), HFDebertaV2AttentionAdapter()
pytestmark = pytest.mark.skipif(bool(W2V.unavailable()), reason=str(W2V.unavailable()))
DEBERTA_SPEC = AttentionSpec(
    2, 4, relative=Shaw(2, values=False, per_head=True, key_side="own"), scale=1 / np.sqrt(3 * 4)
)


def _rel(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert np.isfinite(actual).all(), "NaN or Inf where the truth is finite"
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def _call(spec, L=9, seed=0):
    rng = np.random.default_rng(seed)
    params = numpy_ref.init_params(spec, seed=seed)
    for n in ("rel_k", "rel_q"):
        if n in params:
            params[n] = rng.normal(size=params[n].shape)  # distinct rows: a wrong row shows
    return params, rng.normal(size=(2, L, spec.model_dim)), rng.normal(size=(2, L, spec.model_dim))


def test_tables_hand_derived():
    """SHAW-2: an asymmetric window [-1, 2] of rows (a, b, c, d) is Shaw(2)'s (a, a, b, c, d); DeBERTa's rows
    for Shaw(1)'s (x, y, z) are (z, z, y, x) (row m is distance span - m, span = 2), and back: the values
    return, a gradient sums the two rows of distance 1."""
    rows = np.arange(4.0)[:, None]
    assert asymmetric_table(rows, 1, 2)[:, 0].tolist() == [0, 0, 1, 2, 3]
    shaw = np.array([[10.0], [20.0], [30.0]])
    assert deberta_table(shaw)[:, 0].tolist() == [30, 30, 20, 10]
    assert shaw_table(deberta_table(shaw), grad=False)[:, 0].tolist() == [10, 20, 30]
    assert shaw_table(np.array([[1.0], [2.0], [4.0], [8.0]]), grad=True)[:, 0].tolist() == [8, 4, 3]


def test_wav2vec2_bert_relative_key_is_shaw_keys_with_the_table_as_it_is():
    """SHAW-1..3, SCALE-3: Wav2Vec2BertSelfAttention(relative_key) with left = right = k is Shaw(k, values=False)
    with rel_k = distance_embedding.weight as it is (its distance is key minus query, clipped), in float64 with
    gradients; the table reversed gives another attention."""
    spec = AttentionSpec(2, 4, relative=Shaw(3, values=False))
    params, x, g = _call(spec)
    out = W2V.forward(spec, params, {"query": x}, device="cpu", need_weights=False)["out"]
    assert _rel(out, numpy_ref.attention(spec, params, x)) < 1e-13
    grads = W2V.vjp(spec, params, {"query": x, "key": x, "value": x}, g, device="cpu")
    truth = numpy_ref.attention_vjp(spec, params, x, x, x, grad_out=g)
    for n in ("query", "key", "value", "wq", "wk", "wv", "wo", "bo", "rel_k"):
        assert _rel(grads[n], truth[n]) < 1e-12, n
    reversed_ = {**params, "rel_k": params["rel_k"][::-1].copy()}
    assert _rel(W2V.forward(spec, reversed_, {"query": x}, device="cpu", need_weights=False)["out"], out) > 1e-2


def test_wav2vec2_bert_default_window_is_shaw_with_replicated_edge_rows():
    """SHAW-2: the default relative_key window [-64, 8] of Wav2Vec2-BERT is Shaw(64) whose rows for distances
    9 .. 64 repeat the row of 8 (asymmetric_table), for a call whose distances reach past both edges."""
    import torch
    from transformers import Wav2Vec2BertConfig
    from transformers.models.wav2vec2_bert.modeling_wav2vec2_bert import Wav2Vec2BertSelfAttention

    config = Wav2Vec2BertConfig(hidden_size=8, num_attention_heads=2, position_embeddings_type="relative_key")
    config._attn_implementation = "eager"
    assert (config.left_max_position_embeddings, config.right_max_position_embeddings) == (64, 8)
    spec = AttentionSpec(2, 4, relative=Shaw(64, values=False))
    params, x, _ = _call(spec, L=70)
    table = np.random.default_rng(1).normal(size=(64 + 8 + 1, 4))
    m = _hf_layers.load(Wav2Vec2BertSelfAttention(config).double().eval(), params, "cpu", W2V_PROJECTIONS)
    with torch.no_grad():
        m.distance_embedding.weight.copy_(torch.from_numpy(table))
        out = m(torch.from_numpy(x))[0].numpy()
    want = numpy_ref.attention(spec, {**params, "rel_k": asymmetric_table(table, 64, 8)}, x)
    assert _rel(out, want) < 1e-13


def test_deberta_v2_is_shaw_keys_and_an_own_key_side_at_one_third_scale():
    """SHAW-1..3, SHAW-6, SHAW-7, SCALE-1: DisentangledSelfAttention(c2p, p2c) with max_relative_positions = k + 1
    is Shaw(k, values=False, per_head=True, key_side="own") at scale 1/sqrt(3 d), its tables in DeBERTa's rows
    (deberta_table), to float32 rounding of its divisor, gradients included; with rel_k and rel_q swapped it is
    another attention."""
    params, x, g = _call(DEBERTA_SPEC)
    f32 = {n: a.astype(np.float32) for n, a in params.items()}
    out32 = DEBERTA.forward(DEBERTA_SPEC, f32, {"query": x.astype(np.float32)}, device="cpu", need_weights=False)
    assert _rel(out32["out"], numpy_ref.attention(DEBERTA_SPEC, params, x)) < 100 * 2.0**-24
    grads = DEBERTA.vjp(DEBERTA_SPEC, params, {"query": x, "key": x, "value": x}, g, device="cpu")
    truth = numpy_ref.attention_vjp(DEBERTA_SPEC, params, x, x, x, grad_out=g)
    for n in ("query", "key", "value", "wq", "wk", "wv", "wo", "bo", "rel_k", "rel_q"):
        assert _rel(grads[n], truth[n]) < 1e-7, n
    swapped = {**params, "rel_k": params["rel_q"], "rel_q": params["rel_k"]}
    out = DEBERTA.forward(DEBERTA_SPEC, swapped, {"query": x}, device="cpu", need_weights=False)["out"]
    assert _rel(out, numpy_ref.attention(DEBERTA_SPEC, params, x)) > 1e-2


def test_deberta_v2_float64_carries_its_float32_divisor():
    """PREC-1, the named deviation hf-deberta-v2-float64-scale-in-float32: in float64 the layer equals the spec
    at the scale 1/sqrt(3 d) with sqrt(3 d) rounded to float32, not at the exact scale."""
    params, x, _ = _call(DEBERTA_SPEC)
    out = DEBERTA.forward(DEBERTA_SPEC, params, {"query": x}, device="cpu", need_weights=False)["out"]
    rounded = AttentionSpec(2, 4, relative=DEBERTA_SPEC.relative, scale=1 / float(np.sqrt(np.float32(12.0))))
    assert _rel(out, numpy_ref.attention(rounded, params, x)) < 1e-13
    assert _rel(out, numpy_ref.attention(DEBERTA_SPEC, params, x)) > 1e-9


def test_deberta_v2_takes_only_its_own_configuration():
    """The adapter says why it skips a key-side case that DeBERTa cannot be: a shared table, another scale."""
    from dataclasses import replace

    from conformance.catalog import BY_ID

    own = BY_ID["shaw-key-side/k2/self/own-per-head-scale-third-padding"]
    assert DEBERTA.unsupported_case(own) is None
    assert "own-table key side" in DEBERTA.unsupported_case(BY_ID["shaw-key-side/k2/self/shared"])
    halved = replace(own, spec=replace(own.spec, scale=0.5))
    assert "scales its three logits by 1/sqrt(3 d) = 0.288675" in DEBERTA.unsupported_case(halved)
