"""torch_impl against the float64 reference, its module, interop, compile, memory and errors.

(The full conformance matrix for the ``torch`` adapter runs in
test_conformance_matrix.py.)
"""

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="torch_impl needs PyTorch: pip install attnspec[torch]")

from _random_calls import random_call  # noqa: E402

import numpy_ref  # noqa: E402
import torch_impl  # noqa: E402
from conformance.adapters.torch_impl_adapter import TorchImplAdapter  # noqa: E402
from spec import AttentionSpec, Huang, Shaw  # noqa: E402
from torch_impl.kernels import Tiles, tiles  # noqa: E402

CUDA = pytest.param(
    "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device present on this machine")
)
DEVICES = ["cpu", CUDA]


def tensors(call, device="cpu", requires_grad=False):
    def t(a):
        return None if a is None else torch.as_tensor(np.asarray(a), device=device)

    params = {n: t(a).requires_grad_(requires_grad) for n, a in call.params.items()}
    q, k, v = (t(a).clone().requires_grad_(requires_grad) for a in (call.query, call.key, call.value))
    kw = {n: t(a) for n, a in call.kwargs.items()}
    if "bias" in kw and requires_grad:
        kw["bias"] = kw["bias"].clone().requires_grad_(True)
    return params, q, k, v, kw


#: The tiles kernel cut into tiles of 2 or 3 queries of one (batch, head) pair, on any device.
TINY_TILES = Tiles(elements=6, query_rows=3, min_rows=2)


class TinyTilesAdapter(TorchImplAdapter):
    """The torch adapter with every call on the tiny tiles (a module:Class adapter for the CLI)."""

    name = "torch:tiles-tiny"
    implementation = TINY_TILES


@pytest.mark.parametrize("tiles", ["default", "tiny"])
@pytest.mark.parametrize("device", DEVICES)
@given(seed=st.integers(0, 2**32 - 1))
def test_forward_and_gradients_match_the_reference_in_float64(device, tiles, seed):
    check_against_reference(device, seed, TINY_TILES if tiles == "tiny" else None)


def check_against_reference(device, seed, implementation=None):
    call = random_call(seed)
    call.key, call.value = call.key.copy(), call.value.copy()
    params, q, k, v, kw = tensors(call, device, requires_grad=True)
    kw["implementation"] = implementation
    out, w = torch_impl.attention(call.spec, params, q, k, v, **kw, return_weights=True)
    ref_out, ref_w = numpy_ref.attention(*call.args(), **call.kwargs, return_weights=True)
    np.testing.assert_allclose(out.detach().cpu().numpy(), ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w.detach().cpu().numpy(), ref_w, rtol=0, atol=1e-12)
    g = np.random.default_rng(seed).normal(size=ref_out.shape)
    # the gradient path without weights may take the fused kernel (implementation=None): check it too
    out2 = torch_impl.attention(call.spec, params, q, k, v, **kw)
    np.testing.assert_allclose(out2.detach().cpu().numpy(), ref_out, rtol=0, atol=1e-12)
    with torch.no_grad():  # no gradient recorded: the tiles reuse their buffers
        out3 = torch_impl.attention(call.spec, params, q, k, v, **kw)
    np.testing.assert_allclose(out3.cpu().numpy(), ref_out, rtol=0, atol=1e-12)
    out2.backward(torch.as_tensor(g, device=device))
    ref = numpy_ref.attention_vjp(*call.args(), g, **call.kwargs)
    got = {"query": q.grad, "key": k.grad, "value": v.grad, **{n: p.grad for n, p in params.items()}}
    if "bias" in call.kwargs:
        got["bias"] = kw["bias"].grad
    for name, expected in ref.items():
        np.testing.assert_allclose(got[name].cpu().numpy(), expected, rtol=0, atol=1e-11, err_msg=name)


