"""x-transformers', T5's, BLOOM's, MPT's and Falcon's position biases against the spec (ALIBI-*, T5-*): the adapters
of conformance/adapters/torch_bias_libs.py and the measured findings behind their entries in
conformance/deviations.json.

Each library is optional: its tests skip with the pip command when it is missing. Expected values come from
numpy_ref (float64) and the spec's own bucket function; where a library departs from the spec, the test shows
which other spec call it equals (BLOOM's row is ALIBI-3's linear form, Falcon's is that form at slopes / sqrt(d)).
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; pip install attnspec[torch]")

import numpy_ref  # noqa: E402
from conformance import runner  # noqa: E402
from conformance.adapters import BUILTIN, load_adapter  # noqa: E402
from conformance.catalog import BY_ID  # noqa: E402
from spec import Alibi, AttentionSpec, T5Bias, alibi_slopes, t5_bucket  # noqa: E402

F32 = 2.0**-24  # float32's unit roundoff
PINS = {"x_transformers": "x-transformers==2.31.10", "transformers": "transformers==5.24.0"}
LIBRARY = {
    "xt-alibi": "x_transformers",
    "xt-t5": "x_transformers",
    "hf-t5-bias": "transformers",
    "bloom-alibi": "transformers",
    "mpt-alibi": "transformers",
    "falcon-alibi": "transformers",
}


def _need(module: str):
    return pytest.importorskip(module, reason=f"{module} is not installed; pip install {PINS[module]}")


def _rel(actual, expected, scale=None) -> float:
    """max |actual - expected| over max |expected| (or over ``scale``)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert np.isfinite(actual).all(), "NaN or Inf where the truth is finite"
    return float(np.max(np.abs(actual - expected)) / (np.max(np.abs(expected)) if scale is None else scale))


def _call(spec, *, positions=None, seed=0, B=2, Lq=5, Lk=7):
    rng = np.random.default_rng(seed)
    params = numpy_ref.init_params(spec, seed=seed)
    for name in [n for n in params if n.startswith("rel_")]:  # a table of distinct entries: a wrong row shows
        params[name] = rng.normal(size=params[name].shape)
    D = spec.model_dim
    inputs = {"query": rng.normal(size=(B, Lq, D)), "key": rng.normal(size=(B, Lk, D))}
    inputs["value"] = rng.normal(size=(B, Lk, D))
    if positions is not None:
        inputs["q_positions"], inputs["k_positions"] = positions
    return params, inputs, rng.normal(size=(B, Lq, D))


def _cast(arrays: dict, dtype) -> dict:
    return {n: a.astype(dtype) if np.asarray(a).dtype.kind == "f" else a for n, a in arrays.items()}


def _positions_kw(inputs):
    return {n: inputs[n] for n in ("q_positions", "k_positions") if n in inputs}


def _tensors(inputs):
    return {n: inputs[n] for n in ("query", "key", "value")}


PER_ROW = (np.array([[0, 3, 3, 9, -2], [7, 1, 4, 4, 11]]), np.array([[5, 0, 2, 8, 1, 6, -3], [2, 2, 10, 0, 7, 3, 9]]))
SPREAD = (np.arange(5) * 7, np.arange(7) * 5 - 3)  # distances from -31 to 27: past max_distance both ways
CAUSAL_ALIBI = AttentionSpec(4, 4, causal=True, relative=Alibi())  # slopes 1/4, 1/16, 1/64, 1/256: exact
CELLS = {
    # adapter: (spec, positions, Lq = Lk), where the library's term is the spec's
    "xt-alibi": (AttentionSpec(4, 4, relative=Alibi()), PER_ROW, False),
    "xt-t5": (AttentionSpec(2, 4, relative=T5Bias(num_buckets=8, max_distance=10)), SPREAD, False),
    "hf-t5-bias": (
        AttentionSpec(2, 4, relative=T5Bias(num_buckets=8, max_distance=10, bidirectional=False)),
        None,
        True,
    ),
    "bloom-alibi": (CAUSAL_ALIBI, None, True),
    "mpt-alibi": (CAUSAL_ALIBI, None, True),
}


