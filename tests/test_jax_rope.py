"""RoPE in jax_impl (ROPE-1..ROPE-9): both kernels and the NNX module against numpy_ref.

Every expected value comes from numpy_ref (float64): the forward output, the
weights and every gradient of ``numpy_ref.attention_vjp``; the rotation hook
against the reference's own rotation. Each configuration is one compiled
program holding both kernels (forward and VJP), and the shapes repeat, so
the module stays fast; ``Tiles(query_rows=2)`` cuts the causal calls into
query tiles.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax_impl needs JAX: pip install attnspec[jax]")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import jax_impl  # noqa: E402
import numpy_ref  # noqa: E402
from jax_impl import schemes  # noqa: E402
from jax_impl.kernels import Tiles, Xla  # noqa: E402
from jax_impl.schemes import rope  # noqa: E402
from numpy_ref.schemes import rope as ref_rope  # noqa: E402
from spec import AttentionSpec, Rope  # noqa: E402

KERNELS = (Xla(), Tiles(query_rows=2))
DIFF = ("query", "key", "value", "bias")
OFFSET = 2**17  # large positions: angles of ~1e5 rad, where float32 angles would be off by ~1e-2 (ROPE-9)
#: float64 agreement with the reference, relative to the largest |truth| of each output
RTOL64 = 1e-12


def _max_error(got, truth) -> float:
    """max |got - truth| relative to max(1, max |truth|)."""
    truth = np.asarray(truth, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - truth), initial=0.0)) / max(
        1.0, float(np.max(np.abs(truth), initial=0.0))
    )


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _every_kernel(spec_, kernels_, grads: bool, params, diff, other, g):
    """{"out", "weights", "grad/<name>"...} of each kernel: one compiled program per configuration."""
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

        if not grads:
            out, weights = f(params, diff)
            results.append({"out": out, "weights": weights})
            continue
        out, pullback, weights = jax.vjp(f, params, diff, has_aux=True)
        g_params, g_diff = pullback(g)
        results.append({"out": out, "weights": weights, **{f"grad/{n}": a for n, a in {**g_params, **g_diff}.items()}})
    return results


def check_kernels(spec_, inputs: dict, grads: bool = True, seed: int = 0) -> float:
    """Both kernels against numpy_ref in float64 (out, weights and, with ``grads``, every gradient).

    Returns the largest relative error measured.
    """
    params = numpy_ref.init_params(spec_, seed)
    g = np.random.default_rng(seed + 1).normal(size=inputs["query"].shape)
    kw = {n: a for n, a in inputs.items() if n not in ("query", "key", "value")}
    out, weights = numpy_ref.attention(
        spec_, params, inputs["query"], inputs["key"], inputs["value"], **kw, return_weights=True
    )
    truth = {"out": out, "weights": weights}
    if grads:
        vjp = numpy_ref.attention_vjp(spec_, params, inputs["query"], inputs["key"], inputs["value"], g, **kw)
        truth.update({f"grad/{n}": a for n, a in vjp.items()})
    diff = {n: jnp.asarray(a) for n, a in inputs.items() if n in DIFF}
    other = {n: jnp.asarray(a) for n, a in inputs.items() if n not in DIFF}
    results = _every_kernel(
        spec_, KERNELS, grads, {n: jnp.asarray(a) for n, a in params.items()}, diff, other, jnp.asarray(g)
    )
    worst = 0.0
    for kernel, got in zip(KERNELS, results):
        assert sorted(got) == sorted(truth), kernel
        for n in truth:
            error = _max_error(got[n], truth[n])
            assert error <= RTOL64, f"{kernel.name}: {n} off by {error:.3g} (relative) > {RTOL64}"
            worst = max(worst, error)
    return worst


def _inputs(rng, spec_, B, Lq, Lk, **extra) -> dict:
    D = spec_.model_dim
    x = {
        "query": rng.normal(size=(B, Lq, D)),
        "key": rng.normal(size=(B, Lk, D)),
        "value": rng.normal(size=(B, Lk, D)),
    }
    return {**x, **extra}


def _keep(rng, spec_, B, Lq, Lk):
    return rng.random((B, spec_.num_heads, Lq, Lk)) >= spec_.dropout


# ---------------------------------------------------------------- both kernels against the reference
def case_gqa_decoding():
    """Half layout, r = d, GQA (H = 4, Hkv = 2), causal, (B, L) positions bottom-right, mask, bias, dropout."""
    s = AttentionSpec(4, 8, relative=Rope(), num_kv_heads=2, causal=True, dropout=0.25)
    rng = np.random.default_rng(10)
    B, Lq, Lk = 2, 3, 7
    k_pos = np.array([np.arange(Lk), np.arange(Lk) + 6])
    q_pos = k_pos[:, Lk - Lq :]  # decoding with a cache: the last Lq keys' positions (POS-4)
    mask = rng.random((B, 1, Lq, Lk)) < 0.8
    mask[1, 0, 0] = False  # a fully masked row: exact zeros (MASK-5)
    return s, _inputs(
        rng,
        s,
        B,
        Lq,
        Lk,
        mask=mask,
        bias=rng.normal(size=(1, 4, Lq, Lk)),
        q_positions=q_pos,
        k_positions=k_pos,
        dropout_keep=_keep(rng, s, B, Lq, Lk),
    )


def case_interleaved_partial_large_positions():
    """Interleaved layout, r = 4 of d = 8, attention factor 1.5, (L,) positions from 2**17, a rank-2 mask."""
    s = AttentionSpec(2, 8, relative=Rope(rotary_dim=4, layout="interleaved", attention_factor=1.5))
    rng = np.random.default_rng(11)
    B, Lq, Lk = 2, 5, 6
    return s, _inputs(
        rng,
        s,
        B,
        Lq,
        Lk,
        mask=rng.random((Lq, Lk)) < 0.7,
        q_positions=OFFSET + np.array([0, 3, 1, 7, 2]),
        k_positions=OFFSET + np.arange(Lk),
    )


def case_inv_freq_zeros_causal_tiles():
    """Explicit inv_freq with zeros (r = 6 of d = 8), attention factor 0.8, plain causal (cut into tiles), dropout."""
    s = AttentionSpec(2, 8, relative=Rope(inv_freq=(1.0, 0.0, 0.25), attention_factor=0.8), causal=True, dropout=0.1)
    rng = np.random.default_rng(12)
    B, L = 2, 5
    return s, _inputs(rng, s, B, L, L, dropout_keep=_keep(rng, s, B, L, L))


def case_mqa_value_head_dim_per_batch_positions():
    """Interleaved, r = d, MQA (Hkv = 1), dv = 6, no projection biases, (B, L) positions near 2**17, -inf biases."""
    s = AttentionSpec(2, 8, bias=False, relative=Rope(layout="interleaved"), num_kv_heads=1, value_head_dim=6)
    rng = np.random.default_rng(13)
    B, Lq, Lk = 2, 4, 6
    bias = rng.normal(size=(B, 1, Lq, Lk))
    bias[0, 0, 1, 2] = bias[1, 0, 3, :] = -np.inf  # a disallowed key, a fully disallowed row (BIAS-2)
    return s, _inputs(
        rng,
        s,
        B,
        Lq,
        Lk,
        bias=bias,
        q_positions=OFFSET + rng.integers(0, 50, size=(B, Lq)),
        k_positions=OFFSET + rng.integers(0, 50, size=(B, Lk)),
    )


CASES = {
    "gqa-decoding": case_gqa_decoding,
    "interleaved-partial-large-positions": case_interleaved_partial_large_positions,
    "inv-freq-zeros-causal-tiles": case_inv_freq_zeros_causal_tiles,
    "mqa-dv-per-batch-positions": case_mqa_value_head_dim_per_batch_positions,
}


@pytest.mark.parametrize("name", CASES)
def test_kernels_and_gradients_match_reference(name):
    s, inputs = CASES[name]()
    check_kernels(s, inputs)


#: Each frequency constructor (ROPE-12..ROPE-16), d = 8, both layouts among them.
CONSTRUCTORS = {
    "linear": Rope.linear(4.0, rotary_dim=8),
    "ntk": Rope.ntk(8.0, rotary_dim=8, layout="interleaved"),
    "yarn": Rope.yarn(4.0, 64, rotary_dim=6),
    "llama3": Rope.llama3(8.0, 1.0, 4.0, 64, rotary_dim=8, layout="interleaved"),
    "proportional": Rope.proportional(0.5, rotary_dim=8),
}


@pytest.mark.parametrize("name", CONSTRUCTORS)
def test_constructors_match_reference(name):
    """Forward and weights of each constructor's Rope at positions near 2**17, per batch (ROPE-12..ROPE-16)."""
    s = AttentionSpec(2, 8, relative=CONSTRUCTORS[name], causal=True)
    rng = np.random.default_rng(14)
    B, Lq, Lk = 2, 4, 6
    k_pos = OFFSET + np.array([np.arange(Lk) * 37, np.arange(Lk) * 1000])
    inputs = _inputs(rng, s, B, Lq, Lk, q_positions=k_pos[:, Lk - Lq :], k_positions=k_pos)
    check_kernels(s, inputs, grads=name == "yarn")  # yarn: attention factor != 1 and r < d, with gradients