def test_self_attention_defaults_key_and_value():
    spec = AttentionSpec(2, 3, relative=Huang(4))
    call = random_call(1, spec=spec, cross=False)
    params, q, _, _, _ = tensors(call)
    np.testing.assert_allclose(
        torch_impl.attention(spec, params, q).numpy(), numpy_ref.attention(spec, call.params, call.query), atol=1e-12
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_16_bit_and_float32_stay_in_their_dtype(dtype):
    spec = AttentionSpec(2, 4, relative=Shaw(2), causal=True)
    m = torch_impl.MultiHeadAttention(spec, dtype=dtype)
    x = torch.randn(2, 6, 8, dtype=dtype)
    out, w = m(x, return_weights=True)
    assert out.dtype == dtype and w.dtype == dtype
    ref = numpy_ref.attention(
        spec, {n: a.astype(np.float64) for n, a in m.canonical_params().items()}, x.float().numpy().astype(np.float64)
    )
    tol = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 5e-3}[dtype]
    np.testing.assert_allclose(out.float().detach().numpy(), ref, atol=tol)


# ---------------------------------------------------------------- module
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_canonical_round_trip_is_exact(dtype):
    spec = AttentionSpec(2, 3, relative=Shaw(2, per_head=True))
    m = torch_impl.MultiHeadAttention(spec, dtype=dtype)
    params = m.canonical_params()
    assert {n: a.shape for n, a in params.items()} == spec.param_shapes()
    m2 = torch_impl.MultiHeadAttention(spec, dtype=dtype).load_canonical(params)
    for n, a in m2.canonical_params().items():
        assert a.dtype == params[n].dtype and a.tobytes() == params[n].tobytes(), n
    # the module stores nn.Linear weights (out, in): canonical wq is its transpose
    assert np.array_equal(params["wq"].astype(np.float64), m.q_proj.weight.detach().double().numpy().T)


@pytest.mark.parametrize(
    "spec",
    [
        AttentionSpec(4, 3, num_kv_heads=2, value_head_dim=5, relative=Shaw(2, per_head=True)),
        AttentionSpec(4, 2, num_kv_heads=1, value_head_dim=3, bias=False, relative=Huang(3)),
    ],
    ids=["gqa-dv-shaw-per-head", "mqa-dv-huang-no-bias"],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_the_module_takes_its_shapes_from_param_shapes_and_round_trips_exactly(spec, dtype):
    """PARAM-1, PARAM-3, HEAD-3, HEAD-4: k_proj D -> Hkv * d, v_proj D -> Hkv * dv, out_proj H * dv -> D,
    rel_v (H, R, dv); canonical -> module -> canonical is bit-exact, and the module computes the reference."""
    m = torch_impl.MultiHeadAttention(spec, dtype=dtype)
    D, Hkv, d, dv = spec.model_dim, spec.kv_heads, spec.head_dim, spec.v_head_dim
    assert m.k_proj.weight.shape == (Hkv * d, D) and m.v_proj.weight.shape == (Hkv * dv, D)
    assert m.out_proj.weight.shape == (D, spec.num_heads * dv)
    params = m.canonical_params()
    assert {n: a.shape for n, a in params.items()} == spec.param_shapes()
    back = torch_impl.MultiHeadAttention(spec, dtype=dtype).load_canonical(params).canonical_params()
    for n, a in back.items():
        assert a.dtype == params[n].dtype and a.tobytes() == params[n].tobytes(), n
    if dtype == torch.float64:
        ref_params = numpy_ref.init_params(spec, 2)
        m.load_canonical(ref_params)
        x = np.random.default_rng(3).normal(size=(2, 5, D))
        np.testing.assert_allclose(
            m(torch.as_tensor(x)).detach().numpy(), numpy_ref.attention(spec, ref_params, x), rtol=0, atol=1e-12
        )


@pytest.mark.parametrize(
    "spec",
    [
        AttentionSpec(4, 2, num_kv_heads=2, window=(40, 3), relative=Shaw(3), dropout=0.25),
        AttentionSpec(4, 2, num_kv_heads=1, value_head_dim=3, window=(16, None), causal=True, softcap=2.0,
                      relative=Huang(20), dropout=0.25),
    ],
    ids=["gqa-window-shaw", "mqa-dv-sliding-causal-softcap-huang"],
)  # fmt: skip
def test_default_tiles_with_peer_options_at_a_length_that_splits_them_match_the_reference(spec):
    """Lq = 300 > CPU_QUERY_ROWS with the default tiles: key prefixes stopped by the window's right bound or
    causality (WINDOW-1, CAUSAL-1), grouped heads (HEAD-3), dv (HEAD-4), the cap (SOFTCAP-1)."""
    params = numpy_ref.init_params(spec, 1)
    rng = np.random.default_rng(2)
    x, keep = rng.normal(size=(1, 300, spec.model_dim)), rng.random((1, 4, 300, 300)) < 0.75
    tp = {n: torch.as_tensor(a) for n, a in params.items()}
    got, w = torch_impl.attention(spec, tp, torch.as_tensor(x), dropout_keep=torch.as_tensor(keep), return_weights=True)
    ref, ref_w = numpy_ref.attention(spec, params, x, dropout_keep=keep, return_weights=True)
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=0, atol=1e-12)
    with torch.no_grad():  # no weights returned, no gradient recorded: reused tile buffers, the cap in place
        again = torch_impl.attention(spec, tp, torch.as_tensor(x), dropout_keep=torch.as_tensor(keep))
    np.testing.assert_allclose(again.numpy(), ref, rtol=0, atol=1e-12)


