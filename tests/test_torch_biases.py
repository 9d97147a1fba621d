"""ALiBi, T5 and Swin in torch_impl (ALIBI-*, T5-*, SWIN-*; the bias hook, REL-3 (3)): the buckets and rows
by hand and against ``spec``, every kernel against the float64 reference, gradients (d rel_b too) against
its VJP, lower precision, the bias in float32 for bfloat16 (PREC-4), the module's table, the kernel choice.

Expected values come from ``numpy_ref`` (float64), from ``spec``'s exact integer rules
(``t5_bucket``, ``Swin.row``) or from hand derivations; never from torch_impl. The float64
comparisons allow 1e-12 of the truth's scale (measured: below 1e-14). The float32 and bfloat16
bounds are a small multiple of what rounding the inputs and the arithmetic to that dtype costs on
these sizes (d = 2, at most 5 keys, |delta| <= 16, so |bias| <= 32): float32 logits of that size
carry about 32 * 2^-24 = 2e-6 of rounding, bfloat16 rounds q @ k.T, the weights and out to 8 bits.
"""

import dataclasses
import math
import re
from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch_impl needs PyTorch: pip install attnspec[torch]")

from _random_calls import random_call  # noqa: E402
from test_torch_rope import tensors  # noqa: E402  (the random call as tensors, shared)

import numpy_ref  # noqa: E402
import torch_impl  # noqa: E402
from spec import Alibi, AttentionSpec, Swin, T5Bias, t5_bucket  # noqa: E402
from torch_impl import kernels  # noqa: E402
from torch_impl.kernels import Call, Eager, Tiles  # noqa: E402
from torch_impl.schemes import alibi, swin, t5  # noqa: E402

#: Tiles of 2 or 3 queries of one (batch, head) pair: every boundary of the tiles kernel is crossed.
TINY = Tiles(elements=6, query_rows=3, min_rows=2)
KERNELS = {"eager": "eager", "sdpa": "sdpa", "tiles": "tiles", "tiles-tiny": TINY, "auto": None}
F64_RTOL = 1e-12

#: Explicit ALiBi slopes, one per query head (the first H), a zero slope among them (ALIBI-2: finite >= 0).
SLOPES = (0.5, 0.0, 1.3, 0.25, 2.0)

#: name -> the scheme for H query heads: both ALiBi forms with the schedule and explicit slopes; T5
#: bidirectional and causal, with few buckets (one threshold, none) and the default 32 / 128; Swin windows
#: of several shapes (one column: Ww = 1), with and without a prefix token.
SCHEMES = {
    "alibi": lambda H: Alibi(),
    "alibi-linear": lambda H: Alibi(symmetric=False),
    "alibi-slopes": lambda H: Alibi(slopes=SLOPES[:H]),
    "alibi-slopes-linear": lambda H: Alibi(slopes=SLOPES[:H], symmetric=False),
    "t5": lambda H: T5Bias(8, 10),
    "t5-causal": lambda H: T5Bias(6, 5, False),
    "t5-no-thresholds": lambda H: T5Bias(4, 3),
    "t5-default": lambda H: T5Bias(),
    "swin-3x4": lambda H: Swin((3, 4)),
    "swin-3x4-prefix": lambda H: Swin((3, 4), prefix_tokens=1),
    "swin-4x1": lambda H: Swin((4, 1)),
    "swin-4x1-prefix": lambda H: Swin((4, 1), prefix_tokens=1),
    "swin-2x3": lambda H: Swin((2, 3)),
    "swin-2x3-prefix": lambda H: Swin((2, 3), prefix_tokens=1),
}

#: The rest of the layer around the bias: H = 1, 3, 5, grouped heads, causal, a window, a soft cap (the
#: bias comes after it), mask_fill, dropout keep masks, a value head size and a scale of their own.
OPTIONS = [
    dict(num_heads=1),
    dict(num_heads=3, causal=True),
    dict(num_heads=3, num_kv_heads=1),
    dict(num_heads=5, num_kv_heads=1, causal=True),
    dict(num_heads=5, window=(1, 2)),
    dict(num_heads=3, softcap=2.0),
    dict(num_heads=3, mask_fill=-30.0),
    dict(num_heads=3, dropout=0.3),
    dict(num_heads=3, value_head_dim=3, bias=False, scale=0.7),
]

#: Positions far apart: distances up to 1350, beyond 4 * max_distance of every T5 scheme above (4 * 128),
#: negative positions and positions far outside every Swin window.
FAR_Q = np.array([5, -650, 600, 41, -23])
FAR_K = np.array([0, -700, 650, 45, -41])


def make_spec(name: str, options: dict) -> AttentionSpec:
    options = dict(options)
    H = options.pop("num_heads")
    return AttentionSpec(H, 2, relative=SCHEMES[name](H), **options)


