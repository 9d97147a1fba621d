"""ALiBi, T5 and Swin in jax_impl (ALIBI-1..5, T5-1..5, SWIN-1..6; REL-3 hook 3, PREC-4).

Three kinds of test: hand-derived values (the worked examples of
spec/biases.md, checkable on paper), parity with numpy_ref (float64
forward, weights and every gradient, d rel_b included; float32 and bfloat16
within the tolerances derived at ``LOW_PRECISION``), and error paths matched
by message. Every expected value comes from numpy_ref, from ``spec`` (whose
buckets and rows are exact integer arithmetic) or from a hand derivation,
never from jax_impl itself.

Every kernel runs each configuration: ``xla``, ``tiles`` with
``query_rows=2`` (so a plain causal call is cut into query tiles) and the
automatic choice (None); one compiled program holds all three, forward and
VJP.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax_impl needs JAX: pip install attnspec[jax]")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from test_jax_kernels import _every_kernel  # noqa: E402  (one program per configuration, shared)

import jax_impl  # noqa: E402
import numpy_ref  # noqa: E402
from jax_impl import kernels, schemes  # noqa: E402
from jax_impl.kernels import Tiles, Xla  # noqa: E402
from jax_impl.schemes import alibi, swin, t5  # noqa: E402
from numpy_ref.schemes import swin as ref_swin  # noqa: E402
from spec import Alibi, AttentionSpec, Swin, T5Bias, alibi_slopes  # noqa: E402

KERNELS = (Xla(), Tiles(query_rows=2), None)
KERNEL_IDS = ("xla", "tiles", "automatic")
DIFF = ("query", "key", "value", "bias")
#: float64 agreement with the reference, relative to max(1, max |truth|) of each output
RTOL64 = 1e-12


def _max_error(got, truth) -> float:
    """max |got - truth| relative to max(1, max |truth|)."""
    truth = np.asarray(truth, np.float64)
    error = float(np.max(np.abs(np.asarray(got, np.float64) - truth), initial=0.0))
    return error / max(1.0, float(np.max(np.abs(truth), initial=0.0)))


def measure(spec_, inputs: dict, dtype=np.float64, seed: int = 0) -> list:
    """Every kernel against numpy_ref: per kernel, output name -> error relative to max(1, max |truth|).

    In a low-precision ``dtype`` the inputs, parameters and output gradient
    are rounded to it first and the float64 truth is computed from the
    rounded values, so the errors are the kernel's own arithmetic.
    """
    params = numpy_ref.init_params(spec_, seed)
    g = np.random.default_rng(seed + 1).normal(size=inputs["query"].shape)

    def rounded(a):
        a = np.asarray(a)
        return jnp.asarray(a, dtype) if np.issubdtype(a.dtype, np.floating) else jnp.asarray(a)

    def truth_of(a):  # the value the kernel sees, in float64
        return np.asarray(a.astype(jnp.float64)) if jnp.issubdtype(a.dtype, jnp.floating) else np.asarray(a)

    params_x = {n: rounded(a) for n, a in params.items()}
    inputs_x = {n: rounded(a) for n, a in inputs.items()}
    g_x = rounded(g)
    p64 = {n: truth_of(a) for n, a in params_x.items()}
    x64 = {n: truth_of(a) for n, a in inputs_x.items()}
    kw = {n: a for n, a in x64.items() if n not in ("query", "key", "value")}
    out, weights = numpy_ref.attention(spec_, p64, x64["query"], x64["key"], x64["value"], **kw, return_weights=True)
    grads = numpy_ref.attention_vjp(spec_, p64, x64["query"], x64["key"], x64["value"], truth_of(g_x), **kw)
    truth = {"out": out, "weights": weights, **{f"grad/{n}": a for n, a in grads.items()}}
    diff = {n: a for n, a in inputs_x.items() if n in DIFF}
    other = {n: a for n, a in inputs_x.items() if n not in DIFF}
    results = _every_kernel(spec_, KERNELS, params_x, diff, other, g_x)
    errors = []
    for kernel, got in zip(KERNEL_IDS, results):
        assert sorted(got) == sorted(truth), kernel
        assert got["out"].dtype == got["weights"].dtype == dtype, kernel
        errors.append({n: _max_error(got[n], truth[n]) for n in truth})
    return errors


def check(spec_, inputs: dict, dtype=np.float64, tol: float = RTOL64) -> float:
    """``measure``, every output of every kernel within ``tol``; returns the largest error."""
    worst = 0.0
    for kernel, errors in zip(KERNEL_IDS, measure(spec_, inputs, dtype)):
        for n, error in errors.items():
            assert error <= tol, f"{kernel}: {n} off by {error:.3g} (relative) > {tol:.3g}"
            worst = max(worst, error)
    return worst


def _inputs(rng, spec_, B, Lq, Lk, **extra) -> dict:
    D = spec_.model_dim
    x = {n: rng.normal(size=(B, L, D)) for n, L in (("query", Lq), ("key", Lk), ("value", Lk))}
    return {**x, **extra}


def _bias_input(rng, shape, minus_inf=()):
    """A bias input (BIAS-1) with -inf at the given index tuples (BIAS-2)."""
    bias = rng.normal(size=shape)
    for index in minus_inf:
        bias[index] = -np.inf
    return bias


# ---------------------------------------------------------------- the configurations
def case_alibi_symmetric_mqa_per_batch_positions():
    """ALIBI-3 with the H = 3 schedule (ALIBI-2), Hkv = 1 (HEAD-3), (B, Lq) and (Lk,) positions, mask, bias."""
    s = AttentionSpec(3, 4, relative=Alibi(), num_kv_heads=1)
    rng = np.random.default_rng(1)
    B, Lq, Lk = 2, 5, 6
    mask = rng.random((B, 1, Lq, Lk)) < 0.8
    mask[1, 0, 2] = False  # a fully masked row: exact zeros (MASK-5)
    return s, _inputs(
        rng,
        s,
        B,
        Lq,
        Lk,
        mask=mask,
        bias=_bias_input(rng, (1, 3, Lq, Lk), [(0, 1, 3, 2)]),
        q_positions=rng.integers(-20, 40, size=(B, Lq)),
        k_positions=rng.integers(-20, 40, size=Lk),
    )


def case_alibi_linear_h5_causal_tiles():
    """ALIBI-4 with the H = 5 schedule (not a power of two), plain causal (cut into tiles), dropout."""
    s = AttentionSpec(5, 2, relative=Alibi(symmetric=False), causal=True, dropout=0.25)
    rng = np.random.default_rng(2)
    B, L = 2, 5
    return s, _inputs(rng, s, B, L, L, dropout_keep=rng.random((B, 5, L, L)) >= 0.25)


def case_alibi_explicit_slopes_with_zero_decoding_softcap():
    """Explicit slopes with a 0 (that head unbiased), decoding at arange(Lk - Lq, Lk) (ALIBI-5), causal, cap."""
    s = AttentionSpec(3, 2, relative=Alibi(slopes=(0.5, 0.0, 2.0)), causal=True, softcap=3.0)
    rng = np.random.default_rng(3)
    B, Lq, Lk = 2, 3, 7
    return s, _inputs(rng, s, B, Lq, Lk, q_positions=np.arange(Lk - Lq, Lk))


def case_alibi_one_head_linear_large_positions():
    """H = 1, linear, max_bias = 4, non-causal, positions near 10**6 (only their differences count)."""
    s = AttentionSpec(1, 4, relative=Alibi(max_bias=4.0, symmetric=False))
    rng = np.random.default_rng(4)
    B, Lq, Lk = 2, 4, 5
    return s, _inputs(
        rng, s, B, Lq, Lk, q_positions=10**6 + rng.integers(0, 9, (B, Lq)), k_positions=10**6 + np.arange(Lk)
    )


def case_t5_bidirectional_beyond_four_max_distances():
    """T5Bias(8, 10), T5's scale 1 and no projection biases, Hkv = 2, |delta| up to 120 > 4 M, mask and bias."""
    s = AttentionSpec(4, 2, relative=T5Bias(8, 10), num_kv_heads=2, scale=1.0, bias=False)
    rng = np.random.default_rng(5)
    B, Lq, Lk = 2, 6, 7
    mask = rng.random((B, 1, 1, Lk)) < 0.85
    return s, _inputs(
        rng,
        s,
        B,
        Lq,
        Lk,
        mask=mask,
        bias=_bias_input(rng, (B, 1, Lq, Lk), [(1, 0, 4, slice(None))]),  # a fully disallowed row (BIAS-2)
        q_positions=rng.integers(-60, 60, size=(B, Lq)),
        k_positions=rng.integers(-60, 60, size=(B, Lk)),
    )