def test_the_whole_conformance_run_passes_with_tiny_tiles(capsys):
    """Every case, dtype, gradient and exact check of the torch adapter, with tiles of 2 or 3 queries."""
    from conformance import cli

    code = cli.main(["run", "--adapter", f"{__name__}:TinyTilesAdapter", "--device", "cpu", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    from conformance.adapters.base import REFERENCE_FEATURES
    from conformance.catalog import CASES

    # the only cells skipped are the reference's own checks (REFERENCE_FEATURES), in each of their dtypes
    reference_only = sum(len(c.dtypes) for c in CASES if c.features() & REFERENCE_FEATURES)
    summary = rf"\b[1-9]\d* passed, 0 failed, 0 expected deviations, {reference_only} skipped"
    assert re.search(summary, out), out[-1000:]


@pytest.mark.parametrize("relative", [Shaw(3), Huang(200), None], ids=["shaw", "huang", "none"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_default_tiles_at_a_length_that_splits_them_match_the_reference(relative, causal):
    """Lq = 300 > CPU_QUERY_ROWS: two query tiles, causal ones reading only the keys up to their last query."""
    spec = AttentionSpec(1, 4, relative=relative, causal=causal, dropout=0.25)
    params = numpy_ref.init_params(spec, 1)
    rng = np.random.default_rng(2)
    x, keep = rng.normal(size=(1, 300, 4)), rng.random((1, 1, 300, 300)) < 0.75  # keep: the explicit path
    assert tiles.CPU_QUERY_ROWS < 300
    got, w = torch_impl.attention(
        spec,
        {n: torch.as_tensor(a) for n, a in params.items()},
        torch.as_tensor(x),
        dropout_keep=torch.as_tensor(keep),
        return_weights=True,
    )
    ref, ref_w = numpy_ref.attention(spec, params, x, dropout_keep=keep, return_weights=True)
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=0, atol=1e-12)
    with torch.no_grad():  # no weights returned, no gradient recorded: reused tile buffers
        again = torch_impl.attention(
            spec,
            {n: torch.as_tensor(a) for n, a in params.items()},
            torch.as_tensor(x),
            dropout_keep=torch.as_tensor(keep),
        )
    np.testing.assert_allclose(again.numpy(), ref, rtol=0, atol=1e-12)


def test_module_matches_functional_and_reference():
    spec = AttentionSpec(2, 3, relative=Huang(5), causal=True)
    ref_params = numpy_ref.init_params(spec, 3)
    m = torch_impl.MultiHeadAttention(spec, dtype=torch.float64).load_canonical(ref_params)
    x = np.random.default_rng(0).normal(size=(2, 7, 6))
    np.testing.assert_allclose(
        m(torch.as_tensor(x)).detach().numpy(), numpy_ref.attention(spec, ref_params, x), atol=1e-12
    )


def test_training_mode_draws_dropout_from_the_torch_rng_and_eval_has_none():
    spec = AttentionSpec(2, 3, relative=Shaw(1), dropout=0.4)
    ref_params = numpy_ref.init_params(spec, 0)
    m = torch_impl.MultiHeadAttention(spec, dtype=torch.float64).load_canonical(ref_params)
    x = torch.as_tensor(np.random.default_rng(1).normal(size=(2, 5, 6)))
    m.train()
    torch.manual_seed(7)
    out = m(x)
    torch.manual_seed(7)
    keep = torch.rand(2, 2, 5, 5) >= 0.4  # the same draw
    expected = numpy_ref.attention(spec, ref_params, x.numpy(), dropout_keep=keep.numpy())
    np.testing.assert_allclose(out.detach().numpy(), expected, atol=1e-12)
    assert 0.3 < 1 - keep.float().mean().item() < 0.5
    m.eval()
    np.testing.assert_allclose(m(x).detach().numpy(), numpy_ref.attention(spec, ref_params, x.numpy()), atol=1e-12)


def test_load_canonical_refuses_silent_casts_and_bad_entries():
    spec = AttentionSpec(2, 3)
    m = torch_impl.MultiHeadAttention(spec)  # float32
    params64 = numpy_ref.init_params(spec, 0)
    with pytest.raises(
        TypeError,
        match=re.escape(
            "params: expected arrays of the module's dtype torch.float32 "
            "(cast them explicitly first), got dtype float64"
        ),
    ):
        m.load_canonical(params64)
    params32 = {n: a.astype(np.float32) for n, a in params64.items()}
    params32.pop("bo")
    # the wording of the functional entry point (spec.validation.check_params, PARAM-2)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "params: expected entries ['wq', 'wk', 'wv', 'wo', 'bq', 'bk', "
            "'bv', 'bo'] for this spec, got missing ['bo']"
        ),
    ):
        m.load_canonical(params32)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "params: expected entries ['wq', 'wk', 'wv', 'wo', 'bq', 'bk', "
            "'bv', 'bo'] for this spec (no others), got unexpected ['rel_k']"
        ),
    ):
        m.load_canonical({**params64, "rel_k": np.zeros((3, 3))})
    with pytest.raises(ValueError, match=re.escape("params['wq']: expected shape (6, 6), got (6, 3)")):
        m.load_canonical({**params64, "wq": params64["wq"][:, :3]})
    with pytest.raises(TypeError, match=re.escape("params['bo']: expected a floating-point array, got dtype int64")):
        m.load_canonical({**params64, "bo": np.zeros(6, np.int64)})


