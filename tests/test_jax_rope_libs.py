"""keras-hub's RotaryEmbedding and Gemma's apply_rope (JAX) against the reference and the spec's constructors.

Rules: ROPE-2..ROPE-5 (what turns, by what angle), ROPE-7 (YaRN's attention
factor), ROPE-9 (angle precision), ROPE-11..ROPE-16 (the frequency
constructors). Expected values come from numpy_ref (float64) and from
``spec.Rope``'s constructors; the libraries' frequencies are measured
through their public rotation: a unit pair (1, 0) at position 1 comes back
as af * (cos f_c, sin f_c).
"""

import math
import sys
import types

import ml_dtypes
import numpy as np
import pytest

import numpy_ref
from conformance.adapters import _jax, jax_rope_libs
from conformance.adapters.jax_rope_libs import GemmaRopeAdapter, KerasHubRopeAdapter
from spec import AttentionSpec, Rope

KERAS = KerasHubRopeAdapter()
GEMMA = GemmaRopeAdapter()
needs_keras = pytest.mark.skipif(bool(KERAS.unavailable()), reason=str(KERAS.unavailable()))
needs_gemma = pytest.mark.skipif(bool(GEMMA.unavailable()), reason=str(GEMMA.unavailable()))

D = 8  # head size of every spec here (one compiled shape per dtype)
#: float32 angles and rotations: a few float32 roundings of values near 1
FLOAT32_FREQUENCIES = 1e-6
FLOAT32_ATTENTION = 2e-6


def _spec(rope, **kw):
    return AttentionSpec(num_heads=2, head_dim=D, relative=rope, **kw)


def _check_parity(adapter, spec):
    """Forward and gradients in float32 against numpy_ref (float64), relative to each tensor's largest entry."""
    rng = np.random.default_rng(0)
    params = numpy_ref.init_params(spec, seed=1)
    x, k, v = (rng.normal(size=(1, L, spec.model_dim)) for L in (4, 5, 5))
    qp, kp = np.array([3, 4, 5, 6]), np.arange(5)
    g = rng.normal(size=(1, 4, spec.model_dim))
    want = numpy_ref.attention(spec, params, x, k, v, q_positions=qp, k_positions=kp)
    want_grads = numpy_ref.attention_vjp(spec, params, x, k, v, g, q_positions=qp, k_positions=kp)
    f32 = {n: a.astype(np.float32) for n, a in params.items()}
    inputs = dict(query=x, key=k, value=v)
    inputs = {n: a.astype(np.float32) for n, a in inputs.items()} | dict(q_positions=qp, k_positions=kp)
    out = adapter.forward(spec, f32, inputs, device="cpu", need_weights=False)["out"]
    grads = adapter.vjp(spec, f32, inputs, g.astype(np.float32), device="cpu")
    errors = {"out": np.abs(out - want).max() / np.abs(want).max()}
    for n in ("query", "key", "value", "wq", "wk", "bq"):
        errors[n] = np.abs(grads[n] - want_grads[n]).max() / np.abs(want_grads[n]).max()
    assert max(errors.values()) < FLOAT32_ATTENTION, errors


def _turned(rotate, positions, dtype):
    """af * (cos, sin)(p f_c), shape (L, d/2) each, from rotating unit pairs (1, 0) at ``positions`` (L,)."""
    half = D // 2
    x = np.zeros((1, 1, len(positions), D), dtype=dtype)
    x[..., :half] = 1  # every pair's first channel (half layout)
    y = rotate(x, np.asarray(positions)[None])
    out = np.asarray(y, dtype=np.float64)[0, 0]
    return out[:, :half], out[:, half:], y.dtype


def _measured(rotate, dtype=np.float32):
    """(f_c, af): the frequencies and attention factor a rotation uses, read at position 1."""
    cos, sin, _ = _turned(rotate, [1], dtype)
    return np.arctan2(sin[0], cos[0]), np.hypot(cos[0], sin[0])