def calls(name: str, seeds=(0, 1, 2)):
    """Random calls (masks, bias with -inf, (L,) / (B, L) positions in -6 .. 9, Lq != Lk, keep masks) for
    every OPTIONS, and one call per OPTIONS at the FAR positions, per batch for the keys."""
    for i, options in enumerate(OPTIONS):
        spec = make_spec(name, options)
        for seed in seeds:
            yield random_call(1000 * i + seed, max_len=5, spec=spec)
        call = random_call(1000 * i + 99, max_len=5, spec=spec)
        B, Lq, Lk = call.query.shape[0], call.query.shape[1], call.key.shape[1]
        call.kwargs["q_positions"] = FAR_Q[:Lq]
        call.kwargs["k_positions"] = np.stack([FAR_K[:Lk], FAR_K[:Lk][::-1] + 3])[:B]
        yield call


def kernel_call(spec, q, k, kw, return_weights=False) -> Call:
    return Call(
        q.shape[0], q.shape[1], k.shape[1], q.device, **kw, return_weights=return_weights, causal=spec.causal,
        window=spec.window,
    )  # fmt: skip


def refusal(kernel: str, spec, q, k, kw):
    """The kernel's reason not to run this call, or None; a bias scheme is never the reason."""
    implementation = KERNELS[kernel]
    if implementation is None:
        return None  # the automatic choice always finds a kernel (tiles runs every call)
    plan = kernels.KERNELS[implementation]() if isinstance(implementation, str) else implementation
    reason = plan.unsupported(spec, kernel_call(spec, q, k, kw))
    assert reason is None or "bias hook" not in reason, reason
    assert reason is None or kernel == "sdpa", reason  # eager and tiles run every call
    return reason


def max_rel_error(got, want) -> float:
    got = got.detach().double().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    assert got.shape == want.shape
    assert np.isfinite(got).all(), "NaN or Inf (PREC-3)"
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max())) if want.size else 0.0


def as_tensors(params: dict, dtype=torch.float64) -> dict:
    return {n: torch.as_tensor(a).to(dtype) for n, a in params.items()}


# ---------------------------------------------------------------- the rules by hand
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "linear"])
def test_alibi_weights_by_hand(kernel, symmetric):
    """ALIBI-3, ALIBI-4: H = 2, d = 1, slopes (0.5, 0), wq = 0 so every content logit is 0. The query at
    position 1 sees keys 0 .. 3 at delta = -1, 0, 1, 2: head 0's logits are -0.5 * (1, 0, 1, 2)
    (symmetric) or 0.5 * (-1, 0, 1, 2) (linear), head 1's all 0 (uniform weights). Identity wv, wo:
    out[h] = sum_j w[h, j] * value[j, h]."""
    spec = AttentionSpec(2, 1, relative=Alibi(slopes=(0.5, 0.0), symmetric=symmetric))
    p = numpy_ref.identity_params(spec)
    p["wq"] = np.zeros_like(p["wq"])
    value = np.array([[[1.0, 2.0], [-1.0, 0.5], [3.0, -2.0], [0.25, 4.0]]])  # (1, 4, 2)
    logits0 = [-0.5, 0.0, -0.5, -1.0] if symmetric else [-0.5, 0.0, 0.5, 1.0]
    e = [math.exp(z) for z in logits0]
    w0 = [x / sum(e) for x in e]
    w1 = [0.25] * 4
    want_out = [sum(w * v for w, v in zip(w0, value[0, :, 0])), sum(w * v for w, v in zip(w1, value[0, :, 1]))]
    args = (spec, as_tensors(p), torch.zeros(1, 1, 2, dtype=torch.float64), torch.as_tensor(value))
    q_pos = torch.tensor([1])
    out = torch_impl.attention(*args, q_positions=q_pos, implementation=KERNELS[kernel])
    assert out.flatten().tolist() == pytest.approx(want_out, abs=1e-15)
    if kernel != "sdpa":
        _, w = torch_impl.attention(*args, q_positions=q_pos, return_weights=True, implementation=KERNELS[kernel])
        assert w[0, :, 0].tolist() == [pytest.approx(w0, abs=1e-15), pytest.approx(w1, abs=1e-15)]


def test_t5_buckets_by_hand():
    """T5-2, T5-3. T5Bias(8, 10): S = 4 buckets a side, e = 2 exact distances, one threshold, the least n
    with floor(2 ln(n / 2) / ln(5)) >= 1, i.e. n^2 >= 20: n = 5. T5Bias(6, 5, False): S = 6, e = 3, thresholds
    from n^3 >= 5 * 3^2 = 45 (n = 4) and n^3 >= 25 * 3 = 75 (n = 5); every key after the query is bucket 0."""
    assert T5Bias(8, 10).thresholds() == (5,) and T5Bias(6, 5, False).thresholds() == (4, 5)
    deltas = [-100, -5, -4, -2, -1, 0, 1, 2, 4, 5, 100]
    got = t5.buckets(T5Bias(8, 10), torch.tensor(deltas), t5.thresholds(T5Bias(8, 10), "cpu"))
    assert got.tolist() == [3, 3, 2, 2, 1, 0, 5, 6, 6, 7, 7]
    causal = T5Bias(6, 5, False)
    deltas = [21, 3, 0, -1, -2, -3, -4, -5, -21]
    assert t5.buckets(causal, torch.tensor(deltas), t5.thresholds(causal, "cpu")).tolist() == [
        0,
        0,
        0,
        1,
        2,
        3,
        4,
        5,
        5,
    ]


