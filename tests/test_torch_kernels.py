"""torch_impl's kernels (KERN-1): each against the float64 reference, the tile hooks against plain gathers,
the choice of kernel and its errors.

Float comparisons use the harness's budget (PREC-2, ``conformance.tolerance.budget``):
``k * e_base + floor``, e_base the error of the naive same-dtype emulation
(``conformance.naive``) against the truth, the floor 4 ulps of the truth's
scale. The unit tests of the index algorithms (banded Shaw sums, the Huang
skew) use small integers, whose products and sums are exact in float64, so
they compare exactly: an index off by one cannot hide in a tolerance.
"""

import contextlib
import dataclasses
import re
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="torch_impl needs PyTorch: pip install attnspec[torch]")

from _random_calls import random_call, random_spec  # noqa: E402

import numpy_ref  # noqa: E402
import torch_impl  # noqa: E402
from conformance import generate, naive, tolerance  # noqa: E402
from numpy_ref import relative as ref_rel  # noqa: E402
from spec import Alibi, AttentionSpec, Huang, Shaw, T5Bias  # noqa: E402
from torch_impl import kernels, schemes  # noqa: E402
from torch_impl._workspace import Workspace  # noqa: E402
from torch_impl.kernels import Call, Flex, Tiles  # noqa: E402
from torch_impl.schemes import huang, shaw  # noqa: E402

#: Tiles of 2 or 3 queries of one (batch, head) pair: every boundary of the tiles kernel is crossed.
TINY = Tiles(elements=6, query_rows=3, min_rows=2)
KERNELS = {"eager": "eager", "sdpa": "sdpa", "tiles": "tiles", "tiles-tiny": TINY}
GRADIENT_KERNELS = ("eager", "tiles", "tiles-tiny")
#: Kernels checked here by their forward only: FlexAttention has no backward on the CPU (PyTorch 2.13);
#: eager, the same score_mod as compiled (``test_compiled_flex_matches_eager_flex`` compares the two).
FORWARD_KERNELS = {**KERNELS, "flex": Flex(compiled=False)}
#: The flex kernel's checks: FlexAttention is a GPU kernel run eagerly on the CPU (0.2 s or more a call), so its
#: tests are the `fused` tier of .ci/run (pytest -m fused) with the Triton and Pallas kernels' (the README's pytest
#: leaves them out for time)
FUSED = pytest.mark.fused
#: Kernels that return no weights (return_weights=True is theirs to refuse, KERN-1).
WEIGHTLESS = ("sdpa", "flex")
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


# ---------------------------------------------------------------- the harness's budgets
def rounded_call(call, dtype: str):
    """The call's arrays rounded to dtype, as float64 NumPy (the truth's inputs, PREC-1)."""

    def r(a):
        return None if a is None else generate.rounded(a, dtype).astype(np.float64)

    call.params = {n: r(a) for n, a in call.params.items()}
    call.query, call.key, call.value = r(call.query), r(call.key), r(call.value)
    if "bias" in call.kwargs:
        call.kwargs["bias"] = r(call.kwargs["bias"])
    return call


def truth(call, grad_out=None, dtype: str = "float64"):
    """(goldens, budgets): numpy_ref's outputs (and gradients) and the harness's budget of each (PREC-2)."""
    out, w = numpy_ref.attention(*call.args(), **call.kwargs, return_weights=True)
    goldens = {"out": out, "weights": w}
    if grad_out is not None:
        grads = numpy_ref.attention_vjp(*call.args(), grad_out, **call.kwargs)
        goldens.update({f"grad/{n}": g for n, g in grads.items()})
    inputs = {"query": call.query, "key": call.key, "value": call.value, **call.kwargs}
    errors = dict.fromkeys(goldens, 0.0)
    for order in naive.ORDERS:
        n_out, n_w, cache = naive.forward(call.spec, call.params, inputs, dtype, order)
        produced = {"out": n_out, "weights": n_w}
        if grad_out is not None:
            produced.update({f"grad/{n}": g for n, g in naive.backward(call.spec, cache, grad_out, order).items()})
        for n in goldens:
            errors[n] = max(errors[n], tolerance.max_error(produced[n], goldens[n]))
    # A gradient can cancel to (nearly) 0 in theory: a broadcast bias or key bias (softmax ignores a
    # constant), the query of a row with one allowed key. Its rounding error is that of the terms
    # that cancel, so its floor is in ulps of the largest gradient (the harness's rule for bq, bk, ...).
    grad_scale = max((tolerance.magnitude(g) for n, g in goldens.items() if n.startswith("grad/")), default=0.0)
    budgets = {}
    for n in goldens:
        scale = tolerance.floor_scale(n, goldens)
        if n == "out":  # a random call's output can cancel; its rounding is that of the terms it sums
            scale = max(scale, output_terms(call))
        budgets[n] = tolerance.budget(n, dtype, errors[n], max(scale, grad_scale) if n.startswith("grad/") else scale)
    return goldens, budgets


def output_terms(call) -> float:
    """An upper bound of the terms the output projection sums: the floor's scale for ``out``.

    The harness's floor is 4 ulps of max|truth| (PREC-2), and its cases do not cancel. A random call's
    output can: with one key, out = (v @ wv + bv) @ wo + bo, and a BLAS that fuses multiply-adds rounds the
    terms of that sum, not the sum (PyTorch's float64 matmul on AMD EPYC: 6 ulps of max|out| = 0.156 at
    D = 2). Every weight is in [0, 1] and a row's weights sum to at most 1 (1 / (1 - p) after dropout),
    so a head's output is at most max_j |v_j @ wv + bv| (+ max|rel_v|) per channel, and |out| at most
    that @ |wo| + |bo|.
    """
    p, spec = call.params, call.spec
    value = next(a for a in (call.value, call.key, call.query) if a is not None)
    heads = (np.abs(value) @ np.abs(p["wv"]) + (np.abs(p["bv"]) if "bv" in p else 0.0)).max(axis=1)  # (B, Hkv*dv)
    B, H, Hkv = heads.shape[0], spec.num_heads, spec.kv_heads
    heads = np.repeat(heads.reshape(B, Hkv, -1), H // Hkv, axis=1).reshape(B, -1)  # HEAD-3: (B, H * dv)
    if "rel_v" in p:
        heads = heads + np.abs(p["rel_v"]).max()
    if spec.dropout > 0:
        heads = heads / (1.0 - spec.dropout)
    return float((heads @ np.abs(p["wo"]) + (np.abs(p["bo"]) if "bo" in p else 0.0)).max())


def assert_within_budget(name: str, got, goldens: dict, budgets: dict):
    got = got.detach().cpu().double().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    assert got.shape == goldens[name].shape, name
    assert np.isfinite(got).all(), f"{name}: NaN or Inf (PREC-3)"
    error, budget = tolerance.max_error(got, goldens[name]), budgets[name]["budget"]
    assert error <= budget, f"{name}: error {error:.3g} exceeds the budget {budget:.3g} ({budgets[name]})"


def tensors(call, dtype=torch.float64, requires_grad=False):
    """params, query, key, value and keyword tensors of a random call, in dtype."""

    def t(a, float_dtype=dtype):
        a = torch.as_tensor(np.asarray(a))
        return a.to(float_dtype) if a.is_floating_point() else a

    params = {n: t(a).requires_grad_(requires_grad) for n, a in call.params.items()}
    q, k, v = (t(a).requires_grad_(requires_grad) for a in (call.query, call.key, call.value))
    kw = {n: t(a) for n, a in call.kwargs.items()}
    if "bias" in kw:
        kw["bias"].requires_grad_(requires_grad)
    return params, q, k, v, kw


def supports(kernel, call) -> bool:
    params, q, k, v, kw = tensors(call)
    c = Call(q.shape[0], q.shape[1], k.shape[1], q.device, **kw, causal=call.spec.causal, window=call.spec.window)
    return (kernels.KERNELS[kernel]() if isinstance(kernel, str) else kernel).unsupported(call.spec, c) is None


# ---------------------------------------------------------------- every kernel against the reference
@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=150)
@given(seed=st.integers(0, 2**32 - 1))
def test_kernel_matches_the_reference_in_float64(kernel, seed):
    """KERN-1: every kernel computes the reference's function (out and weights), on every call it supports.

    The random calls cover both schemes, causal, masks, bias with -inf,
    default / explicit / per-batch positions, Lq != Lk, mask_fill and keep masks.
    """
    check_kernel_in_float64(kernel, seed)


