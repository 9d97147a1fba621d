"""RoPE in the reference, against hand derivation (ROPE-1..ROPE-11).

The rotation is checked on its own (``numpy_ref.apply_rope``) against the
2x2 rotation written out per pair, and inside attention against the closed
form of ROPE-6 (a logit from the distance alone), the layout permutation
(ROPE-8) with grouped heads, the attention factor (ROPE-7), the untouched
values (ROPE-1) and the decoding rule (ROPE-10).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import numpy_ref
from spec import AttentionSpec, Rope, dynamic_ntk_alpha, rope_permutation


def _by_hand(x, pos, freqs, layout, af=1.0):
    """ROPE-3..ROPE-7 written out: each pair (a, b) of x (d,) at position pos turned by pos * f."""
    out = [float(v) for v in x]
    half = len(freqs)
    for c, f in enumerate(freqs):
        a, b = (c, c + half) if layout == "half" else (2 * c, 2 * c + 1)
        t = pos * f
        out[a] = af * (x[a] * math.cos(t) - x[b] * math.sin(t))
        out[b] = af * (x[a] * math.sin(t) + x[b] * math.cos(t))
    return out


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(
    "rope", [Rope(), Rope(rotary_dim=4, theta=50.0), Rope(inv_freq=(0.7, 0.0), attention_factor=1.3)]
)
def test_apply_rope_is_the_pairwise_rotation(rope, layout):
    rope = Rope(rope.theta, rope.rotary_dim, layout, rope.inv_freq, rope.attention_factor)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 6))
    before = x.copy()
    pos = np.array([0, 1, 7, -3, 2**17])
    got = numpy_ref.apply_rope(rope, x, pos)
    freqs = rope.frequencies(6)
    want = [_by_hand(x[i], int(pos[i]), freqs, layout, rope.attention_factor) for i in range(5)]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert np.array_equal(x, before), "apply_rope wrote into its input"
    r = rope.rotated(6)
    np.testing.assert_array_equal(got[:, r:], x[:, r:])  # ROPE-2: the other channels pass unchanged


def test_apply_rope_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"apply_rope: expected x \(\.\.\., L, d\) and integer positions \(L,\)"):
        numpy_ref.apply_rope(Rope(), np.zeros((3, 4)), np.arange(2))
    with pytest.raises(ValueError, match=r"apply_rope: expected x .* of dtype float64"):
        numpy_ref.apply_rope(Rope(), np.zeros((3, 4)), np.arange(3.0))
    with pytest.raises(ValueError, match=r"Rope.rotary_dim: expected an even int <= head_dim = 4"):
        numpy_ref.apply_rope(Rope(rotary_dim=6), np.zeros((3, 4)), np.arange(3))


def test_logits_follow_the_closed_form_of_the_distance():
    """ROPE-6: with identity projections one head's logit is s * sum_c [dot cos(delta f) + cross sin(delta f)]."""
    rope = Rope(theta=30.0)
    spec = AttentionSpec(num_heads=1, head_dim=4, relative=rope, bias=False, scale=1.0)
    p = numpy_ref.identity_params(spec)
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(1, 3, 4)), rng.normal(size=(1, 4, 4))
    qp, kp = np.array([5, 9, 2]), np.array([0, 3, 9, 4])
    _, w = numpy_ref.attention(spec, p, q, k, k, q_positions=qp, k_positions=kp, return_weights=True)
    f = rope.frequencies(4)
    logits = np.zeros((3, 4))
    for i in range(3):
        for j in range(4):
            delta = kp[j] - qp[i]
            for c in range(2):
                xq, yq, xk, yk = q[0, i, c], q[0, i, c + 2], k[0, j, c], k[0, j, c + 2]
                t = delta * f[c]
                logits[i, j] += (xq * xk + yq * yk) * math.cos(t) + (yq * xk - xq * yk) * math.sin(t)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(w[0, 0], e / e.sum(-1, keepdims=True), rtol=0, atol=1e-13)


def test_the_values_are_not_rotated():
    """ROPE-1: with one key the output is that key's value, whatever the positions."""
    spec = AttentionSpec(num_heads=2, head_dim=4, relative=Rope())
    p = numpy_ref.init_params(spec, seed=2)
    rng = np.random.default_rng(2)
    q, kv = rng.normal(size=(1, 2, 8)), rng.normal(size=(1, 1, 8))
    out = numpy_ref.attention(spec, p, q, kv, kv, q_positions=np.array([3, 40]), k_positions=np.array([17]))
    v = kv[0, 0] @ p["wv"] + p["bv"]
    np.testing.assert_allclose(out[0], np.broadcast_to(v @ p["wo"] + p["bo"], (2, 8)), rtol=0, atol=1e-12)


