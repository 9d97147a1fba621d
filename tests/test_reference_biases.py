"""ALiBi, T5 buckets and Swin windows: the spec objects and the float64 reference (ALIBI-*, T5-*, SWIN-*, POS-5).

Expected values come from hand derivation and from independent
transcriptions of the libraries' own constructions (the Press et al.
recursion, the T5 logarithm in float64, timm's meshgrid index), never from
the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import numpy_ref
from numpy_ref import definition
from numpy_ref.schemes import swin as swin_rows
from spec import Alibi, AttentionSpec, Swin, T5Bias, alibi_slopes, swin_positions, t5_bucket


# ------------------------------------------------------------------ ALiBi slopes (ALIBI-2)
def press_recursion(n: int) -> list:
    """The slopes as the paper's code writes them (start = ratio = 2^(-8/n) for a power of two)."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + press_recursion(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("H", [1, 2, 3, 5, 8, 12, 16, 40, 64])
def test_slopes_are_the_papers(H):
    # the recursion rounds start * start**i; the spec's 2 ** (-8k / c) is one correctly rounded power
    np.testing.assert_allclose(alibi_slopes(H), press_recursion(H), rtol=4e-15, atol=0)


def test_slopes_by_hand():
    assert alibi_slopes(8) == tuple(2.0**-k for k in range(1, 9))
    assert alibi_slopes(5) == (0.25, 2.0**-4, 2.0**-6, 2.0**-8, 0.5)  # 4 of H=4, then k=1 of H=8
    assert alibi_slopes(4, max_bias=4.0) == (2**-1, 2**-2, 2**-3, 2**-4)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: alibi_slopes(0), ValueError, r"alibi_slopes.num_heads: expected an int >= 1, got 0"),
        (lambda: alibi_slopes(2, max_bias=0.0), ValueError, r"alibi_slopes.max_bias: expected a finite number > 0"),
        (lambda: Alibi(slopes=(0.5, -0.1)), ValueError, r"Alibi.slopes\[1\]: expected a finite number >= 0"),
        (lambda: Alibi(slopes=()), TypeError, r"Alibi.slopes: expected None or a non-empty sequence"),
        (lambda: Alibi(slopes="ab"), TypeError, r"Alibi.slopes: expected None or a non-empty sequence"),
        (lambda: Alibi(symmetric=1), TypeError, r"Alibi.symmetric: expected a bool, got 1"),
        (lambda: Alibi(max_bias=float("inf")), ValueError, r"Alibi.max_bias: expected a finite number > 0"),
        (
            lambda: AttentionSpec(num_heads=3, head_dim=2, relative=Alibi(slopes=(0.5, 0.25))),
            ValueError,
            r"Alibi.slopes: expected one slope per query head, num_heads = 3 \(ALIBI-2\), got 2",
        ),
    ],
)
def test_alibi_rejects_bad_fields(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_alibi_json_round_trip():
    from spec import scheme_from_json

    for a in (Alibi(), Alibi(slopes=(0.5, 0.0), symmetric=False), Alibi(max_bias=4.0)):
        assert scheme_from_json(a.to_json()) == a


# ------------------------------------------------------------------ T5 buckets (T5-2, T5-3, T5-4)
def t5_float64(delta: int, N: int, M: int, bidirectional: bool) -> int:
    """The bucket as Hugging Face writes it (float64 logarithm, truncation, min)."""
    ret = 0
    if bidirectional:
        N //= 2
        ret += N if delta > 0 else 0
        n = abs(delta)
    else:
        n = -min(delta, 0)
    exact = N // 2
    if n < exact:
        return ret + n
    large = exact + int(math.log(n / exact) / math.log(M / exact) * (N - exact))
    return ret + min(large, N - 1)


CONFIGS = [(32, 128, True), (32, 128, False), (8, 10, True), (8, 6, False), (6, 5, True), (16, 20, True), (4, 3, True)]


@pytest.mark.parametrize("N, M, bidirectional", CONFIGS)
def test_buckets_are_the_logarithm_for_every_distance_to_4M(N, M, bidirectional):
    deltas = range(-4 * M - 2, 4 * M + 3)
    expected = [t5_float64(d, N, M, bidirectional) for d in deltas]
    assert [t5_bucket(d, N, M, bidirectional) for d in deltas] == expected
    assert numpy_ref.t5_buckets(np.array(deltas), N, M, bidirectional).tolist() == expected


def test_buckets_by_hand():
    # 32 buckets, 128: e = 8 exact distances per side; the logs start at 8, thresholds 12, 16, 23, ...
    assert T5Bias().thresholds() == (12, 16, 23, 32, 46, 64, 91)
    assert [t5_bucket(d) for d in (-7, -8, -11, -12, -15, -16, -127, -128, -(10**9))] == [7, 8, 8, 9, 9, 10, 15, 15, 15]
    assert [t5_bucket(d) for d in (0, 1, 12, 10**9)] == [0, 17, 25, 31]  # a later key: the upper half
    assert [t5_bucket(d, bidirectional=False) for d in (1, 100, 0, -1)] == [0, 0, 0, 1]  # T5-2: future = bucket 0
    # a boundary that a float32 logarithm can miss: n = 16 is exactly e * (M / e) ** (1/4) with e = 8, M = 128
    assert t5_bucket(-16) == 10 and t5_bucket(-15) == 9


@pytest.mark.parametrize(
    "make, error, message",
    [
        (
            lambda: T5Bias(num_buckets=7),
            ValueError,
            r"T5Bias.num_buckets: expected an even int >= 4 when bidirectional",
        ),
        (
            lambda: T5Bias(num_buckets=2),
            ValueError,
            r"T5Bias.num_buckets: expected an even int >= 4 when bidirectional",
        ),
        (lambda: T5Bias(num_buckets=1, bidirectional=False), ValueError, r"T5Bias.num_buckets: expected an int >= 2"),
        (lambda: T5Bias(32, 8), ValueError, r"T5Bias.max_distance: expected an int > max_exact = 8 .*got 8"),
        (lambda: T5Bias(32, 16, False), ValueError, r"T5Bias.max_distance: expected an int > max_exact = 16"),
        (lambda: T5Bias(32.0), TypeError, r"T5Bias.num_buckets: expected an int >= 2, got 32.0 of type float"),
        (lambda: t5_bucket(1.5), TypeError, r"t5_bucket: expected delta to be an int"),
        (lambda: numpy_ref.t5_buckets(np.array([1.0])), TypeError, r"t5_buckets: expected delta to be an integer"),
    ],
)
def test_t5_rejects_degenerate_configurations(make, error, message):
    with pytest.raises(error, match=message):
        make()


# ------------------------------------------------------------------ Swin rows (SWIN-2, SWIN-3, SWIN-4)
def timm_index(Wh: int, Ww: int) -> np.ndarray:
    """timm's relative_position_index (query minus key), (N, N) over the window's row-major tokens."""
    coords = np.stack(np.meshgrid(np.arange(Wh), np.arange(Ww), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0)
    rel[:, :, 0] += Wh - 1
    rel[:, :, 1] += Ww - 1
    rel[:, :, 0] *= 2 * Ww - 1
    return rel.sum(-1)


def beit_index(Wh: int, Ww: int) -> np.ndarray:
    """BEiT's index with one class token in front: the window's timm index and three extra rows."""
    R0 = (2 * Wh - 1) * (2 * Ww - 1)
    index = np.zeros((Wh * Ww + 1,) * 2, dtype=np.int64)
    index[1:, 1:] = timm_index(Wh, Ww)
    index[0, 0:] = R0
    index[0:, 0] = R0 + 1
    index[0, 0] = R0 + 2
    return index


@pytest.mark.parametrize("window", [(3, 4), (4, 1), (1, 4), (2, 3), (7, 7), (1, 1)])
def test_rows_are_timms_index_reversed(window):
    Wh, Ww = window
    s = Swin(window)
    N, R0 = Wh * Ww, s.offset_rows
    ours = np.array([[s.row(i, j) for j in range(N)] for i in range(N)])
    assert np.array_equal(ours, R0 - 1 - timm_index(Wh, Ww))  # SWIN-3: key minus query = reversed
    pos = np.arange(N)[None]
    assert np.array_equal(swin_rows.rows(s, pos, pos)[0], ours)


@pytest.mark.parametrize("window", [(2, 2), (3, 4)])
def test_prefix_rows_are_beits(window):
    Wh, Ww = window
    s = Swin(window, prefix_tokens=1)
    R0 = s.offset_rows
    N = Wh * Ww + 1
    ours = np.array([[s.row(i, j) for j in range(N)] for i in range(N)])
    expected = beit_index(Wh, Ww)
    expected[1:, 1:] = R0 - 1 - expected[1:, 1:]  # the offset rows reversed, the prefix rows as they are
    assert np.array_equal(ours, expected)
    assert s.num_rows == R0 + 3


def test_swin_coordinates_clip_and_prefix():
    s = Swin((2, 2), prefix_tokens=2)
    assert s.coordinates(1) is None and s.coordinates(-5) is None and s.coordinates(2) == (0, 0)
    assert s.coordinates(7) == (2, 1)  # beyond the window: a row of its own, clipped in SWIN-3
    assert s.row(2, 7) == s.row(2, 5)  # (dh, dw) = (2, 1) clipped to (1, 1)
    assert Swin((3, 3)).coordinates(-1) == (-1, 2)  # no prefix tokens: floor division
    assert swin_positions([(1, 1), (0, 0)], (2, 2), prefix_tokens=2) == [0, 1, 5, 2]


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: Swin((0, 3)), ValueError, r"Swin.window\[0\]: expected an int >= 1, got 0"),
        (lambda: Swin(3), TypeError, r"Swin.window: expected a pair \(Wh, Ww\) of ints >= 1, got 3"),
        (lambda: Swin((2, 2.0)), TypeError, r"Swin.window\[1\]: expected an int >= 1"),
        (lambda: Swin((2, 2), -1), ValueError, r"Swin.prefix_tokens: expected an int >= 0, got -1"),
        (lambda: swin_positions([(0, 2)], (2, 2)), ValueError, r"swin_positions: expected coords\[0\] inside"),
        (lambda: swin_positions([3], (2, 2)), TypeError, r"swin_positions: expected coords\[0\] to be a"),
    ],
)
def test_swin_rejects_bad_fields(make, error, message):
    with pytest.raises(error, match=message):
        make()


