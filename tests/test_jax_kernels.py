"""jax_impl's kernels (KERN-1): ``xla`` and ``tiles`` against numpy_ref, their scheme algorithms, the choice.

Three kinds of test: parity of both kernels with the float64 reference
(forward, weights and every gradient, within the conformance budgets of
``conformance.tolerance``); the fast algorithms of the scheme modules
against plain indexing (exact: integer-valued inputs make every sum exact
in any order); and the kernel choice with its error paths, matched by
message. Tiles run with ``query_rows=2`` so that short calls are cut.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax", reason="jax_impl needs JAX: pip install attnspec[jax]")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import jax_impl  # noqa: E402
import numpy_ref  # noqa: E402
import spec  # noqa: E402
from conformance import naive, tolerance  # noqa: E402
from jax_impl import kernels, schemes  # noqa: E402
from jax_impl.kernels import Tiles, Xla  # noqa: E402
from jax_impl.schemes import huang, shaw  # noqa: E402
from jax_impl.schemes._tables import bucket_sums, gather_rows  # noqa: E402
from numpy_ref import relative as ref_rel  # noqa: E402
from spec import AttentionSpec, Huang, Scheme, Shaw  # noqa: E402

KERNELS = (Xla(), Tiles(query_rows=2))
B, H, d = 2, 2, 2
DIFF = ("query", "key", "value", "bias")


# ---------------------------------------------------------------- parity with the reference
def _budgets(spec_, params, inputs, g, truth) -> dict:
    """PREC-2 at float64: k * e_base + floor per output, e_base from the naive emulation's two orders.

    A gradient can cancel to (nearly) 0 in theory (the query of a row with one allowed key, a key bias):
    its rounding is that of the terms that cancel, so its floor is in ulps of the largest gradient (the
    harness's rule for bq, bk, ..., as tests/test_torch_kernels.py applies it).
    """
    errors = dict.fromkeys(truth, 0.0)
    for order in naive.ORDERS:
        out, w, cache = naive.forward(spec_, params, inputs, "float64", order)
        produced = {
            "out": out,
            "weights": w,
            **{f"grad/{n}": a for n, a in naive.backward(spec_, cache, g, order).items()},
        }
        for n in truth:
            errors[n] = max(errors[n], tolerance.max_error(produced[n], truth[n]))
    grad_scale = max(tolerance.magnitude(a) for n, a in truth.items() if n.startswith("grad/"))
    scales = {n: max(tolerance.floor_scale(n, truth), grad_scale if n.startswith("grad/") else 0.0) for n in truth}
    return {n: tolerance.budget(n, "float64", errors[n], scales[n])["budget"] for n in truth}


@functools.partial(jax.jit, static_argnums=(0, 1))
def _every_kernel(spec_, kernels_, params, diff, other, g):
    """(out, weights, grads) of each kernel: one compiled program per configuration."""
    results = []
    for kernel in kernels_:

        def f(params, diff, kernel=kernel):
            return jax_impl.attention(
                spec_,
                params,
                diff["query"],
                diff["key"],
                diff["value"],
                bias=diff.get("bias"),
                **other,
                return_weights=True,
                implementation=kernel,
            )

        out, pullback, weights = jax.vjp(f, params, diff, has_aux=True)
        g_params, g_diff = pullback(g)
        results.append({"out": out, "weights": weights, **{f"grad/{n}": a for n, a in {**g_params, **g_diff}.items()}})
    return results


def check_every_kernel(spec_, params, inputs, kernels_=KERNELS, seed=0):
    """Both kernels against numpy_ref (out, weights, gradients) and tiles against xla, within the budgets."""
    g = np.random.default_rng(seed).normal(size=inputs["query"].shape)
    kw = {n: a for n, a in inputs.items() if n not in ("query", "key", "value")}
    out, weights = numpy_ref.attention(
        spec_, params, inputs["query"], inputs["key"], inputs["value"], **kw, return_weights=True
    )
    grads = numpy_ref.attention_vjp(spec_, params, inputs["query"], inputs["key"], inputs["value"], g, **kw)
    truth = {"out": out, "weights": weights, **{f"grad/{n}": a for n, a in grads.items()}}
    budgets = _budgets(spec_, params, inputs, g, truth)
    diff = {n: jnp.asarray(a) for n, a in inputs.items() if n in DIFF}
    other = {n: jnp.asarray(a) for n, a in inputs.items() if n not in DIFF}
    results = _every_kernel(
        spec_, kernels_, {n: jnp.asarray(a) for n, a in params.items()}, diff, other, jnp.asarray(g)
    )
    for kernel, got in zip(kernels_, results):
        assert sorted(got) == sorted(truth), kernel
        for n in truth:
            error = tolerance.max_error(np.asarray(got[n]), truth[n])
            assert error <= budgets[n], f"{kernel}: {n} off by {error:.3g} > budget {budgets[n]:.3g}"
    baseline = results[0]
    for kernel, got in zip(kernels_[1:], results[1:]):
        for n in truth:
            error = tolerance.max_error(np.asarray(got[n]), np.asarray(baseline[n]))
            assert error <= budgets[n], f"{kernel} vs xla: {n} differs by {error:.3g} > budget {budgets[n]:.3g}"


SCHEMES = [None, Shaw(2), Shaw(1, keys=False, per_head=True), Shaw(0, values=False), Huang(3), Huang(2, per_head=False)]


@st.composite
def configurations(draw):
    """A spec and a call: fixed B, H, d and a few (Lq, Lk).

    Two in five are *plain causal* (CAUSAL-1 alone, top-left: what Tiles(query_rows=2) cuts into query
    tiles from Lq = 4 on); the others draw masks, biases, positions and mask_fill freely.
    """
    relative = draw(st.sampled_from(SCHEMES))
    plain_causal = draw(st.sampled_from([True, True, False, False, False]))
    dropout = draw(st.sampled_from([0.0, 0.0, 0.25]))
    if plain_causal:
        causal, mask_fill, mask, bias, positions = True, None, None, False, None
        Lq, Lk = draw(st.sampled_from([(5, 5), (6, 3), (4, 6)]))
    else:
        causal = draw(st.booleans())
        mask_fill = draw(st.sampled_from([None, None, -1e9]))
        mask = draw(st.sampled_from([None, "padding", "per-query"]))  # MASK-1 forms, MASK-5 / MASK-7 rows
        bias = draw(st.booleans())  # BIAS-1, BIAS-2
        positions = draw(st.sampled_from([None, "bottom-right", "per-batch"]))  # POS-1..POS-3
        Lq, Lk = draw(st.sampled_from([(5, 5), (3, 6), (6, 3)]))
    spec_ = AttentionSpec(H, d, relative=relative, causal=causal, mask_fill=mask_fill, dropout=dropout)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = {n: rng.normal(size=(B, L, spec_.model_dim)) for n, L in (("query", Lq), ("key", Lk), ("value", Lk))}
    if mask == "padding":
        inputs["mask"] = rng.random((B, 1, 1, Lk)) < 0.7
    elif mask == "per-query":
        inputs["mask"] = rng.random((Lq, Lk)) < 0.7
    if bias:
        inputs["bias"] = np.where(rng.random((B, H, Lq, Lk)) < 0.1, -np.inf, rng.normal(size=(B, H, Lq, Lk)))
    if positions == "bottom-right":
        inputs["q_positions"] = np.arange(Lk - Lq, Lk)
    elif positions == "per-batch":
        inputs["q_positions"] = rng.integers(-4, 6, size=(B, Lq))
        inputs["k_positions"] = rng.integers(-4, 6, size=(B, Lk))
    if dropout:
        inputs["dropout_keep"] = rng.random((B, H, Lq, Lk)) >= dropout  # DROP-1..DROP-4
    return spec_, numpy_ref.init_params(spec_, int(rng.integers(0, 2**31))), inputs


@settings(max_examples=25)  # each example compiles one program holding both kernels
@given(configuration=configurations())
def test_every_kernel_matches_the_reference_in_float64(configuration):
    """REL-1, SHAW-2..4, HUANG-2..4, CAUSAL-1, MASK-4..7, SOFTMAX-1, DROP-1..4 through both kernels (KERN-1)."""
    check_every_kernel(*configuration)


@pytest.mark.parametrize("relative", [Shaw(3), Huang(150), None], ids=["shaw", "huang", "none"])
def test_causal_query_tiles_at_a_length_that_splits_them_match_the_reference(relative):
    """Lq = 300 with Tiles(query_rows=128): three tiles of queries, each attending only keys up to its last query."""
    spec_ = AttentionSpec(1, 4, relative=relative, causal=True, dropout=0.25)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, 300, 4))
    inputs = {"query": x, "key": x.copy(), "value": x.copy(), "dropout_keep": rng.random((1, 1, 300, 300)) < 0.75}
    assert Tiles(query_rows=128).cuts_queries(spec_, kernels.Call(1, 300, 300, True, False, False, True, True))
    check_every_kernel(spec_, numpy_ref.init_params(spec_, 1), inputs, (Xla(), Tiles(query_rows=128)))


# ---------------------------------------------------------------- grouped heads, value head size, softcap, window
# HEAD-3, HEAD-4, SOFTCAP-1 and WINDOW-1 are independent of each other, so each configuration below combines
# several of them: JAX compiles one program per configuration (both kernels, forward and gradients), and
# compilation is what these tests spend their time on.


def check_kernels_tightly(spec_, params, inputs, dtype=np.float64, tol=1e-12, kernels_=KERNELS, seed=0):
    """Every kernel against numpy_ref (out, weights, every gradient): max error <= tol * max(1, |truth|).

    A fixed tolerance (float64 ~1e-12, float32 ~1e-5) instead of the naive emulation's budgets of
    ``check_every_kernel``. Returns the float64 truth and the results per kernel, for exact checks.
    """
    g = np.random.default_rng(seed).normal(size=inputs["query"].shape)
    kw = {n: a for n, a in inputs.items() if n not in ("query", "key", "value")}
    out, weights = numpy_ref.attention(
        spec_, params, inputs["query"], inputs["key"], inputs["value"], **kw, return_weights=True
    )
    grads = numpy_ref.attention_vjp(spec_, params, inputs["query"], inputs["key"], inputs["value"], g, **kw)
    truth = {"out": out, "weights": weights, **{f"grad/{n}": a for n, a in grads.items()}}

    def cast(n, a):
        return jnp.asarray(a, dtype) if np.issubdtype(np.asarray(a).dtype, np.floating) else jnp.asarray(a)

    diff = {n: cast(n, a) for n, a in inputs.items() if n in DIFF}
    other = {n: cast(n, a) for n, a in inputs.items() if n not in DIFF}
    results = _every_kernel(
        spec_, kernels_, {n: cast(n, a) for n, a in params.items()}, diff, other, jnp.asarray(g, dtype)
    )
    for kernel, got in zip(kernels_, results):
        assert sorted(got) == sorted(truth), kernel
        for n, expected in truth.items():
            error = tolerance.max_error(np.asarray(got[n], np.float64), expected)
            limit = tol * max(1.0, float(np.max(np.abs(expected), initial=0.0)))
            assert error <= limit, f"{kernel}: {n} off by {error:.3g} > {limit:.3g}"
    return truth, results


def _inputs(rng, spec_, Lq, Lk, B_=B):
    D = spec_.model_dim
    return {n: rng.normal(size=(B_, L, D)) for n, L in (("query", Lq), ("key", Lk), ("value", Lk))}


def test_grouped_heads_value_head_size_shaw_values_softcap_bias_and_window_match_the_reference():
    """HEAD-3 (Hkv = H / 2), HEAD-4 (dv != d, per-head Shaw values of dv columns), SOFTCAP-1 before a bias
    with -inf entries (BIAS-2), WINDOW-1 on explicit positions with a query whose window holds no key
    (MASK-5: its weights are exactly 0 and its output exactly bo), dropout (DROP-1): both kernels, float64.
    """
    spec_ = AttentionSpec(
        4,
        2,
        num_kv_heads=2,
        value_head_dim=3,
        relative=Shaw(2, per_head=True),
        softcap=1.5,
        window=(1, 2),
        dropout=0.25,
    )
    rng = np.random.default_rng(11)
    Lq, Lk = 5, 6
    inputs = _inputs(rng, spec_, Lq, Lk)
    bias = rng.normal(size=(B, 4, Lq, Lk))
    bias[0, 1, 2, 2] = bias[1, 3, 0, 1] = -np.inf  # allowed by the window, disallowed by the bias
    inputs.update(bias=bias, q_positions=np.array([0, 1, 3, 4, 20]), dropout_keep=rng.random((B, 4, Lq, Lk)) < 0.75)
    params = numpy_ref.init_params(spec_, 5)
    truth, results = check_kernels_tightly(spec_, params, inputs)
    assert truth["weights"][0, 1, 2, 2] == 0 and truth["weights"][1, 3, 0, 1] == 0
    for got in results:
        np.testing.assert_array_equal(np.asarray(got["weights"])[:, :, 4], 0.0)  # q_pos 20: no key within (1, 2)
        np.testing.assert_array_equal(np.asarray(got["out"])[:, 4], np.broadcast_to(params["bo"], (B, 4 * 2)))
        assert np.asarray(got["weights"])[0, 1, 2, 2] == 0 and np.asarray(got["weights"])[1, 3, 0, 1] == 0


def test_multi_query_heads_with_a_causal_window_through_the_query_tiles_match_the_reference():
    """HEAD-3 with Hkv = 1 (multi-query), HEAD-4 without a value table, SOFTCAP-1 on a Huang key term,
    WINDOW-1 (1, None) with CAUSAL-1 at default positions: tiles cuts the queries (query_rows=2), and with
    Lq = 5 > Lk + left the queries 3 and 4 have no key (MASK-5: exact zeros, no bias so the output is 0).
    """
    spec_ = AttentionSpec(
        4,
        2,
        bias=False,
        num_kv_heads=1,
        value_head_dim=3,
        relative=Huang(3),
        softcap=2.0,
        causal=True,
        window=(1, None),
    )
    call = kernels.Call(B, 5, 2, True, False, False, False, True)
    assert Tiles(query_rows=2).cuts_queries(spec_, call) and not Tiles.rows_nonempty(spec_, call)
    rng = np.random.default_rng(12)
    truth, results = check_kernels_tightly(spec_, numpy_ref.init_params(spec_, 6), _inputs(rng, spec_, 5, 2))
    for got in results:
        np.testing.assert_array_equal(np.asarray(got["weights"])[:, :, 3:], 0.0)
        np.testing.assert_array_equal(np.asarray(got["out"])[:, 3:], 0.0)
        assert np.isfinite(np.asarray(got["grad/rel_k"])).all()


def test_decoding_with_a_window_and_grouped_heads_matches_the_reference():
    """WINDOW-1 follows the positions (POS-3): Lq = 3 new queries at arange(Lk - Lq, Lk) against Lk = 8
    cached keys, causal with window (2, 0) keeps each query's last three keys; HEAD-3 (Hkv = H / 2) with
    dv < d and a shared Shaw table (rel_v of dv columns), no cap.
    """
    spec_ = AttentionSpec(4, 3, num_kv_heads=2, value_head_dim=2, relative=Shaw(1), causal=True, window=(2, 0))
    rng = np.random.default_rng(13)
    inputs = {**_inputs(rng, spec_, 3, 8), "q_positions": np.arange(5, 8)}
    truth, _ = check_kernels_tightly(spec_, numpy_ref.init_params(spec_, 7), inputs)
    allowed = np.zeros((3, 8), bool)
    for i, q in enumerate(range(5, 8)):
        allowed[i, q - 2 : q + 1] = True
    assert ((truth["weights"] > 0) == allowed).all()


def test_peer_options_through_the_query_tiles_match_the_reference_in_float32():
    """float32 (within 1e-5): HEAD-3 (Hkv = H / 2), HEAD-4, per-head Shaw values, SOFTCAP-1, CAUSAL-1 with
    WINDOW-1 (2, None) at default positions and dropout: tiles cuts the queries, every row keeps a key.
    """
    spec_ = AttentionSpec(
        4,
        2,
        num_kv_heads=2,
        value_head_dim=3,
        relative=Shaw(2, per_head=True),
        softcap=2.0,
        causal=True,
        window=(2, None),
        dropout=0.25,
    )
    call = kernels.Call(B, 4, 4, True, False, False, True, True)
    assert Tiles(query_rows=2).cuts_queries(spec_, call) and Tiles.rows_nonempty(spec_, call)
    rng = np.random.default_rng(14)
    inputs = {**_inputs(rng, spec_, 4, 4), "dropout_keep": rng.random((B, 4, 4, 4)) < 0.75}
    check_kernels_tightly(spec_, numpy_ref.init_params(spec_, 8), inputs, dtype=np.float32, tol=1e-5)


def test_tiles_drops_the_softmax_guard_only_where_a_window_leaves_every_causal_row_a_key():
    """MASK-5 under CAUSAL-1 + WINDOW-1 at default positions: query i keeps a key iff i - left <= Lk - 1."""

    def nonempty(window, Lq, Lk, **kw):
        spec_ = AttentionSpec(1, 1, causal=True, window=window)
        return Tiles.rows_nonempty(
            spec_,
            kernels.Call(
                1,
                Lq,
                Lk,
                **{
                    **dict(default_positions=True, mask=False, bias=False, dropout_keep=False, return_weights=False),
                    **kw,
                },
            ),
        )

    assert nonempty(None, 9, 3) and nonempty((None, 0), 9, 3) and nonempty((6, None), 9, 3)
    assert not nonempty((5, None), 9, 3)  # query 8: keys 3.. only, and there are 3 keys
    assert nonempty((0, 0), 4, 4) and not nonempty((0, 0), 5, 4)
    assert not nonempty((1, None), 4, 4, mask=True)  # not a plain causal rule: the guard stays


@functools.partial(jax.jit, static_argnums=0)
def _worked_examples(kernels_):
    """The worked examples of HEAD-3, SOFTCAP-1 and WINDOW-1 (spec/attention.md) through each kernel: one program."""
    results = []
    for kernel in kernels_:
        # HEAD-3: four query heads, two key/value heads, d = 1; value features [1, 2] -> per-head values [1, 1, 2, 2]
        s3 = AttentionSpec(num_heads=4, head_dim=1, num_kv_heads=2)
        p3 = {n: jnp.asarray(a) for n, a in numpy_ref.identity_params(s3).items()}
        p3["wv"] = jnp.asarray([[1.0, 0], [0, 1], [0, 0], [0, 0]])
        head3 = jax_impl.attention(s3, p3, jnp.zeros((1, 1, 4)), jnp.asarray([[[1.0, 2, 0, 0]]]), implementation=kernel)
        # SOFTCAP-1: one head, d = 1 (s = 1), query 1, keys (= values) 3 and 0: scores [3, 0] -> [tanh 3, 0]
        # with c = 1; a -inf bias on key 1 still disallows it (the cap comes before the bias)
        sc = AttentionSpec(num_heads=1, head_dim=1, softcap=1.0)
        pc = {n: jnp.asarray(a) for n, a in numpy_ref.identity_params(sc).items()}
        q, kv = jnp.ones((1, 1, 1)), jnp.asarray([[[3.0], [0.0]]])
        capped = jax_impl.attention(sc, pc, q, kv, return_weights=True, implementation=kernel)[1]
        minus_inf = jnp.asarray([0.0, -jnp.inf])
        biased = jax_impl.attention(sc, pc, q, kv, bias=minus_inf, return_weights=True, implementation=kernel)[1]
        # WINDOW-1: keys at 0, 1, 2; window (1, 0): a query at 2 attends keys 1 and 2, one at 5 none
        sw = AttentionSpec(num_heads=1, head_dim=1, window=(1, 0))
        pw = {n: jnp.asarray(a) for n, a in numpy_ref.identity_params(sw).items()}
        kv3 = jnp.asarray([[[1.0], [2.0], [3.0]]])
        q_positions = jnp.asarray([2, 5])
        window = jax_impl.attention(
            sw, pw, jnp.zeros((1, 2, 1)), kv3, q_positions=q_positions, return_weights=True, implementation=kernel
        )[1]
        results.append((head3, capped, biased, window))
    return results


def test_the_worked_examples_of_grouped_heads_softcap_and_window_hold_in_every_kernel():
    """HEAD-3, SOFTCAP-1, BIAS-2, WINDOW-1, MASK-5: the spec's hand-checked values."""
    w0 = np.exp(np.tanh(3.0)) / (np.exp(np.tanh(3.0)) + 1.0)  # softmax([tanh 3, 0])[0] = 0.7301
    for kernel, (head3, capped, biased, window) in zip(KERNELS, _worked_examples(KERNELS)):
        np.testing.assert_array_equal(np.asarray(head3)[0, 0], [1.0, 1.0, 2.0, 2.0], err_msg=str(kernel))
        np.testing.assert_allclose(np.asarray(capped)[0, 0, 0], [w0, 1 - w0], rtol=0, atol=1e-15)
        np.testing.assert_array_equal(np.asarray(biased)[0, 0, 0], [1.0, 0.0])  # not capped to -1: exactly 0
        np.testing.assert_array_equal(np.asarray(window)[0, 0], [[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]])


# ---------------------------------------------------------------- the fast algorithms, exactly
def _tile_delta(q_start: int, Lq: int, Lk: int):
    """POS-2 for default positions and the queries q_start .. q_start + Lq - 1: (1, Lq, Lk)."""
    return (np.arange(Lk)[None, :] - np.arange(q_start, q_start + Lq)[:, None])[None]


# jitted with the sizes static: one small program per example (eager, every primitive would compile alone)
bucket_sums_banded = jax.jit(shaw.bucket_sums_banded, static_argnums=(1, 2))
scatter_sums = jax.jit(bucket_sums, static_argnums=2)
huang_skew_term = jax.jit(huang.huang_skew_term, static_argnums=(2, 3, 4, 5))
huang_key_term = jax.jit(huang.key_term, static_argnums=0)


@settings(max_examples=20)
@given(
    q_start=st.integers(0, 9),
    Lq=st.integers(1, 6),
    Lk=st.integers(1, 12),
    k=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_banded_shaw_value_sums_equal_the_scatter_over_any_tile(q_start, Lq, Lk, k, seed):
    """SHAW-4: the banded bucket sums of a tile are the sums per clipped distance (integer weights: exact)."""
    w = np.random.default_rng(seed).integers(0, 9, size=(1, 2, Lq, Lk)).astype(np.float64)
    index = ref_rel.shaw_index(_tile_delta(q_start, Lq, Lk), k)
    expected = ref_rel.scatter_buckets(w, index, 2 * k + 1)
    np.testing.assert_array_equal(np.asarray(bucket_sums_banded(jnp.asarray(w), k, q_start)), expected)
    np.testing.assert_array_equal(np.asarray(scatter_sums(jnp.asarray(w), jnp.asarray(index), 2 * k + 1)), expected)


@settings(max_examples=20)
@given(
    q_start=st.integers(0, 9),
    Lq=st.integers(1, 6),
    Lk=st.integers(1, 12),
    M=st.integers(1, 8),
    per_head=st.booleans(),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_huang_skew_equals_the_plain_gather_over_any_tile(q_start, Lq, Lk, M, per_head, causal, seed):
    """HUANG-2..4: the skew over the reachable rows is the gather by relative index (integer values: exact).

    Causal: only the keys up to the diagonal are the term; after it the values are finite (CAUSAL-1: the
    caller masks them).
    """
    rng = np.random.default_rng(seed)
    q = rng.integers(-3, 4, size=(1, 2, Lq, 3)).astype(np.float64)
    table = rng.integers(-3, 4, size=(2, 2 * M - 1, 3) if per_head else (2 * M - 1, 3)).astype(np.float64)
    delta = _tile_delta(q_start, Lq, Lk)
    row, valid = ref_rel.huang_index(delta, M)
    expected = np.where(valid[:, None], ref_rel.gather_logits(q, ref_rel.as_4d(table), row), 0.0)
    plain = huang_key_term(Huang(M, per_head), {"rel_k": jnp.asarray(table)}, jnp.asarray(q), jnp.asarray(delta))
    np.testing.assert_array_equal(np.asarray(plain), expected)
    got = np.asarray(huang_skew_term(jnp.asarray(q), jnp.asarray(table), q_start, Lk, M, causal))
    if causal:
        before = np.broadcast_to((delta <= 0)[:, None], expected.shape)
        np.testing.assert_array_equal(got[before], expected[before])
        assert np.isfinite(got).all()
    else:
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("Lq,Lk", [(1, 1), (1, 5), (5, 1), (3, 7), (7, 3), (6, 6)])
def test_skew_is_numpy_refs_skew(Lq, Lk):
    """HUANG-4: out[..., i, j] = r[..., i, j - i + Lq - 1], element for element."""
    r = np.random.default_rng(0).normal(size=(2, 3, Lq, Lq + Lk - 1))
    np.testing.assert_array_equal(np.asarray(huang.skew(jnp.asarray(r), Lk)), ref_rel.skew(r, Lk))


def test_index_helpers_are_numpy_refs():
    """SHAW-2 and HUANG-2/3 row indices, exactly."""
    delta = np.arange(-9, 10)[None, None, :] - np.arange(4)[None, :, None]
    for k in (0, 1, 3):
        np.testing.assert_array_equal(np.asarray(shaw.shaw_index(jnp.asarray(delta), k)), ref_rel.shaw_index(delta, k))
    for M in (1, 2, 5):
        row, valid = huang.huang_index(jnp.asarray(delta), M)
        ref_row, ref_valid = ref_rel.huang_index(delta, M)
        np.testing.assert_array_equal(np.asarray(valid), ref_valid)
        np.testing.assert_array_equal(np.asarray(row)[ref_valid], ref_row[ref_valid])


def test_gather_rows_is_plain_indexing():
    r = np.random.default_rng(1).normal(size=(2, 2, 3, 5))
    index = np.random.default_rng(2).integers(0, 5, size=(2, 3, 4))
    np.testing.assert_array_equal(
        np.asarray(gather_rows(jnp.asarray(r), jnp.asarray(index))), ref_rel.gather_buckets(r, index)
    )


def _shapes(jaxpr):
    """Every intermediate shape of a jaxpr, sub-jaxprs (pjit, custom rules, ...) included."""
    for eqn in jaxpr.eqns:
        yield from (tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _shapes(inner)


@pytest.mark.parametrize("kernel", KERNELS, ids=str)
@pytest.mark.parametrize("relative", [Shaw(2), Huang(4)], ids=str)
def test_no_kernel_builds_anything_of_shape_lq_lk_d(kernel, relative):
    """SHAW-3, SHAW-4, HUANG-4: table matmuls then index operations, forward and backward alike."""
    Lq, Lk, d_ = 7, 5, 3
    spec_ = AttentionSpec(2, d_, relative=relative, causal=True)
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(spec_, 0).items()}
    x, kv = jnp.zeros((1, Lq, spec_.model_dim)), jnp.zeros((1, Lk, spec_.model_dim))

    def loss(params, x, kv, q_positions):
        return jnp.sum(jax_impl.attention(spec_, params, x, kv, q_positions=q_positions, implementation=kernel))

    for q_positions in (None, jnp.arange(Lq)):
        shapes = set(_shapes(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(params, x, kv, q_positions).jaxpr))
        assert (1, 2, Lq, Lk) in shapes  # the walk sees the logits
        assert not [s for s in shapes if any(s[i : i + 3] == (Lq, Lk, d_) for i in range(len(s)))]


# ---------------------------------------------------------------- the choice (KERN-1)
def _call(Lq=4, Lk=4, **kw):
    facts = dict(default_positions=True, mask=False, bias=False, dropout_keep=False, return_weights=False)
    return kernels.Call(1, Lq, Lk, **{**facts, **kw})


@pytest.mark.parametrize("relative", SCHEMES, ids=str)
def test_the_automatic_choice_is_tiles_with_its_defaults(relative):
    """KERN-1: implementation=None takes Tiles() for every built-in scheme, the same program as "tiles"."""
    spec_ = AttentionSpec(H, d, relative=relative, causal=True)
    assert kernels.resolve(None, spec_, _call()) == Tiles() == Tiles(query_rows=256)
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(spec_, 0).items()}
    x = jnp.zeros((1, 4, spec_.model_dim))
    program = {
        impl: str(jax.make_jaxpr(functools.partial(jax_impl.attention, spec_, implementation=impl))(params, x))
        for impl in (None, "tiles", Tiles(query_rows=256))
    }
    assert program[None] == program["tiles"] == program[Tiles(query_rows=256)]


def test_a_kernel_object_is_a_static_argument():
    spec_ = AttentionSpec(H, d, relative=Shaw(1), causal=True)
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(spec_, 0).items()}
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 5, spec_.model_dim)))
    traces = []

    def f(params, x, implementation):
        traces.append(implementation)  # runs only while tracing
        return jax_impl.attention(spec_, params, x, implementation=implementation)

    jf = jax.jit(f, static_argnames="implementation")
    a = jf(params, x, implementation=Tiles(query_rows=2))
    b = jf(params, x, implementation=Tiles(2))  # equal and hashing alike: no new trace
    assert len(traces) == 1 and np.array_equal(np.asarray(a), np.asarray(b))
    expected = numpy_ref.attention(spec_, numpy_ref.init_params(spec_, 0), np.asarray(x))
    for impl in ("xla", Xla(), "tiles"):
        np.testing.assert_allclose(np.asarray(jf(params, x, implementation=impl)), expected, rtol=0, atol=1e-12)


