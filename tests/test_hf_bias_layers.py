"""Hugging Face's SwinAttention and T5Attention as whole layers against the spec (SWIN-*, T5-*): the adapters of
conformance/adapters/hf_bias_layers.py, the table layouts they load, and the findings in
spec/comparison.md.

Expected values come from numpy_ref (float64). transformers is optional: the tests skip with the pip command
when it is missing.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; pip install attnspec[torch]")
pytest.importorskip("transformers", reason="transformers is not installed; pip install transformers==5.24.0")

import numpy_ref  # noqa: E402
from conformance.adapters import load_adapter  # noqa: E402
from spec import AttentionSpec, Swin, T5Bias  # noqa: E402

F32 = 2.0**-24


def _rel(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert np.isfinite(actual).all(), "NaN or Inf where the truth is finite"
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def _self_call(spec, L: int, seed: int = 0, mask=None):
    rng = np.random.default_rng(seed)
    params = numpy_ref.init_params(spec, seed=seed)
    params["rel_b"] = rng.normal(size=params["rel_b"].shape)  # distinct entries: a wrong row shows
    x = rng.normal(size=(2, L, spec.model_dim))
    inputs = {"query": x} if mask is None else {"query": x, "mask": mask}
    return params, inputs, rng.normal(size=x.shape)


def _f32(arrays):
    return {n: a.astype(np.float32) if a.dtype.kind == "f" else a for n, a in arrays.items()}


SWIN = AttentionSpec(2, 4, relative=Swin((3, 4)))


def test_swin_attention_is_the_spec_with_its_table_reversed():
    """SWIN-1..3: SwinAttention on a 3 x 4 window (the library's SwinRelativePositionBias((3, 4))) equals
    numpy_ref in float32, gradients included (rel_b's through the table), once rel_b goes in reversed along R;
    in its own order the table gives another attention."""
    adapter = load_adapter("hf-swin-attention")
    params, inputs, grad_out = _self_call(SWIN, 12)
    want = numpy_ref.attention(SWIN, params, inputs["query"])
    out = adapter.forward(SWIN, _f32(params), _f32(inputs), device="cpu", need_weights=True)
    assert _rel(out["out"], want) < 200 * F32
    grads = adapter.vjp(
        SWIN,
        _f32(params),
        _f32({**inputs, "key": inputs["query"], "value": inputs["query"]}),
        grad_out.astype(np.float32),
        device="cpu",
    )
    x = inputs["query"]
    truth = numpy_ref.attention_vjp(SWIN, params, x, x, x, grad_out=grad_out)
    for n in ("rel_b", "wq", "wv", "query"):
        assert _rel(grads[n], truth[n]) < 1e-5, n
    unreversed = adapter.forward(
        SWIN, _f32({**params, "rel_b": params["rel_b"][:, ::-1].copy()}), _f32(inputs), device="cpu", need_weights=False
    )
    assert _rel(unreversed["out"], want) > 1e-2
    back = adapter.roundtrip_params(SWIN, params)
    assert all(np.array_equal(back[n], params[n]) for n in params)


T5_ENCODER = AttentionSpec(2, 3, bias=False, scale=1.0, relative=T5Bias(8, 6))
T5_DECODER = AttentionSpec(2, 3, bias=False, scale=1.0, causal=True, relative=T5Bias(8, 6, bidirectional=False))


def test_t5_attention_encoder_and_cached_decoder_are_the_spec():
    """T5-1..5, CAUSAL-1, MASK-1: the encoder with a padding mask, and the decoder decoding its last query from
    the cache, equal numpy_ref in float32 (scale 1, no projection biases, the table transposed)."""
    adapter = load_adapter("hf-t5-attention")
    mask = np.ones((2, 1, 1, 9), dtype=bool)
    mask[1, ..., 7:] = False  # the second row's last two keys are padding
    for spec, m in ((T5_ENCODER, mask), (T5_DECODER, None)):
        params, inputs, _ = _self_call(spec, 9, mask=m)
        want = numpy_ref.attention(spec, params, inputs["query"], mask=m)
        out = adapter.forward(spec, _f32(params), _f32(inputs), device="cpu", need_weights=False)
        assert _rel(out["out"], want) < 200 * F32, spec.causal


def test_a_t5_decoder_called_without_a_mask_is_not_causal():
    """The finding in spec/comparison.md: T5Attention(is_decoder=True) called with mask=None makes causal
    buckets (every future key in bucket 0) but masks nothing, so it is the unidirectional bias without the causal
    rule, not the decoder."""
    adapter = load_adapter("hf-t5-attention")
    params, inputs, _ = _self_call(T5_DECODER, 9)
    m = adapter.layer(T5_DECODER, params, "cpu")
    with torch.no_grad():
        out, _, _ = m(torch.from_numpy(inputs["query"]), mask=None)
    unmasked = AttentionSpec(2, 3, bias=False, scale=1.0, relative=T5Bias(8, 6, bidirectional=False))
    assert _rel(out.numpy(), numpy_ref.attention(unmasked, params, inputs["query"])) < 1e-12
    assert _rel(out.numpy(), numpy_ref.attention(T5_DECODER, params, inputs["query"])) > 1e-2


def test_the_layers_skip_what_they_cannot_express_with_the_reason():
    from conformance.catalog import BY_ID

    t5, swin = load_adapter("hf-t5-attention"), load_adapter("hf-swin-attention")
    assert t5.unsupported_case(BY_ID["t5/self/unidirectional-future-keys-attended"]).startswith(
        "T5Attention's projections have no biases"
    )
    assert t5.unsupported_case(BY_ID["t5/self/decoder-scale1-no-bias"]) is None
    assert swin.unsupported_case(BY_ID["swin/self/causal-long-L512"]) == (
        "SwinAttention attends within one window: L = Wh * Ww = 6 tokens, not 512"
    )
    assert swin.unsupported_case(BY_ID["swin/self/window-3x4-shift-mask"]) is None