def case_t5_causal_buckets_causal_tiles():
    """T5Bias(6, 5, bidirectional=False) under a plain causal rule (cut into tiles), H = 3."""
    s = AttentionSpec(3, 2, relative=T5Bias(6, 5, False), causal=True)
    rng = np.random.default_rng(6)
    return s, _inputs(rng, s, 2, 6, 6)


def case_t5_causal_buckets_without_a_causal_mask():
    """T5-2: decoder buckets without causal=True: every later key is bucket 0 and stays attended; far positions."""
    s = AttentionSpec(2, 3, relative=T5Bias(6, 5, False))
    rng = np.random.default_rng(7)
    B, Lq, Lk = 2, 5, 6
    return s, _inputs(
        rng, s, B, Lq, Lk, q_positions=rng.integers(-50, 50, size=(B, Lq)), k_positions=rng.integers(-50, 50, size=Lk)
    )


def case_t5_default_config_every_bucket():
    """T5Bias() (32 buckets, M = 128), H = 5 over Hkv = 1, distances up to ~1400: every bucket and saturation."""
    s = AttentionSpec(5, 2, relative=T5Bias(), num_kv_heads=1)
    rng = np.random.default_rng(8)
    B, Lq, Lk = 2, 6, 9
    return s, _inputs(
        rng, s, B, Lq, Lk, q_positions=rng.integers(-700, 700, size=(B, Lq)), k_positions=rng.integers(-700, 700, Lk)
    )


