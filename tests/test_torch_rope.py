"""RoPE in torch_impl (ROPE-1..ROPE-9): the q/k transform hook, every kernel against the float64 reference,
gradients against its VJP, lower precision, the module, the kernel choice and its errors.

Expected values come from ``numpy_ref`` (float64) or from hand derivations
with ``math.cos`` / ``math.sin``. The float64 comparisons allow 1e-12 of
the truth's scale (the measured errors are a few 1e-16); the float32 and
bfloat16 bounds are a small multiple of what rounding the inputs and the
arithmetic to that dtype costs on these sizes (d <= 8, at most 6 keys).
"""

import dataclasses
import math
import re
from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch_impl needs PyTorch: pip install attnspec[torch]")

from _random_calls import random_call  # noqa: E402

import numpy_ref  # noqa: E402
import torch_impl  # noqa: E402
from spec import AttentionSpec, Rope, Shaw  # noqa: E402
from torch_impl import kernels  # noqa: E402
from torch_impl.kernels import Call, Eager, Tiles  # noqa: E402
from torch_impl.schemes import rope  # noqa: E402

#: Tiles of 2 or 3 queries of one (batch, head) pair: every boundary of the tiles kernel is crossed.
TINY = Tiles(elements=6, query_rows=3, min_rows=2)
KERNELS = {"eager": "eager", "sdpa": "sdpa", "tiles": "tiles", "tiles-tiny": TINY}
F64_RTOL = 1e-12

#: (Rope, head_dim): each layout, partial rotation, explicit frequencies with zeros, the attention
#: factor and every constructor; head_dim > r where the constructor rotates part of a head.
SCHEMES = {
    "half": (Rope(), 4),
    "interleaved": (Rope(layout="interleaved", theta=50.0), 6),
    "interleaved-odd-head": (Rope(rotary_dim=4, layout="interleaved"), 5),  # odd strides: no complex view
    "partial": (Rope(rotary_dim=2), 4),
    "inv-freq-zeros": (Rope(inv_freq=(0.7, 0.0, 1.9)), 8),
    "attention-factor": (Rope(layout="interleaved", attention_factor=1.7), 4),
    "linear": (Rope.linear(2.0, rotary_dim=4), 6),
    "ntk": (Rope.ntk(3.0, rotary_dim=4, layout="interleaved"), 4),
    "yarn": (Rope.yarn(4.0, 8, rotary_dim=4), 6),
    "llama3": (Rope.llama3(8.0, 1.0, 4.0, 8, rotary_dim=4), 4),
    "proportional": (Rope.proportional(0.5, rotary_dim=4, layout="interleaved"), 6),
}

#: The rest of the layer around the rotation: grouped heads, causal, window, dropout, mask_fill, softcap,
#: a value head size of its own, no biases with a scale of its own.
OPTIONS = [
    dict(num_heads=2),
    dict(num_heads=2, num_kv_heads=1),
    dict(num_heads=4, num_kv_heads=2, causal=True),
    dict(num_heads=2, causal=True),
    dict(num_heads=2, dropout=0.3),
    dict(num_heads=2, bias=False, scale=0.7),
    dict(num_heads=2, window=(1, 2)),
    dict(num_heads=2, softcap=2.0),
    dict(num_heads=2, mask_fill=-30.0),
    dict(num_heads=2, value_head_dim=3),
]


def rope_spec(scheme: str, **options) -> AttentionSpec:
    relative, d = SCHEMES[scheme]
    options = dict(options)
    return AttentionSpec(options.pop("num_heads"), d, relative=relative, **options)


def tensors(call, dtype=torch.float64, requires_grad=False):
    """params, query, key, value and keyword tensors of a random call, in dtype (each its own tensor)."""

    def t(a):
        a = torch.as_tensor(np.array(a))
        return a.to(dtype).requires_grad_(requires_grad) if a.is_floating_point() else a

    params = {n: t(a) for n, a in call.params.items()}
    q, k, v = t(call.query), t(call.key), t(call.value)
    kw = {n: (t(a) if n == "bias" else torch.as_tensor(np.array(a))) for n, a in call.kwargs.items()}
    return params, q, k, v, kw


