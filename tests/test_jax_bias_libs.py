"""keras-hub's AlibiBias (JAX backend) against the reference (ALIBI-1..3): the adapter of
conformance/adapters/jax_bias_libs.py and the findings behind its entries in conformance/deviations.json.

keras-hub is installed outside the `all` extra (its requirements pull TensorFlow; `.ci/run` installs it with
--no-deps), so these tests skip with the install command where it is missing. Expected values come from numpy_ref
(float64).
"""

import numpy as np
import pytest

import numpy_ref
from conformance.adapters import _jax
from conformance.adapters.jax_bias_libs import KerasHubAlibiAdapter
from spec import Alibi, AttentionSpec

KERAS = KerasHubAlibiAdapter()
pytestmark = pytest.mark.skipif(bool(KERAS.unavailable()), reason=str(KERAS.unavailable()))


def _rel(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def _call(spec, L=7, seed=0):
    rng = np.random.default_rng(seed)
    params = numpy_ref.init_params(spec, seed=seed)
    x = {n: rng.normal(size=(2, L, spec.model_dim)) for n in ("query", "key", "value")}
    return params, x


def test_alibi_bias_is_the_spec_under_a_causal_mask_and_the_linear_form_without():
    """ALIBI-2, ALIBI-3: with a causal mask AlibiBias (its own slopes, alibi_bias_max = max_bias) equals numpy_ref
    in float64; without one it equals Alibi(symmetric=False), a row constant away, and not the symmetric form."""
    _jax.setup()  # float64 arrays stay float64 (x64), as in the adapters
    for max_bias in (8.0, 4.0):
        causal = AttentionSpec(3, 4, causal=True, relative=Alibi(max_bias=max_bias))
        params, x = _call(causal)
        out = KERAS.forward(causal, params, x, device="cpu", need_weights=False)["out"]
        assert _rel(out, numpy_ref.attention(causal, params, **x)) < 1e-13
    spec = AttentionSpec(3, 4, relative=Alibi())
    out = KERAS.forward(spec, params, x, device="cpu", need_weights=False)["out"]
    linear = AttentionSpec(3, 4, relative=Alibi(symmetric=False))
    assert _rel(out, numpy_ref.attention(linear, params, **x)) < 1e-13
    assert _rel(out, numpy_ref.attention(spec, params, **x)) > 1e-2