def case_swin_3x4_whole_window_default_positions():
    """Swin((3, 4)): the default positions are the 12 window tokens row-major (SWIN-2), padding mask."""
    s = AttentionSpec(3, 2, relative=Swin((3, 4)))
    rng = np.random.default_rng(9)
    B, L = 2, 12
    return s, _inputs(rng, s, B, L, L, mask=rng.random((B, 1, 1, L)) < 0.8)


def case_swin_4x1_prefix_negative_and_outside_positions():
    """Swin((4, 1), prefix_tokens=1), (B, L) positions: prefix, negative and beyond the window (clipped, SWIN-3)."""
    s = AttentionSpec(2, 3, relative=Swin((4, 1), 1))
    rng = np.random.default_rng(10)
    q_pos = np.array([[0, -3, 2, 7, 40], [1, 0, -1, 4, 3]])
    k_pos = np.array([[0, 1, 4, -7, 12, 0], [3, 2, 0, 9, -2, 1]])
    return s, _inputs(rng, s, 2, 5, 6, q_positions=q_pos, k_positions=k_pos, bias=rng.normal(size=(5, 6)))


def case_swin_2x3_prefix_default_causal_tiles():
    """Swin((2, 3), prefix_tokens=1) with the default positions (1 prefix + 6 window tokens), causal, Hkv = 2."""
    s = AttentionSpec(4, 2, relative=Swin((2, 3), 1), num_kv_heads=2, causal=True)
    rng = np.random.default_rng(11)
    return s, _inputs(rng, s, 2, 7, 7)


def case_swin_2x3_explicit_positions_window_mask_fill():
    """Swin((2, 3)) without prefix, negative positions, WINDOW-1 (2, 1) and mask_fill (MASK-6) with a mask."""
    s = AttentionSpec(3, 2, relative=Swin((2, 3)), window=(2, 1), mask_fill=-1e9)
    rng = np.random.default_rng(12)
    B, Lq, Lk = 2, 4, 6
    return s, _inputs(
        rng,
        s,
        B,
        Lq,
        Lk,
        mask=rng.random((Lq, Lk)) < 0.8,
        q_positions=np.array([-4, 0, 2, 5]),
        k_positions=np.array([-6, -1, 0, 1, 3, 8]),
    )


