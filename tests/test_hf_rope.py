"""Hugging Face transformers' RoPE against the spec (ROPE-2..ROPE-16): the adapters, the frequency
functions, and the measured findings behind conformance/deviations.json.

Every model is built from a config with random weights; nothing is downloaded. Expected values come
from numpy_ref (float64) or from the spec's float64 constructors.
"""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is not installed; pip install transformers==5.24.0")

import torch  # noqa: E402
from transformers import GPTNeoXConfig, LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gpt_neox import modeling_gpt_neox as neox  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

import numpy_ref  # noqa: E402
from conformance.adapters import load_adapter  # noqa: E402
from conformance.adapters.hf_rope import GPTJ_MIN_TABLE, gptj_table  # noqa: E402
from spec import AttentionSpec, Rope, dynamic_ntk_alpha  # noqa: E402

F32 = 2.0**-24  # float32's unit roundoff


def _rel(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def _freq_rel(actual, expected) -> float:
    """The largest elementwise relative error of frequency vectors (zeros compared as zeros)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = np.where(expected == 0, 1.0, np.abs(expected))
    return float(np.max(np.abs(actual - expected) / scale))


def _llama_config(parameters: dict, head_dim: int = 64, max_positions: int = 4096) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rope_parameters=parameters,
    )


# ------------------------------------------------------------------------- adapters vs numpy_ref
def _call(spec, *, cross: bool, positions=None, seed=0):
    rng = np.random.default_rng(seed)
    params = numpy_ref.init_params(spec, seed=seed)
    B, Lq, Lk, D = 2, 5, 7 if cross else 5, spec.model_dim
    x = rng.normal(size=(B, Lq, D))
    inputs = {"query": x}
    if cross:
        inputs["key"], inputs["value"] = rng.normal(size=(B, Lk, D)), rng.normal(size=(B, Lk, D))
    if positions is not None:
        inputs["q_positions"], inputs["k_positions"] = positions
    return params, inputs, rng.normal(size=(B, Lq, D))


def _check_adapter(name: str, spec, *, cross: bool = True, positions=None):
    """forward and every gradient of a float32 call within float32 rounding of numpy_ref's float64 truth."""
    params, inputs, grad_out = _call(spec, cross=cross, positions=positions)
    kv = {n: inputs[n] for n in ("key", "value", "q_positions", "k_positions") if n in inputs}
    truth = numpy_ref.attention(spec, params, inputs["query"], **kv)
    explicit = {**inputs, "key": inputs.get("key", inputs["query"]), "value": inputs.get("value", inputs["query"])}
    grads = numpy_ref.attention_vjp(
        spec,
        params,
        explicit["query"],
        explicit["key"],
        explicit["value"],
        grad_out,
        **{n: v for n, v in kv.items() if n.endswith("positions")},
    )
    f32 = {n: a.astype(np.float32) for n, a in params.items()}
    adapter = load_adapter(name)
    out = adapter.forward(
        spec,
        f32,
        {n: np.asarray(v, np.float32) if v.dtype.kind == "f" else v for n, v in inputs.items()},
        device="cpu",
        need_weights=False,
    )["out"]
    assert out.dtype == np.float32
    assert _rel(out, truth) < 2e-5
    got = adapter.vjp(
        spec,
        f32,
        {n: np.asarray(v, np.float32) if v.dtype.kind == "f" else v for n, v in explicit.items()},
        grad_out.astype(np.float32),
        device="cpu",
    )
    for n, g in grads.items():
        assert _rel(got[n], g) < 5e-5, n


ROPE_SPECS = {
    "theta100-attention-factor": AttentionSpec(
        num_heads=2, head_dim=8, relative=Rope(theta=100.0, attention_factor=1.25)
    ),
    "gqa-yarn": AttentionSpec(num_heads=4, head_dim=8, num_kv_heads=2, relative=Rope.yarn(8.0, 16, rotary_dim=8)),
    "llama3-causal": AttentionSpec(
        num_heads=2, head_dim=8, causal=True, relative=Rope.llama3(8.0, 1.0, 4.0, 32, rotary_dim=8)
    ),
}
PER_BATCH = (
    np.array([[3, 4, 5, 6, 7], [10, 11, 12, 13, 14]]),
    np.array([[0, 2, 4, 6, 8, 10, 12], [5, 6, 7, 8, 9, 10, 11]]),
)


@pytest.mark.parametrize("name", ["hf-llama-rope", "hf-gptneox-rope"])
@pytest.mark.parametrize("case", list(ROPE_SPECS))
def test_half_layout_rotations_match_the_reference(name, case):
    """ROPE-3..ROPE-7: Llama's and GPT-NeoX's rotation (cos/sin times attention_scaling) inside the glue."""
    _check_adapter(name, ROPE_SPECS[case], positions=PER_BATCH)


def test_gptneox_rotates_the_first_r_channels():
    """ROPE-2: rotary_pct = r / d rotates channels 0 .. r-1 with frequencies over r."""
    _check_adapter("hf-gptneox-rope", AttentionSpec(num_heads=2, head_dim=8, relative=Rope(theta=100.0, rotary_dim=4)))


@pytest.mark.parametrize(
    "rope",
    [
        Rope(layout="interleaved", rotary_dim=6),
        Rope(theta=100.0, rotary_dim=4),
        Rope.linear(4.0, rotary_dim=8, layout="interleaved"),
    ],
    ids=["interleaved-r6", "half-r4-theta100", "interleaved-linear"],
)
def test_gptj_rotation_matches_the_reference(rope):
    """ROPE-3, ROPE-8: GPT-J's rotate_every_two; the half layout through the channel permutation."""
    _check_adapter(
        "hf-gptj-rope",
        AttentionSpec(num_heads=2, head_dim=8, relative=rope),
        positions=(np.arange(5) + 3, np.arange(7)),
    )


def test_llama_attention_layer_matches_the_reference():
    """The whole LlamaAttention (eager): GQA (HEAD-3), causal (CAUSAL-1), no projection bias, RoPE."""
    spec = AttentionSpec(num_heads=4, head_dim=8, num_kv_heads=2, bias=False, causal=True, relative=Rope(theta=100.0))
    _check_adapter("hf-llama-attention", spec, cross=False)


def test_gptj_table_rebuild_is_gptj_arithmetic():
    """The table hf-gptj-rope builds for other frequencies is create_sinusoidal_positions' own at theta 10000."""
    from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions

    gptj_frequencies = 1.0 / (10000 ** (torch.arange(0, 6, 2, dtype=torch.int64) / 6))  # GPT-J's float32 ones
    expected = create_sinusoidal_positions(GPTJ_MIN_TABLE, 6)
    assert torch.equal(gptj_table(GPTJ_MIN_TABLE, gptj_frequencies.double().numpy()), expected)


# ------------------------------------------------------------------ frequencies vs the constructors
def test_linear_frequencies_match_rope_linear():
    """ROPE-12: HF "linear" is Rope.linear within float32 rounding."""
    inv_freq, factor = ROPE_INIT_FUNCTIONS["linear"](
        _llama_config({"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}), "cpu"
    )
    assert factor == 1.0
    assert _freq_rel(inv_freq, Rope.linear(4.0, rotary_dim=64).inv_freq) < 2 * F32  # measured 7.0e-8


@pytest.mark.parametrize("length", [2048, 4096, 8192, 16384])
def test_dynamic_frequencies_are_rope_ntk_at_the_context_length(length):
    """ROPE-11, ROPE-13: HF "dynamic" at seq_len L is Rope.ntk(dynamic_ntk_alpha(factor, n, L)); 1 up to n."""
    config = _llama_config({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, max_positions=4096)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=length)
    expected = Rope.ntk(dynamic_ntk_alpha(2.0, 4096, length), rotary_dim=64).inv_freq
    assert _freq_rel(inv_freq, expected) < 2 * F32  # measured 7.0e-8 .. 9.2e-8


def test_yarn_frequencies_and_attention_factor_match_rope_yarn():
    """ROPE-14, ROPE-7: HF "yarn" frequencies and attention_factor (0.1 ln 8 + 1) are Rope.yarn's."""
    config = _llama_config(
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 4096},
        max_positions=32768,
    )
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    rope = Rope.yarn(8.0, 4096, rotary_dim=64)
    assert _freq_rel(inv_freq, rope.inv_freq) < 2 * F32  # measured 7.5e-8
    assert factor == pytest.approx(rope.attention_factor, rel=1e-15)  # 1.2079441541679836 both


def test_llama3_frequencies_match_rope_llama3():
    """ROPE-15: HF "llama3" within a few float32 ulps (its wavelengths and smooth band are float32)."""
    config = _llama_config(
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        head_dim=128,
        max_positions=131072,
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    assert _freq_rel(inv_freq, Rope.llama3(8.0, 1.0, 4.0, 8192, rotary_dim=128).inv_freq) < 8 * F32  # measured 3.2e-7


def test_proportional_frequencies_match_rope_proportional():
    """ROPE-16: HF "proportional" turns the first floor(fraction * d / 2) pairs, frequencies over d."""
    config = _llama_config({"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
    expected = np.asarray(Rope.proportional(0.25, rotary_dim=64).inv_freq)
    np.testing.assert_array_equal(inv_freq.numpy() == 0, expected == 0)  # 24 of 32 pairs stand still
    assert _freq_rel(inv_freq, expected) < 2 * F32


# ------------------------------------------------------------------------------------ findings
@pytest.mark.parametrize("length,measured", [(300, 9.0e-6), (4096, 1.5e-4)])
def test_angles_are_made_in_float32(length, measured):
    """ROPE-9: LlamaRotaryEmbedding makes p * f_c in float32 even for a float64 call: cos/sin are off by
    about p * 2**-24 (deviation *-float64-angles-in-float32)."""
    emb = LlamaRotaryEmbedding(_llama_config({"rope_type": "default", "rope_theta": 10000.0})).to(torch.float64)
    cos, sin = emb(torch.zeros(1, 1, 1, 64, dtype=torch.float64), torch.arange(length)[None])
    assert cos.dtype == torch.float64  # float64 out, float32 inside
    angle = np.arange(length)[:, None] * np.asarray(Rope().frequencies(64))
    err = max(
        np.max(np.abs(cos[0, :, :32].numpy() - np.cos(angle))), np.max(np.abs(sin[0, :, :32].numpy() - np.sin(angle)))
    )
    assert measured / 3 < err < 2 * length * F32  # measured 9.0e-6 (L = 300), 1.5e-4 (L = 4096)


def test_bfloat16_cast_rounds_the_frequency_buffer():
    """ROPE-9: module.to(torch.bfloat16) turns inv_freq into bfloat16 (transformers#25681): frequencies off by
    up to 2**-8 relative (measured 3.7e-3), angles at position 4095 off by 1.8 rad, at 2**17 - 1 by 57 rad. The
    catalog's cells still pass: q and k share the rounded frequencies, so a logit sees delta * the error."""
    exact = np.asarray(Rope().frequencies(64))
    emb = LlamaRotaryEmbedding(_llama_config({"rope_type": "default", "rope_theta": 10000.0})).to(torch.bfloat16)
    assert emb.inv_freq.dtype == torch.bfloat16
    err = _freq_rel(emb.inv_freq.float(), exact)
    assert 2**-10 < err <= 2**-8  # measured 3.65e-3: bfloat16 rounding (unit roundoff 2**-8), not 7e-8
    angle_err = np.max(np.abs(4095 * emb.inv_freq.double().numpy() - 4095 * exact))
    assert angle_err > 1.0  # measured 1.79 rad


def test_llama_ignores_partial_rotary_factor():
    """ROPE-2: LlamaRotaryEmbedding's default type computes d/2 frequencies over d whatever
    partial_rotary_factor says (deviation hf-llama-*-partial-rotary-factor-ignored)."""
    config = _llama_config({"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}, head_dim=8)
    inv_freq = LlamaRotaryEmbedding(config).inv_freq
    assert inv_freq.shape == (4,)  # r / 2 = 2 were asked for
    assert _freq_rel(inv_freq, Rope(theta=100.0).frequencies(8)) < 2 * F32  # the frequencies over d = 8
    assert (
        _freq_rel(inv_freq[:2], Rope(theta=100.0, rotary_dim=4).frequencies(8)) > 1
    )  # not those over r = 4 (0.32 vs 0.1)


def test_gptneox_odd_rotary_dim_rotates_r_plus_one_channels_with_frequencies_over_r():
    """ROPE-2, ROPE-4: head_dim 64, rotary_pct 0.3: rotary_ndims = int(19.2) = 19, inv_freq has
    ceil(19 / 2) = 10 entries 10000 ** (-2c / 19), so cos/sin span 20 channels: 20 channels turn, pairs
    (c, c + 10), with frequencies over 19 -- Rope(rotary_dim=20, inv_freq=10000 ** (-2c / 19)),
    not Rope(rotary_dim=20) and not 19 channels."""
    config = GPTNeoXConfig(hidden_size=128, num_attention_heads=2, rotary_pct=0.3)
    assert neox.GPTNeoXAttention(config, layer_idx=0).rotary_ndims == 19
    emb = neox.GPTNeoXRotaryEmbedding(config)
    over_19 = tuple(10000.0 ** (-np.arange(0, 19, 2) / 19))
    assert emb.inv_freq.shape == (10,)
    assert _freq_rel(emb.inv_freq, over_19) < 8 * F32  # measured 2.5e-7

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 1, 6, 64))
    positions = np.arange(6) + 40
    xt = torch.from_numpy(x)
    cos, sin = emb(xt, torch.from_numpy(positions)[None])
    assert cos.shape[-1] == 20
    hf = neox.apply_rotary_pos_emb(xt, xt, cos.double(), sin.double())[0].numpy()
    as_spec = numpy_ref.apply_rope(Rope(rotary_dim=20, inv_freq=over_19), x, positions)
    assert _rel(hf, as_spec) < 1e-5  # float32 angles
    assert _rel(hf, numpy_ref.apply_rope(Rope(rotary_dim=20), x, positions)) > 1e-2  # frequencies over 20
    np.testing.assert_array_equal(hf[..., 20:], x[..., 20:])  # channel 19 turns, 20.. do not


def test_gptj_negative_positions_wrap_around_its_table():
    """POS-1, ROPE-5: GPT-J looks its sin/cos up by position_ids, so position -3 reads row N - 3 of the
    table (N = the table length): the angle of position N - 3, not of -3."""
    spec = AttentionSpec(num_heads=1, head_dim=4, relative=Rope(layout="interleaved"))
    rotate = load_adapter("hf-gptj-rope")._rotate(spec, "float64", "cpu")
    x = np.random.default_rng(1).normal(size=(1, 1, 1, 4))
    got = rotate(torch.from_numpy(x), np.array([[-3]])).numpy()
    wrapped = numpy_ref.apply_rope(spec.relative, x, np.array([GPTJ_MIN_TABLE - 3]))
    assert _rel(got, wrapped) < 1e-5  # float32 angles at position 2045
    assert _rel(got, numpy_ref.apply_rope(spec.relative, x, np.array([-3]))) > 1e-2


def test_adapters_certified_against_transformers_5_say_so_on_another_major_release(monkeypatch):
    """The adapters whose code paths and deviations are transformers 5.x's are unavailable, with the pin to
    install, where another major release is installed (transformers 4.57 runs them into crashes and other
    numbers); the layers that pass on both (Wav2Vec2-BERT, DeBERTa-v2) are not gated."""
    import transformers

    from conformance.adapters.hf_rope import TRANSFORMERS_PIN

    gated = ["hf-llama-rope", "hf-llama-attention", "hf-gptneox-rope", "hf-gptj-rope", "hf-t5-bias"]
    gated += ["hf-t5-attention", "hf-swin-attention"]
    both = ["hf-wav2vec2-bert-relative-key", "hf-deberta-v2-attention"]
    assert all(load_adapter(n).unavailable() is None for n in gated + both)
    monkeypatch.setattr(transformers, "__version__", "4.57.6")
    for name in gated:
        reason = load_adapter(name).unavailable()
        assert reason == (
            f"certified against transformers 5.x (the rope extra pins {TRANSFORMERS_PIN}); this environment has "
            f"4.57.6: pip install {TRANSFORMERS_PIN}"
        ), name
    assert all(load_adapter(n).unavailable() is None for n in both)