# ---------------------------------------------------------------- interop
@pytest.mark.parametrize("bias", [True, False])
def test_torch_mha_round_trip_is_exact_and_computes_the_same(bias):
    spec = AttentionSpec(2, 4, bias=bias)
    params = {n: a.astype(np.float32) for n, a in numpy_ref.init_params(spec, 5).items()}
    mha = torch_impl.to_torch_mha(spec, params)
    assert mha.batch_first
    spec2, back = torch_impl.from_torch_mha(mha)
    assert spec2 == spec and sorted(back) == sorted(params)
    for n in params:
        assert np.array_equal(back[n], params[n]), n
    x = torch.randn(2, 5, 8)
    mask = torch.rand(2, 1, 5, 5) < 0.8
    mask[..., 0] = True  # no empty rows: nn.MultiheadAttention gives NaN there
    ours = torch_impl.attention(spec, {n: torch.as_tensor(a) for n, a in params.items()}, x, mask=mask)
    theirs, _ = mha(x, x, x, attn_mask=~mask.expand(2, 2, 5, 5).reshape(4, 5, 5))  # True = ignore
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), atol=1e-5)


def test_from_torch_mha_of_a_fresh_module():
    mha = torch.nn.MultiheadAttention(12, 3, batch_first=True)
    spec, params = torch_impl.from_torch_mha(mha)
    assert spec == AttentionSpec(3, 4)
    m = torch_impl.MultiHeadAttention(spec).load_canonical(params)
    x = torch.randn(1, 4, 12)
    np.testing.assert_allclose(m(x).detach().numpy(), mha(x, x, x)[0].detach().numpy(), atol=1e-5)


