"""jax_impl against the float64 reference; jit, vmap, the NNX module, Flax interop, errors.

The default kernel choice is tested here; each kernel (``xla``, ``tiles`` with its query
tiles) and the choice itself in test_jax_kernels.py. (The full conformance matrix for the
``jax`` adapters runs in test_conformance_matrix.py.)
"""

import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax", reason="jax_impl needs JAX: pip install attnspec[jax]")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from _random_calls import random_call  # noqa: E402
from flax import nnx  # noqa: E402

import jax_impl  # noqa: E402
import numpy_ref  # noqa: E402
from spec import AttentionSpec, Huang, Shaw  # noqa: E402

HAS_GPU = any(d.platform == "gpu" for d in jax.devices())
GPU = pytest.param("gpu", marks=pytest.mark.skipif(not HAS_GPU, reason="no GPU visible to JAX on this machine"))
DEVICES = ["cpu", GPU]

DIFF = ("query", "key", "value", "bias")


def _fwd_grads(spec, params, diff, other, g):
    def f(params, diff):
        return jax_impl.attention(
            spec, params, diff["query"], diff["key"], diff["value"], bias=diff.get("bias"), **other, return_weights=True
        )

    out, pullback, weights = jax.vjp(f, params, diff, has_aux=True)
    return out, weights, pullback(g)


fwd_grads = jax.jit(_fwd_grads, static_argnums=0)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=10)  # each example compiles its own program; tests/test_jax_kernels.py draws 25 more per kernel
@given(seed=st.integers(0, 2**32 - 1))
def test_forward_and_gradients_match_the_reference_in_float64(device, seed):
    call = random_call(seed)
    call.key, call.value = call.key.copy(), call.value.copy()
    dev = jax.devices(device)[0]

    def put(a):
        return jax.device_put(jnp.asarray(a), dev)

    params = {n: put(a) for n, a in call.params.items()}
    diff = {"query": put(call.query), "key": put(call.key), "value": put(call.value)}
    other = {n: put(a) for n, a in call.kwargs.items() if n != "bias"}
    if "bias" in call.kwargs:
        diff["bias"] = put(call.kwargs["bias"])
    g = np.random.default_rng(seed).normal(size=call.query.shape)
    out, w, (g_params, g_diff) = fwd_grads(call.spec, params, diff, other, put(g))
    ref_out, ref_w = numpy_ref.attention(*call.args(), **call.kwargs, return_weights=True)
    np.testing.assert_allclose(np.asarray(out), ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(w), ref_w, rtol=0, atol=1e-12)
    ref = numpy_ref.attention_vjp(*call.args(), g, **call.kwargs)
    got = {**g_params, **g_diff}
    for name, expected in ref.items():
        np.testing.assert_allclose(np.asarray(got[name]), expected, rtol=0, atol=1e-11, err_msg=name)
    assert next(iter(out.devices())).platform == device


def test_jit_compiles_once_per_shape():
    spec = AttentionSpec(2, 4, relative=Shaw(2), causal=True)
    traces = []

    def f(params, x, mask):
        traces.append(1)  # runs only while tracing
        return jax_impl.attention(spec, params, x, mask=mask)

    jf = jax.jit(f)
    rng = np.random.default_rng(0)
    params = {n: jnp.asarray(a, jnp.float32) for n, a in numpy_ref.init_params(spec, 0).items()}
    for _ in range(3):  # new values, same shapes and dtypes
        x = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32)
        jf(params, x, jnp.asarray(rng.random((2, 1, 1, 5)) < 0.8))
    assert len(traces) == 1
    jf(params, jnp.zeros((2, 6, 8), jnp.float32), jnp.ones((2, 1, 1, 6), bool))  # a new shape retraces
    assert len(traces) == 2


def test_spec_is_a_static_argument():
    spec = AttentionSpec(1, 2, relative=Huang(3))
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(spec, 1).items()}
    x = jnp.asarray(np.random.default_rng(1).normal(size=(1, 4, 2)))
    jf = jax.jit(jax_impl.attention, static_argnums=0, static_argnames="return_weights")
    expected = numpy_ref.attention(spec, numpy_ref.init_params(spec, 1), np.asarray(x))
    np.testing.assert_allclose(np.asarray(jf(spec, params, x)), expected, atol=1e-12)