# ------------------------------------------------------------------ the reference
SCHEMES = [
    (Alibi(), 3),
    (Alibi(symmetric=False), 5),
    (Alibi(slopes=(0.5, 0.0)), 2),
    (T5Bias(8, 10), 2),
    (T5Bias(6, 5, False), 3),
    (Swin((3, 4)), 2),
    (Swin((2, 3), prefix_tokens=1), 2),
]


def _call(scheme, H, causal, seed=0, kv_heads=None):
    rng = np.random.default_rng(seed)
    spec = AttentionSpec(num_heads=H, head_dim=2, relative=scheme, causal=causal, num_kv_heads=kv_heads)
    p = numpy_ref.init_params(spec, seed)
    if "rel_b" in p:
        p["rel_b"] = rng.normal(size=p["rel_b"].shape)
    D = spec.model_dim
    x, kv = rng.normal(size=(2, 6, D)), rng.normal(size=(2, 5, D))
    pos = {"q_positions": rng.integers(-4, 16, (2, 6)), "k_positions": rng.integers(-4, 16, (2, 5))}
    return spec, p, x, kv, pos


@pytest.mark.parametrize("scheme, H", SCHEMES, ids=lambda v: repr(v)[:40])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_the_loop_definition(scheme, H, causal):
    spec, p, x, kv, pos = _call(scheme, H, causal)
    out, w = numpy_ref.attention(spec, p, x, kv, kv, **pos, return_weights=True)
    o2, w2 = definition.attention(spec, p, x, kv, kv, **pos, return_weights=True)
    np.testing.assert_allclose(out, o2, rtol=0, atol=1e-13)
    np.testing.assert_allclose(w, w2, rtol=0, atol=1e-14)