def kernel_call(spec, q, k, kw) -> Call:
    return Call(q.shape[0], q.shape[1], k.shape[1], q.device, **kw, causal=spec.causal, window=spec.window)


def refusal(kernel: str, spec, q, k, kw):
    """The kernel's reason not to run this call, or None; a RoPE call is never refused for being RoPE."""
    implementation = KERNELS[kernel]
    plan = kernels.KERNELS[implementation]() if isinstance(implementation, str) else implementation
    reason = plan.unsupported(spec, kernel_call(spec, q, k, kw))
    assert reason is None or not ("Rope" in reason or "qk_transform" in reason), reason
    assert reason is None or kernel == "sdpa", reason  # eager and tiles run every call
    return reason


def max_rel_error(got, want) -> float:
    got = got.detach().double().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    assert got.shape == want.shape
    assert np.isfinite(got).all(), "NaN or Inf (PREC-3)"
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max())) if want.size else 0.0


def calls(scheme: str, seeds=(0, 1)):
    """Random calls (masks, bias with -inf, (L,) / (B, L) positions, Lq != Lk, keep masks) for every OPTIONS."""
    for i, options in enumerate(OPTIONS):
        spec = rope_spec(scheme, **options)
        for seed in seeds:
            yield random_call(1000 * i + seed, max_len=5, spec=spec)


# ---------------------------------------------------------------- the hook by hand
def test_a_pair_turns_by_position_times_frequency_by_hand():
    """ROPE-4, ROPE-5: with r = 2 the one frequency is theta^0 = 1, so (1, 0) at position p becomes
    (cos p, sin p) and (0, 1) becomes (-sin p, cos p); the half and interleaved layouts agree for r = 2."""
    q = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [3.0, -2.0]]]], dtype=torch.float64)  # (1, 1, 3, 2)
    p = torch.tensor([[2, 5, -3]])
    for layout in ("half", "interleaved"):
        got, _ = rope.qk_transform(Rope(layout=layout), {}, q, q[:, :, :1], p, p[:, :1])
        want = [
            [math.cos(2), math.sin(2)],
            [-math.sin(5), math.cos(5)],
            [3 * math.cos(-3) + 2 * math.sin(-3), 3 * math.sin(-3) - 2 * math.cos(-3)],
        ]
        assert torch.allclose(got[0, 0], torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-15)


def test_the_pairs_of_each_layout_and_the_untouched_channels_by_hand():
    """ROPE-2, ROPE-3, ROPE-7: d = 6, inv_freq (0.5, 0), af = 2. Half: pairs (0, 2), (1, 3); interleaved:
    (0, 1), (2, 3). The pair of frequency 0 is only scaled by af; channels 4, 5 pass unchanged and unscaled."""
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.float64).view(1, 1, 1, 6)
    p = torch.tensor([[3]])
    c, s = math.cos(1.5), math.sin(1.5)
    scheme = Rope(inv_freq=(0.5, 0.0), attention_factor=2.0)
    half, _ = rope.qk_transform(scheme, {}, x, x, p, p)
    want_half = [2 * (1 * c - 3 * s), 2 * 2, 2 * (1 * s + 3 * c), 2 * 4, 5, 6]
    assert half.flatten().tolist() == pytest.approx(want_half, abs=1e-14)
    inter, _ = rope.qk_transform(dataclasses.replace(scheme, layout="interleaved"), {}, x, x, p, p)
    want_inter = [2 * (1 * c - 2 * s), 2 * (1 * s + 2 * c), 2 * 3, 2 * 4, 5, 6]
    assert inter.flatten().tolist() == pytest.approx(want_inter, abs=1e-14)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_rotated_layer_by_hand(kernel):
    """ROPE-5, ROPE-6, v never rotated: H = 1, d = 2, identity projections. The query (1, 0) at position 1
    turns to (cos 1, sin 1); keys (1, 0) at positions 0 and 1 turn to (1, 0) and (cos 1, sin 1), so the
    logits are s cos 1 and s (s = 1/sqrt 2), and the output mixes the unrotated values (1, 0), (0, 1)."""
    spec = AttentionSpec(num_heads=1, head_dim=2, relative=Rope())
    p = {n: torch.as_tensor(a) for n, a in numpy_ref.identity_params(spec).items()}
    query = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    key = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]], dtype=torch.float64)
    value = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    out = torch_impl.attention(
        spec, p, query, key, value, q_positions=torch.tensor([1]), implementation=KERNELS[kernel]
    )
    s = 1 / math.sqrt(2)
    w1 = 1 / (1 + math.exp(s * (math.cos(1) - 1)))
    assert out.flatten().tolist() == pytest.approx([1 - w1, w1], abs=1e-15)


