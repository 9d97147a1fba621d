"""ONNX: its Attention node tests mapped onto numpy_ref, and the onnx-reference / onnxruntime adapters.

Skipped as a whole where onnx or onnxruntime is not installed (the ``onnx``
extra: ``pip install -e ".[onnx]"``).
"""

import numpy as np
import pytest

pytest.importorskip("onnx", reason="onnx is not installed (pip install -e '.[onnx]')")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install -e '.[onnx]')")

from onnx import helper  # noqa: E402

from conformance import cli, onnx_node_tests, runner  # noqa: E402
from conformance.adapters import load_adapter  # noqa: E402
from conformance.catalog import CASES  # noqa: E402

#: The node tests that return pre-softmax logits (qk_matmul_output_mode 0, 1, 2): attnspec has no such output.
LOGITS_OUTPUT_CASES = {
    "test_attention_3d_with_past_and_present_qk_matmul": 0,
    "test_attention_3d_with_past_and_present_qk_matmul_bias": 2,
    "test_attention_3d_with_past_and_present_qk_matmul_softcap": 1,
    "test_attention_4d_with_past_and_present_qk_matmul": 0,
    "test_attention_4d_with_past_and_present_qk_matmul_bias": 2,
    "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask": 2,
    "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal": 2,
    "test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask": 2,
    "test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_causal": 2,
    "test_attention_4d_with_qk_matmul": 0,
    "test_attention_4d_with_qk_matmul_bias": 2,
    "test_attention_4d_with_qk_matmul_softcap": 1,
}


@pytest.fixture(scope="module")
def outcomes():
    return onnx_node_tests.run()


# ------------------------------------------------------------ node tests
def test_every_onnx_node_test_agrees_or_is_a_logits_output(outcomes):
    assert len(outcomes) == 93
    disagree = [onnx_node_tests.render(o) for o in outcomes if o.status == "disagree"]
    assert not disagree, "\n".join(disagree)
    inexpressible = {o.name: o.reason for o in outcomes if o.status == "not expressible"}
    assert inexpressible == {
        name: f"pre-softmax logits output (qk_matmul_output_mode={mode})" for name, mode in LOGITS_OUTPUT_CASES.items()
    }
    assert all(o.margin <= 1 for o in outcomes)


def test_node_test_budgets_come_from_the_naive_emulation(outcomes):
    # PREC-2: every budget is the harness's k * e_base + floor, e_base from conformance.naive
    sources = {o["budget_from"] for out in outcomes for o in out.outputs.values() if "budget_from" in o}
    assert sources == {"naive"}


def test_caches_give_present_key_and_value_exactly(outcomes):
    with_cache = [o for o in outcomes if "present_key" in o.outputs]
    assert len(with_cache) >= 10
    assert all(o.outputs["present_key"]["exact"] and o.outputs["present_value"]["exact"] for o in with_cache)