@pytest.mark.parametrize(
    "scheme",
    [T5Bias(8, 10), T5Bias(6, 5, False), T5Bias(4, 3), T5Bias(2, 2, False), T5Bias(), T5Bias(32, 128, False)],
    ids=repr,
)
def test_t5_buckets_are_spec_s_exact_buckets_at_every_distance(scheme):
    """T5-2, T5-3: torch's bucketize by the integer thresholds (none for T5Bias(4, 3) and T5Bias(2, 2, False))
    gives spec.t5_bucket's bucket at every distance up to 4 * max_distance and beyond, in int64."""
    reach = 5 * scheme.max_distance + 7
    deltas = torch.arange(-reach, reach + 1)
    got = t5.buckets(scheme, deltas, t5.thresholds(scheme, "cpu"))
    assert got.dtype == torch.int64
    want = [t5_bucket(int(d), scheme.num_buckets, scheme.max_distance, scheme.bidirectional) for d in deltas]
    assert got.tolist() == want


def test_swin_rows_by_hand():
    """SWIN-3, SWIN-4, POS-5: window 2 x 3, 3 * 5 = 15 offset rows. Query (0, 0) at position 0 and keys at
    4 = (1, 1): row (1 + 1) * 5 + (1 + 2) = 13; at -1 = (-1, 2) by floor division: 0 * 5 + 4 = 4; at 20 =
    (6, 2), dh clipped to 1: 2 * 5 + 4 = 14; at 0 itself the centre, 1 * 5 + 2 = 7. With one prefix token
    (positions < 1, -1 too): query prefix and key window 15, window and prefix 16, both 17; window query
    1 = (0, 0) and keys 1 = (0, 0): 7, 5 = (1, 1): 13."""
    plain = Swin((2, 3))
    got = swin.pair_rows(plain, torch.tensor([[0]]), torch.tensor([[4, -1, 20, 0]]))
    assert got.tolist() == [[[13, 4, 14, 7]]]
    prefix = Swin((2, 3), prefix_tokens=1)
    got = swin.pair_rows(prefix, torch.tensor([[0, 1, -1]]), torch.tensor([[1, 0, 5]]))
    assert got.tolist() == [[[15, 17, 15], [7, 16, 13], [15, 17, 15]]]


@pytest.mark.parametrize(
    "scheme", [Swin((3, 4)), Swin((3, 4), 1), Swin((4, 1)), Swin((4, 1), 1), Swin((2, 3)), Swin((2, 3), 2)], ids=repr
)
def test_swin_rows_are_spec_s_rows_for_every_pair(scheme):
    """SWIN-3, SWIN-4, POS-5: every pair of positions -9 .. 25 (negative, prefix, inside and far outside the
    window) reads spec's Swin.row; per-batch positions broadcast against shared ones."""
    p = torch.arange(-9, 26)
    got = swin.pair_rows(scheme, torch.stack([p, p.flip(0)]), p.unsqueeze(0))  # (2, L, L)
    want = [[[scheme.row(int(i), int(j)) for j in p] for i in row] for row in (p, p.flip(0))]
    assert got.tolist() == want


# ---------------------------------------------------------------- the hook protocol
@pytest.mark.parametrize(
    "dtype,stat",
    [(torch.float64, torch.float64), (torch.float32, torch.float32), (torch.bfloat16, torch.float32),
     (torch.float16, torch.float32)],
    ids=["float64", "float32", "bfloat16", "float16"],
)  # fmt: skip
@pytest.mark.parametrize("name", ["alibi-slopes-linear", "t5", "swin-3x4-prefix"])
def test_the_bias_hook_gives_1_or_B_H_Lq_Lk_in_the_stat_dtype(name, dtype, stat):
    """REL-3 (3), PREC-4: bias(scheme, params, call, num_heads=H, stat=...) is (1|B, H, Lq, Lk) in the stat
    dtype: (1, ...) for shared positions, (B, ...) for per-batch ones. A table is read exactly (the
    compute dtype's entries, widened); ALiBi's product is the stat dtype's rounding of the float64 one."""
    H = 3
    spec = make_spec(name, dict(num_heads=H))
    scheme = spec.relative
    ref = numpy_ref.init_params(spec, seed=4)
    params = as_tensors(ref, dtype)
    module = {"alibi": alibi, "t5": t5, "swin": swin}[scheme.name]
    for q_pos, k_pos, lead in ((None, None, 1), (np.array([-4, 9]), np.array([[0, 3, 31], [7, -2, 1]]), 2)):
        kw = {} if q_pos is None else {"q_positions": torch.as_tensor(q_pos), "k_positions": torch.as_tensor(k_pos)}
        call = Call(2, 2, 3, torch.device("cpu"), **kw)
        got = module.bias(scheme, params, call, num_heads=H, stat=stat)
        assert got.dtype == stat and got.shape == (lead, H, 2, 3)
        qp = np.arange(2) if q_pos is None else q_pos
        kp = np.arange(3) if k_pos is None else k_pos
        qp, kp = np.broadcast_to(qp, (lead, 2)), np.broadcast_to(kp, (lead, 3))
        table = params["rel_b"].double().numpy() if "rel_b" in params else None  # the rounded table
        truth = [
            [
                [[numpy_ref.schemes.module_for(scheme).literal_bias(
                    scheme, {"rel_b": table}, h, H, int(qp[b, i]), int(kp[b, j])) for j in range(3)]
                 for i in range(2)]
                for h in range(H)
            ]
            for b in range(lead)
        ]  # fmt: skip
        bound = 0.0 if table is not None else np.abs(truth).max() * torch.finfo(stat).eps
        assert np.abs(got.double().numpy() - np.array(truth)).max() <= bound