@pytest.mark.parametrize("name", list(CELLS))
def test_adapter_forward_and_gradients_match_the_reference(name):
    """ALIBI-1..3, T5-1..4, POS-2, GRAD-1: float32 within float32 rounding of numpy_ref, float64 within float64
    rounding, the gradients (the T5 table's among them) by autograd through the library's own lookup."""
    _need(LIBRARY[name])
    spec, positions, square = CELLS[name]
    adapter = load_adapter(name)
    params, inputs, grad_out = _call(spec, positions=positions, Lq=7 if square else 5)
    want = numpy_ref.attention(spec, params, **_positions_kw(inputs), **_tensors(inputs))
    out32 = adapter.forward(
        spec, _cast(params, np.float32), _cast(inputs, np.float32), device="cpu", need_weights=False
    )
    assert _rel(out32["out"], want) < 200 * F32
    out64 = adapter.forward(spec, params, inputs, device="cpu", need_weights=False)
    assert _rel(out64["out"], want) < 1e-13
    grads = adapter.vjp(spec, params, inputs, grad_out, device="cpu")
    truth = numpy_ref.attention_vjp(spec, params, grad_out=grad_out, **_positions_kw(inputs), **_tensors(inputs))
    assert set(truth) <= set(grads)
    for n, g in truth.items():  # bk's gradient is 0 up to rounding: judged on wk's scale (PREC-2)
        scale = np.max(np.abs(truth["wk"])) if n == "bk" else None
        assert _rel(grads[n], g, scale) < 1e-12, n


@pytest.mark.parametrize("name", ["bloom-alibi", "mpt-alibi"])
def test_the_builders_row_is_the_linear_form_not_the_symmetric_one(name):
    """ALIBI-3 (bloom-alibi-linear-form-without-causal-mask): without a causal mask the builders' one row over
    the keys equals numpy_ref with Alibi(symmetric=False) (m * (j - i), a per-row constant away) to float64
    rounding, and is measurably not the symmetric -m |j - i|."""
    _need("transformers")
    spec = AttentionSpec(4, 4, relative=Alibi())
    params, inputs, _ = _call(spec, Lq=7)
    out = load_adapter(name).forward(spec, params, inputs, device="cpu", need_weights=False)["out"]
    linear = numpy_ref.attention(AttentionSpec(4, 4, relative=Alibi(symmetric=False)), params, **_tensors(inputs))
    symmetric = numpy_ref.attention(spec, params, **_tensors(inputs))
    assert _rel(out, linear) < 1e-13
    assert _rel(out, symmetric) > 1e-2


def test_falcon_scales_its_bias_by_one_over_sqrt_head_dim():
    """SCALE-4 (falcon-alibi-bias-scaled): FalconAttention's (q k^T + alibi) / sqrt(d) is the spec's linear
    ALiBi at slopes bfloat16(m) / sqrt(d) (build_alibi_tensor rounds the slopes to bfloat16), causal or not."""
    _need("transformers")
    import ml_dtypes

    for causal in (True, False):
        spec = AttentionSpec(3, 4, causal=causal, relative=Alibi())  # H = 3: slopes 2^-4, 2^-8 and 2^-2
        params, inputs, _ = _call(spec, Lq=7)
        out = load_adapter("falcon-alibi").forward(spec, params, inputs, device="cpu", need_weights=False)["out"]
        d = spec.head_dim
        slopes = tuple(float(np.float64(ml_dtypes.bfloat16(m))) / math.sqrt(d) for m in alibi_slopes(3))
        scaled = AttentionSpec(3, 4, causal=causal, relative=Alibi(slopes=slopes, symmetric=False))
        assert _rel(out, numpy_ref.attention(scaled, params, **_tensors(inputs))) < 1e-13
        assert _rel(out, numpy_ref.attention(spec, params, **_tensors(inputs))) > 1e-3


