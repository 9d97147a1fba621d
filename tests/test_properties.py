"""Properties the rules imply, checked on the reference over random calls."""

from dataclasses import replace

import numpy as np
import pytest
from _random_calls import random_call
from hypothesis import given
from hypothesis import strategies as st

import numpy_ref
from spec import AttentionSpec, Huang, Shaw

seeds = st.integers(0, 2**32 - 1)


def run(call, **overrides):
    kw = {**call.kwargs, **overrides}
    kw = {k: v for k, v in kw.items() if v is not None}
    return numpy_ref.attention(*call.args(), **kw, return_weights=True)


@given(seeds, st.integers(-50, 50))
def test_pos4_shift_invariance(seed, shift):
    call = random_call(seed)
    Lq, Lk = call.query.shape[1], call.key.shape[1]
    qp = call.kwargs.get("q_positions", np.arange(Lq))
    kp = call.kwargs.get("k_positions", np.arange(Lk))
    scheme = call.spec.relative
    if scheme is not None and scheme.name == "swin":
        # POS-4's exception (SWIN-6): without prefix tokens, only whole rows of the window are a shift
        if scheme.prefix_tokens:
            return
        shift *= scheme.window[1]
    out, w = run(call, q_positions=qp, k_positions=kp)
    out2, w2 = run(call, q_positions=np.asarray(qp) + shift, k_positions=np.asarray(kp) + shift)
    if call.spec.relative is not None and call.spec.relative.name == "rope":
        # ROPE-6: exact in exact arithmetic; in float64 up to the rounding of the angles p * f_c (|p| < 70 here)
        np.testing.assert_allclose(w, w2, rtol=0, atol=1e-12)
        np.testing.assert_allclose(out, out2, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(w == 0, w2 == 0)  # the same keys are allowed: exactly
        return
    np.testing.assert_array_equal(w, w2)
    np.testing.assert_array_equal(out, out2)


@given(seeds, st.integers(1, 5))
def test_huang5_huang_equals_shaw_keys_only_when_distances_fit(seed, M):
    huang = AttentionSpec(2, 2, relative=Huang(M, per_head=False))
    shaw = replace(huang, relative=Shaw(M - 1, values=False))
    call = random_call(seed, spec=huang, max_len=M)  # |delta| <= M - 1 with default positions
    call.kwargs.pop("q_positions", None), call.kwargs.pop("k_positions", None)
    out_h, w_h = run(call)
    call.spec = shaw
    out_s, w_s = run(call)
    np.testing.assert_allclose(w_h, w_s, rtol=0, atol=1e-14)
    np.testing.assert_allclose(out_h, out_s, rtol=0, atol=1e-14)


@given(seeds)
def test_causal1_default_positions_equal_lower_triangular_mask(seed):
    call = random_call(seed, cross=True)
    for name in ("q_positions", "k_positions", "mask", "bias"):
        call.kwargs.pop(name, None)
    Lq, Lk = call.query.shape[1], call.key.shape[1]
    call.spec = replace(call.spec, causal=True)
    out_c, w_c = run(call)
    call.spec = replace(call.spec, causal=False)
    out_m, w_m = run(call, mask=np.tril(np.ones((Lq, Lk), dtype=bool)))
    np.testing.assert_array_equal(w_c, w_m)
    np.testing.assert_array_equal(out_c, out_m)


@given(seeds)
def test_pos3_bottom_right_causal_through_offset_positions(seed):
    call = random_call(seed, cross=True)
    for name in ("q_positions", "k_positions", "mask", "bias"):
        call.kwargs.pop(name, None)
    Lq, Lk = call.query.shape[1], call.key.shape[1]
    # the window follows the positions too (WINDOW-1): this property is about causality alone
    call.spec = replace(call.spec, causal=True, relative=None, window=None)
    call.params = {n: a for n, a in call.params.items() if not n.startswith("rel")}
    out_c, w_c = run(call, q_positions=np.arange(Lk - Lq, Lk))
    call.spec = replace(call.spec, causal=False)
    out_m, w_m = run(call, mask=np.tril(np.ones((Lq, Lk), dtype=bool), k=Lk - Lq))
    np.testing.assert_array_equal(w_c, w_m)
    np.testing.assert_array_equal(out_c, out_m)


@given(seeds)
def test_mask5_fully_masked_row_is_exactly_zero_with_zero_gradients(seed):
    call = random_call(seed, cross=True)
    call.spec = replace(call.spec, mask_fill=None)
    call.key, call.value = call.key.copy(), call.value.copy()
    B, Lq, Lk = call.query.shape[0], call.query.shape[1], call.key.shape[1]
    mask = np.ones((B, 1, Lq, Lk), dtype=bool)
    mask[:, :, 0, :] = False  # query 0 may attend nothing, in every head
    kw = {k: v for k, v in call.kwargs.items() if k != "mask"}
    if "bias" in kw:  # full shape, so that row 0 has its own bias gradient
        kw["bias"] = np.broadcast_to(kw["bias"], (B, call.spec.num_heads, Lq, Lk)).copy()
    out, w = numpy_ref.attention(*call.args(), **kw, mask=mask, return_weights=True)
    assert np.all(w[:, :, 0, :] == 0.0)
    bo = call.params.get("bo", np.zeros(call.spec.model_dim))
    assert np.all(out[:, 0, :] == bo)  # exactly bo: the attention output of the row is 0
    g = np.random.default_rng(seed).normal(size=out.shape)
    grads = numpy_ref.attention_vjp(*call.args(), g, **kw, mask=mask)
    assert all(np.isfinite(v).all() for v in grads.values())
    assert np.all(grads["query"][:, 0, :] == 0.0)
    if "bias" in kw:
        assert np.all(grads["bias"][:, :, 0, :] == 0.0)


@pytest.mark.parametrize("poison", [1e6, np.nan, np.inf])
@given(seed=seeds)
def test_mask7_dead_keys_change_nothing(poison, seed):
    call = random_call(seed, cross=True)
    call.spec = replace(call.spec, mask_fill=None)
    call.key, call.value = call.key.copy(), call.value.copy()
    B, Lk = call.key.shape[0], call.key.shape[1]
    pad = np.zeros((B, 1, 1, Lk), dtype=bool)
    pad[..., : max(1, Lk - 1)] = True  # the last key is padding when Lk > 1
    kw = {k: v for k, v in call.kwargs.items() if k != "mask"}
    g = np.random.default_rng(seed).normal(size=call.query.shape)
    out, w = numpy_ref.attention(*call.args(), **kw, mask=pad, return_weights=True)
    grads = numpy_ref.attention_vjp(*call.args(), g, **kw, mask=pad)
    dead = ~pad[:, 0, 0, :]
    key, value = call.key.copy(), call.value.copy()
    key[dead], value[dead] = poison, poison
    out_p, w_p = numpy_ref.attention(
        call.spec, call.params, call.query, key, value, **kw, mask=pad, return_weights=True
    )
    grads_p = numpy_ref.attention_vjp(call.spec, call.params, call.query, key, value, g, **kw, mask=pad)
    np.testing.assert_array_equal(out, out_p)
    np.testing.assert_array_equal(w, w_p)
    for name in grads:
        np.testing.assert_array_equal(grads[name], grads_p[name], err_msg=name)


@given(seeds)
def test_bias2_minus_inf_bias_equals_false_mask(seed):
    call = random_call(seed)
    B, Lq, Lk = call.query.shape[0], call.query.shape[1], call.key.shape[1]
    kw = {k: v for k, v in call.kwargs.items() if k not in ("mask", "bias")}
    mask = np.random.default_rng(seed).random((B, 1, Lq, Lk)) < 0.7
    out_m, w_m = numpy_ref.attention(*call.args(), **kw, mask=mask, return_weights=True)
    bias = np.where(mask, 0.0, -np.inf)
    out_b, w_b = numpy_ref.attention(*call.args(), **kw, bias=bias, return_weights=True)
    np.testing.assert_array_equal(w_m, w_b)
    np.testing.assert_array_equal(out_m, out_b)


@given(seeds)
def test_mask1_every_broadcast_form_agrees_with_the_full_mask(seed):
    call = random_call(seed)
    mask = call.kwargs.get("mask")
    if mask is None:
        return
    B, H, Lq, Lk = call.query.shape[0], call.spec.num_heads, call.query.shape[1], call.key.shape[1]
    out, w = run(call)
    out_full, w_full = run(call, mask=np.broadcast_to(mask, (B, H, Lq, Lk)).copy())
    np.testing.assert_array_equal(w, w_full)
    np.testing.assert_array_equal(out, out_full)


@given(seeds)
def test_softmax1_weights_are_a_distribution_over_allowed_keys(seed):
    call = random_call(seed)
    _, w = run(call)
    sums = w.sum(axis=-1)
    assert np.all((np.abs(sums - 1) < 1e-12) | (sums == 0))
    assert np.all(w >= 0)


def test_huang4_reference_memory_stays_far_below_lq_lk_d():
    """The reference never builds (Lq, Lk, d): tracemalloc sees NumPy's allocations."""
    import tracemalloc

    L, d = 384, 64
    lqlkd = L * L * d * 8
    rng = np.random.default_rng(0)
    for rel in (Shaw(16), Huang(L), Huang(L // 4, per_head=False)):
        spec = AttentionSpec(1, d, relative=rel)
        p = numpy_ref.init_params(spec, 0)
        x = rng.normal(size=(1, L, d))
        for kw in ({}, {"q_positions": rng.permutation(L)}):  # skew path, gather path
            tracemalloc.start()
            numpy_ref.attention(spec, p, x, **kw)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert peak < lqlkd / 4, (rel, list(kw), peak, lqlkd)