def test_vmap_over_an_extra_leading_axis_matches_a_loop():
    spec = AttentionSpec(2, 3, relative=Shaw(1, per_head=True), causal=True)
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(spec, 2).items()}
    xs = jnp.asarray(np.random.default_rng(2).normal(size=(4, 2, 5, 6)))  # (E, B, L, D)
    batched = jax.vmap(lambda x: jax_impl.attention(spec, params, x))(xs)
    looped = jnp.stack([jax_impl.attention(spec, params, x) for x in xs])
    np.testing.assert_allclose(np.asarray(batched), np.asarray(looped), atol=1e-13)


# ---------------------------------------------------------------- module
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32, jnp.bfloat16, jnp.float16])
def test_canonical_round_trip_is_exact(dtype):
    spec = AttentionSpec(2, 3, relative=Shaw(2, per_head=True))
    m = jax_impl.MultiHeadAttention(spec, rngs=nnx.Rngs(0), dtype=dtype)
    params = m.canonical_params()
    assert {n: a.shape for n, a in params.items()} == spec.param_shapes()
    m2 = jax_impl.MultiHeadAttention(spec, rngs=nnx.Rngs(1), dtype=dtype).load_canonical(params)
    for n, a in m2.canonical_params().items():
        assert a.dtype == params[n].dtype and a.tobytes() == params[n].tobytes(), n
    assert m.q_kernel[...].shape == (6, 2, 3) and m.out_kernel[...].shape == (2, 3, 6)  # Flax's layout


def test_module_matches_reference_and_runs_under_nnx_jit():
    spec = AttentionSpec(2, 3, relative=Huang(5), causal=True)
    ref_params = numpy_ref.init_params(spec, 3)
    m = jax_impl.MultiHeadAttention(spec, rngs=nnx.Rngs(0), dtype=jnp.float64).load_canonical(ref_params)
    m.eval()
    x = np.random.default_rng(0).normal(size=(2, 7, 6))
    expected = numpy_ref.attention(spec, ref_params, x)
    np.testing.assert_allclose(np.asarray(m(jnp.asarray(x))), expected, atol=1e-12)
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, x: m(x))(m, jnp.asarray(x))), expected, atol=1e-12)


def test_dropout_comes_from_the_rngs_in_training_and_is_off_in_eval():
    spec = AttentionSpec(2, 3, relative=Shaw(1), dropout=0.4)
    ref_params = numpy_ref.init_params(spec, 0)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, 6)))
    m = jax_impl.MultiHeadAttention(spec, rngs=nnx.Rngs(0, dropout=7), dtype=jnp.float64).load_canonical(ref_params)
    out = m(x)
    keep = jax.random.bernoulli(nnx.Rngs(0, dropout=7).dropout(), 0.6, (2, 2, 5, 5))  # the same draw
    np.testing.assert_allclose(
        np.asarray(out), numpy_ref.attention(spec, ref_params, np.asarray(x), dropout_keep=np.asarray(keep)), atol=1e-12
    )
    assert not np.allclose(np.asarray(m(x)), np.asarray(out))  # the stream advances
    m.eval()
    np.testing.assert_allclose(np.asarray(m(x)), numpy_ref.attention(spec, ref_params, np.asarray(x)), atol=1e-12)


def test_load_canonical_checks_params_in_the_words_of_the_functional_entry_point():
    """PARAM-2: the same check and message as jax_impl.attention's (spec.validation.check_params)."""
    spec = AttentionSpec(2, 3, relative=Shaw(1))
    m = jax_impl.MultiHeadAttention(spec, rngs=nnx.Rngs(0), dtype=jnp.float64)
    params = numpy_ref.init_params(spec, 0)
    x = jnp.zeros((1, 2, 6))
    cases = [
        ({n: a for n, a in params.items() if n != "rel_v"}, ValueError),
        ({**params, "extra": params["wq"]}, ValueError),
        ({**params, "rel_k": params["rel_k"][:2]}, ValueError),
        ({**params, "wq": params["wq"].astype(np.int64)}, TypeError),
        ([1, 2], TypeError),
    ]
    for bad, error in cases:
        with pytest.raises(error) as functional:
            jax_impl.attention(
                spec, bad if not isinstance(bad, dict) else {n: jnp.asarray(a) for n, a in bad.items()}, x
            )
        with pytest.raises(error, match=re.escape(str(functional.value))):
            m.load_canonical(bad)