def test_the_module_passes_implementation_through():
    spec_ = AttentionSpec(H, d, relative=Huang(3), causal=True)
    m = jax_impl.MultiHeadAttention(spec_, rngs=nnx.Rngs(0), dtype=jnp.float64)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 5, spec_.model_dim)))
    expected = numpy_ref.attention(spec_, m.canonical_params(), np.asarray(x))
    call = nnx.jit(lambda m, x, impl: m(x, deterministic=True, implementation=impl), static_argnums=2)
    for impl in ("xla", Tiles(query_rows=2)):
        np.testing.assert_allclose(np.asarray(call(m, x, impl)), expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=re.escape("implementation: expected None, one of ['xla', 'tiles', 'pallas']")):
        m(x, implementation="eager")


def test_unknown_kernels_and_bad_knobs_are_errors():
    spec_ = AttentionSpec(H, d)
    params = {n: jnp.asarray(a, jnp.float32) for n, a in numpy_ref.init_params(spec_, 0).items()}
    x = jnp.zeros((1, 3, spec_.model_dim), jnp.float32)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "implementation: expected None, one of ['xla', 'tiles', 'pallas'] or a "
            "kernel object (jax_impl.kernels.Tiles(query_rows=...), ...), "
            "got 'flash'"
        ),
    ):
        jax_impl.attention(spec_, params, x, implementation="flash")
    with pytest.raises(
        TypeError,
        match=re.escape(
            "implementation: expected None, a kernel name ['xla', 'tiles', 'pallas'] or "
            "a kernel object (jax_impl.kernels.Xla(), "
            "jax_impl.kernels.Tiles(...), jax_impl.kernels.Pallas(...)), got int"
        ),
    ):
        jax_impl.attention(spec_, params, x, implementation=2)
    for rows in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=re.escape(f"Tiles.query_rows: expected an int >= 1, got {rows!r}")):
            Tiles(query_rows=rows)
    assert Tiles(query_rows=1).query_rows == 1  # the least valid knob: one query a tile