def test_shifting_every_position_changes_nothing():
    """ROPE-6: the logits depend on positions only through k_pos - q_pos (up to float64 rounding)."""
    s, inputs = case_interleaved_partial_large_positions()
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(s, 0).items()}
    f = jax.jit(functools.partial(jax_impl.attention, s, params, implementation="xla"))
    x = [jnp.asarray(inputs[n]) for n in ("query", "key", "value")]
    mask = jnp.asarray(inputs["mask"])
    base = f(*x, mask=mask, q_positions=inputs["q_positions"] - OFFSET, k_positions=inputs["k_positions"] - OFFSET)
    shifted = f(*x, mask=mask, q_positions=inputs["q_positions"] + 999, k_positions=inputs["k_positions"] + 999)
    assert _max_error(shifted, base) < 1e-10


# ---------------------------------------------------------------- the hook itself
def _reference_rotation(scheme, x, positions):
    """numpy_ref's ROPE-5 rotation of x (B, heads, L, d) at positions (1|B, L), in float64."""
    d = x.shape[-1]
    first, second = ref_rope.pairs(scheme, d)
    a = ref_rope.angles(scheme, np.asarray(positions), d)
    af = scheme.attention_factor
    return ref_rope.rotate(np.asarray(x, np.float64), first, second, af * np.cos(a), af * np.sin(a))