# ---------------------------------------------------------------- every kernel against the reference
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_kernel_matches_the_reference_in_float64(scheme, kernel):
    """ROPE-1..ROPE-9 through each kernel (out and weights) on every call it supports: each layout and
    constructor, grouped heads, causal, windows, masks, bias, keep masks, Lq != Lk, (L,) and (B, L) positions.
    Where sdpa refuses a call (keep mask, mask_fill, softcap), the reason is never RoPE (``refusal``)."""
    ran = 0
    for call in calls(scheme):
        params, q, k, v, kw = tensors(call)
        if refusal(kernel, call.spec, q, k, kw) is not None:
            continue  # sdpa: a keep mask, mask_fill or softcap (``refusal`` checked the reason)
        want, want_w = numpy_ref.attention(*call.args(), **call.kwargs, return_weights=True)
        with torch.no_grad():  # no gradient recorded: the tiles reuse their buffers
            out = torch_impl.attention(call.spec, params, q, k, v, **kw, implementation=KERNELS[kernel])
        assert max_rel_error(out, want) <= F64_RTOL, call.spec
        if kernel != "sdpa":
            out, w = torch_impl.attention(
                call.spec, params, q, k, v, **kw, return_weights=True, implementation=KERNELS[kernel]
            )
            assert max_rel_error(out, want) <= F64_RTOL, call.spec
            assert max_rel_error(w, want_w) <= F64_RTOL, call.spec
        ran += 1
    assert ran >= len(OPTIONS) if kernel != "sdpa" else ran >= 8


def test_large_positions_keep_float64_angles():
    """ROPE-9: at positions near 2^17 the angles are float64 products of the exact positions. In float32
    the angle itself would be off by up to 2^17 * 2^-24 = 0.008 rad; with float64 angles the float32 layer
    stays at float32 rounding (and float64 at 1e-12)."""
    spec = AttentionSpec(2, 8, relative=Rope(theta=100.0), causal=True)
    rng = np.random.default_rng(7)
    params = numpy_ref.init_params(spec, seed=7)
    x, kv = rng.normal(size=(2, 4, 16)), rng.normal(size=(2, 6, 16))
    offset = 2**17
    q_pos = np.array([[2, 3, 4, 5], [5, 7, 8, 9]]) + offset
    k_pos = np.arange(6) + offset
    rounded = {n: a.astype(np.float32).astype(np.float64) for n, a in params.items()}
    x32, kv32 = x.astype(np.float32).astype(np.float64), kv.astype(np.float32).astype(np.float64)
    truth64 = numpy_ref.attention(spec, params, x, kv, q_positions=q_pos, k_positions=k_pos)
    truth32 = numpy_ref.attention(spec, rounded, x32, kv32, q_positions=q_pos, k_positions=k_pos)
    for kernel in KERNELS.values():
        for dtype, p, a, b, want, bound in (
            (torch.float64, params, x, kv, truth64, F64_RTOL),
            (torch.float32, rounded, x32, kv32, truth32, 1e-5),
        ):
            out = torch_impl.attention(
                spec,
                {n: torch.as_tensor(t, dtype=dtype) for n, t in p.items()},
                torch.as_tensor(a, dtype=dtype),
                torch.as_tensor(b, dtype=dtype),
                q_positions=torch.as_tensor(q_pos),
                k_positions=torch.as_tensor(k_pos),
                implementation=kernel,
            )
            assert max_rel_error(out, want) <= bound, (kernel, dtype)