def test_interop_rejects_what_it_cannot_express():
    with pytest.raises(
        ValueError, match=re.escape("spec.relative: expected None (nn.MultiheadAttention cannot express it), got Shaw(")
    ):
        torch_impl.to_torch_mha(AttentionSpec(2, 2, relative=Shaw(1)), {})
    for field, value, why in [
        ("num_kv_heads", 1, "nn.MultiheadAttention has no grouped key/value heads; HEAD-3"),
        ("value_head_dim", 3, "nn.MultiheadAttention has no value head size of its own"),
        ("softcap", 5.0, "nn.MultiheadAttention has no logit soft-capping; SOFTCAP-1"),
        ("window", (1, 0), "nn.MultiheadAttention has no window on the distance"),
    ]:
        spec = AttentionSpec(2, 2, **{field: value})
        params = {n: a.astype(np.float32) for n, a in numpy_ref.init_params(spec, 0).items()}
        with pytest.raises(ValueError, match=re.escape(f"spec.{field}: expected None ({why}")) as e:
            torch_impl.to_torch_mha(spec, params)
        assert str(e.value).endswith(f"got {value!r}")
    with pytest.raises(ValueError, match=re.escape("module: expected no add_bias_kv / add_zero_attn")):
        torch_impl.from_torch_mha(torch.nn.MultiheadAttention(4, 2, add_bias_kv=True))
    with pytest.raises(TypeError, match=re.escape("module: expected a torch.nn.MultiheadAttention, got Linear")):
        torch_impl.from_torch_mha(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- compile
@pytest.mark.parametrize("relative", [Shaw(2), Huang(8)], ids=["shaw", "huang"])
def test_torch_compile_matches_eager_on_cpu(relative):
    spec = AttentionSpec(2, 4, relative=relative, causal=True)
    m = torch_impl.MultiHeadAttention(spec).eval()
    x = torch.randn(2, 8, 8)
    mask = torch.rand(2, 1, 1, 8) < 0.9
    compiled = torch.compile(m)
    np.testing.assert_allclose(compiled(x, mask=mask).detach().numpy(), m(x, mask=mask).detach().numpy(), atol=1e-5)
    # two query tiles, no gradient recorded (outside compile the tiles reuse their buffers there)
    with torch.no_grad():
        np.testing.assert_allclose(
            compiled(x, implementation=Tiles(query_rows=4)).numpy(),
            m(x, implementation=Tiles(query_rows=4)).numpy(),
            atol=1e-5,
        )


# ---------------------------------------------------------------- memory
MEMORY_PROBE = textwrap.dedent("""
    import resource, sys, torch, torch_impl
    from spec import AttentionSpec, Shaw
    torch.set_num_threads(1)
    L, d = 2048, 64
    spec = AttentionSpec(1, d, relative=Shaw(16))
    m = torch_impl.MultiHeadAttention(spec).eval()
    x = torch.randn(1, L, d)
    with torch.no_grad():
        m(torch.randn(1, 8, d))                       # warm up allocators and kernels
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        m(x)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((after - before) * 1024)
""")


def test_shaw_forward_memory_stays_far_below_an_lq_lk_d_tensor():
    """Measured peak RSS growth of one forward at L = 2048 (a subprocess, so nothing else counts)."""
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    extra = int(out.stdout.strip().splitlines()[-1])
    lqlkd = 2048 * 2048 * 64 * 4  # (L, L, d) float32: 1 GiB
    assert extra < lqlkd / 4, f"peak grew by {extra / 2**20:.0f} MiB, an (L, L, d) tensor is {lqlkd / 2**20:.0f} MiB"


# ---------------------------------------------------------------- errors
@pytest.fixture
def small():
    spec = AttentionSpec(2, 2, relative=Shaw(1))
    params = {n: torch.as_tensor(a.astype(np.float32)) for n, a in numpy_ref.init_params(spec, 0).items()}
    return spec, params, torch.randn(2, 3, 4)


def test_bad_input_messages_match_the_reference(small):
    spec, params, x = small
    with pytest.raises(
        TypeError,
        match=re.escape(
            "mask: expected a boolean array (True = attend); for an additive "
            "float mask use bias=, got dtype torch.float32"
        ),
    ):
        torch_impl.attention(spec, params, x, mask=torch.ones(3, 3))
    with pytest.raises(
        ValueError, match=re.escape("query: expected shape (B, Lq, D) with D = model_dim = 4, got (3, 4)")
    ):
        torch_impl.attention(spec, params, x[0])
    with pytest.raises(ValueError, match=re.escape("dropout_keep: expected None because spec.dropout == 0")):
        torch_impl.attention(spec, params, x, dropout_keep=torch.ones(2, 2, 3, 3, dtype=torch.bool))
    with pytest.raises(
        TypeError, match=re.escape("q_positions: expected an integer array of positions, got dtype torch.float32")
    ):
        torch_impl.attention(spec, params, x, q_positions=torch.zeros(3))


def test_no_implicit_casts(small):
    spec, params, x = small
    with pytest.raises(
        TypeError,
        match=re.escape("key: expected the query's dtype torch.float32 (no implicit casting), got dtype torch.float64"),
    ):
        torch_impl.attention(spec, params, x, x.double())
    with pytest.raises(
        TypeError,
        match=re.escape(
            "params['wq']: expected the query's dtype torch.float32 (no implicit casting), got dtype torch.float64"
        ),
    ):
        torch_impl.attention(spec, {**params, "wq": params["wq"].double()}, x)
    with pytest.raises(ValueError, match=re.escape("params['rel_v']: expected shape (3, 2), got (2, 3, 2)")):
        torch_impl.attention(spec, {**params, "rel_v": torch.zeros(2, 3, 2)}, x)
    with pytest.raises(ValueError, match=re.escape("params: expected entries")):
        torch_impl.attention(spec, {n: a for n, a in params.items() if n != "rel_k"}, x)


def test_tensors_on_another_device_are_rejected(small):
    """Checked on the meta device, so it runs without a GPU."""
    spec, params, x = small
    with pytest.raises(
        ValueError, match=re.escape("mask: expected an array on the query's device cpu, got device meta")
    ):
        torch_impl.attention(spec, params, x, mask=torch.ones(3, 3, dtype=torch.bool, device="meta"))
    with pytest.raises(
        ValueError, match=re.escape("params['wq']: expected a tensor on the query's device cpu, got device meta")
    ):
        torch_impl.attention(spec, {**params, "wq": params["wq"].to("meta")}, x)
    with pytest.raises(TypeError, match=re.escape("mask: expected a torch.Tensor, got ndarray")):
        torch_impl.attention(spec, params, x, mask=np.ones((3, 3), bool))


@pytest.mark.parametrize("device", DEVICES)
def test_tensors_follow_their_inputs(device):
    spec = AttentionSpec(2, 2, relative=Huang(3), causal=True)
    m = torch_impl.MultiHeadAttention(spec, device=device)
    out, w = m(torch.randn(1, 4, 4, device=device), return_weights=True)
    assert out.device.type == device and w.device.type == device
