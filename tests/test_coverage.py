"""The catalog-coverage review (conformance/coverage.py) and its stored table."""

from conformance import coverage

STORED = coverage.STORED
ROWS = coverage.table()
BY_NAME = {dim.name: cells for dim, cells in ROWS}


def test_stored_table_is_the_generated_one():
    assert STORED.read_text(encoding="utf-8") == coverage.render(ROWS), (
        "conformance/COVERAGE.md is stale: run `python -m conformance coverage --write`"
    )


def test_every_scheme_dimension_has_a_case_in_every_scheme():
    assert coverage.gaps(ROWS) == []


def test_predicates_read_the_stored_inputs():
    """Hand-checked facts about a few cases (their recipes say what the stored inputs must hold)."""
    some_heads = BY_NAME["rows empty in some heads only"]
    assert "mask/ragged-heads-and-batch" in some_heads["vanilla"]
    assert "mask/fully-masked-rows" not in some_heads["vanilla"]  # its rows are empty in every head
    every_head = BY_NAME["rows empty in every head (MASK-5)"]
    assert "mask/fully-masked-rows" in every_head["vanilla"]
    assert "mask/ragged-heads-and-batch" not in every_head["vanilla"]
    offsets = BY_NAME["key-minus-query offsets differ across batch"]
    assert "shaw/k2/cross/per-batch-offsets-causal" in offsets["shaw"]
    bias_alone = BY_NAME["a key removed by a -inf bias alone"]
    assert bias_alone["vanilla"] == ["bias/minus-inf-dead-keys-B11K"]
    beyond = BY_NAME["distances beyond the table"]
    assert "huang/M3/cross/beyond-table" in beyond["huang"]
    assert "huang/M6/self/shared-fits-equals-shaw" not in beyond["huang"]  # HUANG-5: every distance fits


def test_a_missing_dimension_is_reported_as_a_gap():
    rows = coverage.table([c for c in coverage.CASES if c.id != "mask/ragged-heads-and-batch"])
    assert ("rows empty in some heads only", "vanilla") in coverage.gaps(rows)
    assert "**none**" in coverage.render(rows)