@FUSED
@settings(max_examples=40)  # eager FlexAttention vmaps its score_mod over every pair: 0.2 s a call
@given(seed=st.integers(0, 2**32 - 1))
def test_flex_matches_the_reference_in_float64(seed):
    """KERN-1: the flex kernel computes the reference's function, on every random call it supports."""
    check_kernel_in_float64("flex", seed)


def check_kernel_in_float64(kernel: str, seed: int):
    call = random_call(seed, max_len=6)
    implementation = FORWARD_KERNELS[kernel]
    if not supports(implementation, call):
        return  # the sdpa and flex kernels refuse (tested below)
    goldens, budgets = truth(call)
    params, q, k, v, kw = tensors(call)
    with torch.no_grad():  # no gradient recorded: the tiles reuse their buffers
        out = torch_impl.attention(call.spec, params, q, k, v, **kw, implementation=implementation)
    assert_within_budget("out", out, goldens, budgets)
    if kernel not in WEIGHTLESS:
        out, w = torch_impl.attention(
            call.spec, params, q, k, v, **kw, return_weights=True, implementation=implementation
        )
        assert_within_budget("out", out, goldens, budgets)
        assert_within_budget("weights", w, goldens, budgets)


@pytest.mark.parametrize("kernel", GRADIENT_KERNELS)
@settings(max_examples=80)
@given(seed=st.integers(0, 2**32 - 1))
def test_kernel_gradients_match_the_reference_vjp_in_float64(kernel, seed):
    """GRAD-1 through each kernel's autograd: every input, the bias and every parameter."""
    call = random_call(seed, max_len=6)
    call.key, call.value = call.key.copy(), call.value.copy()  # own gradients for key and value
    grad_out = np.random.default_rng(seed).normal(size=call.query.shape)
    goldens, budgets = truth(call, grad_out)
    params, q, k, v, kw = tensors(call, requires_grad=True)
    out = torch_impl.attention(call.spec, params, q, k, v, **kw, implementation=KERNELS[kernel])
    out.backward(torch.as_tensor(grad_out))
    got = {"query": q.grad, "key": k.grad, "value": v.grad, **{n: p.grad for n, p in params.items()}}
    if "bias" in kw:
        got["bias"] = kw["bias"].grad
    for name in (n[len("grad/") :] for n in goldens if n.startswith("grad/")):
        assert_within_budget(f"grad/{name}", got[name], goldens, budgets)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernel", [pytest.param(k, marks=FUSED) if k == "flex" else k for k in FORWARD_KERNELS])
@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1))
def test_kernel_in_lower_precision_stays_within_the_harness_budget(kernel, dtype, seed):
    """PREC-2, PREC-4: in float32 and bfloat16 (float32 softmax statistics) each kernel is within budget."""
    call = rounded_call(random_call(seed, max_len=6), dtype)
    if not supports(FORWARD_KERNELS[kernel], call):
        return
    goldens, budgets = truth(call, dtype=dtype)
    params, q, k, v, kw = tensors(call, TORCH_DTYPES[dtype])
    with torch.no_grad():
        out = torch_impl.attention(call.spec, params, q, k, v, **kw, implementation=FORWARD_KERNELS[kernel])
    assert out.dtype == TORCH_DTYPES[dtype]
    assert_within_budget("out", out, goldens, budgets)


@pytest.mark.parametrize("kernel", ["eager", "tiles", "tiles-tiny"])
def test_the_worked_shaw_example_by_hand(kernel):
    """SHAW-2..SHAW-4, the example of spec/attention.md: weights [1, 2, 2] / 5, [1, 1, 2] / 4, uniform."""
    spec = AttentionSpec(num_heads=1, head_dim=1, relative=Shaw(max_distance=1))
    p = {n: torch.as_tensor(a) for n, a in numpy_ref.identity_params(spec).items()}
    p["rel_k"] = torch.tensor([[0.0], [0.0], [np.log(2)]], dtype=torch.float64)
    p["rel_v"] = torch.tensor([[-1.0], [0.0], [1.0]], dtype=torch.float64)
    out, w = torch_impl.attention(
        spec, p, torch.ones(1, 3, 1, dtype=torch.float64), return_weights=True, implementation=KERNELS[kernel]
    )
    goldens = {
        "out": np.array([[[1.8], [1.25], [1 / 3]]]),
        "weights": np.array([[[[0.2, 0.4, 0.4], [0.25, 0.25, 0.5], [1 / 3, 1 / 3, 1 / 3]]]]),
    }
    budgets = {n: tolerance.budget(n, "float64", 0.0, tolerance.magnitude(g)) for n, g in goldens.items()}
    assert_within_budget("out", out, goldens, budgets)
    assert_within_budget("weights", w, goldens, budgets)


# ---------------------------------------------------------------- the tile hooks against plain gathers
small_ints = st.integers(-3, 3)


def int_array(data, shape, lo=-3, hi=3):
    return np.array(
        data.draw(st.lists(st.integers(lo, hi), min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))),
        dtype=np.float64,
    ).reshape(shape)


def tile_delta(q0: int, T: int, Lk: int) -> np.ndarray:
    """POS-2 with default positions for queries q0 .. q0 + T - 1 and keys 0 .. Lk - 1: (1, T, Lk)."""
    return (np.arange(Lk)[None, :] - np.arange(q0, q0 + T)[:, None])[None]


@settings(max_examples=150)
@given(
    k=st.integers(0, 4),
    T=st.integers(1, 5),
    extra=st.integers(0, 2),
    q0=st.integers(0, 9),
    Lk=st.integers(1, 14),
    into_buffer=st.booleans(),
    data=st.data(),
)
def test_banded_shaw_key_term_is_the_plain_gather(k, T, extra, q0, Lk, into_buffer, data):
    """SHAW-2, SHAW-3: the edge broadcasts and the band of a tile are exactly the gather by clipped index."""
    r = int_array(data, (1, 2, T, 2 * k + 1))
    expected = ref_rel.gather_buckets(r, ref_rel.shaw_index(tile_delta(q0, T, Lk), k))
    band = shaw.key_band_index(T + extra, k, "cpu")  # built for the longest tile, used by shorter ones
    out = torch.empty(1, 2, T, Lk, dtype=torch.float64) if into_buffer else None
    got = shaw.key_term_banded(torch.as_tensor(r), q0, Lk, k, band, out)
    np.testing.assert_array_equal(got.numpy(), expected)


@settings(max_examples=150)
@given(
    k=st.integers(0, 4),
    T=st.integers(1, 5),
    extra=st.integers(0, 2),
    q0=st.integers(0, 9),
    Lk=st.integers(1, 14),
    precomputed=st.booleans(),
    data=st.data(),
)
def test_banded_shaw_value_sums_are_the_plain_bucket_sums(k, T, extra, q0, Lk, precomputed, data):
    """SHAW-2, SHAW-4: the triangles, edge sums and band of a tile are exactly the scatter-add per table row."""
    w = int_array(data, (1, 2, T, Lk), 0, 8)
    expected = ref_rel.scatter_buckets(w, ref_rel.shaw_index(tile_delta(q0, T, Lk), k), 2 * k + 1)
    masks = band = None
    if precomputed:  # as the tiles kernel passes them: built once for the longest tile and every query
        masks = shaw.edge_masks(T + extra, torch.float64, "cpu")
        band = shaw.value_band_index(q0 + T + extra, k, "cpu")[q0 : q0 + T] if k > 0 else None
    got = shaw.bucket_sums_banded(torch.as_tensor(w), k, q0, masks, band)
    np.testing.assert_array_equal(got.numpy(), expected)


