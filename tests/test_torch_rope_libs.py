"""rotary-embedding-torch, torchtune and x-transformers RoPE against the spec (ROPE-2..ROPE-15): the adapters of
conformance/adapters/torch_rope_libs.py, the libraries' frequency options against the spec's constructors, and
the measured findings behind their entries in conformance/deviations.json.

Each library is optional: its tests skip with the pip command when it is missing. Expected values come from
numpy_ref (float64), from the spec's float64 constructors, or from float64 NumPy cos / sin written here.
"""

import importlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; pip install attnspec[torch]")

import numpy_ref  # noqa: E402
from conformance.adapters import BUILTIN, _glue, load_adapter, torch_rope_libs  # noqa: E402
from spec import AttentionSpec, Rope  # noqa: E402

F32 = 2.0**-24  # float32's unit roundoff
PINS = {
    "rotary_embedding_torch": "rotary-embedding-torch==0.9.1",
    "torchtune": "torchtune==0.6.1 torchao==0.17.0",
    "x_transformers": "x-transformers==2.31.10",
}


def _need(module: str):
    return pytest.importorskip(module, reason=f"{module} is not installed; pip install {PINS[module.split('.')[0]]}")


@pytest.fixture(scope="module")
def ret():
    return _need("rotary_embedding_torch")


@pytest.fixture(scope="module")
def tt():
    _need("torchtune")
    return importlib.import_module("torchtune.modules")


@pytest.fixture(scope="module")
def xt():
    _need("x_transformers")
    return importlib.import_module("x_transformers.x_transformers")


LIBRARY = {"rotary-embedding-torch": "ret", "torchtune-rope": "tt", "xt-rope": "xt"}