# ---------------------------------------------------------------- every kernel against the reference
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", SCHEMES)
def test_kernel_matches_the_reference_in_float64(name, kernel):
    """ALIBI-*, T5-*, SWIN-*, REL-3 (3) through each kernel (out and weights) on every call it supports: H = 1,
    3, 5, grouped heads, causal, windows, soft cap, mask_fill, masks, bias with -inf, keep masks, Lq != Lk,
    default, (L,) and (B, L) positions, far ones too. Where sdpa refuses (keep mask, mask_fill, softcap) the
    reason is never the bias scheme (``refusal``)."""
    ran, seen = 0, set()
    for call in calls(name):
        params, q, k, v, kw = tensors(call)
        if refusal(kernel, call.spec, q, k, kw) is not None:
            continue
        want, want_w = numpy_ref.attention(*call.args(), **call.kwargs, return_weights=True)
        with torch.no_grad():  # no gradient recorded: the tiles reuse their buffers
            out = torch_impl.attention(call.spec, params, q, k, v, **kw, implementation=KERNELS[kernel])
        assert max_rel_error(out, want) <= F64_RTOL, (call.spec, sorted(kw))
        if kernel != "sdpa":
            out, w = torch_impl.attention(
                call.spec, params, q, k, v, **kw, return_weights=True, implementation=KERNELS[kernel]
            )
            assert max_rel_error(out, want) <= F64_RTOL, (call.spec, sorted(kw))
            assert max_rel_error(w, want_w) <= F64_RTOL, (call.spec, sorted(kw))
        ran += 1
        seen |= set(kw)
    assert seen >= {"mask", "bias", "q_positions", "k_positions"}
    assert ran >= (len(OPTIONS) * 4 if kernel != "sdpa" else 15)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", SCHEMES)
def test_kernel_gradients_match_the_reference_vjp_in_float64(name, kernel):
    """GRAD-1, T5-5: query, key, value, the bias input and every parameter, rel_b included (autograd's
    scatter-add of the index read, through sdpa's float mask too); ALiBi has no table to differentiate."""
    ran = 0
    for call in calls(name, seeds=(5,)):
        call.key, call.value = call.key.copy(), call.value.copy()  # own gradients for key and value
        params, q, k, v, kw = tensors(call, requires_grad=True)
        if refusal(kernel, call.spec, q, k, kw) is not None:
            continue
        grad_out = np.random.default_rng(ran).normal(size=call.query.shape)
        want = numpy_ref.attention_vjp(*call.args(), grad_out, **call.kwargs)
        out = torch_impl.attention(call.spec, params, q, k, v, **kw, implementation=KERNELS[kernel])
        out.backward(torch.as_tensor(grad_out))
        got = {"query": q.grad, "key": k.grad, "value": v.grad, **{n: t.grad for n, t in params.items()}}
        if "bias" in kw:
            got["bias"] = kw["bias"].grad
        assert set(got) == set(want)
        assert ("rel_b" in want) == (call.spec.relative.name != "alibi")
        for n, g in want.items():
            assert max_rel_error(got[n], g) <= F64_RTOL, (n, call.spec, sorted(kw))
        ran += 1
    assert ran >= (len(OPTIONS) * 2 if kernel != "sdpa" else 8)


@pytest.mark.parametrize("kernel", ["eager", "sdpa", "tiles", "tiles-tiny"])
@pytest.mark.parametrize("name", ["alibi", "t5", "swin-2x3-prefix"])
def test_rows_without_an_allowed_key_give_zero_weights_and_out_bo_exactly(name, kernel):
    """MASK-5, MASK-7 with a scheme bias: a fully masked query row has weight 0 at every key and out = bo
    exactly (the bias is finite and changes nothing there); a key no query may attend contributes nothing."""
    spec = make_spec(name, dict(num_heads=3, num_kv_heads=1))
    params = numpy_ref.init_params(spec, seed=8)
    rng = np.random.default_rng(8)
    x, kv = rng.normal(size=(2, 4, 6)), rng.normal(size=(2, 5, 6))
    mask = np.ones((2, 1, 4, 5), dtype=bool)
    mask[0, :, 1] = False  # batch 0, query 1: no allowed key
    mask[:, :, :, 3] = False  # key 3: dead for every query
    want, want_w = numpy_ref.attention(spec, params, x, kv, mask=mask, return_weights=True)
    args = (spec, as_tensors(params), torch.as_tensor(x), torch.as_tensor(kv))
    out = torch_impl.attention(*args, mask=torch.as_tensor(mask), implementation=KERNELS[kernel])
    assert torch.equal(out[0, 1], torch.as_tensor(params["bo"]))
    assert max_rel_error(out, want) <= F64_RTOL
    if kernel != "sdpa":
        _, w = torch_impl.attention(
            *args, mask=torch.as_tensor(mask), return_weights=True, implementation=KERNELS[kernel]
        )
        assert (w[0, :, 1] == 0).all() and (w[..., 3] == 0).all()
        assert max_rel_error(w, want_w) <= F64_RTOL


