"""The vectorised reference equals the loop-level definition to 1e-12.

The definition transcribes the rule formulas element by element; agreement
over random configurations of every option is what makes the vectorised
reference (skew, gathers, bucket sums) trustworthy as the spec's executable form.
"""

import numpy as np
import pytest
from _random_calls import random_call
from hypothesis import given
from hypothesis import strategies as st

import numpy_ref
from spec import AttentionSpec, Huang, Shaw

TOL = 1e-12


def assert_same(call):
    out, w = numpy_ref.attention(*call.args(), **call.kwargs, return_weights=True)
    out_def, w_def = numpy_ref.definition.attention(*call.args(), **call.kwargs, return_weights=True)
    assert np.isfinite(out).all() and np.isfinite(w).all()
    np.testing.assert_allclose(w, w_def, rtol=0, atol=TOL)
    np.testing.assert_allclose(out, out_def, rtol=0, atol=TOL)


@given(st.integers(0, 2**32 - 1))
def test_random_configurations(seed):
    assert_same(random_call(seed))


EDGE_SPECS = {
    "vanilla-no-bias": AttentionSpec(2, 3, bias=False),
    "shaw-k0": AttentionSpec(2, 2, relative=Shaw(0)),
    "shaw-k-beyond-length": AttentionSpec(2, 2, relative=Shaw(9)),
    "shaw-keys-only-per-head": AttentionSpec(2, 2, relative=Shaw(1, values=False, per_head=True)),
    "shaw-values-only": AttentionSpec(2, 2, relative=Shaw(2, keys=False)),
    "huang-M1": AttentionSpec(2, 2, relative=Huang(1)),
    "huang-beyond-table": AttentionSpec(1, 3, relative=Huang(2, per_head=False)),
    "huang-unscaled-causal": AttentionSpec(2, 2, relative=Huang(3), scale_relative=False, causal=True),
    "shaw-key-side-shared-gqa": AttentionSpec(4, 2, num_kv_heads=2, relative=Shaw(1, key_side="shared")),
    "shaw-key-side-own-only-unscaled": AttentionSpec(
        2, 2, relative=Shaw(2, keys=False, values=False, per_head=True, key_side="own", key_side_scaled=False)
    ),
    "huang-values-per-head-dv3": AttentionSpec(2, 2, value_head_dim=3, relative=Huang(2, values=True)),
    "mask-fill-causal": AttentionSpec(2, 2, relative=Shaw(1), causal=True, mask_fill=-1e10),
}


@pytest.mark.parametrize("name", list(EDGE_SPECS))
@pytest.mark.parametrize("seed", range(6))
def test_edge_configurations(name, seed):
    assert_same(random_call(seed, spec=EDGE_SPECS[name], max_len=6))


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_every_mask_rank(rank):
    spec = AttentionSpec(2, 2, relative=Shaw(1))
    call = random_call(7, spec=spec, cross=True)
    B, Lq, Lk = call.query.shape[0], call.query.shape[1], call.key.shape[1]
    full = (B, 2, Lq, Lk)
    call.kwargs = {"mask": np.random.default_rng(rank).random(full[4 - rank :]) < 0.6}
    assert_same(call)


def test_positions_as_vector_and_per_batch():
    spec = AttentionSpec(2, 2, relative=Huang(3))
    call = random_call(3, spec=spec, cross=True)
    B, Lq, Lk = call.query.shape[0], call.query.shape[1], call.key.shape[1]
    call.kwargs = {"q_positions": np.arange(Lq) + 2, "k_positions": np.tile(np.arange(Lk) * 2, (B, 1))}
    assert_same(call)