def _keras_rotate(dtype="float32", **kw):
    import keras_hub

    _jax.setup()  # float64 arrays stay float64 (x64), as in the adapters

    layer = keras_hub.layers.RotaryEmbedding(sequence_axis=2, feature_axis=-1, dtype=dtype, **kw)
    return lambda x, p: layer(x, positions=p)


def _gemma_rotate(**kw):
    _jax.setup()
    apply_rope = jax_rope_libs._gemma_rope()[0]
    return lambda x, p: apply_rope(x.transpose(0, 2, 1, 3), p, **kw).transpose(0, 2, 1, 3)


def _relative(got, want):
    want = np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(got - want) / np.where(want == 0, 1.0, np.abs(want))))


# ------------------------------------------------------------------ mapping
def test_rope_to_library_arguments():
    """ROPE-12, ROPE-13, ROPE-16: the Ropes each library expresses, with the arguments solved by hand."""
    args, r = jax_rope_libs.keras_hub_arguments(_spec(Rope.ntk(3.0, rotary_dim=D)))
    assert r == D and args["rope_type"] == "linear" and args["scaling_factor"] == pytest.approx(1.0)
    assert args["max_wavelength"] == pytest.approx(10000 * 3 ** (8 / 6), rel=1e-12)  # 43267.487...
    args, r = jax_rope_libs.keras_hub_arguments(_spec(Rope(theta=100.0, rotary_dim=4)))
    assert (args, r) == ({"max_wavelength": 100.0, "scaling_factor": 1.0, "rope_type": "linear"}, 4)
    args, _ = jax_rope_libs.gemma_arguments(_spec(Rope.linear(4.0, rotary_dim=D)))
    assert args == {"base_frequency": 10000.0, "scale_factor": pytest.approx(4.0), "rope_proportion": 1.0}
    args, _ = jax_rope_libs.gemma_arguments(_spec(Rope.proportional(0.25, rotary_dim=D)))
    assert args == {"base_frequency": 10000.0, "scale_factor": 1.0, "rope_proportion": 0.25}


def test_keras_hub_yarn_arguments_give_the_case_frequencies():
    """ROPE-14: the solved beta_fast / beta_slow reproduce Rope.yarn(8, 16)'s frequencies and factor."""
    rope = Rope.yarn(8.0, 16, rotary_dim=D)
    args, _ = jax_rope_libs.keras_hub_arguments(_spec(rope))
    assert args["rope_type"] == "yarn" and args["scaling_factor"] == pytest.approx(8.0)
    again = Rope.yarn(8.0, args["original_max_position_embeddings"], args["beta_fast"], args["beta_slow"], rotary_dim=D)
    assert again.inv_freq == pytest.approx(rope.inv_freq, rel=1e-12)
    assert again.attention_factor == pytest.approx(rope.attention_factor, rel=1e-12)


@pytest.mark.parametrize(
    "which, rope, message",
    [
        ("keras", Rope(layout="interleaved"), "half layout"),
        ("keras", Rope.llama3(8.0, 1.0, 4.0, 32, rotary_dim=D), "not explicit"),
        ("keras", Rope.proportional(0.25, rotary_dim=D), "not explicit"),
        ("keras", Rope(attention_factor=1.25), "attention factor is YaRN's"),
        ("gemma", Rope(rotary_dim=4), "whole head"),
        ("gemma", Rope(attention_factor=1.25), "no attention factor"),
        ("gemma", Rope.llama3(8.0, 1.0, 4.0, 32, rotary_dim=D), "not explicit"),
        ("gemma", Rope.linear(0.5, rotary_dim=D), "scale_factor < 1"),
    ],
)
def test_inexpressible_ropes_are_named(which, rope, message):
    fit = jax_rope_libs.keras_hub_arguments if which == "keras" else jax_rope_libs.gemma_arguments
    args, why = fit(_spec(rope))
    assert args is None and message in why