@settings(max_examples=200)
@given(
    M=st.integers(1, 6),
    T=st.integers(1, 5),
    q0=st.integers(0, 9),
    Lk=st.integers(1, 14),
    per_head=st.booleans(),
    causal=st.booleans(),
    workspace=st.booleans(),
    data=st.data(),
)
@example(M=4, T=3, q0=5, Lk=7, per_head=True, causal=True, workspace=True, data=None)  # the strided read
@example(M=4, T=3, q0=0, Lk=7, per_head=False, causal=True, workspace=True, data=None)  # zero padded
@example(M=2, T=4, q0=6, Lk=12, per_head=False, causal=False, workspace=False, data=None)  # beyond the table
def test_huang_skew_is_the_plain_gather(M, T, q0, Lk, per_head, causal, workspace, data):
    """HUANG-2..HUANG-4: the skew of a tile equals (q @ rel_k.T)[delta + M - 1], zero beyond the table.

    With ``causal`` (the strided read without a recorded gradient, or the
    zero-padded product) only the keys up to the diagonal are the term;
    the others are unspecified but finite, and the caller masks them (CAUSAL-1).
    """
    rng = np.random.default_rng([M, T, q0, Lk])
    if data is None:
        q, table = rng.integers(-3, 4, (1, 2, T, 3)).astype(float), rng.integers(-3, 4, (2, 2 * M - 1, 3)) * 1.0
    else:
        q, table = int_array(data, (1, 2, T, 3)), int_array(data, (2, 2 * M - 1, 3))
    table = table if per_head else table[0]
    row, valid = ref_rel.huang_index(tile_delta(q0, T, Lk), M)
    expected = np.where(valid[:, None], ref_rel.gather_buckets(ref_rel.rows_logits(q, ref_rel.as_4d(table)), row), 0)
    ws = Workspace(torch.device("cpu")) if workspace else None
    got = huang.huang_skew_term(torch.as_tensor(q), torch.as_tensor(table), q0, Lk, M, causal=causal, ws=ws).numpy()
    assert np.isfinite(got).all()
    if causal:
        kept = np.broadcast_to((tile_delta(q0, T, Lk) <= 0)[:, None], got.shape)
        np.testing.assert_array_equal(got[kept], expected[kept])
    else:
        np.testing.assert_array_equal(got, expected)


def test_distance_rows_follow_the_shared_row_span():
    """HUANG-2/3 through spec.index.distance_row_span: table rows or zero rows, for any range."""
    M = 3
    table = torch.arange(1.0, 2 * M).unsqueeze(1) * torch.tensor([[1.0, -1.0]])  # distances -2 .. 2
    for first, count in [(-9, 4), (-4, 6), (-2, 5), (1, 7), (5, 3)]:
        expected = [table[t + M - 1].tolist() if abs(t) <= M - 1 else [0.0, 0.0] for t in range(first, first + count)]
        assert huang.distance_rows(table, first, count, M).tolist() == expected


def test_tiny_tiles_cover_every_query_once_with_two_or_three_queries():
    """The grid of Tiles(elements=6, query_rows=3, min_rows=2): each (batch, head, query) in exactly one tile
    of one (batch, head) pair; 3 queries where 3 rows of keys fit 6 logits, else min_rows = 2."""
    for Lk, rows in ((8, 2), (2, 3)):
        grid = TINY.grid(2, 3, 9, Lk, causal_prefix=False, short_rows=True, device_type="cpu")
        tiles = [t for group in grid for heads in group for t in heads]
        seen = np.zeros((2, 3, 9), int)
        for t in tiles:
            assert t.b.stop - t.b.start == 1 and t.h.stop - t.h.start == 1 and t.k1 == Lk
            assert t.q1 - t.q0 == rows or t.q1 == 9  # the last tile holds the remainder
            seen[t.b, t.h, t.q0 : t.q1] += 1
        assert (seen == 1).all()
    causal = TINY.grid(1, 1, 6, 6, causal_prefix=True, short_rows=True, device_type="cpu")
    assert [(t.q0, t.q1, t.k1) for t in causal[0][0]] == [(0, 2, 2), (2, 4, 4), (4, 6, 6)]  # keys up to q1


@pytest.mark.parametrize("H, G", [(4, 1), (4, 2), (6, 2), (6, 3), (8, 4)])
def test_a_tile_holds_whole_groups_of_heads_or_part_of_one(H, G):
    """HEAD-3: whatever the budget, each (batch, head, query) lies in exactly one tile, and a tile's query heads
    are whole groups of G heads or a part of one group, so ``Tile.kv_heads`` reads the right key/value heads."""
    for pairs in range(1, 2 * H + 1):  # pairs of (batch, head) per tile: 4 queries x 4 keys each
        grid = Tiles(elements=16 * pairs).grid(
            2, H, 4, 4, causal_prefix=False, short_rows=False, device_type="cpu", group=G
        )
        seen = np.zeros((2, H, 4), int)
        for t in (t for g in grid for heads in g for t in heads):
            heads = range(H)[t.h]
            whole = heads.start % G == 0 and len(heads) % G == 0
            assert whole or heads.start // G == (heads[-1]) // G, (pairs, heads)
            seen[t.b, t.h, t.q0 : t.q1] += 1
        assert (seen == 1).all(), pairs


def test_default_tiles_are_todays_sizes():
    """The default knobs: 256-query tiles on the CPU where short tiles pay, whole rows elsewhere."""
    cpu = Tiles().grid(1, 2, 1024, 1024, causal_prefix=True, short_rows=True, device_type="cpu")
    assert [(t.q0, t.q1, t.k1) for t in cpu[0][0]] == [
        (0, 256, 256),
        (256, 512, 512),
        (512, 768, 768),
        (768, 1024, 1024),
    ]
    assert len(cpu) == 1 and len(cpu[0]) == 1  # both heads in each tile: 2 x 256 x 1024 <= 2^20 logits
    gpu = Tiles().grid(1, 2, 1024, 1024, causal_prefix=False, short_rows=True, device_type="cuda")
    assert [(t.q0, t.q1, t.k1) for g in gpu for h in g for t in h] == [(0, 1024, 1024)]
    long_keys = Tiles().grid(1, 1, 64, 1 << 17, causal_prefix=False, short_rows=False, device_type="cpu")
    assert {t.q1 - t.q0 for g in long_keys for h in g for t in h} == {16}  # min_rows: 2^20 // 2^17 < 16


def test_tile_knobs_are_validated():
    with pytest.raises(ValueError, match=re.escape("Tiles.elements: expected an int >= 1, got 0")):
        Tiles(elements=0)
    with pytest.raises(TypeError, match=re.escape("Tiles.query_rows: expected an int >= 1, got 2.5 of type float")):
        Tiles(query_rows=2.5)
    assert Tiles(min_rows=4) == Tiles(min_rows=4) and hash(Tiles()) == hash(Tiles())  # frozen values


# ---------------------------------------------------------------- the choice of kernel (KERN-1)
def plain_call(**kw):
    return Call(2, 5, 5, torch.device("cpu"), **kw)


KEEP = torch.ones(2, 2, 5, 5, dtype=torch.bool)
CHOICES = [
    (AttentionSpec(2, 3), {}, "sdpa"),
    (AttentionSpec(2, 3, causal=True), {"causal": True}, "sdpa"),
    (AttentionSpec(2, 3), {"mask": torch.ones(5, dtype=torch.bool), "bias": torch.zeros(5)}, "sdpa"),
    (AttentionSpec(2, 3, causal=True), {"q_positions": torch.arange(5), "causal": True}, "sdpa"),
    (AttentionSpec(2, 3, dropout=0.1), {}, "sdpa"),  # no keep mask: no dropout to apply
    (AttentionSpec(2, 3, relative=Shaw(2)), {}, "tiles"),
    (AttentionSpec(2, 3, relative=Huang(4), causal=True), {"causal": True}, "tiles"),
    (AttentionSpec(2, 3, mask_fill=-1e9), {}, "tiles"),
    (AttentionSpec(2, 3, dropout=0.1), {"dropout_keep": KEEP}, "tiles"),
    (AttentionSpec(2, 3), {"return_weights": True}, "tiles"),
]


@pytest.mark.parametrize("spec,kw,expected", CHOICES, ids=[f"{i}-{c[2]}" for i, c in enumerate(CHOICES)])
def test_the_automatic_choice_is_sdpa_for_plain_calls_and_tiles_otherwise(spec, kw, expected):
    """KERN-1: implementation=None takes the first of ("sdpa", "triton", "tiles") that supports the call; on this
    CPU never triton (its interpreter is not chosen automatically)."""
    assert kernels.resolve(None, spec, plain_call(**kw)).name == expected


