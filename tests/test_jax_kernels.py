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
    with pytest.raises(ValueError, match=re.escape("implementation: expected None, one of ['xla', 'tiles']")):
        m(x, implementation="eager")


def test_unknown_kernels_and_bad_knobs_are_errors():
    spec_ = AttentionSpec(H, d)
    params = {n: jnp.asarray(a, jnp.float32) for n, a in numpy_ref.init_params(spec_, 0).items()}
    x = jnp.zeros((1, 3, spec_.model_dim), jnp.float32)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "implementation: expected None, one of ['xla', 'tiles'] or a "
            "kernel object (jax_impl.kernels.Tiles(query_rows=...), ...), "
            "got 'flash'"
        ),
    ):
        jax_impl.attention(spec_, params, x, implementation="flash")
    with pytest.raises(
        TypeError,
        match=re.escape(
            "implementation: expected None, a kernel name ['xla', 'tiles'] or "
            "a kernel object (jax_impl.kernels.Xla(), "
            "jax_impl.kernels.Tiles(...)), got int"
        ),
    ):
        jax_impl.attention(spec_, params, x, implementation=2)
    for rows in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=re.escape(f"Tiles.query_rows: expected an int >= 1, got {rows!r}")):
            Tiles(query_rows=rows)


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
    def bias(scheme, params, delta):
        return -0.5 * jnp.abs(delta)[:, None].astype(jnp.float64)


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
            f"spec.relative: expected a scheme jax_impl implements (one of ['huang', 'shaw']; add one with "
            f"jax_impl.schemes.register_module(name, module)), got {registered.name!r} (DoubleQueryMinusDistance)"
        ),
    ):
        jax_impl.attention(spec_, params, jnp.zeros((1, 2, spec_.model_dim)))