CASES = {
    "alibi-symmetric-mqa-per-batch-positions": case_alibi_symmetric_mqa_per_batch_positions,
    "alibi-linear-h5-causal-tiles": case_alibi_linear_h5_causal_tiles,
    "alibi-explicit-slopes-with-zero-decoding-softcap": case_alibi_explicit_slopes_with_zero_decoding_softcap,
    "alibi-one-head-linear-large-positions": case_alibi_one_head_linear_large_positions,
    "t5-bidirectional-beyond-four-max-distances": case_t5_bidirectional_beyond_four_max_distances,
    "t5-causal-buckets-causal-tiles": case_t5_causal_buckets_causal_tiles,
    "t5-causal-buckets-without-a-causal-mask": case_t5_causal_buckets_without_a_causal_mask,
    "t5-default-config-every-bucket": case_t5_default_config_every_bucket,
    "swin-3x4-whole-window-default-positions": case_swin_3x4_whole_window_default_positions,
    "swin-4x1-prefix-negative-and-outside-positions": case_swin_4x1_prefix_negative_and_outside_positions,
    "swin-2x3-prefix-default-causal-tiles": case_swin_2x3_prefix_default_causal_tiles,
    "swin-2x3-explicit-positions-window-mask-fill": case_swin_2x3_explicit_positions_window_mask_fill,
}


@pytest.mark.parametrize("name", CASES)
def test_every_kernel_matches_the_reference_in_float64(name):
    """REL-3 hook 3 (after the cap, before the bias input and masks), ALIBI-1..4, T5-1..3, T5-5, SWIN-1..4."""
    check(*CASES[name]())


def test_the_causal_configurations_are_cut_into_query_tiles():
    """The causal cases above exercise the tiles' own path: Tiles(query_rows=2) cuts them (KERN-1)."""
    for name in (
        "alibi-linear-h5-causal-tiles",
        "t5-causal-buckets-causal-tiles",
        "swin-2x3-prefix-default-causal-tiles",
    ):
        s, inputs = CASES[name]()
        call = kernels.Call.of(inputs["query"], inputs["key"], **{n: inputs.get(n) for n in ("mask", "bias")})
        assert Tiles(query_rows=2).cuts_queries(s, call), name


# ---------------------------------------------------------------- float32 and bfloat16
#: Tolerances relative to max(1, max |truth|), for inputs already rounded to the dtype (``measure``).
#: float32 (unit roundoff u = 2^-24 ~ 6e-8): a logit is a sum of d products plus a bias of up to ~15
#: (slope 1/4 at |delta| <= 60), each rounded a few times: ~1e-6 absolute at worst; the weights, outputs
#: and gradients inherit it through the softmax and a few sums (measured: <= 9e-7): 1e-5.
#: bfloat16 (u = 2^-9 ~ 2e-3): q, k and v are rounded to bfloat16 after the projections, the weights
#: before ``w @ v``, the outputs and every gradient once more: a few u on each factor (measured:
#: <= 1.7e-2, a value gradient): 5e-2.
LOW_PRECISION = {"float32": 1e-5, "bfloat16": 5e-2}
LOW_PRECISION_CASES = (
    "alibi-symmetric-mqa-per-batch-positions",
    "alibi-linear-h5-causal-tiles",
    "t5-bidirectional-beyond-four-max-distances",
    "swin-4x1-prefix-negative-and-outside-positions",
)


@pytest.mark.parametrize("dtype", list(LOW_PRECISION))
@pytest.mark.parametrize("name", LOW_PRECISION_CASES)
def test_low_precision_matches_the_float64_reference(name, dtype):
    """PREC-4: float32 and bfloat16 (softmax and scheme bias in float32) within the tolerances above."""
    check(*CASES[name](), dtype=jnp.dtype(dtype), tol=LOW_PRECISION[dtype])