def test_keras_already_imported_with_another_backend_is_explained(monkeypatch):
    fake = types.SimpleNamespace(backend=types.SimpleNamespace(backend=lambda: "torch"))
    monkeypatch.setitem(sys.modules, "keras", fake)
    assert "already imported with the 'torch' backend" in jax_rope_libs._keras_backend_problem()
    assert "KERAS_BACKEND=jax" in jax_rope_libs._keras_backend_problem()


# ------------------------------------------------------------------ parity
@needs_keras
@pytest.mark.parametrize(
    "rope",
    [Rope(), Rope(theta=100.0, rotary_dim=4), Rope.yarn(8.0, 16, rotary_dim=D)],
    ids=["half", "partial-r4", "yarn"],
)
def test_keras_hub_rope_matches_reference(rope):
    """ROPE-1..ROPE-7: keras-hub's layer in the glue, float32, against the float64 reference."""
    _check_parity(KERAS, _spec(rope))


@needs_gemma
@pytest.mark.parametrize(
    "rope",
    [Rope(), Rope.proportional(0.25, rotary_dim=D), Rope.linear(4.0, rotary_dim=D)],
    ids=["half", "proportional", "linear"],
)
def test_gemma_rope_matches_reference(rope):
    """ROPE-1..ROPE-5, ROPE-16: Gemma's apply_rope in the glue, float32, against the float64 reference."""
    _check_parity(GEMMA, _spec(rope))


# ------------------------------------------------------------- frequencies
@needs_keras
def test_keras_hub_linear_and_yarn_frequencies_are_the_spec_constructors():
    """ROPE-12, ROPE-14, ROPE-7: scaling_factor divides uniformly (Rope.linear); "yarn" is Rope.yarn with its factor."""
    f, af = _measured(_keras_rotate(scaling_factor=4.0))
    assert _relative(f, Rope.linear(4.0, rotary_dim=D).inv_freq) < FLOAT32_FREQUENCIES
    assert np.abs(af - 1).max() < FLOAT32_FREQUENCIES
    f, af = _measured(_keras_rotate(scaling_factor=8.0, rope_type="yarn", original_max_position_embeddings=16))
    want = Rope.yarn(8.0, 16, rotary_dim=D)
    assert _relative(f, want.inv_freq) < FLOAT32_FREQUENCIES
    assert np.abs(af - want.attention_factor).max() < FLOAT32_FREQUENCIES


@needs_keras
def test_keras_hub_dynamic_is_not_dynamic_ntk():
    """ROPE-11, ROPE-13: keras-hub's rope_type="dynamic" divides every frequency by s ** (r / (r - 2)).

    That is Rope.linear(s ** (r / (r - 2))), the same at every sequence length. Hugging Face's dynamic
    NTK is Rope.ntk(dynamic_ntk_alpha(s, n, L)) for the call's length L: a changed base, which keeps
    f_0 = 1 for every alpha, where keras-hub's f_0 is s ** (-r / (r - 2)) = 2 ** (-4/3) = 0.397 for s = 2.
    """
    s = 2.0
    rotate = _keras_rotate(scaling_factor=s, rope_type="dynamic")
    f, _ = _measured(rotate)
    assert _relative(f, Rope.linear(s ** (D / (D - 2)), rotary_dim=D).inv_freq) < FLOAT32_FREQUENCIES
    assert f[0] == pytest.approx(2 ** (-4 / 3), rel=FLOAT32_FREQUENCIES)
    for alpha in (1.0, 2.0, 3.0, 100.0):  # every dynamic-NTK context length gives some alpha >= 1
        assert Rope.ntk(alpha, rotary_dim=D).inv_freq[0] == 1.0
    assert abs(f[0] - 1.0) > 0.5
    at_64 = np.asarray(rotate(np.ones((1, 1, 64, D), np.float32), np.arange(64)[None]))[0, 0, :4]
    at_4 = np.asarray(rotate(np.ones((1, 1, 4, D), np.float32), np.arange(4)[None]))[0, 0]
    assert np.array_equal(at_64, at_4)  # no dependence on the call's length (ROPE-10)