@pytest.mark.parametrize("per_batch", [False, True], ids=["(L,)", "(B, L)"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_explicit_positions_of_either_shape(kernel, per_batch):
    """POS-1, ROPE-5: (L,) positions rotate every batch alike, (B, L) each batch at its own positions;
    with int32 positions too."""
    spec = AttentionSpec(4, 4, num_kv_heads=2, relative=Rope(layout="interleaved"))
    rng = np.random.default_rng(3)
    params = numpy_ref.init_params(spec, seed=3)
    x, kv = rng.normal(size=(2, 3, 16)), rng.normal(size=(2, 5, 16))
    q_pos = rng.integers(-40, 40, size=(2, 3) if per_batch else (3,))
    k_pos = rng.integers(-40, 40, size=(2, 5) if per_batch else (5,))
    want = numpy_ref.attention(spec, params, x, kv, q_positions=q_pos, k_positions=k_pos)
    out = torch_impl.attention(
        spec,
        {n: torch.as_tensor(a) for n, a in params.items()},
        torch.as_tensor(x),
        torch.as_tensor(kv),
        q_positions=torch.as_tensor(q_pos, dtype=torch.int32),
        k_positions=torch.as_tensor(k_pos),
        implementation=KERNELS[kernel],
    )
    assert max_rel_error(out, want) <= F64_RTOL


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("scheme", ["half", "interleaved", "inv-freq-zeros", "yarn", "proportional"])
def test_kernel_gradients_match_the_reference_vjp_in_float64(scheme, kernel):
    """GRAD-1 through the rotation's autograd: query, key, value, bias and every parameter (wq, bq, wk, bk
    pass through the rotation's transpose; wv, bv never see it)."""
    ran = 0
    for call in calls(scheme, seeds=(5,)):
        call.key, call.value = call.key.copy(), call.value.copy()  # own gradients for key and value
        params, q, k, v, kw = tensors(call, requires_grad=True)
        if refusal(kernel, call.spec, q, k, kw) is not None:
            continue  # sdpa: a keep mask, mask_fill or softcap
        grad_out = np.random.default_rng(ran).normal(size=call.query.shape)
        want = numpy_ref.attention_vjp(*call.args(), grad_out, **call.kwargs)
        out = torch_impl.attention(call.spec, params, q, k, v, **kw, implementation=KERNELS[kernel])
        out.backward(torch.as_tensor(grad_out))
        got = {"query": q.grad, "key": k.grad, "value": v.grad, **{n: t.grad for n, t in params.items()}}
        if "bias" in kw:
            got["bias"] = kw["bias"].grad
        assert set(got) == set(want)
        for name, g in want.items():
            assert max_rel_error(got[name], g) <= F64_RTOL, (name, call.spec)
        ran += 1
    assert ran >= 3


# ---------------------------------------------------------------- lower precision
def rounded(a, dtype):
    return torch.as_tensor(np.asarray(a)).to(dtype).double().numpy()


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 2e-6), (torch.bfloat16, 4e-2)], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_lower_precision_stays_near_the_truth_of_its_rounded_inputs(kernel, dtype, bound):
    """PREC-1, PREC-4: in float32 and bfloat16 every kernel is within a few roundings of the float64 truth
    of the same (rounded) inputs; out keeps the input dtype."""
    for scheme in ("half", "interleaved", "partial", "yarn"):
        for options in (OPTIONS[0], OPTIONS[2]):
            call = random_call(11, max_len=5, spec=rope_spec(scheme, **options))
            call.kwargs.pop("bias", None)  # the bias's rounding is not what is measured here
            call.params = {n: rounded(a, dtype) for n, a in call.params.items()}
            call.query, call.key, call.value = (rounded(a, dtype) for a in (call.query, call.key, call.value))
            params, q, k, v, kw = tensors(call, dtype)
            want = numpy_ref.attention(*call.args(), **call.kwargs)
            with torch.no_grad():
                out = torch_impl.attention(call.spec, params, q, k, v, **kw, implementation=KERNELS[kernel])
            assert out.dtype == dtype
            assert max_rel_error(out, want) <= bound, (scheme, options)