@functools.partial(jax.jit, static_argnums=0)
def _hook(scheme, q, k, q_positions, k_positions):
    """The qk_transform hook, compiled once per scheme and shape."""
    return rope.qk_transform(scheme, {}, q, k, q_positions, k_positions)


HOOK_SCHEMES = [Rope(), Rope(layout="interleaved", rotary_dim=6, attention_factor=2.0), CONSTRUCTORS["yarn"]]


@pytest.mark.parametrize("scheme", HOOK_SCHEMES, ids=["half", "interleaved-partial-af", "yarn"])
def test_hook_rotates_q_and_grouped_k_like_the_reference(scheme):
    """qk_transform: q (B, H, Lq, d) and k (B, Hkv, Lk, d) at their own positions; (L,) and (B, L) positions."""
    rng = np.random.default_rng(15)
    q, k = rng.normal(size=(2, 4, 3, 8)), rng.normal(size=(2, 1, 5, 8))
    q_pos, k_pos = OFFSET + np.array([[3, 1, 4]]), OFFSET + rng.integers(0, 9, size=(2, 5))
    got_q, got_k = _hook(scheme, jnp.asarray(q), jnp.asarray(k), jnp.asarray(q_pos), jnp.asarray(k_pos))
    assert got_q.dtype == got_k.dtype == jnp.float64
    assert _max_error(got_q, _reference_rotation(scheme, q, q_pos)) < RTOL64
    assert _max_error(got_k, _reference_rotation(scheme, k, k_pos)) < RTOL64