def test_attention_factor_multiplies_the_rotated_logits_by_its_square():
    """ROPE-7: af on q and on k is af**2 on the rotated part: with every channel rotated, scale * af**2."""
    base = AttentionSpec(num_heads=2, head_dim=4, relative=Rope(), num_kv_heads=1)
    af = AttentionSpec(num_heads=2, head_dim=4, relative=Rope(attention_factor=1.5), num_kv_heads=1)
    scaled = AttentionSpec(num_heads=2, head_dim=4, relative=Rope(), num_kv_heads=1, scale=2.25 / 2.0)
    p = numpy_ref.init_params(base, seed=3)
    x = np.random.default_rng(3).normal(size=(2, 5, 8))
    np.testing.assert_allclose(numpy_ref.attention(af, p, x), numpy_ref.attention(scaled, p, x), rtol=0, atol=1e-12)
    assert np.abs(numpy_ref.attention(af, p, x) - numpy_ref.attention(base, p, x)).max() > 1e-3


@pytest.mark.parametrize("rotary_dim", [None, 2, 4])
def test_layout_permutation_converts_weights_with_grouped_heads(rotary_dim):
    """ROPE-8: wq with H heads, wk with Hkv heads, each permuted within its heads' rotated channels."""
    kw = dict(num_heads=4, head_dim=6, num_kv_heads=2)
    half = AttentionSpec(**kw, relative=Rope(rotary_dim=rotary_dim or 6))
    inter = AttentionSpec(**kw, relative=Rope(rotary_dim=rotary_dim or 6, layout="interleaved"))
    p = numpy_ref.init_params(inter, seed=4)
    pq, pk = (np.array(rope_permutation(h, 6, rotary_dim)) for h in (4, 2))
    ph = dict(p, wq=p["wq"][:, pq], bq=p["bq"][pq], wk=p["wk"][:, pk], bk=p["bk"][pk])
    rng = np.random.default_rng(4)
    x, kv = rng.normal(size=(2, 3, 24)), rng.normal(size=(2, 5, 24))
    kwargs = dict(q_positions=np.array([[4, 5, 6], [0, 9, 1]]), k_positions=np.arange(5))
    np.testing.assert_allclose(
        numpy_ref.attention(inter, p, x, kv, **kwargs), numpy_ref.attention(half, ph, x, kv, **kwargs), atol=1e-12
    )
    back = {n: ph[n][:, np.argsort(pq)] if n == "wq" else ph[n] for n in ph}
    np.testing.assert_array_equal(back["wq"], p["wq"])  # argsort(perm) converts back


def test_prefill_then_steps_is_the_full_forward():
    """ROPE-10, POS-3: 3 prefilled queries then 3 steps of one query, against the keys seen so far."""
    spec = AttentionSpec(num_heads=2, head_dim=4, causal=True, relative=Rope.yarn(4.0, 8, rotary_dim=4))
    p = numpy_ref.init_params(spec, seed=5)
    x = np.random.default_rng(5).normal(size=(1, 6, 8))
    full = numpy_ref.attention(spec, p, x)
    rows = [numpy_ref.attention(spec, p, x[:, :3])]
    for t in range(3, 6):
        rows.append(numpy_ref.attention(spec, p, x[:, t : t + 1], x[:, : t + 1], q_positions=np.array([t])))
    np.testing.assert_allclose(np.concatenate(rows, axis=1), full, rtol=0, atol=1e-13)


def test_dynamic_ntk_is_a_rope_per_context_length():
    """ROPE-11: below the original length the Rope is unscaled; above it the NTK base grows with L."""
    assert dynamic_ntk_alpha(4.0, 1024, 512) == 1.0
    short, long = (Rope.ntk(dynamic_ntk_alpha(4.0, 1024, n), rotary_dim=8) for n in (2048, 4096))
    assert short.inv_freq[0] == long.inv_freq[0] == 1.0
    assert all(a > b for a, b in zip(short.inv_freq[1:], long.inv_freq[1:]))
    # the same query-key pair gets other logits when the call is longer: not a fixed Rope (POS-4 fails)
    assert Rope.ntk(1.0, rotary_dim=8).inv_freq == Rope(rotary_dim=8).frequencies(8)