# ---------------------------------------------------------------- lower precision
def rounded(a, dtype):
    return torch.as_tensor(np.asarray(a)).to(dtype).double().numpy()


#: Measured maxima over these calls (float32 / bfloat16, every kernel): 2.5e-7 / 7.3e-3; the bounds (RoPE's,
#: test_torch_rope.py) leave 8x / 5x of that.
LOWER = {"float32": (torch.float32, 2e-6), "bfloat16": (torch.bfloat16, 4e-2)}


@pytest.mark.parametrize("dtype", LOWER)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ["alibi", "alibi-slopes-linear", "t5", "t5-causal", "swin-3x4-prefix", "swin-4x1"])
def test_lower_precision_stays_near_the_truth_of_its_rounded_inputs(name, kernel, dtype):
    """PREC-1, PREC-4: in float32 and bfloat16 every kernel is within a few roundings of the float64 truth
    of the same rounded inputs (the table rel_b rounded too; ALiBi's slopes are float64 in the truth and
    rounded once to float32 in the bias); out keeps the input dtype."""
    torch_dtype, bound = LOWER[dtype]
    for options in (OPTIONS[0], OPTIONS[1], OPTIONS[3], OPTIONS[4]):
        for seed in (11, 12):
            call = random_call(seed, max_len=5, spec=make_spec(name, options))
            call.kwargs.pop("bias", None)  # the bias input's rounding is not what is measured here
            call.params = {n: rounded(a, torch_dtype) for n, a in call.params.items()}
            call.query, call.key, call.value = (rounded(a, torch_dtype) for a in (call.query, call.key, call.value))
            params, q, k, v, kw = tensors(call, torch_dtype)
            want = numpy_ref.attention(*call.args(), **call.kwargs)
            with torch.no_grad():
                out = torch_impl.attention(call.spec, params, q, k, v, **kw, implementation=KERNELS[kernel])
            assert out.dtype == torch_dtype
            assert max_rel_error(out, want) <= bound, (options, seed)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_bfloat16_call_computes_the_alibi_bias_in_float32(kernel):
    """PREC-4, ALIBI-3: one query at position 4095, 2048 keys at 0 .. 2047, slope 1, wq = 0 (content logits
    0): the logits are -(4095 - j), whose softmax puts 1 - 1/e on key 2047, (1 - 1/e)/e on key 2046, ...
    In bfloat16 those biases would be multiples of 16, off by up to 8 (checked below), and the eight
    nearest keys would share the weight. Computed in float32 (integers exact up to 2^24) the weights are
    the float64 ones up to their rounding to bfloat16 (half an ulp: 2^-9 below 1) and float32's
    2^-24 * 4095 in the logits; out likewise, up to the bfloat16 roundings of w @ v."""
    spec = AttentionSpec(1, 4, relative=Alibi(slopes=(1.0,)))
    params = numpy_ref.identity_params(spec)
    params["wq"] = np.zeros_like(params["wq"])
    rng = np.random.default_rng(0)
    x, kv = rounded(rng.normal(size=(1, 1, 4)), torch.bfloat16), rounded(rng.normal(size=(1, 2048, 4)), torch.bfloat16)
    q_pos = np.array([4095])
    want, want_w = numpy_ref.attention(spec, params, x, kv, q_positions=q_pos, return_weights=True)
    bias = -(4095.0 - np.arange(2048))
    assert np.abs(rounded(bias, torch.bfloat16) - bias).max() > 1  # what a bfloat16 bias would cost
    bf = torch.bfloat16
    args = (spec, as_tensors(params, bf), torch.as_tensor(x).to(bf), torch.as_tensor(kv).to(bf))
    out = torch_impl.attention(*args, q_positions=torch.as_tensor(q_pos), implementation=KERNELS[kernel])
    assert np.abs(out.double().numpy() - want).max() <= 4e-3
    if kernel != "sdpa":
        _, w = torch_impl.attention(
            *args, q_positions=torch.as_tensor(q_pos), return_weights=True, implementation=KERNELS[kernel]
        )
        assert w.dtype == bf and np.abs(w.double().numpy() - want_w).max() <= 2.0**-9 + 1e-4


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("scheme", [T5Bias(8, 10), Swin((4, 4))], ids=["t5", "swin"])
def test_a_bfloat16_table_gets_its_gradient_summed_in_float32(scheme, kernel):
    """PREC-4, T5-5: at L = 256 (causal) each row of rel_b is read by thousands of pairs. The table is widened
    before the read, so the scatter-add of their gradients sums in float32 and is rounded to bfloat16 once:
    within 2e-2 of the largest d rel_b of the float64 truth of the same rounded inputs (measured: 6.6e-3,
    the bfloat16 roundings of out, its gradient and the final sum). A sum in bfloat16 misses by 3e-2
    (Swin) to 0.9 (T5); tiny tiles whose partial sums were added in bfloat16 by 1e-2."""
    bf = torch.bfloat16
    spec = AttentionSpec(1, 2, relative=scheme, causal=True)
    params = {n: rounded(a, bf) for n, a in numpy_ref.init_params(spec, seed=1).items()}
    rng = np.random.default_rng(1)
    x, grad_out = rounded(rng.normal(size=(1, 256, 2)), bf), rounded(rng.normal(size=(1, 256, 2)), bf)
    want = numpy_ref.attention_vjp(spec, params, x, x, x, grad_out)["rel_b"]
    tp = {n: t.requires_grad_() for n, t in as_tensors(params, bf).items()}
    out = torch_impl.attention(spec, tp, torch.as_tensor(x).to(bf), implementation=KERNELS[kernel])
    out.backward(torch.as_tensor(grad_out).to(bf))
    assert tp["rel_b"].grad.dtype == bf
    assert np.abs(tp["rel_b"].grad.double().numpy() - want).max() <= 2e-2 * np.abs(want).max()
    # the tiles widen the table once per call, so the sum over their tiles is in float32 too
    module = {"t5": t5, "swin": swin}[scheme.name]
    q = torch.zeros(1, 1, 256, 2, dtype=bf)
    state = module.tile_state(scheme, tp, q, Call(1, 256, 256, q.device), causal=True, rows=3, stat=torch.float32)
    assert state.rel_b.dtype == torch.float32