def test_both_bucket_functions_are_the_spec_one_far_beyond_max_distance():
    """T5-2, T5-3: HF's and x-transformers' floating-point bucket functions give spec.t5_bucket's exact
    integers for every |delta| <= 8 max_distance, both directions, on five configurations."""
    _need("transformers")
    _need("x_transformers")
    from transformers.models.t5.modeling_t5 import T5Attention
    from x_transformers.x_transformers import RelativePositionBias

    for N, M, bidirectional in ((32, 128, True), (32, 128, False), (8, 10, True), (6, 5, False), (4, 2, True)):
        delta = np.arange(-8 * M, 8 * M + 1)
        want = np.array([t5_bucket(int(x), N, M, bidirectional) for x in delta])
        hf = T5Attention._relative_position_bucket(
            torch.from_numpy(delta), bidirectional=bidirectional, num_buckets=N, max_distance=M
        )
        xt = RelativePositionBias._relative_position_bucket(
            torch.from_numpy(delta), causal=not bidirectional, num_buckets=N, max_distance=M
        )
        assert np.array_equal(hf.numpy(), want) and np.array_equal(xt.numpy(), want), (N, M, bidirectional)


def test_an_embedding_table_sums_its_gradient_in_its_own_16_bit_dtype():
    """The measurement behind xt-t5- and hf-t5-bias-table-gradient-summed-in-16-bit: nn.functional.embedding's
    CPU backward into a bfloat16 table of 8 rows from 512 x 512 lookups is far from the float64 sum of the same
    bfloat16 gradients, and a float32 table of the same values is not."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 8, (512, 512), generator=gen)
    grad = (torch.randn(512, 512, 4, generator=gen) * 1e-3).to(torch.bfloat16)
    exact = torch.zeros(8, 4, dtype=torch.float64).index_add_(0, rows.flatten(), grad.double().reshape(-1, 4))
    errors = {}
    for dtype in (torch.bfloat16, torch.float32):
        table = torch.zeros(8, 4, dtype=dtype, requires_grad=True)
        torch.nn.functional.embedding(rows, table).backward(grad.to(dtype))
        errors[dtype] = float((table.grad.double() - exact).abs().max() / exact.abs().max())
    assert errors[torch.bfloat16] > 0.05 and errors[torch.float32] < 1e-5


def test_every_adapter_is_registered_and_certifies_only_its_family():
    """Built-in names; Capabilities.requires skips cases of other schemes; the builders skip calls whose
    slopes or key positions they cannot take, with the reason."""
    _need("transformers")
    assert {BUILTIN[n].rpartition(":")[0] for n in LIBRARY} == {"conformance.adapters.torch_bias_libs"}
    cases = [BY_ID[c] for c in ("rope/half/self/basic", "alibi/self/h1-causal", "t5/self/causal-long-L512")]
    cases += [BY_ID["alibi/cross/explicit-slopes-gqa-masked"], BY_ID["alibi/cross/gqa-causal-mask-empty-rows"]]
    plan = runner.Plan([load_adapter("bloom-alibi"), load_adapter("xt-t5")], cases=cases, dtypes=["float32"])
    skips = {(a.name, case.id): skip for a, _, _, _, case, skip in runner.matrix(plan)}
    assert skips["bloom-alibi", "rope/half/self/basic"] == "certifies only cases that use alibi"
    assert skips["xt-t5", "alibi/self/h1-causal"] == "certifies only cases that use t5"
    assert not skips["bloom-alibi", "alibi/self/h1-causal"] and not skips["xt-t5", "t5/self/causal-long-L512"]
    assert "takes none of the call's" in skips["bloom-alibi", "alibi/cross/explicit-slopes-gqa-masked"]
    assert skips["bloom-alibi", "alibi/cross/gqa-causal-mask-empty-rows"] == (
        "the builder puts the keys at arange(Lk): it takes no key positions"
    )
