"""The conformance matrix under pytest: one test per (adapter, device, dtype, case).

A test fails when any check of its cell fails (expected deviations listed in
conformance/deviations.json are allowed, strictly); a cell the adapter
cannot run is skipped with the reason the harness gives.
"""

import pytest

from conformance import runner
from conformance.adapters import BUILTIN, load_adapter
from conformance.checks import CaseRun
from conformance.store import load_case, load_manifest

MANIFEST = load_manifest()
DEVIATIONS = runner.load_deviations()
ADAPTERS = {name: load_adapter(name) for name in BUILTIN}
CELLS = list(runner.matrix(runner.Plan(list(ADAPTERS.values()))))


def _id(cell):
    adapter, _, device, dtype, case, _ = cell
    return f"{adapter.name}-{device}-{dtype}-{case.id}"


@pytest.mark.parametrize("cell", CELLS, ids=[_id(c) for c in CELLS])
def test_cell(cell):
    adapter, caps, device, dtype, case, skip = cell
    if skip:
        pytest.skip(skip)
    entry = MANIFEST["cases"][case.id]
    results = CaseRun(case, entry, load_case(case.id, entry), adapter, caps, dtype, device).run()
    runner.apply_deviations(results, DEVIATIONS)
    assert results, "a runnable cell must produce checks"
    failed = [f"[{r.check}] {r.message}" for r in results if r.failed]
    assert not failed, "\n".join(failed)