# ------------------------------------------- a scheme with the two hooks no built-in scheme uses
@dataclass(frozen=True)
class DoubleQueryMinusDistance(Scheme):  # registered by the `registered` fixture below
    """A test-only scheme: q/k transform q -> 2q (REL-3 hook 1) and bias -|delta| / 2 (hook 3); no tables."""

    name = "jax-test-double-q-minus-distance"
    rule_prefix = "REL"

    def param_shapes(self, num_heads, head_dim, value_head_dim):
        return {}

    @property
    def hooks(self):
        return frozenset({"qk_transform", "bias"})

    @property
    def features(self):
        return frozenset()


class PlainHooksOnly:
    """Its jax_impl module: plain hooks, no tiled ones (so ``tiles`` does not support it)."""

    @staticmethod
    def qk_transform(scheme, params, q, k, q_positions, k_positions):
        return 2 * q, k

    @staticmethod
    def bias(scheme, params, q_positions, k_positions, delta, *, num_heads, dtype):
        return (-0.5 * jnp.abs(delta)[:, None]).astype(dtype)


@pytest.fixture
def registered():
    """The test scheme in spec and its module in jax_impl.schemes, removed again afterwards."""
    name = DoubleQueryMinusDistance.name
    spec.register(DoubleQueryMinusDistance)
    schemes.register_module(name, PlainHooksOnly)
    yield DoubleQueryMinusDistance()
    schemes.REGISTRY.pop(name, None)
    spec.unregister(name)