def test_bfloat16_alibi_bias_is_computed_in_float32():
    """ALIBI-5, PREC-4 at Lk = 2048: one query at 4095, keys at 0 .. 2047, slope 0.5, a zero query (q.k = 0).

    The biases -0.5 * (4095 - j) run from -1024 to -2047.5, where bfloat16's spacing is 8: a bias
    computed in bfloat16 would be off by up to 4 (> 1), flattening the weights of every 8 nearest keys.
    In float32 the biases are exact, and the weights are the float64 softmax rounded once to bfloat16.
    """
    Lk, q_pos, slope = 2048, 4095, 0.5
    s = AttentionSpec(1, 2, bias=False, relative=Alibi(slopes=(slope,)))
    params = {n: jnp.asarray(a, jnp.bfloat16) for n, a in numpy_ref.identity_params(s).items()}
    rng = np.random.default_rng(13)
    x = jnp.zeros((1, 1, 2), jnp.bfloat16)  # identity projections: q = 0, so the logits are the biases alone
    kv = jnp.asarray(rng.normal(size=(1, Lk, 2)), jnp.bfloat16)
    truth_bias = -slope * (q_pos - np.arange(Lk, dtype=np.float64))  # hand derivation (ALIBI-3)
    truth = np.exp(truth_bias - truth_bias.max()) / np.sum(np.exp(truth_bias - truth_bias.max()))
    bf16_bias = np.asarray(jnp.asarray(truth_bias, jnp.bfloat16).astype(jnp.float64))
    assert np.max(np.abs(bf16_bias - truth_bias)) > 1  # what a bfloat16 bias would be
    bf16_weights = np.exp(bf16_bias - bf16_bias.max()) / np.sum(np.exp(bf16_bias - bf16_bias.max()))
    assert np.max(np.abs(bf16_weights - truth)) > 0.1
    for kernel in KERNELS:
        _, w = jax.jit(functools.partial(jax_impl.attention, s, return_weights=True, implementation=kernel))(
            params, x, kv, q_positions=jnp.asarray([q_pos])
        )
        assert w.dtype == jnp.bfloat16
        error = np.abs(np.asarray(w[0, 0, 0], np.float64) - truth)
        assert np.all(error <= 2.0**-8 * truth + 1e-30), (kernel, float(np.max(error)))  # one bfloat16 rounding


# ---------------------------------------------------------------- hand-derived values
@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
def test_alibi_worked_example_of_three_positions(kernel):
    """ALIBI-3 / ALIBI-4 on paper: slope 1, zero inputs (q.k = 0), the middle query of three positions.

    Symmetric biases (-1, 0, -1): weights (e^-1, 1, e^-1) / (1 + 2 e^-1); linear (-1, 0, 1): (e^-1, 1, e) /
    (e^-1 + 1 + e). Under a causal mask both forms give the last query the biases (-2, -1, 0).
    """
    x = jnp.zeros((1, 3, 1))  # identity projections: q = k = 0, the logits are the biases alone
    e = math.e
    expected = {
        True: np.array([1 / e, 1.0, 1 / e]) / (1 + 2 / e),
        False: np.array([1 / e, 1.0, e]) / (1 / e + 1 + e),
    }
    for symmetric, weights in expected.items():
        s = AttentionSpec(1, 1, bias=False, relative=Alibi(slopes=(1.0,), symmetric=symmetric))
        params = {n: jnp.asarray(a) for n, a in numpy_ref.identity_params(s).items()}
        _, w = jax_impl.attention(s, params, x, return_weights=True, implementation=kernel)
        np.testing.assert_allclose(np.asarray(w[0, 0, 1]), weights, rtol=1e-15, atol=0)
        causal = AttentionSpec(1, 1, bias=False, relative=s.relative, causal=True)
        _, w = jax_impl.attention(causal, params, x, return_weights=True, implementation=kernel)
        np.testing.assert_allclose(np.asarray(w[0, 0, 2]), np.array([e**-2, e**-1, 1.0]) / (e**-2 + e**-1 + 1))


def test_alibi_hook_is_slope_times_distance_in_the_softmax_dtype():
    """ALIBI-1..4: the (1|B, H, Lq, Lk) bias m_h * g(delta) for the H = 4 schedule (1/4, 1/16, 1/64, 1/256)."""
    q_pos, k_pos = jnp.asarray([[0, 3]]), jnp.asarray([[1, 5, -2]])
    delta = k_pos[:, None, :] - q_pos[:, :, None]  # [[1, 5, -2], [-2, 2, -5]]
    slopes = np.array([0.25, 0.0625, 0.015625, 0.00390625])[:, None, None]
    assert alibi_slopes(4) == tuple(slopes.ravel())
    for dtype in (jnp.float32, jnp.float64):
        for symmetric, g in ((True, -np.abs(np.asarray(delta[0]))), (False, np.asarray(delta[0]))):
            got = alibi.bias(Alibi(symmetric=symmetric), {}, q_pos, k_pos, delta, num_heads=4, dtype=dtype)
            assert got.shape == (1, 4, 2, 3) and got.dtype == dtype
            np.testing.assert_array_equal(np.asarray(got[0]), slopes * g)  # powers of two: exact


