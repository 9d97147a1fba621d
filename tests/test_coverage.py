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


COMBINATIONS = coverage.combinations()
CELLS = {subject.name: cells for subject, cells in COMBINATIONS}


def test_every_scheme_and_option_is_covered_causal_and_not_default_and_explicit_positions_decoding_long_each_dtype():
    assert coverage.combination_gaps(COMBINATIONS) == []


def test_a_decode_step_is_one_query_after_its_cache_not_any_single_query():
    decode = "decode step (Lq = 1 after a cache)"
    assert "decode/vanilla/window-gqa-padding" in CELLS["vanilla (no position scheme)"][decode]
    # Lq = 1 at default positions is the query at position 0 before 8 later keys: a single query, no decoding
    assert "vanilla/cross/lq1-lk9" not in CELLS["vanilla (no position scheme)"][decode]
    assert "rope/half/self/prefill-then-steps" in CELLS["rope (ROPE-1..16)"][decode]  # ROPE-10: also decoded
    long = f"long (Lq, Lk >= {coverage.LONG})"
    assert "long/huang/M64-values-causal-mask-fill-no-projection-bias-L512" in CELLS["mask_fill (MASK-6)"][long]
    assert "causal/self/long-L640" not in CELLS["mask_fill (MASK-6)"][long]


def test_a_combination_without_a_case_is_a_gap_and_a_meaningless_one_gives_its_reason():
    cases = [c for c in coverage.CASES if not c.id.startswith("decode/huang/")]
    rows = coverage.combinations(cases)
    assert ("huang values (HUANG-6)", "decode step (Lq = 1 after a cache)") in coverage.combination_gaps(rows, cases)
    text = coverage.render(coverage.table(cases), rows)
    # the decode steps of Huang's key term, of its value term and of mask_fill were that case's alone
    assert "Gaps in the combinations: 3." in text and "- mask_fill (MASK-6): decode step" in text
    (swin,) = [cells for subject, cells in rows if subject.name.startswith("swin")]
    assert swin["decode step (Lq = 1 after a cache)"] == []  # no gap: the subject says why
    assert "(1) swin (SWIN-1..6), decode step (Lq = 1 after a cache): Swin attends within the windows" in text


def test_a_case_in_fewer_dtypes_must_say_why():
    from dataclasses import replace

    bare = [replace(c, notes="") if c.id == "vanilla/cross/large-logits" else c for c in coverage.CASES]
    assert ("vanilla/cross/large-logits", "dtypes") in coverage.combination_gaps(COMBINATIONS, bare)
    assert "vanilla/cross/large-logits" in {c.id for c in coverage.fewer_dtypes()}