@pytest.mark.parametrize("scheme, H", [s for s in SCHEMES if s[0].name != "alibi"], ids=lambda v: repr(v)[:40])
def test_table_gradient_is_the_finite_difference(scheme, H):
    spec, p, x, kv, pos = _call(scheme, H, causal=False, seed=3)
    g = np.random.default_rng(4).normal(size=(2, 6, spec.model_dim))
    grads = numpy_ref.attention_vjp(spec, p, x, kv, kv, g, **pos)
    eps, rel_b = 1e-6, p["rel_b"]
    fd = np.zeros_like(rel_b)
    for idx in np.ndindex(rel_b.shape):
        hi, lo = rel_b.copy(), rel_b.copy()
        hi[idx] += eps
        lo[idx] -= eps
        f = [np.sum(g * numpy_ref.attention(spec, {**p, "rel_b": t}, x, kv, kv, **pos)) for t in (hi, lo)]
        fd[idx] = (f[0] - f[1]) / (2 * eps)
    np.testing.assert_allclose(grads["rel_b"], fd, rtol=1e-6, atol=1e-8)


def test_alibi_bias_by_hand():
    # zero content logits: the weights are the softmax of -m |delta| alone (ALIBI-3), unscaled (SCALE-4)
    spec = AttentionSpec(num_heads=2, head_dim=1, bias=False, scale=0.25, relative=Alibi())
    x = np.zeros((1, 3, 2))
    _, w = numpy_ref.attention(spec, numpy_ref.identity_params(spec), x, return_weights=True)
    for h, m in enumerate(alibi_slopes(2)):
        e = np.exp(-m * np.abs(np.arange(3)[None] - np.arange(3)[:, None]))
        np.testing.assert_allclose(w[0, h], e / e.sum(-1, keepdims=True), rtol=1e-15)