# ---------------------------------------------------------------- the tiles compute the bias per tile
@pytest.mark.parametrize("name", ["alibi", "t5", "swin-3x4-prefix"])
def test_the_tiles_read_the_bias_of_each_tile_and_never_the_whole_call_s(name):
    """REL-3 (3) in the tiles kernel: the scheme's tile_bias once per tile (tiny tiles: many), the eager hook
    never (no (B, H, Lq, Lk) bias); the result is the reference's."""
    spec = make_spec(name, dict(num_heads=3, num_kv_heads=1))
    params = numpy_ref.init_params(spec, seed=3)
    x = np.random.default_rng(3).normal(size=(2, 7, 6))
    module = {"alibi": alibi, "t5": t5, "swin": swin}[spec.relative.name]
    want = numpy_ref.attention(spec, params, x)
    with (
        mock.patch.object(module, "bias", side_effect=AssertionError("the whole call's bias")),
        mock.patch.object(module, "tile_bias", wraps=module.tile_bias) as per_tile,
    ):
        out = torch_impl.attention(spec, as_tensors(params), torch.as_tensor(x), implementation=TINY)
    tiles = TINY.grid(2, 3, 7, 7, causal_prefix=False, short_rows=False, device_type="cpu", group=3)
    assert per_tile.call_count == sum(len(q) for g in tiles for q in g) > 6
    assert max_rel_error(out, want) <= F64_RTOL


# ---------------------------------------------------------------- the module
@pytest.mark.parametrize("name", ["t5", "swin-3x4-prefix"])
def test_the_module_holds_rel_b_round_trips_it_and_trains_it(name):
    """T5-1, SWIN-1, PARAM-1..3: a T5 or Swin layer has the parameter rel_b (H, R) beside the projections;
    load_canonical then canonical_params gives every table back exactly; its forward matches the reference
    and the gradient reaches m.rel_b (the reference's d rel_b)."""
    spec = make_spec(name, dict(num_heads=3, num_kv_heads=1, causal=True))
    params = numpy_ref.init_params(spec, seed=2)
    m = torch_impl.MultiHeadAttention(spec, dtype=torch.float64)
    names = {n for n, _ in m.named_parameters()}
    assert names == {
        f"{lin}.{kind}" for lin in ("q_proj", "k_proj", "v_proj", "out_proj") for kind in ("weight", "bias")
    } | {"rel_b"}
    assert tuple(m.rel_b.shape) == spec.param_shapes()["rel_b"]
    m.load_canonical(params)
    back = m.canonical_params()
    assert back.keys() == params.keys() and all(np.array_equal(back[n], params[n]) for n in params)
    x = np.random.default_rng(2).normal(size=(2, 5, 6))
    q_pos = np.array([0, 3, 4, 9, 11])
    grad_out = np.random.default_rng(3).normal(size=(2, 5, 6))
    want = numpy_ref.attention(spec, params, x, q_positions=q_pos, k_positions=q_pos)
    want_grads = numpy_ref.attention_vjp(spec, params, x, x, x, grad_out, q_positions=q_pos, k_positions=q_pos)
    for implementation in (None, "tiles"):
        m.zero_grad()
        pos = torch.as_tensor(q_pos)
        out = m(torch.as_tensor(x), q_positions=pos, k_positions=pos, implementation=implementation)
        assert max_rel_error(out, want) <= F64_RTOL
        out.backward(torch.as_tensor(grad_out))
        assert max_rel_error(m.rel_b.grad, want_grads["rel_b"]) <= F64_RTOL