def test_new_hook_kinds_need_only_a_module_and_tiles_says_it_lacks_them(registered):
    """REL-3: xla calls a q/k transform and a scheme bias; tiles is unsupported, never a silent fallback (KERN-1)."""
    spec_ = AttentionSpec(H, d, relative=registered)
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(B, 4, spec_.model_dim)))
    mask = jnp.asarray(rng.random((B, 1, 4, 4)) < 0.8)
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(AttentionSpec(H, d), 0).items()}
    assert kernels.resolve(None, spec_, _call()) == Xla()
    got = jax_impl.attention(spec_, params, x, mask=mask)
    # the same function without the scheme: q -> 2q is twice the scale (exact), the bias an input
    same = AttentionSpec(H, d, scale=2 * spec_.effective_scale)
    delta = np.arange(4)[None, :] - np.arange(4)[:, None]
    expected = jax_impl.attention(
        same, params, x, mask=mask, bias=jnp.asarray(-0.5 * np.abs(delta)), implementation="xla"
    )
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"implementation='tiles' does not support this call: the jax_impl module of scheme {registered.name!r} "
            "has no tiled hooks (bias_tiled); kernels that do: ['xla'] (KERN-1)"
        ),
    ):
        jax_impl.attention(spec_, params, x, implementation="tiles")


def test_a_scheme_without_a_jax_module_is_refused_by_name(registered):
    """REL-4: a scheme spec knows and jax_impl does not implement is a ValueError naming the ones it has."""
    schemes.REGISTRY.pop(registered.name)
    spec_ = AttentionSpec(H, d, relative=registered)
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(AttentionSpec(H, d), 0).items()}
    with pytest.raises(
        ValueError,
        match=re.escape(
            "spec.relative: expected a scheme jax_impl implements "
            f"(one of ['alibi', 'huang', 'rope', 'shaw', 'swin', 't5']; add one with "
            f"jax_impl.schemes.register_module(name, module)), got {registered.name!r} (DoubleQueryMinusDistance)"
        ),
    ):
        jax_impl.attention(spec_, params, jnp.zeros((1, 2, spec_.model_dim)))