def test_linear_form_equals_symmetric_under_causal_only():
    sym, lin = Alibi(), Alibi(symmetric=False)
    for causal, same in ((True, True), (False, False)):
        specs = [AttentionSpec(num_heads=3, head_dim=2, relative=r, causal=causal) for r in (sym, lin)]
        _, p, x, kv, pos = _call(sym, 3, causal)
        a, b = (numpy_ref.attention(s, p, x, kv, kv, **pos) for s in specs)
        assert np.allclose(a, b, rtol=0, atol=1e-13) == same


def test_swin_depends_on_coordinates_not_on_delta():
    # SWIN-6: a shift by one position moves tokens across rows; a shift by Ww moves whole rows
    spec = AttentionSpec(num_heads=2, head_dim=2, relative=Swin((3, 4)))
    p = numpy_ref.init_params(spec, 0)
    p["rel_b"] = np.random.default_rng(0).normal(size=p["rel_b"].shape)
    x = np.random.default_rng(1).normal(size=(1, 12, spec.model_dim))
    base = numpy_ref.attention(spec, p, x)
    for shift, same in ((4, True), (8, True), (1, False), (3, False)):
        pos = np.arange(12) + shift
        moved = numpy_ref.attention(spec, p, x, q_positions=pos, k_positions=pos)
        assert np.allclose(moved, base, rtol=0, atol=1e-14) == same, shift


def test_t5_future_keys_are_bucket_zero_not_masked():
    # T5-2: a unidirectional table without causal=True still attends the later keys, through rel_b[:, 0]
    spec = AttentionSpec(num_heads=1, head_dim=1, bias=False, relative=T5Bias(4, 3, bidirectional=False))
    p = {**numpy_ref.identity_params(spec), "rel_b": np.array([[5.0, 0.0, -1.0, -2.0]])}
    _, w = numpy_ref.attention(spec, p, np.zeros((1, 3, 1)), return_weights=True)
    # query 0: keys 0, 1, 2 at distances 0, 1, 2: buckets 0, 0, 0
    np.testing.assert_allclose(w[0, 0, 0], [1 / 3] * 3, rtol=1e-15)
    # query 2: distances -2, -1, 0: n = 2, 1, 0; e = 2: buckets 2 (log: 2 + 0), 1, 0
    e = np.exp([-1.0, 0.0, 5.0])
    np.testing.assert_allclose(w[0, 0, 2], e / e.sum(), rtol=1e-15)