@pytest.mark.parametrize(
    "scheme,deltas,buckets",
    [  # by hand: base + n for n < e, else base + e + floor((S - e) ln(n / e) / ln(M / e)), at most base + S - 1
        # encoder S = 16, e = 8 (n = 12: 8 + floor(8 ln 1.5 / ln 16) = 8 + floor(1.17) = 9); decoder S = 32, e = 16
        # (n = 22: 16 + floor(16 ln 1.375 / ln 8) = 16 + floor(2.45) = 18; n = 23: 16 + floor(2.79) = 18)
        (T5Bias(), [0, -1, -7, -8, -11, -12, -127, -128, -(10**6)], [0, 1, 7, 8, 8, 9, 15, 15, 15]),
        (T5Bias(), [1, 7, 8, 12, 128, 10**6], [17, 23, 24, 25, 31, 31]),
        (T5Bias(bidirectional=False), [3, 0, -1, -15, -16, -22, -23, -128], [0, 0, 1, 15, 16, 18, 18, 31]),
    ],
    ids=["encoder-past", "encoder-future", "decoder"],
)
def test_t5_buckets_of_the_worked_examples(scheme, deltas, buckets):
    """T5-2, T5-3 by hand."""
    got = jax.jit(t5.buckets, static_argnums=0)(scheme, jnp.asarray([deltas]))
    np.testing.assert_array_equal(np.asarray(got[0]), buckets)


T5_SCHEMES = [T5Bias(), T5Bias(8, 10), T5Bias(6, 5, False), T5Bias(4, 3), T5Bias(32, 128, False), T5Bias(2, 2, False)]


@pytest.mark.parametrize("scheme", T5_SCHEMES, ids=str)
def test_t5_buckets_equal_the_reference_over_every_distance(scheme):
    """T5-2, T5-3: every distance in [-2000, 2000] (beyond 4 M: saturation), int64 and int8 distances."""
    delta = np.arange(-2000, 2001)[None, None]
    truth = numpy_ref.t5_buckets(delta, scheme.num_buckets, scheme.max_distance, scheme.bidirectional)
    np.testing.assert_array_equal(np.asarray(t5.buckets(scheme, jnp.asarray(delta))), truth)
    small = np.arange(-128, 128, dtype=np.int8)[None, None]  # thresholds up to 128 must not wrap
    np.testing.assert_array_equal(
        np.asarray(t5.buckets(scheme, jnp.asarray(small))), truth[..., 2000 - 128 : 2000 + 128]
    )


@pytest.mark.parametrize(
    "scheme,pairs",
    [  # the worked examples of SWIN-3 and SWIN-4 (spec/biases.md), by hand
        (Swin((3, 4)), {(0, 0): 17, (0, 11): 34, (11, 0): 0, (5, 6): 18}),
        (Swin((4, 1)), {(0, 3): 6, (3, 0): 0}),
        (Swin((2, 2), 1), {(0, 3): 9, (3, 0): 10, (0, 0): 11, (1, 4): 8}),
    ],
    ids=["3x4", "4x1", "2x2-prefix"],
)
def test_swin_rows_of_the_worked_examples(scheme, pairs):
    """SWIN-3, SWIN-4 by hand: rows of (q_pos, k_pos) pairs."""
    q_pos = jnp.asarray([[q for q, _ in pairs]])
    k_pos = jnp.asarray([[k for _, k in pairs]])
    got = np.asarray(swin.rows(scheme, q_pos, k_pos))[0]
    np.testing.assert_array_equal(np.diagonal(got), list(pairs.values()))


SWIN_SCHEMES = [Swin((3, 4)), Swin((4, 1)), Swin((2, 3)), Swin((3, 4), 1), Swin((4, 1), 1), Swin((2, 3), 2), Swin()]