def test_load_canonical_refuses_silent_casts():
    spec = AttentionSpec(2, 3)
    m = jax_impl.MultiHeadAttention(spec, rngs=nnx.Rngs(0))  # float32
    with pytest.raises(
        TypeError,
        match=re.escape(
            "params: expected arrays of the module's dtype float32 (cast them explicitly first), got dtype float64"
        ),
    ):
        m.load_canonical(numpy_ref.init_params(spec, 0))


def test_module_builds_grouped_heads_and_a_value_head_size_from_param_shapes():
    """PARAM-1, PARAM-3 with HEAD-3 and HEAD-4: shapes from spec.param_shapes(), Flax's layout per head,
    an exact round trip, and the reference's result under nnx.jit."""
    spec = AttentionSpec(4, 2, num_kv_heads=2, value_head_dim=3, relative=Shaw(1, per_head=True), softcap=3.0)
    m = jax_impl.MultiHeadAttention(spec, rngs=nnx.Rngs(0), dtype=jnp.float64)
    params = m.canonical_params()
    assert {n: a.shape for n, a in params.items()} == spec.param_shapes()
    assert params["wk"].shape == (8, 4) and params["wv"].shape == (8, 6) and params["wo"].shape == (12, 8)
    assert (m.k_kernel[...].shape, m.v_kernel[...].shape, m.out_kernel[...].shape) == ((8, 2, 2), (8, 2, 3), (4, 3, 8))
    assert (m.k_bias[...].shape, m.v_bias[...].shape, m.rel_v[...].shape) == ((2, 2), (2, 3), (4, 3, 3))
    ref_params = numpy_ref.init_params(spec, 4)
    m.load_canonical(ref_params).eval()
    for n, a in m.canonical_params().items():
        assert a.tobytes() == ref_params[n].tobytes(), n
    x = np.random.default_rng(4).normal(size=(2, 5, 8))
    expected = numpy_ref.attention(spec, ref_params, x)
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, x: m(x))(m, jnp.asarray(x))), expected, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- interop
@pytest.mark.parametrize("bias", [True, False])
def test_flax_mha_round_trip_is_exact_and_computes_the_same(bias):
    spec = AttentionSpec(2, 4, bias=bias)
    params = numpy_ref.init_params(spec, 5)  # float64
    mha = jax_impl.to_flax_mha(spec, params)
    spec2, back = jax_impl.from_flax_mha(mha)
    assert spec2 == spec and sorted(back) == sorted(params)
    for n in params:
        assert np.array_equal(back[n], params[n]), n
    x = np.random.default_rng(0).normal(size=(2, 5, 8))
    mask = np.random.default_rng(1).random((2, 1, 5, 5)) < 0.8
    mask[..., 0] = True  # no empty rows: Flax averages V there
    theirs = mha(jnp.asarray(x), mask=jnp.asarray(mask), deterministic=True)
    ours = jax_impl.attention(
        spec, {n: jnp.asarray(a) for n, a in params.items()}, jnp.asarray(x), mask=jnp.asarray(mask)
    )
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-6)  # Flax softmaxes in float32


def test_interop_rejects_what_it_cannot_express():
    with pytest.raises(
        ValueError, match=re.escape("spec.scale: expected None (nnx.MultiHeadAttention cannot express it), got 0.5")
    ):
        jax_impl.to_flax_mha(AttentionSpec(2, 2, scale=0.5), {})
    with pytest.raises(TypeError, match=re.escape("module: expected a flax.nnx.MultiHeadAttention, got Linear")):
        jax_impl.from_flax_mha(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))