CUDA_CHOICES = [
    (AttentionSpec(2, 3), {}, "sdpa"),
    (AttentionSpec(2, 3, relative=Shaw(2)), {}, "triton"),
    (AttentionSpec(2, 3, relative=Alibi(), causal=True), {"causal": True}, "sdpa"),
    (
        AttentionSpec(2, 3, relative=Shaw(2), causal=True),
        {"causal": True, "q_positions": torch.arange(5) + 7},
        "triton",
    ),
    (AttentionSpec(2, 3, relative=Shaw(2), causal=True), {"causal": True, "q_positions": torch.arange(5) * 2}, "tiles"),
    (AttentionSpec(2, 3, relative=Huang(4)), {}, "triton"),
    (AttentionSpec(2, 3, relative=Huang(128)), {}, "tiles"),  # 257 rows: past MAX_TABLE_ROWS
    (AttentionSpec(2, 3, relative=Shaw(2), softcap=3.0), {}, "tiles"),
    (AttentionSpec(2, 3, relative=Shaw(2)), {"return_weights": True}, "tiles"),
]


@pytest.mark.parametrize("spec,kw,expected", CUDA_CHOICES, ids=[f"{i}-{c[2]}" for i, c in enumerate(CUDA_CHOICES)])
def test_on_cuda_the_automatic_choice_takes_triton_for_what_it_fuses(spec, kw, expected):
    """KERN-1: for CUDA tensors (a call whose device is cuda, with Triton compiling rather than interpreting)
    the automatic choice takes triton after sdpa (which takes ALiBi, T5 and RoPE as a bias or a rotation): Shaw,
    with a run of positions too, and Huang; not at strided positions, nor a table past MAX_TABLE_ROWS, a soft cap or
    returned weights (tiles)."""
    from torch_impl.kernels import fused

    call = Call(2, 5, 5, torch.device("cuda"), **kw)
    with (
        mock.patch.object(fused, "interpreting", return_value=False),
        mock.patch.object(fused, "triton_unavailable", return_value=None),
    ):
        assert kernels.resolve(None, spec, call).name == expected


def test_the_triton_interpreter_is_never_chosen_automatically():
    from torch_impl.kernels import fused

    with mock.patch.object(fused, "interpreting", return_value=True):
        reason = kernels.KERNELS["triton"]().automatic(AttentionSpec(2, 3, relative=Shaw(2)), plain_call())
    assert reason == "triton is chosen automatically where it compiles for a CUDA device, not in its interpreter"


@pytest.mark.parametrize("relative,expected", [(None, "sdpa"), (Shaw(2), "tiles"), (Huang(3), "tiles")])
def test_the_automatic_choice_computes_exactly_what_the_chosen_kernel_does(relative, expected):
    spec = AttentionSpec(2, 3, relative=relative, causal=True)
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, 0).items()}
    x = torch.as_tensor(np.random.default_rng(0).normal(size=(2, 5, 6)))
    auto, chosen = (torch_impl.attention(spec, params, x, implementation=i) for i in (None, expected))
    assert torch.equal(auto, chosen)


@pytest.fixture
def shaw_layer():
    spec = AttentionSpec(2, 2, relative=Shaw(1), dropout=0.5)
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, 0).items()}
    return spec, params, torch.randn(2, 3, 4, dtype=torch.float64)


def test_an_unknown_kernel_name_lists_the_names(shaw_layer):
    spec, params, x = shaw_layer
    with pytest.raises(
        ValueError,
        match=re.escape(
            "implementation: expected None, one of 'eager', 'sdpa', 'tiles', 'flex', 'triton' or a kernel object "
            "such as torch_impl.kernels.Tiles(...), got 'flash'"
        ),
    ):
        torch_impl.attention(spec, params, x, implementation="flash")
    with pytest.raises(TypeError, match=re.escape("got 3 of type int")):
        torch_impl.attention(spec, params, x, implementation=3)


def test_sdpa_refuses_a_relative_scheme_and_names_the_kernels_that_can(shaw_layer):
    """The kernels that can: flex only off a CPU (compiled FlexAttention returns no log-sum-exp for CPU
    tensors, which Shaw's value term needs), the fused triton kernel too where Triton is installed (the
    `triton` extra)."""
    from torch_impl.kernels.fused import triton_unavailable

    spec, params, x = shaw_layer
    able = (
        "'eager', 'tiles'"
        + ("" if x.device.type == "cpu" else ", 'flex'")
        + ("" if triton_unavailable() else ", 'triton'")
    )
    with pytest.raises(
        ValueError,
        match=re.escape(
            "implementation='sdpa': cannot run this call: Shaw relative terms need the key_term and value_term "
            f"hooks, and sdpa calls qk_transform, bias; kernels that can: {able} "
            "(KERN-1: no silent fallback)"
        ),
    ):
        torch_impl.attention(spec, params, x, implementation="sdpa")
    m = torch_impl.MultiHeadAttention(AttentionSpec(2, 2, relative=Huang(3))).eval()
    with pytest.raises(
        ValueError,
        match=re.escape("implementation='sdpa': cannot run this call: Huang relative terms need the key_term hook"),
    ):
        m(torch.randn(1, 3, 4), implementation="sdpa")


@pytest.mark.parametrize(
    "kernel,case,message",
    [
        (
            "sdpa",
            "mask_fill",
            "spec.mask_fill=-1000000000.0 replaces disallowed logits (MASK-6), and sdpa only gives them "
            "weight 0 (MASK-5); kernels that can: 'eager', 'tiles', 'flex'",
        ),
        ("sdpa", "keep", "sdpa takes no dropout_keep mask (DROP-1); kernels that can: 'eager', 'tiles'"),
        ("sdpa", "weights", "sdpa does not return the weights (return_weights=True); kernels that can: "
                            "'eager', 'tiles'"),
        (
            "flex",
            "huang-values",
            "flex computes a value term from FlexAttention's log-sum-exp only where each distance owns one key per "
            "query and one row (Shaw); Huang's value term has no such form here; kernels that can: 'eager', 'tiles'",
        ),
        (
            "flex",
            "shaw-values-positions",
            "flex computes the value term at default positions only (one key per query and distance); kernels that "
            "can: 'eager', 'tiles'",
        ),
        ("flex", "keep", "flex takes no dropout_keep mask (DROP-1); kernels that can: 'eager', 'tiles'"),
        ("flex", "weights", "flex does not return the weights (return_weights=True); kernels that can: "
                            "'eager', 'tiles'"),
    ],
)  # fmt: skip
def test_a_fused_kernel_refuses_what_it_cannot_compute(kernel, case, message):
    """KERN-1: SDPA has no fill value, keep mask or weights; FlexAttention no keep mask or weights, and a value
    term only where its log-sum-exp gives it (Shaw at default positions)."""
    relative = {"huang-values": Huang(2, values=True), "shaw-values-positions": Shaw(1)}.get(case)
    spec = AttentionSpec(2, 2, mask_fill=-1e9 if case == "mask_fill" else None, relative=relative, dropout=0.5)
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, 0).items()}
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    keep = torch.ones(2, 2, 3, 3, dtype=torch.bool) if case == "keep" else None
    positions = torch.arange(3) + 2 if case == "shaw-values-positions" else None
    with pytest.raises(ValueError, match=re.escape(f"implementation={kernel!r}: cannot run this call: {message}")):
        torch_impl.attention(
            spec,
            params,
            x,
            dropout_keep=keep,
            q_positions=positions,
            return_weights=case == "weights",
            implementation=kernel,
        )