def test_unrotated_channels_pass_unchanged_and_unscaled():
    """ROPE-2, ROPE-7: channels r .. d - 1 are bit-identical to the input, whatever the attention factor."""
    scheme = Rope(rotary_dim=2, attention_factor=3.0)
    x = jnp.asarray(np.random.default_rng(16).normal(size=(1, 2, 4, 8)))
    pos = jnp.arange(4)[None] + 5
    q, k = _hook(scheme, x, x, pos, pos)
    np.testing.assert_array_equal(np.asarray(q[..., 2:]), np.asarray(x[..., 2:]))
    np.testing.assert_array_equal(np.asarray(k[..., 2:]), np.asarray(x[..., 2:]))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sixteen_bit_inputs_rotate_in_float32_and_round_once(dtype):
    """PREC-4: a 16-bit q is rotated in float32 and rounded once: within half an ulp of the truth (+ float32 noise)."""
    scheme = Rope(layout="interleaved", attention_factor=1.25)
    x16 = jnp.asarray(np.random.default_rng(17).normal(size=(2, 2, 6, 8)), dtype)
    pos = jnp.asarray(OFFSET + np.arange(6)[None])
    got, _ = _hook(scheme, x16, x16, pos, pos)
    assert got.dtype == x16.dtype
    truth = _reference_rotation(scheme, np.asarray(x16.astype(jnp.float64)), np.asarray(pos))
    mantissa = {"bfloat16": 7, "float16": 10}[dtype]
    half_ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(truth), 2.0**-14))) - mantissa - 1)
    error = np.abs(np.asarray(got.astype(jnp.float64)) - truth)
    assert np.all(error <= half_ulp * (1 + 1e-3) + 1e-6), float(np.max(error / half_ulp))


def test_float32_inputs_take_their_angles_in_float64_under_x64():
    """ROPE-9: at positions near 2**17 float32 q, k are rotated by float64 angles (float32 angles err by ~1e-2)."""
    scheme = Rope()
    x = np.random.default_rng(18).normal(size=(1, 2, 5, 8)).astype(np.float32)
    pos = OFFSET + 12345 + np.arange(5)[None]
    got, _ = _hook(scheme, jnp.asarray(x), jnp.asarray(x), jnp.asarray(pos), jnp.asarray(pos))
    assert got.dtype == jnp.float32
    assert _max_error(got, _reference_rotation(scheme, x, pos)) < 1e-6


def test_without_x64_angles_are_float32():
    """Without jax_enable_x64 the widest float is float32; small positions still match the reference in float32."""
    scheme = Rope(layout="interleaved")
    x = np.random.default_rng(19).normal(size=(1, 2, 5, 8)).astype(np.float32)
    pos = np.arange(5, dtype=np.int32)[None]
    with jax.enable_x64(False):
        assert rope.angle_dtype() == jnp.float32
        cos, _ = rope.rotation(scheme, jnp.asarray(pos), 8)
        got, _ = _hook(scheme, jnp.asarray(x), jnp.asarray(x), jnp.asarray(pos), jnp.asarray(pos))
    assert cos.dtype == got.dtype == jnp.float32
    assert _max_error(got, _reference_rotation(scheme, x, pos)) < 1e-6