def test_flax_mha_with_grouped_kv_heads_round_trips_exactly_and_computes_the_same():
    """HEAD-3 <-> Flax's num_kv_heads: both group query head h over key/value head h // G."""
    spec = AttentionSpec(4, 2, num_kv_heads=2)
    params = numpy_ref.init_params(spec, 6)
    mha = jax_impl.to_flax_mha(spec, params)
    assert mha.num_kv_heads == 2 and mha.key.kernel[...].shape == (8, 2, 2)
    spec2, back = jax_impl.from_flax_mha(mha)
    assert spec2 == spec and all(np.array_equal(back[n], params[n]) for n in params)
    x, kv = np.random.default_rng(0).normal(size=(2, 3, 8)), np.random.default_rng(1).normal(size=(2, 5, 8))
    theirs = mha(jnp.asarray(x), jnp.asarray(kv), deterministic=True)
    np.testing.assert_allclose(np.asarray(theirs), numpy_ref.attention(spec, params, x, kv), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "field, value, why",
    [
        ("value_head_dim", 3, "nnx.MultiHeadAttention has no value head size of its own (its query, key and value"),
        ("softcap", 30.0, "nnx.MultiHeadAttention has no logit soft-capping; SOFTCAP-1"),
        ("window", (4, 0), "nnx.MultiHeadAttention has no window on the distance (pass the window as its mask"),
    ],
    ids=["HEAD-4", "SOFTCAP-1", "WINDOW-1"],
)
def test_interop_rejects_the_options_flax_mha_cannot_express(field, value, why):
    """nnx.MultiHeadAttention has one head size for q, k and v, no logit cap and no window (grouped heads it has)."""
    spec = AttentionSpec(2, 2, num_kv_heads=1, **{field: value})
    with pytest.raises(ValueError, match=re.escape(f"spec.{field}: expected None ({why}")) as e:
        jax_impl.to_flax_mha(spec, numpy_ref.init_params(spec, 0))
    assert str(e.value).endswith(f"got {value!r}")


# ---------------------------------------------------------------- errors
@pytest.fixture
def small():
    spec = AttentionSpec(2, 2, relative=Shaw(1))
    params = {n: jnp.asarray(a, jnp.float32) for n, a in numpy_ref.init_params(spec, 0).items()}
    return spec, params, jnp.ones((2, 3, 4), jnp.float32)


def test_bad_input_is_rejected_at_trace_time_with_the_reference_messages(small):
    spec, params, x = small
    jf = jax.jit(jax_impl.attention, static_argnums=0)
    with pytest.raises(
        TypeError,
        match=re.escape(
            "mask: expected a boolean array (True = attend); for an additive float mask use bias=, got dtype float32"
        ),
    ):
        jf(spec, params, x, mask=jnp.ones((3, 3), jnp.float32))
    with pytest.raises(
        ValueError, match=re.escape("mask: expected a shape broadcastable to (B, H, Lq, Lk) = (2, 2, 3, 3)")
    ):
        jf(spec, params, x, mask=jnp.ones((2, 3), bool))
    with pytest.raises(
        TypeError, match=re.escape("key: expected the query's dtype float32 (no implicit casting), got dtype float16")
    ):
        jf(spec, params, x, x.astype(jnp.float16))
    with pytest.raises(
        TypeError,
        match=re.escape("params['wq']: expected the query's dtype float32 (no implicit casting), got dtype float64"),
    ):
        jf(spec, {**params, "wq": params["wq"].astype(jnp.float64)}, x)
    with pytest.raises(ValueError, match=re.escape("params: expected entries")):
        jf(spec, {n: a for n, a in params.items() if n != "rel_v"}, x)
    with pytest.raises(
        TypeError, match=re.escape("q_positions: expected an integer array of positions, got dtype float32")
    ):
        jf(spec, params, x, q_positions=jnp.zeros(3, jnp.float32))


def test_float64_without_x64_is_refused_not_downcast():
    code = (
        "import numpy as np, jax_impl, numpy_ref\n"
        "from spec import AttentionSpec\n"
        "s = AttentionSpec(1, 2)\n"
        "jax_impl.attention(s, numpy_ref.init_params(s, 0), np.zeros((1, 2, 2)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "query: expected float64 only with jax_enable_x64" in out.stderr


@pytest.mark.parametrize("device", DEVICES)
def test_arrays_follow_their_inputs(device):
    spec = AttentionSpec(2, 2, relative=Huang(3), causal=True)
    m = jax_impl.MultiHeadAttention(spec, rngs=nnx.Rngs(0))
    x = jax.device_put(jnp.ones((1, 4, 4), jnp.float32), jax.devices(device)[0])
    out, w = m(x, return_weights=True, deterministic=True)
    assert next(iter(out.devices())).platform == device and next(iter(w.devices())).platform == device