@needs_gemma
def test_gemma_frequencies_are_proportional_and_linear():
    """ROPE-16, ROPE-12: rope_proportion is Rope.proportional over the whole head; scale_factor is Rope.linear."""
    f, af = _measured(_gemma_rotate(base_frequency=10000, rope_proportion=0.25))
    assert _relative(f, Rope.proportional(0.25, rotary_dim=D).inv_freq) < FLOAT32_FREQUENCIES
    assert np.all(f[1:] == 0.0) and np.abs(af - 1).max() < FLOAT32_FREQUENCIES
    f, _ = _measured(_gemma_rotate(base_frequency=10000, scale_factor=4.0))
    assert _relative(f, Rope.linear(4.0, rotary_dim=D).inv_freq) < FLOAT32_FREQUENCIES
    with pytest.raises(ValueError, match="scale_factor must be >= 1.0"):
        _gemma_rotate(base_frequency=10000, scale_factor=0.5)(np.zeros((1, 1, 1, D), np.float32), np.zeros((1, 1)))


# --------------------------------------------------------------- precision
FAR = 2**17


def _far_error(rotate, dtype):
    """Largest error of (cos, sin)(p f_c) at p = 2**17 .. 2**17 + 63 against float64 truth, and the output dtype."""
    positions = FAR + np.arange(64)
    cos, sin, out_dtype = _turned(rotate, positions, dtype)
    angle = positions[:, None] * np.asarray(Rope().frequencies(D))
    return max(np.abs(cos - np.cos(angle)).max(), np.abs(sin - np.sin(angle)).max()), out_dtype


@needs_keras
@needs_gemma
def test_float64_inputs_get_float32_angles():
    """ROPE-9 (the deviations *-float64-angles-in-float32): both libraries turn float64 vectors by float32 angles.

    Near 2**17 the float32 angle p f_c (a product in keras-hub, a quotient p / timescale in Gemma) is
    off by up to half its ulp, 2**-11 rad near 13107 (f_1 = 0.1), plus p times f_c's own float32
    rounding; float64 angles would be off by about 1e-11.
    """
    for rotate in (_keras_rotate(dtype="float64"), _gemma_rotate(base_frequency=10000)):
        error, dtype = _far_error(rotate, np.float64)
        assert dtype == np.float64
        assert 1e-5 < error < 2**-7, error


@needs_keras
@needs_gemma
def test_bfloat16_keeps_float32_frequencies_and_positions():
    """ROPE-9: in bfloat16 both keep positions and frequencies in float32 and round cos and sin once.

    Positions held in bfloat16 would be off by up to 512 near 2**17 (an error of order 1); what is seen is
    the float32 angle (<= 2**-7) plus one bfloat16 rounding of a value <= 1 (<= 2**-9).
    """
    bf16 = ml_dtypes.bfloat16
    for rotate in (_keras_rotate(dtype="bfloat16"), _gemma_rotate(base_frequency=10000)):
        error, dtype = _far_error(rotate, bf16)
        assert dtype == bf16
        assert error < 2**-7 + 2**-8, error


@needs_keras
def test_keras_hub_yarn_attention_factor_is_rounded_to_bfloat16():
    """ROPE-7, ROPE-14: in bfloat16 the YaRN factor 0.1 ln 8 + 1 = 1.2079 is computed in bfloat16: 1.2109 (+0.25%)."""
    bf16 = ml_dtypes.bfloat16
    cos, _, _ = _turned(_keras_rotate(dtype="bfloat16", scaling_factor=8.0, rope_type="yarn"), [0], bf16)
    exact = 0.1 * math.log(8.0) + 1.0
    rounded = float(np.asarray(0.1, bf16) * np.log(np.asarray(8.0, bf16)) + np.asarray(1.0, bf16))
    assert rounded == 1.2109375
    assert cos[0, 0] == rounded  # at position 0 the rotated pair (1, 0) is (af, 0): the factor itself
    assert cos[0, 0] / exact - 1 > 2e-3