def test_an_alibi_module_has_only_the_projections():
    """ALIBI-1: no tables; the module's canonical params are exactly the projections'."""
    spec = AttentionSpec(4, 2, relative=Alibi())
    m = torch_impl.MultiHeadAttention(spec, dtype=torch.float64)
    assert m.rel_b is None and set(m.canonical_params()) == set(spec.param_shapes())
    assert "rel_b" not in spec.param_shapes()


def test_a_table_of_the_wrong_shape_is_refused():
    """PARAM-1, INPUT-1: rel_b must have the scheme's shape, at the call and at load_canonical; it is required."""
    spec = make_spec("t5", dict(num_heads=2))
    params = numpy_ref.init_params(spec, seed=0)
    x = torch.zeros(1, 3, 4, dtype=torch.float64)
    bad = {**params, "rel_b": np.zeros((2, 7))}
    message = re.escape("params['rel_b']: expected shape (2, 8), got (2, 7)")
    with pytest.raises(ValueError, match=message):
        torch_impl.attention(spec, as_tensors(bad), x)
    with pytest.raises(ValueError, match=message):
        torch_impl.MultiHeadAttention(spec, dtype=torch.float64).load_canonical(bad)
    with pytest.raises(ValueError, match=re.escape("got missing ['rel_b']")):
        torch_impl.attention(spec, as_tensors({n: a for n, a in params.items() if n != "rel_b"}), x)


# ---------------------------------------------------------------- the kernel choice
def test_every_kernel_has_a_bias_call_site_and_triton_fuses_every_bias_scheme():
    """REL-3, KERN-1: every kernel calls the bias hook; the fused triton program reads ALiBi's and T5's bias per
    distance and Swin's table at the rows it computes from both positions."""
    from torch_impl.kernels.fused import scheme_unsupported

    with_bias = {name for name, cls in kernels.KERNELS.items() if "bias" in cls.scheme_hooks}
    assert with_bias == set(kernels.KERNELS)
    assert scheme_unsupported(Alibi()) is None
    assert scheme_unsupported(T5Bias(num_buckets=8, max_distance=16)) is None
    assert scheme_unsupported(Swin((2, 2), prefix_tokens=1)) is None


@pytest.mark.parametrize(
    "options,kw,expected",
    [
        (dict(), {}, "sdpa"),
        (dict(causal=True, num_kv_heads=1), {}, "sdpa"),
        (dict(softcap=2.0), {}, "tiles"),
        (dict(), {"return_weights": True}, "tiles"),
    ],
)
@pytest.mark.parametrize("name", ["alibi", "t5", "swin-2x3"])
def test_the_automatic_choice_takes_sdpa_unless_the_call_needs_the_tiles(name, options, kw, expected):
    """KERN-1: a bias scheme alone never sends a call away from sdpa; its soft cap or the weights do."""
    spec = make_spec(name, dict(num_heads=2, **options))
    q = k = torch.zeros(1, 3, spec.model_dim)
    assert kernels.resolve(None, spec, kernel_call(spec, q, k, {}, **kw)).name == expected


def test_sdpa_refuses_a_capped_bias_scheme_for_the_cap():
    """SOFTCAP-1, KERN-1: the scheme bias comes after the cap, which sdpa cannot apply: the reason names the
    cap, not the bias."""
    spec = AttentionSpec(2, 2, relative=Alibi(), softcap=3.0)
    params = as_tensors(numpy_ref.init_params(spec, seed=0))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "implementation='sdpa': cannot run this call: spec.softcap=3.0 caps the score before the masks "
            "(SOFTCAP-1), and sdpa has no score modification; kernels that can: 'eager', 'tiles'"
        ),
    ):
        torch_impl.attention(spec, params, torch.zeros(1, 3, 4, dtype=torch.float64), implementation="sdpa")


def test_a_kernel_without_the_bias_call_site_says_so():
    """REL-3, KERN-1: a kernel that never calls the bias hook refuses ALiBi, T5 and Swin and names the hook."""

    @dataclasses.dataclass(frozen=True)
    class NoBias(Eager):
        scheme_hooks = frozenset({"qk_transform", "key_term", "value_term"})

    call = Call(1, 3, 3, torch.device("cpu"))
    for scheme, cls in ((Alibi(), "Alibi"), (T5Bias(), "T5Bias"), (Swin((2, 2)), "Swin")):
        assert NoBias().unsupported(AttentionSpec(2, 2, relative=scheme), call) == (
            f"{cls} relative terms need the bias hook, and eager calls qk_transform, key_term, value_term"
        )