def test_bfloat16_is_rotated_in_float32_and_rounded_once():
    """PREC-4: the rotated bfloat16 q and k are the float32 rotation rounded once: within half a bfloat16
    ulp (and a float32 hair) of the exact rotation; a rotation in bfloat16 arithmetic misses by more."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 64, 16, generator=gen).to(torch.bfloat16)
    p = torch.arange(64).view(1, 64) * 37
    scheme = Rope(attention_factor=1.3)
    got, _ = rope.qk_transform(scheme, {}, x, x, p, p)
    assert got.dtype == torch.bfloat16
    exact, _ = rope.qk_transform(scheme, {}, x.double(), x.double(), p, p)
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(2.0**-100))) - 7)  # bfloat16 has 8 bits
    assert ((got.double() - exact).abs() <= 0.5 * ulp * (1 + 2.0**-12) + 1e-30).all()


# ---------------------------------------------------------------- the module
def test_the_module_with_rope_round_trips_and_matches_the_reference():
    """ROPE-1, PARAM-1..3: a Rope layer has exactly the projection parameters; load_canonical then
    canonical_params gives them back exactly; its forward (automatic kernel) and an explicit tiles
    forward match the reference."""
    spec = AttentionSpec(4, 6, num_kv_heads=2, relative=Rope.yarn(4.0, 8, rotary_dim=4), causal=True)
    params = numpy_ref.init_params(spec, seed=2)
    m = torch_impl.MultiHeadAttention(spec, dtype=torch.float64)
    assert {n for n, _ in m.named_parameters()} == {
        f"{lin}.{kind}" for lin in ("q_proj", "k_proj", "v_proj", "out_proj") for kind in ("weight", "bias")
    }
    m.load_canonical(params)
    back = m.canonical_params()
    assert back.keys() == params.keys() and all(np.array_equal(back[n], params[n]) for n in params)
    x = np.random.default_rng(2).normal(size=(2, 5, 24))
    want = numpy_ref.attention(spec, params, x, q_positions=np.arange(5) + 9, k_positions=np.arange(5) + 9)
    for implementation in (None, "tiles"):
        out = m(
            torch.as_tensor(x),
            q_positions=torch.arange(5) + 9,
            k_positions=torch.arange(5) + 9,
            implementation=implementation,
        )
        assert max_rel_error(out, want) <= F64_RTOL
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(torch.as_tensor(x)), m(torch.as_tensor(x), implementation="sdpa"))


# ---------------------------------------------------------------- the kernel choice and its errors
def test_the_automatic_choice_is_the_one_of_the_same_call_without_rope():
    """KERN-1: implementation=None picks sdpa for a RoPE call exactly when it picks it without RoPE."""
    picked = set()
    for scheme in ("half", "partial"):
        for call in calls(scheme, seeds=(0, 1, 2)):
            _, q, k, _, kw = tensors(call)
            c = kernel_call(call.spec, q, k, kw)
            with_rope = kernels.resolve(None, call.spec, c).name
            without = kernels.resolve(None, dataclasses.replace(call.spec, relative=None), c).name
            assert with_rope == without, call.spec
            picked.add(with_rope)
    assert picked == {"sdpa", "tiles"}


def test_the_tiles_kernel_rotates_once_per_call():
    """REL-3 (1): tiles calls the transform once, before its first tile (many tiles here)."""
    spec = AttentionSpec(2, 4, relative=Rope(), causal=True)
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, seed=0).items()}
    with mock.patch.object(rope, "qk_transform", wraps=rope.qk_transform) as hook:
        torch_impl.attention(spec, params, torch.randn(2, 7, 8, dtype=torch.float64), implementation=TINY)
    assert hook.call_count == 1


def test_sdpa_refuses_a_rope_call_for_the_call_s_reasons_only():
    """KERN-1: sdpa runs RoPE, so a RoPE call it refuses is refused for its keep mask or weights, named."""
    spec = AttentionSpec(2, 4, relative=Rope(), dropout=0.5)
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, seed=0).items()}
    x = torch.randn(1, 3, 8, dtype=torch.float64)
    keep = torch.ones(1, 2, 3, 3, dtype=torch.bool)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "implementation='sdpa': cannot run this call: sdpa takes no dropout_keep mask (DROP-1); "
            "sdpa does not return the weights (return_weights=True); kernels that can: 'eager', 'tiles' "
            "(KERN-1: no silent fallback)"
        ),
    ):
        torch_impl.attention(spec, params, x, dropout_keep=keep, return_weights=True, implementation="sdpa")
    with pytest.raises(ValueError, match=re.escape("implementation='sdpa': cannot run this call: spec.softcap=")):
        torch_impl.attention(dataclasses.replace(spec, softcap=3.0), params, x, implementation="sdpa")


def test_a_kernel_without_the_transform_call_site_says_so():
    """REL-3, KERN-1: a kernel that never calls qk_transform refuses a Rope spec and names the hook; sdpa's
    refusal of a Shaw spec now says that it calls qk_transform only."""

    @dataclasses.dataclass(frozen=True)
    class KeyTermsOnly(Eager):
        scheme_hooks = frozenset({"key_term", "value_term"})

    spec = AttentionSpec(2, 4, relative=Rope())
    call = Call(1, 3, 3, torch.device("cpu"))
    assert KeyTermsOnly().unsupported(spec, call) == (
        "Rope relative terms need the qk_transform hook, and eager calls key_term, value_term"
    )
    shaw = AttentionSpec(2, 4, relative=Shaw(2))
    assert kernels.SDPA().unsupported(shaw, call) == (
        "Shaw relative terms need the key_term and value_term hooks, and sdpa calls qk_transform, bias"
    )


def test_float_positions_are_refused_by_name():
    """INPUT-1, POS-1: RoPE's angles come from integer positions; float positions are a TypeError."""
    spec = AttentionSpec(2, 4, relative=Rope())
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, seed=0).items()}
    x = torch.randn(1, 3, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match="q_positions"):
        torch_impl.attention(spec, params, x, q_positions=torch.arange(3.0))


@pytest.mark.parametrize("layout,d", [("half", 6), ("interleaved", 6), ("interleaved", 5)])
def test_the_rotation_node_has_exact_first_and_second_derivatives(layout, d):
    """GRAD-1: the rotation's own backward (the rotation by the negated angles) against finite differences,
    and its backward differentiated again (gradcheck, gradgradcheck in float64)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, d, dtype=torch.float64, generator=gen).requires_grad_(True)
    scheme = Rope(rotary_dim=4, layout=layout, attention_factor=1.2)
    cos, sin = rope.angle_tables(scheme, torch.tensor([[0, 3, -2, 7]]), d, torch.float64)
    f = lambda t: rope.rotate(t, cos, sin, 4, layout)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))