def test_compiled_flex_refuses_the_value_term_on_a_cpu_before_compiling():
    """KERN-1: compiled FlexAttention returns no log-sum-exp for CPU tensors (PyTorch 2.13), which Shaw's value
    term reads: a ValueError naming the eager kernel, not Inductor's error from inside torch.compile."""
    spec = AttentionSpec(2, 2, relative=Shaw(1))
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, 0).items()}
    x = torch.randn(1, 3, 4, dtype=torch.float64)
    message = (
        "implementation='flex': cannot run this call: compiled FlexAttention returns no log-sum-exp for CPU tensors "
        "(PyTorch 2.13), which the value term needs: pass implementation=torch_impl.kernels.Flex(compiled=False) "
        "to run it eagerly; kernels that can: 'eager', 'tiles'"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        torch_impl.attention(spec, params, x, implementation="flex")
    eager = torch_impl.attention(spec, params, x, implementation=Flex(compiled=False))
    expected = numpy_ref.attention(spec, numpy_ref.init_params(spec, 0), x.numpy())
    np.testing.assert_allclose(eager.numpy(), expected, rtol=0, atol=1e-12)


def test_the_flex_kernel_checks_its_field():
    with pytest.raises(TypeError, match=re.escape("Flex.compiled: expected a bool, got 1 of type int")):
        Flex(compiled=1)


@FUSED
def test_the_flex_adapter_checks_the_forward_and_skips_the_cpu_gradients_with_the_reason():
    """torch:flex in the harness: eager FlexAttention on the CPU passes every forward check of a cell (here
    ALiBi with a causal rule, T5 with a mask and positions, Shaw's value term) and its gradients are one skip
    naming PyTorch's missing CPU backward; Huang's value term is a skip of the whole cell (KERN-1)."""
    from conformance import catalog, runner, store
    from conformance.adapters import load_adapter
    from conformance.adapters.torch_impl_adapter import FLEX_NO_CPU_GRADIENTS

    adapter = load_adapter("torch:flex")
    assert adapter.kernel("cpu") == Flex(compiled=False) and adapter.kernel("cuda") == Flex(compiled=True)
    ids = ("alibi/self/h1-causal", "t5/cross/encoder-padding", "shaw/k2/self/basic", "huang-values/M8/self/per-head")
    cases = [catalog.BY_ID[c] for c in ids]
    results = runner._run_cells(runner.Plan([adapter], cases=cases, dtypes=["float32"]), store.GOLDEN_DIR, None)
    for case in cases[:3]:
        checks = {r.check: r for r in results if r.case == case.id}
        assert checks["out"].status == "pass" and not [r for r in checks.values() if r.failed], case.id
        assert checks["gradients"].status == "skip"
        assert checks["gradients"].message == f"no gradients on cpu: {FLEX_NO_CPU_GRADIENTS}"
    (huang,) = [r for r in results if r.case == cases[3].id]
    assert huang.status == "skip" and "the flex kernel computes Shaw's value term only" in huang.message


class Refusing(Tiles):
    """A kernel object whose support is narrower than its class's."""

    def unsupported(self, spec, call):
        return "this test says no"


def test_a_kernel_object_is_named_in_its_error():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "implementation=Refusing(elements=None, query_rows=None, "
            "min_rows=16): cannot run this call: this test says no"
        ),
    ):
        kernels.resolve(Refusing(), AttentionSpec(1, 2), plain_call())


def test_a_hook_no_kernel_calls_is_an_error_not_a_fallback():
    """KERN-1, REL-3: a scheme with a hook kind no kernel has a call site for is refused by every kernel.

    Every hook kind has a call site today, so the kernels here lose their bias call site for the test.
    """
    scheme = SimpleNamespace(name="alibi", hooks=frozenset({"bias"}))
    spec = SimpleNamespace(relative=scheme, mask_fill=None, softcap=None)
    without = {n: cls.scheme_hooks - {"bias"} for n, cls in kernels.KERNELS.items()}
    with contextlib.ExitStack() as stack:
        for n, cls in kernels.KERNELS.items():
            stack.enter_context(mock.patch.object(cls, "scheme_hooks", without[n]))
        with pytest.raises(
            ValueError,
            match=re.escape(
                "implementation=None: no kernel can run this call: sdpa: SimpleNamespace relative terms need the "
                "bias hook"
            ),
        ):
            kernels.resolve(None, spec, plain_call())
        with pytest.raises(
            ValueError,
            match=re.escape("and eager calls qk_transform, key_term, key_side_term, value_term; no kernel can"),
        ):
            kernels.resolve("eager", spec, plain_call())


def test_a_scheme_without_a_torch_module_is_refused_by_name():
    """REL-4: the registry names the schemes it has."""
    spec = AttentionSpec(2, 2, relative=Shaw(1))
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, 0).items()}
    with mock.patch.dict(schemes.REGISTRY, {"huang": huang}, clear=True):
        with pytest.raises(
            ValueError,
            match=re.escape(
                "spec.relative: expected a scheme torch_impl implements "
                "(one of ['huang']; add one with torch_impl.schemes."
                "register_module(name, module)), got 'shaw' (Shaw)"
            ),
        ):
            torch_impl.attention(spec, params, torch.randn(1, 3, 4, dtype=torch.float64), implementation="eager")


def test_the_module_passes_its_kernel_through():
    spec = AttentionSpec(2, 3, relative=Shaw(2), causal=True)
    ref_params = numpy_ref.init_params(spec, 1)
    m = torch_impl.MultiHeadAttention(spec, dtype=torch.float64).load_canonical(ref_params).eval()
    x = np.random.default_rng(1).normal(size=(1, 7, 6))
    call = SimpleNamespace(
        spec=spec, params=ref_params, query=x, key=x, value=x, kwargs={}, args=lambda: (spec, ref_params, x, x, x)
    )
    goldens, budgets = truth(call)
    for implementation in ("eager", "tiles", TINY, None):
        assert_within_budget("out", m(torch.as_tensor(x), implementation=implementation), goldens, budgets)


# ---------------------------------------------------------------- the peer options: HEAD-3, HEAD-4, SOFTCAP-1, WINDOW-1
#: float64 against the float64 reference; float32 (inputs rounded to float32) in units of the largest value.
F64_ATOL, F32_RTOL = 1e-12, 1e-5


def _minus_inf_bias(rng, shape):
    bias = rng.normal(size=shape)
    bias[rng.random(shape) < 0.25] = -np.inf  # BIAS-2: disallowed keys, after the cap (SOFTCAP-1)
    return bias


#: name -> (spec, B, Lq, Lk, keyword inputs drawn from an rng). Cross-attention throughout (own key, value).
PEER_CASES = {
    "HEAD-3-mqa-hkv1-mask": (
        AttentionSpec(4, 3, num_kv_heads=1),
        2, 4, 6,
        lambda rng: {"mask": rng.random((2, 1, 4, 6)) < 0.7},
    ),
    "HEAD-3-gqa-hkv2-causal-bias": (
        AttentionSpec(4, 3, num_kv_heads=2, causal=True),
        2, 5, 5,
        lambda rng: {"bias": rng.normal(size=(4, 5, 5))},
    ),
    "HEAD-4-dv5-gqa": (AttentionSpec(4, 2, num_kv_heads=2, value_head_dim=5), 1, 3, 4, lambda rng: {}),
    "HEAD-4-dv5-shaw-values-per-head-hkv2": (
        AttentionSpec(4, 2, num_kv_heads=2, value_head_dim=5, relative=Shaw(2, per_head=True)),
        2, 5, 6,
        lambda rng: {},
    ),
    "HEAD-4-dv1-shaw-values-only-positions": (
        AttentionSpec(2, 3, value_head_dim=1, relative=Shaw(1, keys=False, per_head=True)),
        2, 4, 5,
        lambda rng: {"q_positions": rng.integers(-3, 6, size=(2, 4)), "k_positions": np.arange(5)},
    ),
    "SOFTCAP-1-shaw-bias-minus-inf": (
        AttentionSpec(2, 3, scale=1.5, softcap=1.0, relative=Shaw(2)),
        2, 4, 5,
        lambda rng: {"bias": _minus_inf_bias(rng, (2, 1, 4, 5))},
    ),
    "SOFTCAP-1-plain-bias-minus-inf": (
        AttentionSpec(2, 3, scale=2.0, softcap=0.5),
        1, 3, 4,
        lambda rng: {"bias": _minus_inf_bias(rng, (3, 4))},
    ),
    "SOFTCAP-1-huang-causal-mqa": (
        AttentionSpec(2, 3, num_kv_heads=1, softcap=2.0, relative=Huang(4), causal=True),
        1, 6, 6,
        lambda rng: {},
    ),
    "WINDOW-1-sliding-causal": (AttentionSpec(2, 3, window=(2, None), causal=True), 2, 7, 7, lambda rng: {}),
    "WINDOW-1-two-sided-gqa": (AttentionSpec(4, 2, num_kv_heads=2, window=(1, 2)), 1, 6, 6, lambda rng: {}),
    "WINDOW-1-right-only-shaw": (AttentionSpec(2, 2, window=(None, 1), relative=Shaw(2)), 1, 6, 5, lambda rng: {}),
    "WINDOW-1-decoding-huang": (
        AttentionSpec(2, 3, window=(2, 0), relative=Huang(3)),
        2, 2, 7,
        lambda rng: {"q_positions": np.arange(5, 7)},  # POS-3: the last two of seven positions
    ),
    "WINDOW-1-decoding-plain-causal": (
        AttentionSpec(2, 3, window=(3, None), causal=True),
        1, 3, 8,
        lambda rng: {"q_positions": np.arange(5, 8)},
    ),
    "all-gqa-dv-softcap-window-shaw-dropout": (
        AttentionSpec(
            4, 2, num_kv_heads=2, value_head_dim=3, softcap=1.5, window=(1, 1), relative=Shaw(1, per_head=True),
            dropout=0.3,
        ),
        2, 4, 5,
        lambda rng: {"dropout_keep": rng.random((2, 4, 4, 5)) >= 0.3, "mask": rng.random((4, 5)) < 0.8},
    ),
}  # fmt: skip