def test_cli_reports_each_case_and_a_summary(capsys):
    assert cli.main(["onnx-node-tests", "--case", "*qk_matmul_softcap"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("2 ONNX Attention node tests: 0 agree, 0 disagree, 2 not expressible")
    assert sum(line.startswith("not expressible  test_attention_") for line in lines) == 2
    assert cli.main(["onnx-node-tests", "--case", "no-such-test"]) == 2
    assert "matches no ONNX Attention node test" in capsys.readouterr().err


# ----------------------------------------------------- the mapping's helpers
def test_value_chunks_feed_each_output_column_its_kv_feature():
    # HEAD-3, HEAD-4: H = 2 query heads share one kv head of dv = 3 channels, D = 4.
    # merged columns f = h * 3 + c read value feature c; columns 0..3 in the first run, 4..5 in the second
    assert onnx_node_tests.value_chunks(H=2, Hkv=1, dv=3, D=4) == [(0, 4, [0, 1, 2]), (4, 6, [1, 2])]
    # two kv heads, G = 1: column f reads feature f
    assert onnx_node_tests.value_chunks(H=2, Hkv=2, dv=3, D=4) == [(0, 4, [0, 1, 2, 3]), (4, 6, [4, 5])]


def test_short_mask_is_padded_as_onnx_pads_it():
    mask = np.array([[True, False]])
    assert onnx_node_tests.pad_last(mask, 4, False).tolist() == [[True, False, False, False]]
    bias = onnx_node_tests.pad_last(np.zeros((1, 2)), 3, -np.inf)
    assert bias.tolist() == [[0.0, 0.0, -np.inf]]


def _node_case(name, inputs, outputs, **attrs):
    names = [n if n in inputs else "" for n in onnx_node_tests.INPUTS]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("Attention", names, list(outputs), **attrs)
    return onnx_node_tests.NodeCase(name, node, 23, inputs, {})


def test_past_cache_puts_the_queries_after_the_past_not_bottom_right():
    # POS-3, CAUSAL-1: one query, a past of two keys and a new block of two keys. ONNX's
    # frontier is j <= i + past_length = 2: keys 0, 1, 2 (not key 3), with zero logits
    # uniform weights 1/3; bottom-right alignment (q at position 3) would allow all four.
    v = np.array([3.0, 6.0, 9.0, 100.0]).reshape(1, 1, 4, 1)
    inputs = {
        "Q": np.zeros((1, 1, 1, 1), np.float32),
        "K": np.zeros((1, 1, 2, 1), np.float32),
        "V": v[:, :, 2:].astype(np.float32),
        "past_key": np.zeros((1, 1, 2, 1), np.float32),
        "past_value": v[:, :, :2].astype(np.float32),
    }
    case = _node_case("hand", inputs, ["Y", "present_key", "present_value"], is_causal=1)
    mapping = onnx_node_tests.map_case(case)
    [(_, call, _)] = mapping.calls
    assert call["q_positions"].tolist() == [2]
    truth = onnx_node_tests.evaluate(mapping)
    np.testing.assert_allclose(truth["Y"].ravel(), [6.0], rtol=1e-15)
    np.testing.assert_allclose(truth["qk_matmul_output"].ravel(), [1 / 3, 1 / 3, 1 / 3, 0.0], rtol=1e-15)
    assert np.array_equal(mapping.present["present_value"], v.astype(np.float32))


def test_chunked_value_heads_equal_the_per_head_formula():
    # HEAD-3, HEAD-4: H = 4, Hkv = 2, d = 1, dv = 3, so H * dv = 12 > D = 4 takes three runs
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(2, 4, 3, 1)), rng.normal(size=(2, 2, 5, 1)), rng.normal(size=(2, 2, 5, 3))
    mapping = onnx_node_tests.map_case(_node_case("gqa-dv", {"Q": Q, "K": K, "V": V}, ["Y"]))
    assert len(mapping.calls) == 3
    k, v = np.repeat(K, 2, axis=1), np.repeat(V, 2, axis=1)  # query head h reads kv head h // 2
    logits = Q @ k.swapaxes(-1, -2)  # scale 1 / sqrt(1)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    expected = (w / w.sum(-1, keepdims=True)) @ v  # (B, H, Lq, dv)
    y = onnx_node_tests.as_onnx_y(onnx_node_tests.evaluate(mapping)["Y"], mapping)
    np.testing.assert_allclose(y, expected, rtol=1e-13, atol=1e-15)


def test_logits_output_is_not_expressible_but_y_is_still_judged():
    rng = np.random.default_rng(1)
    Q, K, V = (rng.random((1, 1, 2, 4)).astype(np.float32) for _ in range(3))
    case = _node_case("q", {"Q": Q, "K": K, "V": V}, ["Y", "", "", "qk_matmul_output"], qk_matmul_output_mode=1)
    mapping = onnx_node_tests.map_case(case)
    y = onnx_node_tests.as_onnx_y(onnx_node_tests.evaluate(mapping)["Y"], mapping)
    case.outputs = {"Y": y.astype(np.float32), "qk_matmul_output": np.zeros((1, 1, 2, 2), np.float32)}
    outcome = onnx_node_tests.check(case)
    assert outcome.status == "not expressible"
    assert outcome.reason == "pre-softmax logits output (qk_matmul_output_mode=1)"
    case.outputs["Y"] = case.outputs["Y"] + 1
    assert onnx_node_tests.check(case).status == "disagree"


# ----------------------------------------------------------------- adapters
def _first(pred):
    return next(c for c in CASES if pred(c))


def _sample_cases():
    """A few cases by what they exercise: plain, dead keys (MASK-7), fully masked rows (MASK-5), GQA, window."""
    return [
        _first(lambda c: c.id == "vanilla/cross/lq5-lk7"),
        _first(lambda c: c.id == "mask/padding-B11K-dead-keys"),
        _first(lambda c: c.id == "mask/fully-masked-rows"),
        _first(lambda c: "grouped-kv-heads" in c.features() and c.features() <= _features()),
        _first(lambda c: "window" in c.features() and c.features() <= _features()),
    ]


def _features():
    return load_adapter("onnxruntime").capabilities().features


@pytest.mark.parametrize("name", ["onnx-reference", "onnxruntime"])
def test_adapter_passes_the_harness_with_only_named_deviations(name):
    adapter = load_adapter(name)
    caps = adapter.capabilities()
    assert not caps.gradients and caps.weights
    results = runner.run(runner.Plan([adapter], cases=_sample_cases(), dtypes=["float32", "float16"]))
    assert not [f"{r.case} {r.dtype} [{r.check}] {r.message}" for r in results if r.failed]
    deviations = {(r.case, r.dtype, r.check) for r in results if r.status == "deviation"}
    assert deviations == {("mask/padding-B11K-dead-keys", dt, "dead-keys/nan") for dt in ("float32", "float16")}
    passed = {(r.case, r.check) for r in results if r.status == "pass"}
    assert ("mask/fully-masked-rows", "fully-masked-rows") in passed  # MASK-5 exactly: weights 0, out bo


def test_onnxruntime_has_no_bfloat16_and_says_why():
    caps = load_adapter("onnxruntime").capabilities()
    assert "bfloat16" in caps.unsupported["cpu", "bfloat16"]
    results = runner.run(runner.Plan([load_adapter("onnxruntime")], cases=_sample_cases()[:1], dtypes=["bfloat16"]))
    assert {r.status for r in results} == {"skip"} and "NOT_IMPLEMENTED" in results[0].message


def test_onnxruntime_float64_deviation_is_strict():
    # the float64 scale is rounded through float32 (SCALE-1, PREC-1): a named deviation, and
    # a case where every row has one key (vanilla/self/L1: weights 1 whatever the scale) passes,
    # so the deviation must not claim it: it would be an unexpected pass
    adapter = load_adapter("onnxruntime")
    cases = [_first(lambda c: c.id == "vanilla/self/basic"), _first(lambda c: c.id == "vanilla/self/L1")]
    results = runner.run(runner.Plan([adapter], cases=cases, dtypes=["float64"]))
    assert not [r for r in results if r.failed]
    assert {r.case for r in results if r.status == "deviation"} == {"vanilla/self/basic"}
    everywhere = runner.Deviation(adapter="onnxruntime", case="*", check="*", dtype="float64", reason="r", name="wide")
    results = runner.run(runner.Plan([adapter], cases=cases, dtypes=["float64"]), deviations=[everywhere])
    unexpected = [r for r in results if r.status == "unexpected-pass"]
    assert [r.case for r in unexpected] == ["vanilla/self/L1"] and unexpected[0].failed


def test_dead_key_deviation_is_strict():
    # a deviation claiming a check that passes (dead-keys/large: a large finite value is masked to 0) fails the run
    adapter = load_adapter("onnx-reference")
    case = _first(lambda c: c.id == "mask/padding-B11K-dead-keys")
    wrong = runner.Deviation(adapter="onnx-reference", case="*", check="dead-keys/large", reason="r", name="wrong")
    results = runner.run(runner.Plan([adapter], cases=[case], dtypes=["float32"]), deviations=[wrong])
    assert any(r.status == "unexpected-pass" and r.failed for r in results)
    assert any(r.check == "dead-keys/nan" and r.status == "fail" for r in results)


# ------------------------------------------------ the exporting direction: torch_impl through torch.onnx
class TorchImplExportedToOnnxruntime:
    """torch_impl.MultiHeadAttention exported with ``torch.onnx.export`` (dynamo) and run by onnxruntime.

    The demonstration that the semantics port to a runtime nobody here wrote: the relative schemes and the
    peer options leave PyTorch as an ONNX graph of plain operators, and the harness judges what onnxruntime
    computes from it with the stored goldens and budgets. float32 only (what the export is for), no
    gradients, no keep masks (a module draws those itself in training mode).
    """

    name = "torch-impl-onnx-export"

    def __new__(cls):
        from conformance.adapters.base import FEATURES, Adapter, Capabilities

        class _Adapter(Adapter):
            name = cls.name

            def capabilities(self):
                features = FEATURES - {"validates-input", "dropout-keep", "dropout-spec"}
                return Capabilities(dtypes=("float32",), features=features, weights=True, gradients=False)

            def forward(self, spec, params, inputs, *, device, need_weights):
                return _export_and_run(spec, params, inputs)

        return _Adapter()


#: The optional inputs, in the order the exported graph takes them after the query.
_EXPORT_ARGS = ("key", "value", "mask", "bias", "q_positions", "k_positions")


def _export_and_run(spec, params, inputs):
    import pathlib
    import tempfile
    import warnings

    import onnxruntime
    import torch

    import torch_impl

    module = torch_impl.MultiHeadAttention(spec, dtype=torch.float32).load_canonical(params)
    given = [n for n in _EXPORT_ARGS if n in inputs]

    class Call(torch.nn.Module):  # positional tensors in, (out, weights) out: what an ONNX graph takes
        def __init__(self):
            super().__init__()
            self.attention = module

        def forward(self, query, *rest):
            kw = dict(zip(given, rest))
            return self.attention(query, kw.pop("key", None), kw.pop("value", None), **kw, return_weights=True)

    args = tuple(torch.from_numpy(np.asarray(inputs[n])) for n in ("query", *given))
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as tmp:
        warnings.simplefilter("ignore")
        path = pathlib.Path(tmp) / "attention.onnx"
        torch.onnx.export(Call(), args, dynamo=True, verbose=False).save(str(path))
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    out, weights = session.run(None, feeds)
    return {"out": out, "weights": weights}


#: Relative schemes and peer options, self- and cross-attention, masks and positions.
EXPORT_CASES = (
    "huang/M8/self/per-head",
    "shaw/k2/cross/random-positions",
    "peer/value-head-dim/self/gqa-shaw-values-causal",
    "peer/softcap/self/huang-causal-scale2",
    "peer/window/cross/two-sided-decoding-shaw",
)


def test_torch_impl_exported_with_torch_onnx_passes_under_onnxruntime():
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript (the onnx extra)")
    pytest.importorskip("torch", reason="torch is not installed")
    by_id = {c.id: c for c in CASES}
    plan = runner.Plan([TorchImplExportedToOnnxruntime()], cases=[by_id[i] for i in EXPORT_CASES], dtypes=["float32"])
    results = runner.run(plan, deviations=[])
    assert not [f"{r.case} [{r.check}] {r.message}" for r in results if r.failed or r.status == "skip"]
    judged = {r.case for r in results if r.status == "pass" and r.check == "out"}
    assert judged == set(EXPORT_CASES)