def _rel(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert np.isfinite(actual).all(), "NaN or Inf where the truth is finite"
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def _truth_angles(positions, frequencies):
    """ROPE-4, ROPE-9: p * f_c in float64, (L,) x (r/2,) -> (L, r/2)."""
    return np.asarray(positions, np.float64)[:, None] * np.asarray(frequencies, np.float64)[None, :]


def _interleaved_truth(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """ROPE-3, ROPE-5 in float64: pairs (2c, 2c + 1) of x (..., L, r) turned by angles (L, r/2)."""
    out = np.array(x, np.float64)
    a, b = out[..., 0::2].copy(), out[..., 1::2].copy()
    out[..., 0::2] = a * np.cos(angles) - b * np.sin(angles)
    out[..., 1::2] = a * np.sin(angles) + b * np.cos(angles)
    return out


# --------------------------------------------------------------------------------- adapters vs numpy_ref
def _call(spec, *, positions=None, seed=0, B=2, Lq=5, Lk=7):
    rng = np.random.default_rng(seed)
    params = numpy_ref.init_params(spec, seed=seed)
    D = spec.model_dim
    inputs = {"query": rng.normal(size=(B, Lq, D)), "key": rng.normal(size=(B, Lk, D))}
    inputs["value"] = rng.normal(size=(B, Lk, D))
    if positions is not None:
        inputs["q_positions"], inputs["k_positions"] = positions
    return params, inputs, rng.normal(size=(B, Lq, D))


def _cast(arrays: dict, dtype) -> dict:
    return {n: a.astype(dtype) if np.asarray(a).dtype.kind == "f" else a for n, a in arrays.items()}


PER_ROW = (np.array([[0, 3, 3, 9, -2], [7, 1, 4, 4, 11]]), np.array([[5, 0, 2, 8, 1, 6, -3], [2, 2, 10, 0, 7, 3, 9]]))
PER_ROW_NONNEGATIVE = (PER_ROW[0] + 3, PER_ROW[1] + 3)  # torchtune reads negative positions from its cache's end
SHIFTED = (np.arange(5) + 120, np.arange(7) + 117)
SPECS = {
    # (spec, positions): both layouts (half through ROPE-8's permutation), custom theta, partial rotation,
    # explicit frequencies with YaRN's attention factor, grouped heads with per-row positions, causal
    "half": (AttentionSpec(2, 8, relative=Rope()), None),
    "interleaved-theta50-shifted": (AttentionSpec(2, 8, relative=Rope(theta=50.0, layout="interleaved")), SHIFTED),
    "partial-r4": (AttentionSpec(2, 8, relative=Rope(theta=100.0, rotary_dim=4)), SHIFTED),
    "yarn": (AttentionSpec(2, 8, relative=Rope.yarn(8.0, 16, rotary_dim=8), causal=True), SHIFTED),
    "gqa-per-row-af": (
        AttentionSpec(4, 4, num_kv_heads=2, relative=Rope(layout="interleaved", attention_factor=1.25)),
        PER_ROW,
    ),
    "gqa-per-row-causal": (AttentionSpec(4, 4, num_kv_heads=2, causal=True, relative=Rope()), PER_ROW_NONNEGATIVE),
}


def _cells():
    """(adapter, spec) pairs whose RoPE features the adapter declares."""
    for name in LIBRARY:
        caps = load_adapter(name).capabilities()
        for key, (spec, _) in SPECS.items():
            if spec.relative.features <= caps.features:
                yield pytest.param(name, key, id=f"{name}-{key}")


def _tensors(inputs):
    return {n: inputs[n] for n in ("query", "key", "value")}


def _positions_kw(inputs):
    return {n: inputs[n] for n in ("q_positions", "k_positions") if n in inputs}


@pytest.mark.parametrize("name,key", list(_cells()))
def test_adapter_forward_and_gradients_match_the_reference(name, key, request):
    """ROPE-2..ROPE-7, HEAD-3, POS-1, GRAD-1: float32 within float32 rounding of numpy_ref; float64 within
    the libraries' float32 frequencies (the float64 deviations), gradients by autograd through the rotation."""
    request.getfixturevalue(LIBRARY[name])
    spec, positions = SPECS[key]
    adapter = load_adapter(name)
    params, inputs, grad_out = _call(spec, positions=positions)
    want = numpy_ref.attention(spec, params, **_positions_kw(inputs), **_tensors(inputs))
    out32 = adapter.forward(
        spec, _cast(params, np.float32), _cast(inputs, np.float32), device="cpu", need_weights=False
    )
    assert _rel(out32["out"], want) < 200 * F32
    out64 = adapter.forward(spec, params, inputs, device="cpu", need_weights=False)
    assert _rel(out64["out"], want) < 1e-5
    grads = adapter.vjp(spec, params, inputs, grad_out, device="cpu")
    truth = numpy_ref.attention_vjp(spec, params, grad_out=grad_out, **_positions_kw(inputs), **_tensors(inputs))
    for n, g in truth.items():
        assert _rel(grads[n], g) < 1e-5, n


def test_every_adapter_is_registered_and_declares_what_its_library_expresses():
    """The three names are built-in; torchtune's RotaryPositionalEmbeddings has no partial rotation and no
    attention factor (ROPE-2, ROPE-7), the other two have both; none has the half layout of its own."""
    assert {BUILTIN[n].rpartition(":")[0] for n in LIBRARY} == {"conformance.adapters.torch_rope_libs"}
    full = {"rope", "rope-interleaved", "rope-partial", "rope-attention-factor"}
    for name in LIBRARY:
        caps = load_adapter(name).capabilities()
        rope = {f for f in caps.features if f.startswith("rope")}
        assert rope == (full - {"rope-partial", "rope-attention-factor"} if name == "torchtune-rope" else full)
    notes = load_adapter("torchtune-rope").capabilities().notes
    assert "ROPE-2" in notes["rope-partial"] and "ROPE-7" in notes["rope-attention-factor"]


def test_a_missing_library_is_unavailable_with_its_pip_command(monkeypatch):
    real = importlib.import_module

    def fake(name, *args):
        if name.startswith(("rotary_embedding_torch", "torchtune", "x_transformers")):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(torch_rope_libs.importlib, "import_module", fake)
    for name, pip in (("rotary-embedding-torch", "rotary-embedding-torch"), ("torchtune-rope", "torchtune")):
        reason = load_adapter(name).unavailable()
        assert "cannot be imported" in reason and f"pip install {pip}" in reason


def test_cases_without_a_rope_are_skipped_with_the_reason():
    """Capabilities.requires: a rotation-only adapter would check the glue alone on them."""
    from conformance import runner
    from conformance.catalog import BY_ID

    plan = runner.Plan([load_adapter("xt-rope")], cases=[BY_ID["shaw/k2/self/basic"], BY_ID["rope/half/self/basic"]])
    skips = {case.id: skip for *_, case, skip in runner.matrix(plan)}
    assert skips["shaw/k2/self/basic"] == "certifies only cases that use rope"
    assert not skips["rope/half/self/basic"]


def test_the_glue_zeroes_dead_keys():
    """MASK-7: a key that no query of any head may attend (here by the mask, and by causality on the positions)
    has its key and value rows zeroed; keys some query attends are untouched; self-attention is left alone."""
    spec = AttentionSpec(2, 4, causal=True, relative=Rope())
    key = np.arange(2 * 4 * 8, dtype=np.float64).reshape(2, 4, 8) + 1
    mask = np.array([True, True, False, True])[None, None, None, :]  # key 2 masked for every query
    inputs = {"query": np.ones((2, 3, 8)), "key": key, "value": -key, "mask": mask, "q_positions": np.arange(3)}
    out = _glue.without_dead_keys(spec, inputs, _glue.allowed_keys(spec, inputs))
    dead = np.array([False, False, True, True])  # key 3 is after every query (CAUSAL-1), key 2 masked
    assert (out["key"][:, dead] == 0).all() and (out["value"][:, dead] == 0).all()
    assert (out["key"][:, ~dead] == key[:, ~dead]).all() and (out["value"][:, ~dead] == -key[:, ~dead]).all()
    alone = {"query": inputs["query"]}
    assert _glue.without_dead_keys(spec, alone, _glue.allowed_keys(spec, alone)) == alone


# ------------------------------------------------------------------- frequencies against the spec
def test_rotary_embedding_torch_frequencies_and_ntk_rescale_are_the_spec_constructors(ret):
    """ROPE-4, ROPE-13: RotaryEmbedding(dim=r, theta) holds theta^(-2c/r); theta_rescale_factor=alpha is
    Rope.ntk(alpha) (base theta * alpha^(r/(r-2))), both within float32 rounding (measured <= 1.5 ulp)."""
    for r, theta, alpha in ((8, 10000.0, 1.0), (64, 10000.0, 4.0), (128, 500000.0, 2.5)):
        module = ret.RotaryEmbedding(dim=r, theta=theta, theta_rescale_factor=alpha)
        want = Rope.ntk(alpha, rotary_dim=r, theta=theta).frequencies(r)
        assert module.freqs.dtype == torch.float32
        assert _rel(module.freqs.detach(), want) < 8 * F32


def test_rotary_embedding_torch_interpolate_factor_is_rope_linear(ret):
    """ROPE-12: interpolate_factor divides the positions, Rope.linear divides the frequencies: the same
    angles p / s * f_c in exact arithmetic, within float32 rounding here (positions < 2**12)."""
    r, factor = 16, 4.0
    module = ret.RotaryEmbedding(dim=r, interpolate_factor=factor)
    got = module(module.get_seq_pos(4096, dtype=torch.float32))[:, 0::2]  # (L, r/2): the library repeats each
    want = _truth_angles(np.arange(4096), Rope.linear(factor, rotary_dim=r).frequencies(r))
    assert np.abs(got.numpy() - want).max() < 4096 * 4 * F32


def test_x_transformers_frequencies_rescale_and_interpolation_are_the_spec_constructors(xt):
    """ROPE-4, ROPE-12, ROPE-13: RotaryEmbedding(dim=r, base) holds base^(-2c/r) in float32;
    base_rescale_factor is Rope.ntk and interpolation_factor (angles divided by it) is Rope.linear."""
    r = 32
    module = xt.RotaryEmbedding(r, base=10000.0, base_rescale_factor=3.0)
    assert module.inv_freq.dtype == torch.float32
    assert _rel(module.inv_freq, Rope.ntk(3.0, rotary_dim=r).frequencies(r)) < 8 * F32
    interp = xt.RotaryEmbedding(r, interpolation_factor=8.0)
    freqs, scale = interp(torch.arange(2048))
    want = _truth_angles(np.arange(2048), Rope.linear(8.0, rotary_dim=r).frequencies(r))
    assert scale == 1.0 and np.abs(freqs[0, :, 0::2].numpy() - want).max() < 2048 * 4 * F32


def test_torchtune_llama3_scaled_rope_is_rope_llama3(tt):
    """ROPE-15: torchtune's Llama3ScaledRoPE at Llama 3.1's configuration (d = 128, base 500000, factor 8,
    low 1, high 4, 8192 positions) holds Rope.llama3's frequencies within float32 rounding."""
    from torchtune.models.llama3_1 import Llama3ScaledRoPE

    module = Llama3ScaledRoPE(dim=128, max_seq_len=16, base=500_000)
    want = Rope.llama3(8.0, 1.0, 4.0, 8192, rotary_dim=128).frequencies(128)
    assert module.theta.dtype == torch.float32
    assert _rel(module.theta, want) < 8 * F32
    plain = tt.RotaryPositionalEmbeddings(dim=128, max_seq_len=16, base=500_000)
    assert _rel(plain.theta, Rope(theta=500000.0).frequencies(128)) < 8 * F32


def test_torchtune_cannot_rotate_part_of_a_head(tt):
    """ROPE-2: RotaryPositionalEmbeddings' dim must be the head size (its cache is reshaped to the head's
    d / 2 pairs), so r < d is not expressible and the adapter leaves rope-partial out."""
    module = tt.RotaryPositionalEmbeddings(dim=4, max_seq_len=8)
    with pytest.raises(RuntimeError):
        module(torch.ones(1, 3, 2, 8))


def test_torchtune_negative_positions_read_the_cache_from_its_end(tt):
    """POS-1 allows any integer position; torchtune indexes its cache with input_pos, so position -1 is
    silently position max_seq_len - 1 (no conformance case reaches it: the cases with negative positions
    need rope-attention-factor)."""
    module = tt.RotaryPositionalEmbeddings(dim=4, max_seq_len=64)
    x = torch.randn(1, 1, 1, 4, dtype=torch.float64)
    at_minus_one = module(x, input_pos=torch.tensor([[-1]]))
    assert torch.equal(at_minus_one, module(x, input_pos=torch.tensor([[63]])))
    truth = _interleaved_truth(x.numpy(), _truth_angles([-1], Rope().frequencies(4)))
    assert _rel(at_minus_one, truth) > 0.1


# --------------------------------------------------------------------- the 16-bit and float64 findings
def _rotation_error(rotated: torch.Tensor, x: torch.Tensor, frequencies, positions) -> np.ndarray:
    """|rotated - truth| per position (max over channels), truth in float64 (ROPE-9)."""
    truth = _interleaved_truth(x.double().numpy(), _truth_angles(positions, frequencies))
    return np.abs(rotated.double().numpy() - truth).max(axis=-1).reshape(-1)


def test_rotary_embedding_torch_in_bfloat16_rounds_the_positions_it_builds(ret):
    """ROPE-9 (deviation ret-bfloat16-positions-rounded): after .to(torch.bfloat16) rotate_queries_or_keys
    builds arange(L, dtype=bfloat16) + offset: positions 256..263 become 256, 256, 258, 260, 260, 260, 262,
    264; at L = 300 the rotated vectors are off by up to 2.08 (measured) past position 256, against 0.16 before
    it, where only the bfloat16 frequencies and products round."""
    module = ret.RotaryEmbedding(dim=8).to(torch.bfloat16)
    assert module.freqs.dtype == torch.bfloat16
    seq = module.get_seq_pos(8, dtype=torch.bfloat16, offset=256)
    assert seq.tolist() == [256, 256, 258, 260, 260, 260, 262, 264]
    x = torch.randn(1, 1, 300, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    error = _rotation_error(module.rotate_queries_or_keys(x), x, Rope().frequencies(8), np.arange(300))
    assert error[256:].max() > 1.0 and error[:256].max() < 0.2
    exact = ret.RotaryEmbedding(dim=8)  # float32: positions exact, angles within float32 rounding
    assert (
        _rotation_error(exact.rotate_queries_or_keys(x.float()), x, Rope().frequencies(8), np.arange(300)).max() < 1e-4
    )


def test_rotary_embedding_torch_in_float16_overflows_positions_beyond_65504(ret):
    """ROPE-9 (deviation ret-float16-positions-overflow): positions held in float16 become inf near 2**17,
    so the rotation is NaN."""
    module = ret.RotaryEmbedding(dim=8).to(torch.float16)
    assert torch.isinf(module.get_seq_pos(2, dtype=torch.float16, offset=2**17)).all()
    rotated = module.rotate_queries_or_keys(torch.ones(1, 1, 2, 8, dtype=torch.float16), offset=2**17)
    assert torch.isnan(rotated).any()


def test_x_transformers_inv_freq_is_a_persistent_buffer_cast_with_the_module(xt):
    """ROPE-9 (deviation xt-bfloat16-inv-freq-buffer-cast): inv_freq is in the state dict and follows
    .to(torch.bfloat16); forward casts the positions to it, so position 299 turns as 300 (pair 0, f = 1)."""
    module = xt.RotaryEmbedding(8)
    assert "inv_freq" in module.state_dict()
    module = module.to(torch.bfloat16)
    assert module.inv_freq.dtype == torch.bfloat16
    freqs, _ = module(torch.arange(296, 302))
    assert freqs[0, :, 0].tolist() == [296, 296, 298, 300, 300, 300]


def test_torchtune_in_bfloat16_keeps_exact_positions(tt):
    """ROPE-9: torchtune builds its cos / sin cache in float32 at construction, so .to(torch.bfloat16) only
    rounds cos and sin (<= 2**-8) and the rotation runs in float32: at L = 300 the rotated vectors stay
    within 0.03 (measured 0.02) of the truth, where rotary-embedding-torch is off by 2.08."""
    module = tt.RotaryPositionalEmbeddings(dim=8, max_seq_len=300).to(torch.bfloat16)
    assert module.cache.dtype == torch.bfloat16
    want = np.stack([np.cos(a := _truth_angles(np.arange(300), Rope().frequencies(8))), np.sin(a)], axis=-1)
    assert np.abs(module.cache.double().numpy() - want).max() <= 2.0**-8
    x = torch.randn(1, 300, 1, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    rotated = module(x).transpose(1, 2)
    assert _rotation_error(rotated, x.transpose(1, 2), Rope().frequencies(8), np.arange(300)).max() < 0.03


def test_torchtune_rotates_float64_inputs_in_float32(tt):
    """ROPE-9, PREC-1 (deviation torchtune-float64-rotation-in-float32): x.float() and a float32 cache, so a
    float64 input comes back rounded to float32 (errors near float32's, not float64's, rounding)."""
    module = tt.RotaryPositionalEmbeddings(dim=8, max_seq_len=64).to(torch.float64)
    x = torch.randn(1, 64, 1, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rotated = module(x)
    assert rotated.dtype == torch.float64
    error = _rotation_error(rotated.transpose(1, 2), x.transpose(1, 2), Rope().frequencies(8), np.arange(64))
    assert 1e-9 < error.max() < 1e-5


@pytest.mark.parametrize("library", ["ret", "xt"])
def test_float64_modules_keep_float32_frequencies(library, request):
    """ROPE-4, PREC-1 (deviations ret-/xt-float64-frequencies-in-float32): both make their frequencies with
    .float(); .to(torch.float64) keeps the float32 values (off by up to 6e-8 relative, not 1e-16)."""
    lib = request.getfixturevalue(library)
    module = (lib.RotaryEmbedding(dim=8) if library == "ret" else lib.RotaryEmbedding(8)).to(torch.float64)
    held = (module.freqs if library == "ret" else module.inv_freq).detach()
    assert held.dtype == torch.float64
    error = _rel(held, Rope().frequencies(8))
    assert 1e-10 < error < 8 * F32