def peer_call(name: str):
    """The case as a RandomCall (numpy_ref.init_params, inputs N(0, 1)), reproducible from its name."""
    spec, B, Lq, Lk, make_kw = PEER_CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    D = spec.model_dim
    params = numpy_ref.init_params(spec, seed=int(rng.integers(0, 2**31)))
    query, key, value = rng.normal(size=(B, Lq, D)), rng.normal(size=(B, Lk, D)), rng.normal(size=(B, Lk, D))
    return SimpleNamespace(
        spec=spec, params=params, query=query, key=key, value=value, kwargs=make_kw(rng),
        args=lambda: (spec, params, query, key, value),
    )  # fmt: skip


def peer_supports(kernel, call) -> bool:
    params, q, k, v, kw = tensors(call)
    c = Call(q.shape[0], q.shape[1], k.shape[1], q.device, **kw, causal=call.spec.causal, window=call.spec.window)
    return (kernels.KERNELS[kernel]() if isinstance(kernel, str) else kernel).unsupported(call.spec, c) is None


def forward_and_gradients(call, kernel, dtype):
    """(out, weights or None, gradients by name) of torch_impl in dtype, gradients of <out, grad_out>."""
    params, q, k, v, kw = tensors(call, dtype, requires_grad=True)
    implementation = KERNELS[kernel]
    out = torch_impl.attention(call.spec, params, q, k, v, **kw, implementation=implementation)
    out.backward(torch.as_tensor(call.grad_out, dtype=dtype))
    grads = {"query": q.grad, "key": k.grad, "value": v.grad, **{n: p.grad for n, p in params.items()}}
    if "bias" in kw:
        grads["bias"] = kw["bias"].grad
    weights = None
    if kernel != "sdpa":
        with torch.no_grad():
            out_w, weights = torch_impl.attention(
                call.spec, params, q, k, v, **kw, return_weights=True, implementation=implementation
            )
        assert torch.equal(out_w, out.detach()) or torch.allclose(out_w, out.detach(), rtol=0, atol=1e-13)
    with torch.no_grad():  # no gradient recorded: the tiles reuse their buffers and cap in place
        again = torch_impl.attention(call.spec, params, q, k, v, **kw, implementation=implementation)
    assert torch.allclose(again, out.detach(), rtol=0, atol=1e-13 if dtype == torch.float64 else 1e-6)
    return out, weights, grads


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", PEER_CASES)
def test_peer_option_forward_and_gradients_match_the_reference_in_float64(case, kernel):
    """HEAD-3, HEAD-4, SOFTCAP-1, WINDOW-1 (and GRAD-1 through them): every kernel that supports the case
    computes numpy_ref's output, weights and every gradient to 1e-12."""
    call = peer_call(case)
    if not peer_supports(KERNELS[kernel], call):
        assert kernel == "sdpa", f"{kernel} must run {case}"
        assert call.spec.relative is not None or call.spec.softcap is not None or "dropout_keep" in call.kwargs
        return
    call.grad_out = np.random.default_rng(1).normal(size=call.query.shape)
    ref_out, ref_w = numpy_ref.attention(*call.args(), **call.kwargs, return_weights=True)
    ref_grads = numpy_ref.attention_vjp(*call.args(), call.grad_out, **call.kwargs)
    out, weights, grads = forward_and_gradients(call, kernel, torch.float64)
    np.testing.assert_allclose(out.detach().numpy(), ref_out, rtol=0, atol=F64_ATOL)
    if weights is not None:
        np.testing.assert_allclose(weights.numpy(), ref_w, rtol=0, atol=F64_ATOL)
    assert sorted(grads) == sorted(ref_grads)
    for name, expected in ref_grads.items():
        np.testing.assert_allclose(grads[name].numpy(), expected, rtol=0, atol=F64_ATOL, err_msg=name)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "case", ["HEAD-3-mqa-hkv1-mask", "HEAD-4-dv5-shaw-values-per-head-hkv2", "SOFTCAP-1-shaw-bias-minus-inf",
             "WINDOW-1-two-sided-gqa", "all-gqa-dv-softcap-window-shaw-dropout"],
)  # fmt: skip
def test_peer_option_in_float32_is_within_1e_5_of_the_reference(case, kernel):
    """PREC-1: in float32 (inputs rounded to float32, the truth from those in float64), out and gradients
    are within 1e-5 of their largest value."""
    call = peer_call(case)
    if not peer_supports(KERNELS[kernel], call):
        return
    call = rounded_call(call, "float32")
    call.grad_out = generate.rounded(np.random.default_rng(1).normal(size=call.query.shape), "float32")
    ref_out = numpy_ref.attention(*call.args(), **call.kwargs)
    ref_grads = numpy_ref.attention_vjp(*call.args(), call.grad_out.astype(np.float64), **call.kwargs)
    out, _, grads = forward_and_gradients(call, kernel, torch.float32)
    assert out.dtype == torch.float32
    for name, got, expected in [("out", out, ref_out), *((n, grads[n], g) for n, g in ref_grads.items())]:
        error = np.abs(got.detach().double().numpy() - expected).max()
        assert error <= F32_RTOL * max(1.0, np.abs(expected).max()), f"{name}: error {error:.3g}"


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "spec,q_positions",
    [
        (AttentionSpec(2, 3, window=(0, 1), relative=Shaw(1)), [1, 9, 3]),
        (AttentionSpec(4, 2, num_kv_heads=2, window=(0, 0), value_head_dim=3), [1, 7, 2]),
    ],
    ids=["shaw", "gqa-dv"],
)
def test_a_row_outside_every_window_gives_exact_zeros(spec, q_positions, kernel):
    """WINDOW-1, MASK-5, MASK-7, GRAD-2: the query at a position whose window holds no key has all-zero
    weights, per-head output exactly 0 (so out = bo exactly) and a zero gradient; a key in no window (key 0)
    gets a zero gradient too."""
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, 3).items()}
    rng = np.random.default_rng(4)
    D = spec.model_dim
    q = torch.as_tensor(rng.normal(size=(2, 3, D))).requires_grad_(True)
    kv = torch.as_tensor(rng.normal(size=(2, 5, D))).requires_grad_(True)
    positions = torch.tensor(q_positions)
    if kernel == "sdpa" and spec.relative is not None:
        return  # the sdpa kernel takes no relative scheme
    out = torch_impl.attention(spec, params, q, kv, q_positions=positions, implementation=KERNELS[kernel])
    assert torch.equal(out[:, 1].detach(), params["bo"].expand(2, D))  # HEAD-2, OUT-1: merged row 0 -> bo
    out.backward(torch.ones_like(out))
    assert torch.equal(q.grad[:, 1], torch.zeros(2, D, dtype=torch.float64))
    assert torch.equal(kv.grad[:, 0], torch.zeros(2, D, dtype=torch.float64))  # MASK-7: a dead key
    assert torch.isfinite(q.grad).all() and torch.isfinite(kv.grad).all()
    if kernel != "sdpa":
        _, w = torch_impl.attention(
            spec, params, q, kv, q_positions=positions, return_weights=True, implementation=KERNELS[kernel]
        )
        assert torch.equal(w[:, :, 1], torch.zeros(2, spec.num_heads, 5, dtype=torch.float64))


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_worked_grouped_heads_example_by_hand(kernel):
    """HEAD-3, the example of spec/attention.md: query heads 0, 1 read key/value head 0 and heads 2, 3 read
    head 1, so one key with value features [1, 2] gives per-head values [1, 1, 2, 2], not [1, 2, 1, 2]."""
    spec = AttentionSpec(num_heads=4, head_dim=1, num_kv_heads=2)
    p = {n: torch.as_tensor(a) for n, a in numpy_ref.identity_params(spec).items()}
    p["wv"] = torch.tensor([[1.0, 0], [0, 1], [0, 0], [0, 0]], dtype=torch.float64)
    query, kv = torch.zeros(1, 1, 4, dtype=torch.float64), torch.tensor([[[1.0, 2.0, 0.0, 0.0]]], dtype=torch.float64)
    out = torch_impl.attention(spec, p, query, kv, implementation=KERNELS[kernel])
    assert out[0, 0].tolist() == [1.0, 1.0, 2.0, 2.0]