def test_hook_has_no_gather_and_positions_do_not_recompile():
    """Slices and reshapes, no gather (both layouts); new position values reuse the compiled program."""
    x = jnp.zeros((2, 2, 5, 8))
    for scheme in (Rope(rotary_dim=6), Rope(layout="interleaved")):
        jaxpr = str(
            jax.make_jaxpr(functools.partial(rope.qk_transform, scheme, {}))(
                x, x, jnp.arange(5)[None], jnp.arange(5)[None]
            )
        )
        assert "gather" not in jaxpr, jaxpr
    s = AttentionSpec(2, 8, relative=Rope())
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(s, 0).items()}
    f = jax.jit(functools.partial(jax_impl.attention, s, params))
    q = jnp.ones((2, 5, 16))
    for offset in (0, 7, OFFSET):
        f(q, q_positions=jnp.arange(5) + offset, k_positions=jnp.arange(5) + offset).block_until_ready()
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


@pytest.mark.parametrize("kernel", KERNELS, ids=str)
def test_no_kernel_builds_anything_of_shape_lq_lk_d(kernel):
    """Forward and backward with RoPE: rotations of (B, heads, L, d), logits (B, H, Lq, Lk), nothing (Lq, Lk, d)."""
    Lq, Lk, d_ = 7, 5, 6
    s = AttentionSpec(2, d_, relative=Rope(layout="interleaved"), num_kv_heads=1, causal=True)
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(s, 0).items()}
    x, kv = jnp.zeros((1, Lq, s.model_dim)), jnp.zeros((1, Lk, s.model_dim))

    def loss(params, x, kv):
        return jnp.sum(jax_impl.attention(s, params, x, kv, q_positions=jnp.arange(Lq), implementation=kernel))

    shapes = set(_shapes(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(params, x, kv).jaxpr))
    assert (1, 2, Lq, Lk) in shapes  # the walk sees the logits
    assert not [t for t in shapes if any(t[i : i + 3] == (Lq, Lk, d_) for i in range(len(t)))]


def test_registry_finds_rope_for_both_kernels():
    """REL-4: "rope" names this module; its one hook serves xla and tiles (no tiled hooks needed)."""
    assert schemes.module_for(Rope()) is rope
    assert schemes.missing_tiled(Rope()) == []
    assert schemes.plain_hooks(Rope()).key_term is None
    s = AttentionSpec(2, 8, relative=Rope(), causal=True)
    assert jax_impl.kernels.resolve(None, s, jax_impl.kernels.Call.of(jnp.zeros((1, 4, 16)))) == Tiles()


# ---------------------------------------------------------------- the Flax NNX module
def test_module_with_rope_matches_reference():
    """MultiHeadAttention(spec with Rope): own and loaded canonical parameters, forward against numpy_ref."""
    s = AttentionSpec(4, 8, relative=Rope(rotary_dim=6, layout="interleaved"), num_kv_heads=2, causal=True)
    m = jax_impl.MultiHeadAttention(s, rngs=nnx.Rngs(0), dtype=jnp.float64)
    own = m.canonical_params()
    assert sorted(own) == sorted(s.param_shapes())  # no tables (ROPE-1)
    rng = np.random.default_rng(20)
    x = rng.normal(size=(2, 5, 32))
    pos = OFFSET + np.array([[0, 1, 2, 3, 4], [9, 10, 11, 12, 13]])
    forward = nnx.jit(lambda m, x, p: m(x, q_positions=p, k_positions=p))
    got = forward(m, jnp.asarray(x), jnp.asarray(pos))
    assert _max_error(got, numpy_ref.attention(s, own, x, q_positions=pos, k_positions=pos)) < RTOL64
    params = numpy_ref.init_params(s, 3)
    m.load_canonical({n: jnp.asarray(a) for n, a in params.items()})
    got = forward(m, jnp.asarray(x), jnp.asarray(pos))
    assert _max_error(got, numpy_ref.attention(s, params, x, q_positions=pos, k_positions=pos)) < RTOL64
    with pytest.raises(
        ValueError, match=r"spec\.relative: expected None \(nnx\.MultiHeadAttention cannot express it\)"
    ):
        jax_impl.to_flax_mha(s, params)  # Flax's own module has no rotation
