"""timm's Swin WindowAttention against the reference (SWIN-1..3): the adapter of conformance/adapters/timm_swin.py.

timm needs an environment of its own (the `timm` extra: torch 2.14.1, torchvision 0.29.1; `.ci/run` makes it and
runs this file there); elsewhere these tests skip with the adapter's reason. Expected values come from numpy_ref
(float64).
"""

import numpy as np
import pytest

import numpy_ref
from conformance.adapters.timm_swin import TimmWindowAttentionAdapter
from spec import AttentionSpec, Swin

TIMM = TimmWindowAttentionAdapter()
pytestmark = pytest.mark.skipif(bool(TIMM.unavailable()), reason=str(TIMM.unavailable()))


def _rel(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert np.isfinite(actual).all(), "NaN or Inf where the truth is finite"
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


@pytest.mark.parametrize("window", [(3, 4), (4, 1)], ids=["3x4", "4x1"])
def test_window_attention_is_the_spec_with_its_table_reversed(window):
    """SWIN-1..3: WindowAttention on one window equals numpy_ref in float64 (its explicit path keeps the input
    dtype), gradients included (rel_b's through the reversed table, wq/wk/wv through the packed qkv), and its
    weights come back from the packed layout exactly; in its own order the table gives another attention."""
    spec = AttentionSpec(2, 4, relative=Swin(window))
    L = window[0] * window[1]
    rng = np.random.default_rng(1)
    params = numpy_ref.init_params(spec, seed=1)
    params["rel_b"] = rng.normal(size=params["rel_b"].shape)
    x, g = rng.normal(size=(2, L, 8)), rng.normal(size=(2, L, 8))
    inputs = {"query": x}
    out = TIMM.forward(spec, params, inputs, device="cpu", need_weights=False)["out"]
    assert _rel(out, numpy_ref.attention(spec, params, x)) < 1e-13
    grads = TIMM.vjp(spec, params, {"query": x, "key": x, "value": x}, g, device="cpu")
    truth = numpy_ref.attention_vjp(spec, params, x, x, x, grad_out=g)
    for n in ("rel_b", "wq", "wk", "wv", "bq", "wo", "query", "key", "value"):
        scale = np.max(np.abs(truth["wq"])) if n == "bq" else None
        err = np.max(np.abs(grads[n] - truth[n])) / (np.max(np.abs(truth[n])) if scale is None else scale)
        assert err < 1e-12, n
    back = TIMM.roundtrip_params(spec, params)
    assert sorted(back) == sorted(params) and all(np.array_equal(back[n], params[n]) for n in params)
    unreversed = {**params, "rel_b": params["rel_b"][:, ::-1].copy()}
    assert _rel(TIMM.forward(spec, unreversed, inputs, device="cpu", need_weights=False)["out"], out) > 1e-2