@pytest.mark.parametrize("kernel", ["eager", "tiles", "tiles-tiny"])
def test_the_worked_window_and_softcap_examples_by_hand(kernel):
    """WINDOW-1, the example of spec/attention.md: window (1, 0), query positions 2 and 5 over keys 0..2:
    weights [0, 1/2, 1/2] and a row of zeros. SOFTCAP-1: scores 6 and 0 capped at 3 become 3 tanh(2) and 0,
    so the weights are e^(3 tanh 2) / (e^(3 tanh 2) + 1) and its complement."""
    spec = AttentionSpec(num_heads=1, head_dim=1, window=(1, 0))
    p = {n: torch.as_tensor(a) for n, a in numpy_ref.identity_params(spec).items()}
    q, kv = torch.zeros(1, 2, 1, dtype=torch.float64), torch.tensor([[[1.0], [2.0], [3.0]]], dtype=torch.float64)
    _, w = torch_impl.attention(
        spec, p, q, kv, q_positions=torch.tensor([2, 5]), return_weights=True, implementation=KERNELS[kernel]
    )
    assert w[0, 0].tolist() == [[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]]

    spec = AttentionSpec(num_heads=1, head_dim=1, softcap=3.0)
    p = {n: torch.as_tensor(a) for n, a in numpy_ref.identity_params(spec).items()}
    q, kv = torch.tensor([[[2.0]]], dtype=torch.float64), torch.tensor([[[3.0], [0.0]]], dtype=torch.float64)
    _, w = torch_impl.attention(spec, p, q, kv, return_weights=True, implementation=KERNELS[kernel])
    e = np.exp(3.0 * np.tanh(2.0))
    np.testing.assert_allclose(w[0, 0, 0].numpy(), [e / (e + 1), 1 / (e + 1)], rtol=0, atol=1e-15)


def test_sdpa_refuses_softcap_by_name_and_the_automatic_choice_takes_tiles():
    """SOFTCAP-1, KERN-1: the fused kernel has no hook between the score and the mask."""
    spec = AttentionSpec(2, 2, softcap=1.5)
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, 0).items()}
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "implementation='sdpa': cannot run this call: spec.softcap=1.5 caps the score before the masks "
            "(SOFTCAP-1), and sdpa has no score modification; kernels that can: 'eager', 'tiles'"
        ),
    ):
        torch_impl.attention(spec, params, x, implementation="sdpa")
    assert kernels.resolve(None, spec, plain_call()).name == "tiles"
    assert torch.equal(
        torch_impl.attention(spec, params, x), torch_impl.attention(spec, params, x, implementation="tiles")
    )


@pytest.mark.parametrize(
    "spec",
    [
        AttentionSpec(4, 3, num_kv_heads=2),
        AttentionSpec(4, 3, num_kv_heads=1, value_head_dim=5),
        AttentionSpec(2, 3, window=(1, 0)),
        AttentionSpec(2, 3, window=(2, None), causal=True),
    ],
    ids=["gqa", "mqa-dv", "window", "window-causal"],
)
def test_the_automatic_choice_keeps_sdpa_for_grouped_heads_value_sizes_and_windows(spec):
    """KERN-1, HEAD-3, HEAD-4, WINDOW-1: sdpa runs them (enable_gqa, its own value size, the boolean mask)."""
    assert kernels.resolve(None, spec, plain_call(causal=spec.causal, window=spec.window)).name == "sdpa"