def test_alibi_slopes_are_one_per_query_head():
    """ALIBI-2, INPUT-1: explicit slopes must be one per query head (checked by the spec, before any kernel)."""
    with pytest.raises(
        ValueError, match=re.escape("Alibi.slopes: expected one slope per query head, num_heads = 3 (ALIBI-2), got 2")
    ):
        AttentionSpec(3, 2, relative=Alibi(slopes=(1.0, 2.0)))


@pytest.mark.parametrize("name", ["alibi", "alibi-linear", "alibi-slopes", "t5", "t5-causal", "t5-default"])
@pytest.mark.parametrize("shape", [(5, 9, 3, 3), (7, 3, 3, 1), (1, 6, 5, 5)], ids=["lq5-lk9", "lq7-lk3-gqa", "lq1"])
def test_sdpa_reads_a_bias_of_the_distance_from_a_view_of_its_lq_plus_lk_minus_1_values(name, shape):
    """REL-3 (3), POS-3: at default positions with nothing else in the mask, sdpa gives SDPA the strided
    view of the Lq + Lk - 1 values (``distance_bias``) with the queries in reverse order; never a whole
    (H, Lq, Lk) bias (``scheme_bias`` is not called). Out and every gradient (rel_b's through the view's
    backward) are the reference's in float64."""
    Lq, Lk, H, Hkv = shape
    spec = AttentionSpec(H, 2, relative=SCHEMES[name](H), num_kv_heads=Hkv)
    params = numpy_ref.init_params(spec, seed=3)
    rng = np.random.default_rng(3)
    x, kv, g = rng.normal(size=(2, Lq, 2 * H)), rng.normal(size=(2, Lk, 2 * H)), rng.normal(size=(2, Lq, 2 * H))
    want = numpy_ref.attention(spec, params, x, kv, kv)
    want_grads = numpy_ref.attention_vjp(spec, params, x, kv, kv.copy(), g)
    tp = {n: t.requires_grad_() for n, t in as_tensors(params).items()}
    tx, tk, tv = (torch.as_tensor(a).requires_grad_() for a in (x, kv, kv.copy()))
    with mock.patch("torch_impl.kernels.sdpa.scheme_bias", side_effect=AssertionError("a whole bias was built")):
        out = torch_impl.attention(spec, tp, tx, tk, tv, implementation="sdpa")
    assert max_rel_error(out, want) <= F64_RTOL
    out.backward(torch.as_tensor(g))
    got = {**{n: t.grad for n, t in tp.items()}, "query": tx.grad, "key": tk.grad, "value": tv.grad}
    for n, a in want_grads.items():
        assert max_rel_error(got[n], a) <= F64_RTOL, n


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("window", [(3, 4), (4, 1), (1, 3), (2, 3)], ids=["3x4", "4x1", "1x3", "2x3"])
def test_one_whole_swin_window_reads_its_table_through_a_view(window, kernel):
    """SWIN-1 for the call Swin makes per window (Wh * Ww tokens, default positions, no prefix): the table
    through an unfolded view (``swin._reversed_pairs``), no row index (``pair_rows`` is not called); out and
    every gradient, rel_b's included, are the reference's in float64. Without gradients the sdpa kernel
    writes the bias into this thread's persistent workspace: two calls with different tables in a row each
    give the reference's output (the second overwrites the first's buffer, never reads it)."""
    Wh, Ww = window
    L = Wh * Ww
    spec = AttentionSpec(3, 2, relative=Swin(window))
    params = numpy_ref.init_params(spec, seed=4)
    rng = np.random.default_rng(4)
    x, g = rng.normal(size=(2, L, 6)), rng.normal(size=(2, L, 6))
    want, want_grads = numpy_ref.attention(spec, params, x), numpy_ref.attention_vjp(spec, params, x, x, x, g)
    tp = {n: t.requires_grad_() for n, t in as_tensors(params).items()}
    tx = torch.as_tensor(x).requires_grad_()
    with mock.patch.object(swin, "pair_rows", side_effect=AssertionError("a row index was built")):
        out = torch_impl.attention(spec, tp, tx, implementation=kernel)
    assert max_rel_error(out, want) <= F64_RTOL
    out.backward(torch.as_tensor(g))
    assert max_rel_error(tp["rel_b"].grad, want_grads["rel_b"]) <= F64_RTOL
    assert max_rel_error(tx.grad, want_grads["query"] + want_grads["key"] + want_grads["value"]) <= F64_RTOL
    other = {**params, "rel_b": rng.normal(size=params["rel_b"].shape)}
    with torch.no_grad(), mock.patch.object(swin, "pair_rows", side_effect=AssertionError("a row index was built")):
        for p in (params, other, params):
            out = torch_impl.attention(spec, as_tensors(p), torch.as_tensor(x), implementation=kernel)
            assert max_rel_error(out, numpy_ref.attention(spec, p, x)) <= F64_RTOL
    if kernel == "sdpa":
        from torch_impl import _workspace

        assert ("reversed-bias", torch.float64) in _workspace.persistent(torch.device("cpu"))._flat