@pytest.mark.parametrize("scheme", SWIN_SCHEMES, ids=str)
def test_swin_rows_equal_the_reference(scheme):
    """SWIN-3, SWIN-4, POS-5: every pair of positions in [-30, 70], (1|B, L) positions, int8 positions."""
    q_pos = np.arange(-30, 70)[None]
    k_pos = np.stack([np.arange(-30, 70), np.arange(70, -30, -1)])
    truth = ref_swin.rows(scheme, q_pos, k_pos)
    np.testing.assert_array_equal(np.asarray(swin.rows(scheme, jnp.asarray(q_pos), jnp.asarray(k_pos))), truth)
    small = [jnp.asarray(p, jnp.int8) for p in (q_pos, k_pos)]  # rows up to (2Wh - 1)(2Ww - 1) + 2 must not wrap
    np.testing.assert_array_equal(np.asarray(swin.rows(scheme, *small)), truth)


# ---------------------------------------------------------------- static configuration
SCHEME_SPECS = {
    "alibi": AttentionSpec(3, 2, relative=Alibi()),
    "t5": AttentionSpec(3, 2, relative=T5Bias(8, 10)),
    "swin": AttentionSpec(3, 2, relative=Swin((2, 3), 1)),
}


@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("name", SCHEME_SPECS)
def test_new_position_values_do_not_recompile(name, kernel):
    """Slopes, thresholds and the window are static; positions are traced: one trace for every position value."""
    s = SCHEME_SPECS[name]
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(s, 0).items()}
    traces = []

    @jax.jit
    def f(params, x, q_positions, k_positions):
        traces.append(None)  # a Python side effect: runs once per trace
        return jax_impl.attention(s, params, x, q_positions=q_positions, k_positions=k_positions, implementation=kernel)

    x = np.random.default_rng(14).normal(size=(1, 5, s.model_dim))
    for offset in (0, -7, 1000, 10**6):  # Swin: prefix, window and clipped offsets; T5: every bucket region
        pos = np.array([0, 3, 1, 9, 2]) + offset
        got = f(params, jnp.asarray(x), jnp.asarray(pos), jnp.asarray(pos[::-1]))
        truth = numpy_ref.attention(s, numpy_ref.init_params(s, 0), x, q_positions=pos, k_positions=pos[::-1])
        assert _max_error(got, truth) <= RTOL64, offset
    assert len(traces) == 1
    assert f._cache_size() == 1


def _shapes(jaxpr):
    """Every intermediate shape of a jaxpr, nested calls included."""
    for eqn in jaxpr.eqns:
        yield from (tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _shapes(inner)


@pytest.mark.parametrize("kernel", KERNELS[:2], ids=KERNEL_IDS[:2])
@pytest.mark.parametrize("name", SCHEME_SPECS)
def test_no_kernel_builds_anything_of_shape_lq_lk_d(name, kernel):
    """Forward and backward: the bias is (1|B, H, Lq, Lk), nothing of shape (Lq, Lk, d) (d = 6 here)."""
    s = AttentionSpec(3, 6, relative=SCHEME_SPECS[name].relative)
    Lq, Lk, d = 7, 5, 6
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(s, 0).items()}
    x, kv = jnp.zeros((1, Lq, s.model_dim)), jnp.zeros((1, Lk, s.model_dim))

    def loss(params, x, kv):
        return jnp.sum(jax_impl.attention(s, params, x, kv, q_positions=jnp.arange(Lq), implementation=kernel))

    shapes = set(_shapes(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(params, x, kv).jaxpr))
    assert (1, 3, Lq, Lk) in shapes  # the walk sees the logits
    assert not [t for t in shapes if any(t[i : i + 3] == (Lq, Lk, d) for i in range(len(t)))]


def test_registry_finds_each_module_for_both_kernels():
    """REL-4: the scheme names find these modules; their one hook has a tiled form, so tiles is the choice."""
    for s, module in zip(SCHEME_SPECS.values(), (alibi, t5, swin)):
        assert schemes.module_for(s.relative) is module
        assert schemes.missing_tiled(s.relative) == []
        hooks = schemes.plain_hooks(s.relative)
        assert hooks.bias is not None and hooks.key_term is hooks.value_term is hooks.qk_transform is None
        assert kernels.resolve(None, s, kernels.Call.of(jnp.zeros((1, 4, s.model_dim)))) == Tiles()


