"""The float64 battery (PREC-6): independent float64 evaluations in other summation orders pass every float64
check with headroom (worst margin <= 0.5), so that a correct port summing in an order nobody here has tried
is not failed by rounding.

Members: numpy_ref as stored (BLAS-blocked matmuls, pairwise sums), numpy_ref over three key blocks combined
(BLOCK-1..BLOCK-6), numpy_ref with every feature and channel contraction in reversed and in a random order
(forward only: the permutation indexes the parameters), torch_impl's eager and tiles kernels in float64 (their
own contraction orders, their own autodiff).

jax_impl's xla and tiles kernels are members too, checked where their float64 programs are compiled anyway:
``.ci/run`` runs ``python -m conformance run --adapter jax --adapter jax:tiles --adapter jax:xla --headroom 0.5``
(one XLA program per case and dtype, about 280 s of this run's time if it compiled them again here).
"""

import pytest
from _reordered import ReorderedReference

from conformance import runner
from conformance.adapters import load_adapter

WORST_MARGIN = 0.5

MEMBERS = {
    "numpy": lambda: load_adapter("numpy"),
    "numpy:blockwise": lambda: load_adapter("numpy:blockwise"),
    "reversed-reference": lambda: ReorderedReference(reverse=True),
    "reordered-reference": lambda: ReorderedReference(),
    "torch:eager": lambda: load_adapter("torch:eager"),
    "torch:tiles": lambda: load_adapter("torch:tiles"),
}


@pytest.mark.parametrize("member", list(MEMBERS))
def test_a_battery_member_passes_every_float64_check_with_headroom(member):
    adapter = MEMBERS[member]()
    if adapter.unavailable():
        pytest.skip(f"{member}: {adapter.unavailable()}")
    results = runner.run(runner.Plan([adapter], dtypes=["float64"]), deviations=[])
    checked = [r for r in results if r.margin is not None]
    assert checked, f"{member} ran no float64 check"
    assert not [(r.case, r.check, r.message) for r in results if r.failed]
    worst = max(checked, key=lambda r: r.margin)
    assert worst.margin <= WORST_MARGIN, f"{member}: {worst.case} [{worst.check}] at margin {worst.margin:.3f}"
