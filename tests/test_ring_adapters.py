"""The ring adapters' padding (conformance/adapters/ring.py): what a sharded call adds to a case must change none of
its rows (MASK-4, MASK-5, MASK-6), checked against numpy_ref on the padded call itself. The rings' own results
are judged by ``python -m conformance run --adapter jax:ring --adapter torch:ring`` (.ci/run)."""

import numpy as np
import pytest

import numpy_ref
from conformance.adapters.ring import (
    bias_padding,
    mask_fill_reason,
    pad_inputs,
    padded_lengths,
    shard_count,
)
from spec import AttentionSpec, Shaw


def _padded_reference(spec, inputs, n):
    """numpy_ref on the padded call (the bias padded as the adapters pad it), its first Lq rows."""
    Lq, Lk, Lq2, Lk2 = padded_lengths(spec, inputs, n)
    kw = pad_inputs(spec, inputs, n)
    rows = lambda a, L2: np.pad(a, ((0, 0), (0, L2 - a.shape[1]), (0, 0)))  # noqa: E731
    if "bias" in inputs:
        b = inputs["bias"]
        kw["bias"] = np.pad(b.reshape((1,) * (4 - b.ndim) + b.shape), bias_padding(b.shape, Lq, Lk, Lq2, Lk2))
    params = numpy_ref.init_params(spec, 1)
    out = numpy_ref.attention(
        spec, params, rows(inputs["query"], Lq2), rows(inputs["key"], Lk2), rows(inputs["key"], Lk2), **kw
    )
    want = numpy_ref.attention(spec, params, inputs["query"], inputs["key"], inputs["key"], **{
        k: v for k, v in inputs.items() if k not in ("query", "key")
    })  # fmt: skip
    return out[:, :Lq], want


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_padding_changes_no_row(n, causal):
    """Padded keys are masked and padded rows dropped: the call's rows are the unpadded call's, with a mask that
    empties a row (MASK-5), a bias broadcast over the queries, uint8 positions near their top and a causal rule
    through them."""
    rng = np.random.default_rng(0)
    spec = AttentionSpec(2, 4, relative=Shaw(2), causal=causal)
    Lq, Lk = 5, 7
    mask = rng.random((2, 1, Lq, Lk)) < 0.7
    mask[0, :, 1] = False
    inputs = {
        "query": rng.normal(size=(2, Lq, 8)),
        "key": rng.normal(size=(2, Lk, 8)),
        "mask": mask,
        "bias": rng.normal(size=(2, 1, Lk)),
        "q_positions": np.arange(250, 250 + Lq, dtype=np.uint8),
        "k_positions": np.arange(248, 248 + Lk, dtype=np.uint8),
    }
    got, want = _padded_reference(spec, inputs, n)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got[0, 1], want[0, 1])  # MASK-5: the empty row is exactly the output bias


def test_mask_fill_takes_a_count_that_divides_the_keys():
    """MASK-6: disallowed keys count at the fill, so the keys are never padded: the count's unit divides Lk, or
    none does and the reason says so."""
    spec = AttentionSpec(2, 4, mask_fill=-1e9, causal=True)
    n = shard_count(spec, 5, 16, (2, 4, 8))
    assert 16 % (2 * n) == 0
    assert shard_count(spec, 5, 7, (2, 4, 8)) is None
    expected = "mask_fill counts every key (MASK-6), so the keys cannot be padded, and Lk = 7 is a multiple of no "
    assert mask_fill_reason(spec, 7, (2, 4, 8)).startswith(expected)
    assert mask_fill_reason(spec, 7, (2, 4, 8)).endswith("shard unit (4, 8, 16)")


def test_the_shard_count_is_fixed_per_call_and_meets_every_count():
    """The count is a function of the spec and the lengths, and the catalog's shapes reach 2, 4 and 8."""
    spec = AttentionSpec(2, 4)
    assert shard_count(spec, 5, 7, (2, 4, 8)) == shard_count(spec, 5, 7, (2, 4, 8))
    seen = {shard_count(AttentionSpec(2, 4, relative=Shaw(k)), 9, 9, (2, 4, 8)) for k in range(12)}
    assert seen == {2, 4, 8}