# ---------------------------------------------------------------- the Flax NNX module
@pytest.mark.parametrize("name", ["t5", "swin"])
def test_module_holds_rel_b_and_round_trips_it_exactly(name):
    """PARAM-1..3: ``rel_b`` is an nnx.Param of shape (H, R); load_canonical / canonical_params are exact;
    forward and d rel_b through the module match numpy_ref."""
    s = AttentionSpec(3, 2, relative=SCHEME_SPECS[name].relative, num_kv_heads=1)
    m = jax_impl.MultiHeadAttention(s, rngs=nnx.Rngs(0), dtype=jnp.float64)
    assert isinstance(m.rel_b, nnx.Param) and m.rel_b[...].shape == s.param_shapes()["rel_b"]
    assert sorted(m.canonical_params()) == sorted(s.param_shapes())
    params = numpy_ref.init_params(s, 4)
    m.load_canonical({n: jnp.asarray(a) for n, a in params.items()})
    back = m.canonical_params()
    assert sorted(back) == sorted(params)
    for n in params:
        np.testing.assert_array_equal(back[n], params[n])  # bit for bit
    rng = np.random.default_rng(15)
    x = rng.normal(size=(2, 7, s.model_dim))
    pos = np.array([[0, 1, 2, 3, 4, 5, 6], [-3, 0, 8, 1, 2, 40, 5]])
    g = rng.normal(size=x.shape)

    def loss(m, x):
        return jnp.sum(m(x, q_positions=pos, k_positions=pos) * g)

    grads = nnx.jit(nnx.grad(loss))(m, jnp.asarray(x))
    truth = numpy_ref.attention_vjp(s, params, x, x, x, g, q_positions=pos, k_positions=pos)
    assert _max_error(grads.rel_b[...], truth["rel_b"]) <= RTOL64
    out = nnx.jit(lambda m, x: m(x, q_positions=pos, k_positions=pos))(m, jnp.asarray(x))
    assert _max_error(out, numpy_ref.attention(s, params, x, q_positions=pos, k_positions=pos)) <= RTOL64


def test_module_with_alibi_has_no_table():
    """ALIBI-1: no tables, so the module holds only the projections."""
    s = SCHEME_SPECS["alibi"]
    m = jax_impl.MultiHeadAttention(s, rngs=nnx.Rngs(0), dtype=jnp.float64)
    assert not hasattr(m, "rel_b")
    assert sorted(m.canonical_params()) == sorted(s.param_shapes())


# ---------------------------------------------------------------- error paths
def test_a_missing_or_misshaped_rel_b_is_refused_by_name():
    """PARAM-2: rel_b is part of the canonical set; its absence and its shape are ValueErrors, in the module too."""
    s = SCHEME_SPECS["t5"]
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(s, 0).items()}
    x = jnp.ones((1, 3, s.model_dim))
    without = {n: a for n, a in params.items() if n != "rel_b"}
    with pytest.raises(
        ValueError,
        match=r"params: expected entries \['wq', 'wk', 'wv', 'wo', 'bq', 'bk', 'bv', 'bo', 'rel_b'\] "
        r"for this spec, got missing \['rel_b'\]",
    ):
        jax_impl.attention(s, without, x)
    misshaped = {**params, "rel_b": params["rel_b"][:, :4]}
    with pytest.raises(ValueError, match=r"params\['rel_b'\]: expected shape \(3, 8\), got \(3, 4\)"):
        jax_impl.attention(s, misshaped, x)
    m = jax_impl.MultiHeadAttention(s, rngs=nnx.Rngs(0), dtype=jnp.float64)
    with pytest.raises(ValueError, match=r"params\['rel_b'\]: expected shape \(3, 8\), got \(3, 4\)"):
        m.load_canonical(misshaped)


def test_alibi_slopes_must_match_the_query_heads():
    """ALIBI-2: explicit slopes are one per query head (not per key/value head, HEAD-3)."""
    with pytest.raises(
        ValueError, match=r"Alibi\.slopes: expected one slope per query head, num_heads = 4 \(ALIBI-2\), got 2"
    ):
        AttentionSpec(4, 2, relative=Alibi(slopes=(0.5, 0.25)), num_kv_heads=2)
