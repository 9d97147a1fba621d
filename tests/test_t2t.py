"""tensor2tensor's relative attention against the reference (SHAW-1..3, HUANG-1..6): the adapters of
conformance/adapters/t2t.py and the findings in spec/comparison.md.

tensor2tensor needs an environment of its own (the `t2t` extra, TensorFlow CPU, then tensor2tensor without its
requirements; `.ci/run` makes it and runs this file there); elsewhere these tests skip with the adapter's reason.
Expected values come from numpy_ref (float64).
"""

import numpy as np
import pytest

import numpy_ref
from conformance.adapters.t2t import T2THuangAdapter, T2TShawAdapter
from spec import AttentionSpec, Huang, Shaw

SHAW, HUANG = T2TShawAdapter(), T2THuangAdapter()
pytestmark = pytest.mark.skipif(bool(SHAW.unavailable()), reason=str(SHAW.unavailable()))
GRADS = ("query", "key", "value", "wq", "wk", "wv", "wo", "bq", "bo", "rel_k", "rel_v")


def _rel(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert np.isfinite(actual).all(), "NaN or Inf where the truth is finite"
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def _call(spec, L=7, seed=0, dtype=np.float64):
    """Canonical params with distinct table rows (a wrong row shows), an input and an upstream gradient."""
    rng = np.random.default_rng(seed)
    params = numpy_ref.init_params(spec, seed=seed)
    for n in ("rel_k", "rel_v"):
        if n in params:
            params[n] = rng.normal(size=params[n].shape)
    x, g = rng.normal(size=(2, L, spec.model_dim)), rng.normal(size=(2, L, spec.model_dim))
    return {n: a.astype(dtype) for n, a in params.items()}, x.astype(dtype), g.astype(dtype), params, x, g


def _check(adapter, spec, L=7, dtype=np.float64, tol=1e-13):
    """The adapter's output and every gradient against numpy_ref's, in float64 unless ``dtype`` says."""
    params, x, g, truth_params, tx, tg = _call(spec, L, dtype=dtype)
    out = adapter.forward(spec, params, {"query": x}, device="cpu", need_weights=False)["out"]
    assert _rel(out, numpy_ref.attention(spec, truth_params, tx)) < tol
    grads = adapter.vjp(spec, params, {"query": x, "key": x, "value": x}, g, device="cpu")
    truth = numpy_ref.attention_vjp(spec, truth_params, tx, tx, tx, grad_out=tg)
    for n in GRADS:
        if n in truth:
            assert _rel(grads[n], truth[n]) < tol, n
    return out


def test_shaw_is_dot_product_attention_relative_with_the_tables_as_they_are():
    """SHAW-1..3, SCALE-3: dot_product_attention_relative on the query scaled by d ** -0.5 is Shaw(k) with
    rel_k, rel_v in t2t's own row order (distance key minus query, clipped), gradients included; with the
    tables reversed it is another attention."""
    spec = AttentionSpec(2, 4, relative=Shaw(2))
    out = _check(SHAW, spec, L=7)
    params, x = _call(spec)[:2]
    flipped = {**params, "rel_k": params["rel_k"][::-1].copy(), "rel_v": params["rel_v"][::-1].copy()}
    assert _rel(SHAW.forward(spec, flipped, {"query": x}, device="cpu", need_weights=False)["out"], out) > 1e-2


def test_shaw_without_a_value_term_loads_a_table_of_zeros():
    """SHAW-3: Shaw(k, values=False) is t2t's function with its value table all zero, causal through t2t's
    lower-triangle bias (CAUSAL-1)."""
    _check(SHAW, AttentionSpec(2, 4, relative=Shaw(3, values=False), causal=True), L=9)


def test_t2t_rejects_a_shaw_window_of_zero():
    """Shaw(0) is one table row for every distance (SHAW-2); t2t raises for it, so the adapter skips such cases
    with that reason."""
    from conformance.catalog import BY_ID

    assert "ValueError for max_relative_position = 0" in SHAW.unsupported_case(BY_ID["shaw/k0/self"])
    spec = AttentionSpec(2, 4, relative=Shaw(0))
    params, x = _call(spec)[:2]
    with pytest.raises(ValueError, match="should be > 0"):
        SHAW.forward(spec, params, {"query": x}, device="cpu", need_weights=False)


@pytest.mark.parametrize("per_head", [True, False], ids=["per-head", "shared"])
@pytest.mark.parametrize("values", [False, True], ids=["keys", "keys-and-values"])
def test_huang_causal_is_the_v2_function_on_the_tables_first_rows(per_head, values):
    """HUANG-1..4, HUANG-6: dot_product_self_attention_relative_v2 with M = 3 < L is causal Huang(3) (distances
    beyond the table add zero, HUANG-3) with its table in the spec's rows 0 .. M-1, in float64 with gradients;
    the rows for distances > 0 are never read (their gradients are zero)."""
    spec = AttentionSpec(2, 4, relative=Huang(3, per_head=per_head, values=values), causal=True)
    _check(HUANG, spec, L=6)
    params, x, g = _call(spec, L=6)[:3]
    grads = HUANG.vjp(spec, params, {"query": x, "key": x, "value": x}, g, device="cpu")
    assert not grads["rel_k"][..., 3:, :].any()


def test_huang_bidirectional_runs_in_float32_only():
    """HUANG-1..4: dot_product_unmasked_self_attention_relative_v2 is Huang(M) with the spec's own table, to
    float32 rounding; outside float32 it raises TypeError (the named deviation
    t2t-huang-bidirectional-float32-only: its skew pads with float32 zeros)."""
    spec = AttentionSpec(2, 4, relative=Huang(4, values=True))
    _check(HUANG, spec, L=6, dtype=np.float32, tol=100 * 2.0**-24)
    params, x = _call(spec, L=6)[:2]
    with pytest.raises(TypeError, match="ConcatV2"):
        HUANG.forward(spec, params, {"query": x}, device="cpu", need_weights=False)