def test_tiles_never_split_a_group_of_query_heads():
    """HEAD-3: a tile holds whole groups of G query heads or a part of one group, so that its key/value
    heads are a slice; every (batch, head, query) is in one tile."""
    for H, G, elements in ((6, 2, 3 * 4 * 4), (6, 3, 2 * 4 * 4), (8, 4, 3 * 4 * 4), (6, 2, 5 * 4 * 4), (4, 4, 16)):
        grid = Tiles(elements=elements, min_rows=4).grid(
            2, H, 4, 4, causal_prefix=False, short_rows=False, device_type="cpu", group=G
        )
        seen = np.zeros((2, H, 4), int)
        for t in (t for g in grid for heads in g for t in heads):
            h0, h1 = (0, H) if t.h.start is None else (t.h.start, t.h.stop)
            whole_groups = h0 % G == 0 and (h1 - h0) % G == 0
            assert whole_groups or h0 // G == (h1 - 1) // G, (H, G, elements, t)
            kv = t.kv_heads(G)
            kv0, kv1 = (0, H // G) if kv.start is None else (kv.start, kv.stop)
            assert (kv0, kv1) == (h0 // G, (h1 - 1) // G + 1)
            seen[t.b, h0:h1, t.q0 : t.q1] += 1
        assert (seen == 1).all()


def test_a_window_right_bound_stops_the_tiles_keys():
    """WINDOW-1 with default positions: a tile of queries q0 .. q1 - 1 reads keys up to q1 - 1 + right only."""
    grid = TINY.grid(1, 1, 6, 9, causal_prefix=True, short_rows=True, device_type="cpu", reach=2)
    assert [(t.q0, t.q1, t.k1) for t in grid[0][0]] == [(0, 2, 4), (2, 4, 6), (4, 6, 8)]


def random_peer_spec(rng) -> AttentionSpec:
    """A random spec of ``_random_calls`` (scheme, causal, mask_fill, dropout, ...) with random peer options:
    Hkv a divisor of H (HEAD-3), dv (HEAD-4), a cap (SOFTCAP-1), a window (WINDOW-1)."""
    spec = random_spec(rng)
    H = int(rng.choice([spec.num_heads, 4]))
    if H != spec.num_heads and spec.relative is not None and spec.relative.name == "alibi":
        spec = dataclasses.replace(spec, relative=dataclasses.replace(spec.relative, slopes=None))  # ALIBI-2: H slopes
    divisors = [n for n in range(1, H + 1) if H % n == 0]
    side = [None, 0, 1, 2, 3]
    window = None
    if rng.random() < 0.6:
        window = (side[int(rng.integers(0, 5))], side[int(rng.integers(1, 5))])[:: 1 if rng.random() < 0.5 else -1]
    return dataclasses.replace(
        spec,
        num_heads=H,
        num_kv_heads=None if rng.random() < 0.2 else int(rng.choice(divisors)),
        value_head_dim=None if rng.random() < 0.4 else int(rng.integers(1, 5)),
        softcap=None if rng.random() < 0.5 else float(rng.uniform(0.3, 3.0)),
        window=window,
    )


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_calls_with_peer_options_match_the_reference_in_float64(kernel, seed):
    """HEAD-3, HEAD-4, SOFTCAP-1, WINDOW-1 together with every other option of the random calls (masks, bias
    with -inf, positions, mask_fill, keep masks, both schemes): out, weights and gradients to 1e-12 / 1e-11."""
    call = random_call(seed, max_len=6, spec=random_peer_spec(np.random.default_rng(seed)))
    call.key, call.value = call.key.copy(), call.value.copy()  # own gradients for key and value
    if not supports(KERNELS[kernel], call):
        return
    call.grad_out = np.random.default_rng(seed).normal(size=call.query.shape)
    ref_out, ref_w = numpy_ref.attention(*call.args(), **call.kwargs, return_weights=True)
    ref_grads = numpy_ref.attention_vjp(*call.args(), call.grad_out, **call.kwargs)
    out, weights, grads = forward_and_gradients(call, kernel, torch.float64)
    np.testing.assert_allclose(out.detach().numpy(), ref_out, rtol=0, atol=F64_ATOL)
    if weights is not None:
        np.testing.assert_allclose(weights.numpy(), ref_w, rtol=0, atol=F64_ATOL)
    for name, expected in ref_grads.items():
        np.testing.assert_allclose(grads[name].numpy(), expected, rtol=0, atol=10 * F64_ATOL, err_msg=name)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("pairs", [2, 3])
def test_tiles_of_whole_groups_or_part_of_a_group_match_the_reference(kv_heads, pairs):
    """HEAD-3 in the tiles kernel: with 4 query heads, tiles of 2 heads (``pairs`` (batch, head) pairs fit the
    element budget) are whole groups of G = 2 or half of the group G = 4; out and gradients as numpy_ref."""
    spec = AttentionSpec(4, 2, num_kv_heads=kv_heads, value_head_dim=3, relative=Shaw(1, per_head=True))
    plan = Tiles(elements=pairs * 5 * 5, min_rows=5)
    assert {t.h.stop - t.h.start for g in plan.grid(1, 4, 5, 5, causal_prefix=False, short_rows=False,
            device_type="cpu", group=4 // kv_heads) for heads in g for t in heads} == {2}  # fmt: skip
    rng = np.random.default_rng(5)
    call = SimpleNamespace(
        spec=spec, params=numpy_ref.init_params(spec, 5), query=rng.normal(size=(2, 5, 8)),
        key=rng.normal(size=(2, 5, 8)), value=rng.normal(size=(2, 5, 8)), kwargs={"bias": rng.normal(size=(5, 5))},
        grad_out=rng.normal(size=(2, 5, 8)),
    )  # fmt: skip
    call.args = lambda: (spec, call.params, call.query, call.key, call.value)
    ref_out = numpy_ref.attention(*call.args(), **call.kwargs)
    ref_grads = numpy_ref.attention_vjp(*call.args(), call.grad_out, **call.kwargs)
    params, q, k, v, kw = tensors(call, requires_grad=True)
    out = torch_impl.attention(spec, params, q, k, v, **kw, implementation=plan)
    out.backward(torch.as_tensor(call.grad_out))
    np.testing.assert_allclose(out.detach().numpy(), ref_out, rtol=0, atol=F64_ATOL)
    got = {
        "query": q.grad,
        "key": k.grad,
        "value": v.grad,
        "bias": kw["bias"].grad,
        **{n: p.grad for n, p in params.items()},
    }
    for name, expected in ref_grads.items():
        np.testing.assert_allclose(got[name].numpy(), expected, rtol=0, atol=F64_ATOL, err_msg=name)
    with torch.no_grad():
        again = torch_impl.attention(spec, params, q, k, v, **kw, implementation=plan)
    np.testing.assert_allclose(again.numpy(), ref_out, rtol=0, atol=F64_ATOL)


# ---------------------------------------------------------------- the flex kernel
@pytest.mark.parametrize(
    "spec",
    [
        AttentionSpec(4, 8, causal=True, relative=Alibi()),
        AttentionSpec(4, 8, relative=T5Bias(num_buckets=8, max_distance=16), softcap=5.0),
    ],
    ids=["alibi-causal", "t5-softcap"],
)
@FUSED
def test_compiled_flex_matches_eager_flex(spec):
    """The fused FlexAttention kernel (torch.compile) computes what its eager form does, to float32 rounding,
    with explicit positions and a mask."""
    rng = np.random.default_rng(7)
    params = {n: torch.as_tensor(a, dtype=torch.float32) for n, a in numpy_ref.init_params(spec, 2).items()}
    x = torch.as_tensor(rng.normal(size=(2, 20, spec.model_dim)), dtype=torch.float32)
    kw = {"q_positions": torch.arange(20) * 3, "mask": torch.as_tensor(rng.random((2, 1, 20, 20)) < 0.8)}
    with torch.no_grad():
        eager = torch_impl.attention(spec, params, x, **kw, implementation=Flex(compiled=False))
        fused = torch_impl.attention(spec, params, x, **kw, implementation="flex")
        reference = torch_impl.attention(spec, params, x, **kw, implementation="eager")
    assert (fused - eager).abs().max() <= 1e-5 * eager.abs().max()
    assert (eager - reference).abs().max() <= 1e-5 * reference.abs().max()


SHAW_VALUE_CALLS = {
    "k0": (AttentionSpec(2, 4, relative=Shaw(0)), {}),
    "k1-causal": (AttentionSpec(2, 4, relative=Shaw(1), causal=True), {}),
    "k2-empty-rows": (AttentionSpec(2, 4, relative=Shaw(2)), {"mask": "rows"}),
    "k3-gqa-per-head-values-only": (
        AttentionSpec(4, 4, num_kv_heads=2, relative=Shaw(3, keys=False, per_head=True), value_head_dim=3),
        {},
    ),
    "k2-mask-fill-causal": (AttentionSpec(2, 4, relative=Shaw(2), causal=True, mask_fill=-1e4), {"mask": "rows"}),
    "k9-past-every-distance": (AttentionSpec(2, 4, relative=Shaw(9, key_side="own")), {}),
    "k2-window-softcap": (AttentionSpec(2, 4, relative=Shaw(2), window=(3, 1), softcap=3.0), {}),
}


@FUSED
@pytest.mark.parametrize("name", SHAW_VALUE_CALLS)
def test_flex_computes_shaw_values_from_its_log_sum_exp(name):
    """SHAW-4 in the flex kernel: the band's weights recomputed from FlexAttention's log-sum-exp, the clipped
    rows from the rest (causal) or a second call, equal the reference in float64: k = 0 (one row), k past
    every distance (no clip), a causal rule, rows with no allowed key (0, MASK-5) and mask_fill (MASK-6),
    grouped heads with per-head value tables of their own size, a window and a soft cap; Lq != Lk."""
    spec, extra = SHAW_VALUE_CALLS[name]
    rng = np.random.default_rng(11)
    params = numpy_ref.init_params(spec, 3)
    for n in ("rel_k", "rel_v", "rel_q"):
        if n in params:
            params[n] = rng.normal(size=params[n].shape)
    x, y = rng.normal(size=(2, 7, spec.model_dim)), rng.normal(size=(2, 9, spec.model_dim))
    kw = {}
    if extra.get("mask") == "rows":
        mask = rng.random((2, 1, 7, 9)) < 0.7
        mask[0, :, 3] = False  # a row with no allowed key
        kw["mask"] = mask
    want = numpy_ref.attention(spec, params, x, y, y, **kw)
    t = {n: torch.as_tensor(a) for n, a in params.items()}
    tkw = {n: torch.as_tensor(a) for n, a in kw.items()}
    got = torch_impl.attention(
        spec, t, torch.as_tensor(x), torch.as_tensor(y), **tkw, implementation=Flex(compiled=False)
    )
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-13 * np.abs(want).max())
    if "mask" in kw and spec.mask_fill is None:  # MASK-5: the row's attention exactly 0, so its output is bo
        assert torch.equal(got[0, 3], t["bo"])


@FUSED
def test_flex_shaw_values_keep_float32_accuracy_with_large_logits():
    """The value term's weights exp(score - lse) lose ulp(lse) when logits are large (1e3: 6e-5 in float32):
    the flex kernel shifts every row by a band logit first, so float32 stays at float32 rounding of the
    output (against float64 on the same float32 inputs)."""
    spec = AttentionSpec(2, 4, relative=Shaw(2))
    rng = np.random.default_rng(5)
    params = {n: a.astype(np.float32).astype(np.float64) for n, a in numpy_ref.init_params(spec, 1).items()}
    params["wq"] = params["wq"] * 300  # logits of order 1e3
    x = rng.normal(size=(2, 9, 8)).astype(np.float32).astype(np.float64)
    want = numpy_ref.attention(spec, params, x)
    t = {n: torch.as_tensor(a, dtype=torch.float32) for n, a in params.items()}
    got = torch_impl.attention(spec, t, torch.as_tensor(x, dtype=torch.float32), implementation=Flex(compiled=False))
    assert np.abs(got.double().numpy() - want).max() <= 50 * 2.0**-24 * np.abs(want).max()
