"""The mutation campaign over numpy_ref (conformance/campaign.py): operators, ids, runner, report."""

import argparse
import ast
import json
import re

import pytest

from conformance import campaign, cli
from conformance.catalog import CASES

TOY = '''\
"""A toy module."""

import numpy as np


def f(x, y, mask):
    """Never mutated."""
    if x is None:
        raise ValueError(f"x: expected an array, got {x!r}")
    z = x - y * 2.0
    z = np.where(mask, z, 0.0)
    out = z.sum(axis=-1, keepdims=True)
    out[..., 0] = -y
    return out.transpose(0, 2, 1)[:, None]


def g(a, b, n):
    keep = ~a & b
    keep |= a
    if not (n > 1 and b.any()):
        return None
    return np.abs(a[1 : n - 1]) if n < 3 else a.copy()
'''

TOY_MUTANTS = {
    "toy.py:f:compare:0": (8, "x is None", "x is not None"),
    "toy.py:f:stmt-drop:0": (9, "raise ValueError(f'x: expected an array, got {x!r}')", "pass"),
    "toy.py:f:arith:0": (10, "x - y * 2.0", "x + y * 2.0"),
    "toy.py:f:operand-swap:0": (10, "x - y * 2.0", "y * 2.0 - x"),
    "toy.py:f:operand-drop:0": (10, "x - y * 2.0", "x"),
    "toy.py:f:operand-drop:1": (10, "x - y * 2.0", "y * 2.0"),
    "toy.py:f:arith:1": (10, "y * 2.0", "y / 2.0"),
    "toy.py:f:float-const:0": (10, "2.0", "-2.0"),
    "toy.py:f:float-const:1": (10, "2.0", "4.0"),
    "toy.py:f:stmt-drop:1": (11, "z = np.where(mask, z, 0.0)", "pass"),
    "toy.py:f:where-swap:0": (11, "np.where(mask, z, 0.0)", "np.where(mask, 0.0, z)"),
    "toy.py:f:float-const:2": (11, "0.0", "1.0"),
    "toy.py:f:func-swap:0": (12, "z.sum(axis=-1, keepdims=True)", "z.mean(axis=-1, keepdims=True)"),
    "toy.py:f:axis:0": (12, "-1", "0"),
    "toy.py:f:axis:1": (12, "-1", "-2"),
    "toy.py:f:keepdims:0": (12, "keepdims=True", "keepdims=False"),
    "toy.py:f:stmt-drop:2": (13, "out[..., 0] = -y", "pass"),
    "toy.py:f:index:0": (13, "0", "1"),
    "toy.py:f:index:1": (13, "0", "-1"),
    "toy.py:f:neg-removal:0": (13, "-y", "y"),
    "toy.py:f:none-move:0": (14, "out.transpose(0, 2, 1)[:, None]", "out.transpose(0, 2, 1)[None, :]"),
    "toy.py:f:perm-swap:0": (14, "out.transpose(0, 2, 1)", "out.transpose(2, 0, 1)"),
    "toy.py:f:perm-swap:1": (14, "out.transpose(0, 2, 1)", "out.transpose(1, 2, 0)"),
    "toy.py:f:perm-swap:2": (14, "out.transpose(0, 2, 1)", "out.transpose(0, 1, 2)"),
    "toy.py:g:bitwise:0": (18, "~a & b", "~a | b"),
    "toy.py:g:operand-drop:0": (18, "~a & b", "~a"),
    "toy.py:g:operand-drop:1": (18, "~a & b", "b"),
    "toy.py:g:invert-removal:0": (18, "~a", "a"),
    "toy.py:g:bitwise:1": (19, "keep |= a", "keep &= a"),
    "toy.py:g:stmt-drop:0": (19, "keep |= a", "pass"),
    "toy.py:g:not-removal:0": (20, "not (n > 1 and b.any())", "n > 1 and b.any()"),
    "toy.py:g:boolop:0": (20, "n > 1 and b.any()", "n > 1 or b.any()"),
    "toy.py:g:compare:0": (20, "n > 1", "n >= 1"),
    "toy.py:g:int-const:0": (20, "1", "2"),
    "toy.py:g:int-const:1": (20, "1", "0"),
    "toy.py:g:func-swap:0": (20, "b.any()", "b.all()"),
    "toy.py:g:call-drop:0": (22, "np.abs(a[1:n - 1])", "a[1:n - 1]"),
    "toy.py:g:slice:0": (22, "1:n - 1", "2:n - 1"),
    "toy.py:g:slice:1": (22, "1:n - 1", "0:n - 1"),
    "toy.py:g:arith:0": (22, "n - 1", "n + 1"),
    "toy.py:g:operand-swap:0": (22, "n - 1", "1 - n"),
    "toy.py:g:operand-drop:2": (22, "n - 1", "n"),
    "toy.py:g:operand-drop:3": (22, "n - 1", "1"),
    "toy.py:g:int-const:2": (22, "1", "2"),
    "toy.py:g:int-const:3": (22, "1", "0"),
    "toy.py:g:compare:1": (22, "n < 3", "n <= 3"),
    "toy.py:g:cond-negate:0": (22, "n < 3", "not n < 3"),
    "toy.py:g:int-const:4": (22, "3", "4"),
    "toy.py:g:int-const:5": (22, "3", "2"),
    "toy.py:g:call-drop:1": (22, "a.copy()", "a"),
}


def test_operators_on_a_toy_module():
    got = {m.id: (m.line, m.original, m.mutated) for m in campaign.generate(TOY, "toy.py")}
    assert got == TOY_MUTANTS


def test_docstrings_strings_and_exception_messages_are_never_mutated():
    source = 'def h(x):\n    """Doc 1."""\n    raise ValueError("x: expected 1, got " + str(x - 1))\n'
    assert [(m.operator, m.mutated) for m in campaign.generate(source, "h.py")] == [("stmt-drop", "pass")]


def test_a_mutant_carries_the_rules_its_function_or_else_its_module_names():
    source = (
        '"""Module: MASK-5 and SOFTMAX-1."""\n\n\n'
        'def h(x):\n    """MASK-4 (MASK-2), not UTF-8 or NOPE-1: ids the spec declares."""\n    return x - 1\n\n\n'
        'def k(x):\n    """Nothing named."""\n\n    def inner(y):\n        return y + 1\n\n    return inner(x) * 2\n'
    )
    rules = {m.id: m.rules for m in campaign.generate(source, "r.py")}
    assert rules["r.py:h:arith:0"] == ("MASK-4", "MASK-2")
    assert rules["r.py:k:arith:0"] == rules["r.py:k.<locals>.inner:arith:0"] == ("MASK-5", "SOFTMAX-1")


def test_every_reference_mutant_names_rules_of_the_spec(reference_mutants):
    from spec import rule_ids

    known = set(rule_ids())
    assert all(m.rules and set(m.rules) <= known for m in reference_mutants)


def test_a_default_value_is_reached_when_its_function_body_runs():
    source = 'def h(n=3):\n    """Doc."""\n    return n - 1\n'
    by_id = {m.id: m for m in campaign.generate(source, "h.py")}
    assert (by_id["h.py:h:int-const:0"].line, by_id["h.py:h:int-const:0"].reach) == (1, (3, 3))
    assert by_id["h.py:h:int-const:2"].original == "1" and by_id["h.py:h:int-const:2"].reach == (3, 3)


def test_mutated_source_rewrites_only_the_node():
    by_id = {m.id: m for m in campaign.generate(TOY, "toy.py")}
    lines = TOY.splitlines()
    dropped = campaign.mutated_source(TOY, by_id["toy.py:f:stmt-drop:1"]).splitlines()
    assert dropped == lines[:10] + ["    pass"] + lines[11:]
    sliced = campaign.mutated_source(TOY, by_id["toy.py:g:slice:0"]).splitlines()
    assert sliced[21] == "    return np.abs(a[2:n - 1]) if n < 3 else a.copy()"
    assert sliced[:21] == lines[:21]
    tree = campaign.mutated_tree(TOY, by_id["toy.py:f:axis:1"])
    assert "out = z.sum(axis=-2, keepdims=True)" in ast.unparse(tree)


@pytest.fixture(scope="module")
def reference_mutants():
    return campaign.generate_files(campaign.scope_files())


def test_ids_are_stable_unique_and_name_their_place(reference_mutants):
    again = campaign.generate_files(campaign.scope_files())
    assert [m.id for m in again] == [m.id for m in reference_mutants]
    ids = [m.id for m in reference_mutants]
    assert len(ids) == len(set(ids))
    files = set(campaign.scope_files())
    assert "definition.py" not in files and "schemes/_literal.py" not in files and "forward.py" in files
    for m in reference_mutants:
        rel, function, operator, k = m.id.split(":")
        assert rel == m.file in files and function == m.function and operator == m.operator and k.isdigit()
    per_key: dict = {}
    for m in reference_mutants:
        per_key.setdefault(m.id.rsplit(":", 1)[0], []).append(int(m.id.rsplit(":", 1)[1]))
    assert all(ks == list(range(len(ks))) for ks in per_key.values())


def test_every_reference_mutant_compiles_and_reads_as_a_change_of_its_own_lines(reference_mutants):
    root = campaign.package_dir()
    sources = {f: (root / f).read_text(encoding="utf-8") for f in {m.file for m in reference_mutants}}
    for m in reference_mutants:
        compile(campaign.mutated_tree(sources[m.file], m), m.file, "exec", dont_inherit=True)
    # the readable source: one mutant per file and operator, and every negative literal (the parser's -n)
    sample = {(m.file, m.operator): m for m in reversed(reference_mutants)}
    sample.update({m.id: m for m in reference_mutants if m.mutated.startswith("-")})
    for m in sample.values():
        old = sources[m.file].splitlines()
        new = campaign.mutated_source(sources[m.file], m).splitlines()
        after = len(old) - m.end_line
        assert new[: m.line - 1] == old[: m.line - 1] and new[len(new) - after :] == old[m.end_line :], m.id


def _find(mutants, file, function, operator, original, mutated):
    hits = [
        m
        for m in mutants
        if (m.file, m.function, m.operator, m.original, m.mutated) == (file, function, operator, original, mutated)
    ]
    assert len(hits) == 1, hits
    return hits[0].id


CASE_IDS = ("vanilla/cross/lq5-lk7", "mask/rank2-QK", "mask/fully-masked-rows")
LONG_CASE_IDS = ("causal/self/long-L640", "huang/M512/self/causal-long-L512", "shaw/k3/self/causal-long-L640")


@pytest.fixture(scope="module")
def ids(reference_mutants):
    find = lambda *a: _find(reference_mutants, *a)  # noqa: E731
    return {
        "inverted-max": find("masking.py", "masked_softmax", "operand-swap", "z - row_max", "row_max - z"),
        "mask-dropped": find("masking.py", "allowed_keys", "stmt-drop", "allowed &= mask", "pass"),
        # the fallback denominator of an empty row: the outer np.where puts 0.0 there whatever it is
        "equivalent": [
            m.id
            for m in reference_mutants
            if m.function == "masked_softmax" and m.original == "1.0" and m.mutated == "2.0"
        ][0],
        "unreached": find(
            "params.py",
            "identity_params",
            "stmt-drop",
            "params[name] = np.eye(*shape) if name.startswith('w') else np.zeros(shape)",
            "pass",
        ),
    }


@pytest.fixture(scope="module")
def small_campaign(ids):
    equivalent = {
        ids["equivalent"]: "the fallback only fills rows that the outer where sets to 0.0",
        ids["mask-dropped"]: "a wrong argument",
    }
    return campaign.run_campaign(
        targets=["masking.py", "params.py"],
        mutant_patterns=[ids["inverted-max"], ids["mask-dropped"], ids["equivalent"], ids["unreached"]],
        cases=[c for c in CASES if c.id in CASE_IDS],
        jobs=2,
        equivalent=equivalent,
    )


def test_the_runner_kills_wrong_softmax_and_dropped_mask_and_spares_an_equivalent(small_campaign, ids):
    status = {o.mutant.id: o for o in small_campaign.outcomes}
    for name in ("inverted-max", "mask-dropped"):
        o = status[ids[name]]
        assert o.status == "killed", o
        assert o.killed_by["kind"] == "check" and o.killed_by["case"] in CASE_IDS and o.killed_by["check"]
        assert o.killed_by["by_rule"] and o.mutant.rules
    assert status[ids["mask-dropped"]].killed_by["case"].startswith("mask/")
    assert status[ids["equivalent"]].status == "equivalent"
    assert status[ids["equivalent"]].argument.startswith("the fallback")
    assert status[ids["unreached"]].status == "unreached"
    assert small_campaign.checks > 0 and small_campaign.case_ids == [c.id for c in CASES if c.id in CASE_IDS]


def test_a_kill_by_a_check_claiming_none_of_the_mutants_rules_is_a_failure(ids, monkeypatch, tmp_path, capsys):
    """The wrong softmax breaks SOFTMAX-1; told that it implements ROPE-1 alone (which no vanilla or mask case
    claims), the campaign finds no claiming check among its failures and says so."""
    monkeypatch.setattr(campaign, "_docstring_rules", lambda node: ("ROPE-1",))
    c = campaign.run_campaign(
        targets=["masking.py"], mutant_patterns=[ids["inverted-max"]], cases=[c for c in CASES if c.id in CASE_IDS]
    )
    (o,) = c.outcomes
    assert o.status == "killed-unclaimed" and o.mutant.rules == ("ROPE-1",)
    assert o.killed_by["by_rule"] is False and o.killed_by["case"] in CASE_IDS
    assert c.unclaimed_kills == [o] and c.totals()["killed-unclaimed"] == 1
    monkeypatch.setattr(campaign, "run_campaign", lambda **kw: c)
    assert campaign.main(_args(report_dir=str(tmp_path))) == 1
    assert f"KILLED-UNCLAIMED {ids['inverted-max']}" in capsys.readouterr().out
    md = (tmp_path / "REPORT.md").read_text()
    assert "## Killed by a check claiming none of the mutant's rules (1)" in md and "| ROPE-1 |" in md


def test_stale_equivalence_arguments_are_reported(small_campaign, ids):
    ((stale_id, why),) = small_campaign.stale
    assert stale_id == ids["mask-dropped"] and why.startswith("killed by mask/")
    gone = {"masking.py:nowhere:arith:0": "x"}
    assert campaign.stale_equivalent(gone, small_campaign.outcomes, ["masking.py"], None) == [
        ("masking.py:nowhere:arith:0", "no longer generated")
    ]
    # an argued id outside the campaign's files or --mutant patterns is not judged
    assert campaign.stale_equivalent(gone, small_campaign.outcomes, ["params.py"], None) == []
    assert campaign.stale_equivalent(gone, small_campaign.outcomes, ["masking.py"], ["masking.py:dead*"]) == []


def test_trusted_arguments_are_built_not_run_and_the_others_run_as_always(small_campaign, ids, tmp_path):
    """--trust-arguments: the argued mutants are equivalent by their arguments alone, so a wrong argument (the
    dropped mask, which the full run kills) is not caught; the unargued mutants have the full run's outcomes."""
    trusted = campaign.run_campaign(
        targets=["masking.py", "params.py"],
        mutant_patterns=[ids["inverted-max"], ids["mask-dropped"], ids["equivalent"], ids["unreached"]],
        cases=[c for c in CASES if c.id in CASE_IDS],
        jobs=2,
        equivalent={ids["equivalent"]: "the fallback", ids["mask-dropped"]: "a wrong argument"},
        trust_arguments=True,
    )
    full = {o.mutant.id: o for o in small_campaign.outcomes}
    for o in trusted.outcomes:
        if o.mutant.id in (ids["equivalent"], ids["mask-dropped"]):
            assert (o.status, o.message, o.cells) == ("equivalent", campaign.TRUSTED, ()), o
        else:
            assert (o.status, o.killed_by) == (full[o.mutant.id].status, full[o.mutant.id].killed_by)
    assert trusted.stale == [] and trusted.trust_arguments
    assert trusted.seconds.get("equivalent", 0.0) == 0.0
    campaign.write_reports(trusted, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["scope"]["trust_arguments"] is True
    assert "built and not run (--trust-arguments)" in (tmp_path / "REPORT.md").read_text()
    with pytest.raises(ValueError, match=r"^--trust-arguments: expected True or False, got 'yes'$"):
        campaign.run_campaign(trust_arguments="yes")


def test_a_mutant_past_its_timeout_is_killed_by_timeout(ids):
    c = campaign.run_campaign(
        targets=["masking.py"],
        mutant_patterns=[ids["equivalent"]],
        cases=[c for c in CASES if c.id in LONG_CASE_IDS],
        timeout=0.05,
    )
    (o,) = c.outcomes
    assert o.status == "timeout" and "still running after 0.05 s" in o.killed_by["message"]


def test_the_report_renders(small_campaign, ids, tmp_path):
    paths = campaign.write_reports(small_campaign, tmp_path)
    assert [p.name for p in paths] == ["report.json", "REPORT.md"]
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["totals"] == {
        "generated": 4,
        "killed": 2,
        "killed-unclaimed": 0,
        "timeout": 0,
        "survived": 0,
        "equivalent": 1,
        "unreached": 1,
        "error-on-build": 0,
    }
    records = {r["id"]: r for r in data["mutants"]}
    killed = records[ids["inverted-max"]]
    assert killed["file"] == "numpy_ref/masking.py" and killed["original"] == "z - row_max"
    assert set(killed["killed_by"]) == {"kind", "case", "check", "message", "by_rule"}
    assert killed["killed_by"]["by_rule"] is True and "SOFTMAX-1" in killed["rules"]
    assert [s["id"] for s in data["stale_equivalent"]] == [ids["mask-dropped"]]
    md = (tmp_path / "REPORT.md").read_text()
    eq = records[ids["equivalent"]]
    assert re.search(
        rf"\| numpy_ref/masking.py:{eq['line']} \| `{re.escape(ids['equivalent'])}` \| `1.0` -> `2.0` \| "
        r"EQUIVALENT: the fallback",
        md,
    )
    assert "### numpy_ref/params.py: identity_params (1)" in md
    assert "## Stale equivalence arguments (1)" in md and "python -m conformance campaign --jobs 2" in md


def _args(**kw):
    defaults = dict(
        target=None, mutant=None, jobs=2, timeout=30.0, report_dir=None, equivalent=None, allow_survivors=False,
        list=False, show=None, no_progress=True, goldens=str(campaign.HERE / "goldens"),
    )  # fmt: skip
    defaults.update(kw)
    return argparse.Namespace(**defaults)


def test_the_exit_status_gates_on_unargued_survivors(small_campaign, ids, monkeypatch, tmp_path, capsys):
    survived = campaign.Campaign(
        small_campaign.targets,
        small_campaign.case_ids,
        small_campaign.checks,
        [campaign.Outcome(o.mutant, "survived") if o.status == "equivalent" else o for o in small_campaign.outcomes],
        [],
    )
    monkeypatch.setattr(campaign, "run_campaign", lambda **kw: survived)
    assert campaign.main(_args(report_dir=str(tmp_path))) == 1
    assert "SURVIVED masking.py:masked_softmax:float-const" in capsys.readouterr().out
    assert campaign.main(_args(report_dir=str(tmp_path), allow_survivors=True)) == 0
    monkeypatch.setattr(campaign, "run_campaign", lambda **kw: small_campaign)
    assert campaign.main(_args(report_dir=str(tmp_path))) == 0
    assert f"stale equivalence argument {ids['mask-dropped']}: killed by" in capsys.readouterr().err


def test_bad_targets_and_arguments_are_named():
    with pytest.raises(ValueError) as e:
        campaign.select_targets(["nope.py"], ["a.py", "schemes/b.py"])
    assert str(e.value) == (
        "--target: expected a file of numpy_ref/ in the campaign's scope or a pattern matching one "
        "(a.py, schemes/b.py; definition.py and schemes/_literal.py are out of scope), got 'nope.py'"
    )
    assert campaign.select_targets(["numpy_ref/schemes/*", "a.py"], ["a.py", "c.py", "schemes/b.py"]) == [
        "a.py",
        "schemes/b.py",
    ]
    with pytest.raises(ValueError, match=r"^--jobs: expected an integer >= 1, got 0$"):
        campaign.run_campaign(jobs=0)
    with pytest.raises(ValueError, match=r"^--timeout: expected a positive number of seconds, got 0$"):
        campaign.run_campaign(timeout=0)
    with pytest.raises(
        ValueError, match=r"^--mutant: expected a pattern matching generated mutant ids \(see --list\), "
    ):
        campaign.select_mutants(campaign.generate(TOY, "toy.py"), ["toy.py:h:*"])


def test_cli_usage_errors_exit_2(capsys):
    assert cli.main(["campaign", "--target", "definition.py", "--list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("conformance: --target: expected a file of numpy_ref/ in the campaign's scope")
    assert err.rstrip().endswith("got 'definition.py'")
    assert cli.main(["campaign", "--show", "forward.py:run:nope:0"]) == 2
    assert "--show: expected the id of a generated mutant (see --list), got" in capsys.readouterr().err


def test_cli_lists_and_shows_mutants(capsys):
    assert cli.main(["campaign", "--target", "heads.py", "--list"]) == 0
    out = capsys.readouterr().out
    assert "heads.py:merge_heads:perm-swap:3" in out and out.rstrip().endswith("mutants in 1 files")
    assert cli.main(["campaign", "--show", "heads.py:merge_heads:perm-swap:3"]) == 0
    out = capsys.readouterr().out
    assert "-    return x.transpose(0, 2, 1, 3).reshape(B, L, H * d)" in out
    assert "+    return x.transpose(0, 1, 2, 3).reshape(B, L, H * d)" in out


# ---------------------------------------------------------------- torch_impl's kernels
TORCH_TOY = '''\
"""A toy torch module."""

import torch


def f(x, m):
    y = torch.where(m, x, torch.zeros_like(x))
    z = y.amax(dim=-1, keepdim=True)
    return z.transpose(1, 2).detach()
'''


def test_torch_operators_read_torch_names_and_ids_name_the_package():
    got = {m.id: (m.line, m.original, m.mutated) for m in campaign.generate(TORCH_TOY, "toy.py", "torch_impl")}
    assert got == {
        "torch_impl/toy.py:f:where-swap:0": (
            7, "torch.where(m, x, torch.zeros_like(x))", "torch.where(m, torch.zeros_like(x), x)"
        ),
        "torch_impl/toy.py:f:func-swap:0": (7, "torch.zeros_like(x)", "torch.ones_like(x)"),
        "torch_impl/toy.py:f:func-swap:1": (8, "y.amax(dim=-1, keepdim=True)", "y.amin(dim=-1, keepdim=True)"),
        "torch_impl/toy.py:f:axis:0": (8, "-1", "0"),
        "torch_impl/toy.py:f:axis:1": (8, "-1", "-2"),
        "torch_impl/toy.py:f:keepdims:0": (8, "keepdim=True", "keepdim=False"),
        "torch_impl/toy.py:f:call-drop:0": (9, "z.transpose(1, 2).detach()", "z.transpose(1, 2)"),
        "torch_impl/toy.py:f:axis:2": (9, "1", "2"),  # torch's transpose swaps two axes: no perm-swap
        "torch_impl/toy.py:f:axis:3": (9, "1", "0"),
        "torch_impl/toy.py:f:axis:4": (9, "2", "3"),
        "torch_impl/toy.py:f:axis:5": (9, "2", "1"),
    }  # fmt: skip
    # the same source read as numpy_ref's: no torch names (dim is a plain integer, transpose a permutation)
    assert {m.id for m in campaign.generate(TORCH_TOY, "toy.py")} == {
        "toy.py:f:int-const:0",
        "toy.py:f:int-const:1",
        "toy.py:f:perm-swap:0",
    }


@pytest.fixture(scope="module")
def torch_mutants():
    return campaign.generate_files(campaign.scope_files(package="torch_impl"), package="torch_impl")


def test_kernel_mutant_ids_are_prefixed_with_their_package(torch_mutants, reference_mutants):
    from spec import rule_ids

    files = set(campaign.scope_files(package="torch_impl"))
    assert {"kernels/eager.py", "kernels/tiles.py", "kernels/sdpa.py", "kernels/flex.py", "_core.py"} <= files
    assert {"functional.py", "schemes/shaw.py", "kernels/_base.py"} <= files
    assert not {"kernels/fused.py", "kernels/_fused_program.py", "ring.py", "module.py"} & files
    ids = [m.id for m in torch_mutants]
    assert len(ids) == len(set(ids)) and not set(ids) & {m.id for m in reference_mutants}
    known = set(rule_ids())
    for m in torch_mutants:
        assert (
            m.id.startswith(f"torch_impl/{m.file}:{m.function}:{m.operator}:") and m.id_file == f"torch_impl/{m.file}"
        )
        assert m.where == f"torch_impl/{m.file}:{m.line}" and m.module.startswith("torch_impl")
        assert m.rules and set(m.rules) <= known, m.id
    assert not any(m.id.startswith("numpy_ref/") for m in reference_mutants)  # numpy_ref's ids stay as stored
    assert campaign.kernel_files(sorted(files), "torch_impl", ["torch:sdpa"]) == sorted(
        files - {"kernels/eager.py", "kernels/tiles.py", "kernels/flex.py"}
    )


def test_the_small_tiles_cut_every_case_into_several_tiles():
    """TorchSmallTilesAdapter sizes the tiles kernel's knobs to the call: the catalog's commonest case (B = 2,
    H = 2, Lq = 5, Lk = 7) gets two query tiles of one (batch, head) pair each, its causal calls three query
    tiles of both heads, each reading the keys up to its last query (CAUSAL-1)."""
    import numpy as np

    from conformance.adapters.torch_impl_adapter import TorchSmallTilesAdapter

    kernel = TorchSmallTilesAdapter().kernel_for("cpu", {"query": np.zeros((2, 5, 4)), "key": np.zeros((2, 7, 4))})
    assert (kernel.elements, kernel.query_rows, kernel.min_rows) == (28, 2, 2)
    plain = kernel.grid(2, 2, 5, 7, causal_prefix=False, short_rows=False, device_type="cpu")
    assert [[[(t.h, t.q0, t.q1, t.k1) for t in h] for h in g] for g in plain[:1]] == [
        [[(slice(0, 1), 0, 4, 7), (slice(0, 1), 4, 5, 7)], [(slice(1, 2), 0, 4, 7), (slice(1, 2), 4, 5, 7)]]
    ]
    causal = kernel.grid(2, 2, 5, 7, causal_prefix=True, short_rows=True, device_type="cpu")
    assert len(causal) == 2 and [(t.h, t.q0, t.q1, t.k1) for t in causal[0][0]] == [
        (slice(None), 0, 2, 2),
        (slice(None), 2, 4, 4),
        (slice(None), 4, 5, 5),
    ]


TORCH_CASE_IDS = ("causal/self/top-left", "vanilla/cross/lq5-lk7", "peer/gqa/self/h4-kv2")


def _on_line(mutants, file, function, operator, original, mutated, text):
    """The id of the one mutant of ``function`` whose line of source contains ``text``."""
    root = campaign.package_dir("torch_impl")
    lines = (root / file).read_text(encoding="utf-8").splitlines()
    hits = [
        m
        for m in mutants
        if (m.file, m.function, m.operator, m.original, m.mutated) == (file, function, operator, original, mutated)
        and text in lines[m.line - 1]
    ]
    assert len(hits) == 1, hits
    return hits[0].id


@pytest.fixture(scope="module")
def torch_ids(torch_mutants):
    tiles = [m for m in torch_mutants if m.file == "kernels/tiles.py"]
    return {
        # every tile starts one query late: query 0 is never computed, the tiles after the first are misplaced
        "boundary": _on_line(tiles, "kernels/tiles.py", "Tiles.grid", "int-const", "0", "1", "ranges = "),
        # causal tiles read every key and other tiles a prefix: the causal prefix skip turned inside out
        "prefix": _on_line(
            tiles, "kernels/tiles.py", "Tiles.grid", "cond-negate", "causal_prefix", "not causal_prefix", "Tile("
        ),
        # the keys after the diagonal of a causal tile are no longer masked
        "diagonal": _find(
            tiles,
            "kernels/tiles.py",
            "_tile",
            "stmt-drop",
            "_disallow_after_diagonal(logits, t.q0, run.future)",
            "pass",
        ),
        # the default min_rows, 16 -> 17: tile sizes only
        "equivalent": _find(tiles, "kernels/tiles.py", "Tiles", "int-const", "16", "17"),
    }


@pytest.fixture(scope="module")
def torch_campaign(torch_ids):
    return campaign.run_campaign(
        package="torch_impl",
        kernels=["torch:tiles"],
        targets=["kernels/tiles.py"],
        mutant_patterns=list(torch_ids.values()),
        cases=[c for c in CASES if c.id in TORCH_CASE_IDS],
        jobs=2,
        equivalent={torch_ids["equivalent"]: "a default knob: tile sizes only"},
    )


def test_a_torch_tiles_campaign_kills_wrong_tiles_by_rule_and_spares_an_equivalent(torch_campaign, torch_ids):
    c = torch_campaign
    assert (c.package, c.kernels, c.targets) == ("torch_impl", ["torch:tiles"], ["kernels/tiles.py"])
    assert c.adapters == {campaign.SMALL_TILES_ADAPTER: "torch:tiles-small", "torch:tiles": "torch:tiles"}
    status = {o.mutant.id: o for o in c.outcomes}
    for name in ("boundary", "prefix", "diagonal"):
        o = status[torch_ids[name]]
        assert o.status == "killed" and o.killed_by["by_rule"] and o.killed_by["case"] in TORCH_CASE_IDS, o
        assert o.adapter in ("torch:tiles-small", "torch:tiles") and "torch:tiles-small" in o.adapters
        assert o.mutant.id.startswith("torch_impl/kernels/tiles.py:")
    assert set(status[torch_ids["diagonal"]].mutant.rules) >= {"CAUSAL-1"}
    assert status[torch_ids["diagonal"]].killed_by["case"] == "causal/self/top-left"
    assert status[torch_ids["equivalent"]].status == "equivalent"
    assert c.seconds["baseline"] > 0 and c.checks > 0


def test_the_torch_report_has_a_row_per_kernel_and_file(torch_campaign, tmp_path):
    paths = campaign.write_reports(torch_campaign, tmp_path)
    data = json.loads(paths[0].read_text())
    assert data["package"] == "torch_impl" and data["adapters"] == ["torch:tiles-small", "torch:tiles"]
    assert data["totals"]["killed"] == 3 and data["totals"]["equivalent"] == 1
    (row,) = data["kernels"]
    assert row["kernel"] == "torch:tiles" and row["files"] == ["torch_impl/kernels/tiles.py"]
    assert row["own"]["killed"] == 3 and row["own"]["equivalent"] == 1
    assert [f["file"] for f in data["files"]] == ["torch_impl/kernels/tiles.py"]
    assert all(r["id"].startswith("torch_impl/kernels/tiles.py:") for r in data["mutants"])
    md = paths[1].read_text()
    assert (
        md.startswith("# Mutation campaign over torch_impl")
        and "| torch:tiles | `torch:tiles-small`, `torch:tiles` |" in md
    )
    assert "campaign_data/torch_impl/equivalent.json" in md and "--kernel torch:eager" in md


def test_bad_packages_and_kernels_are_named(capsys):
    assert cli.main(["campaign", "--kernel", "torch:nope", "--list"]) == 2
    assert capsys.readouterr().err.strip() == (
        "conformance: --kernel: expected one of numpy, torch:eager, torch:tiles, torch:sdpa, torch:flex, jax:xla, "
        "jax:tiles, jax:pallas, got 'torch:nope'"
    )
    assert cli.main(["campaign", "--package", "jax", "--list"]) == 2
    assert capsys.readouterr().err.strip() == (
        "conformance: --package: expected one of numpy_ref, torch_impl, jax_impl, got 'jax'"
    )
    assert cli.main(["campaign", "--all", "--target", "nope.py", "--list"]) == 2
    assert capsys.readouterr().err.strip() == (
        "conformance: --target: expected a file in the campaign's scope of numpy_ref/ or torch_impl/ or "
        "jax_impl/ or a pattern matching one, got 'nope.py'"
    )
    with pytest.raises(ValueError, match=r"^--kernel: expected a kernel of numpy_ref \(numpy\), got 'torch:sdpa'$"):
        campaign.select_kernels(["torch:sdpa"], "numpy_ref")
    with pytest.raises(ValueError, match=r"^--package: expected one of numpy_ref, torch_impl, jax_impl, got 'torch'$"):
        campaign.run_campaign(package="torch")
    with pytest.raises(ValueError, match=r"^--target: expected a file of torch_impl/ in the campaign's scope "):
        campaign.select_targets(["kernels/fused.py"], campaign.scope_files(package="torch_impl"), "torch_impl")


def test_cli_lists_a_kernel_and_a_package_named_by_its_prefix(capsys):
    assert cli.main(["campaign", "--kernel", "torch:sdpa", "--list"]) == 0
    out = capsys.readouterr().out
    assert "torch_impl/kernels/sdpa.py:attention:" in out and "torch_impl/_core.py:" in out
    assert "kernels/tiles.py" not in out and "kernels/eager.py" not in out and "masking.py" not in out
    assert re.search(r"\d+ mutants in \d+ files of torch_impl\n$", out)
    assert cli.main(["campaign", "--target", "torch_impl/kernels/eager.py", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert all(line.startswith("torch_impl/kernels/eager.py:") for line in out[:-1]) and "in 1 files" in out[-1]
    assert cli.main(["campaign", "--show", "torch_impl/kernels/tiles.py:_tile:stmt-drop:0"]) == 0
    assert "--- torch_impl/kernels/tiles.py\n" in capsys.readouterr().out


def test_the_stored_kernel_arguments_name_generated_mutants_and_functions(torch_mutants):
    """campaign_data/torch_impl: every equivalence argument names a mutant the campaign generates, every unreached
    reason a function of the files in scope (a renamed function leaves neither behind)."""
    data = campaign.PACKAGES["torch_impl"].data_dir
    equivalent = campaign.load_equivalent(data / "equivalent.json")
    assert equivalent and set(equivalent) <= {m.id for m in torch_mutants}
    unreached = campaign.load_unreached(data / "unreached.json")
    assert unreached and set(unreached) <= {f"{m.id_file}:{m.function}" for m in torch_mutants}


# ---------------------------------------------------------------- jax_impl's kernels
JAX_TOY = '''\
"""A toy jax module."""

import jax
import jax.numpy as jnp
from jax import lax


def f(x, m):
    y = jnp.where(m, x, jnp.zeros_like(x))
    z = jax.numpy.max(y.astype(x.dtype), axis=-1, keepdims=True)
    return lax.stop_gradient(jnp.swapaxes(z.transpose(0, 2, 1), 1, 2)).sum(axis=(0, 1))
'''


def test_jax_operators_read_jnp_and_lax_names_and_ids_name_the_package():
    """jnp., jax.numpy. and lax. are the module names; swapaxes takes two axes, transpose a permutation (NumPy's
    meaning), axis= a reduction's axes in any order; a cast (astype) is never dropped."""
    got = {m.id: (m.line, m.original, m.mutated) for m in campaign.generate(JAX_TOY, "toy.py", "jax_impl")}
    line11 = "lax.stop_gradient(jnp.swapaxes(z.transpose(0, 2, 1), 1, 2))"
    assert got == {
        "jax_impl/toy.py:f:where-swap:0": (
            9, "jnp.where(m, x, jnp.zeros_like(x))", "jnp.where(m, jnp.zeros_like(x), x)"
        ),
        "jax_impl/toy.py:f:func-swap:0": (9, "jnp.zeros_like(x)", "jnp.ones_like(x)"),
        "jax_impl/toy.py:f:func-swap:1": (
            10,
            "jax.numpy.max(y.astype(x.dtype), axis=-1, keepdims=True)",
            "jax.numpy.min(y.astype(x.dtype), axis=-1, keepdims=True)",
        ),
        "jax_impl/toy.py:f:axis:0": (10, "-1", "0"),
        "jax_impl/toy.py:f:axis:1": (10, "-1", "-2"),
        "jax_impl/toy.py:f:keepdims:0": (10, "keepdims=True", "keepdims=False"),
        "jax_impl/toy.py:f:func-swap:2": (11, f"{line11}.sum(axis=(0, 1))", f"{line11}.mean(axis=(0, 1))"),
        "jax_impl/toy.py:f:call-drop:0": (11, line11, "jnp.swapaxes(z.transpose(0, 2, 1), 1, 2)"),
        "jax_impl/toy.py:f:perm-swap:0": (11, "z.transpose(0, 2, 1)", "z.transpose(2, 0, 1)"),
        "jax_impl/toy.py:f:perm-swap:1": (11, "z.transpose(0, 2, 1)", "z.transpose(1, 2, 0)"),
        "jax_impl/toy.py:f:perm-swap:2": (11, "z.transpose(0, 2, 1)", "z.transpose(0, 1, 2)"),
        "jax_impl/toy.py:f:axis:2": (11, "1", "2"),  # swapaxes' first axis
        "jax_impl/toy.py:f:axis:3": (11, "1", "0"),
        "jax_impl/toy.py:f:axis:4": (11, "2", "3"),  # and its second
        "jax_impl/toy.py:f:axis:5": (11, "2", "1"),
        "jax_impl/toy.py:f:axis:6": (11, "0", "1"),  # the reduction's axes: no perm-swap of (0, 1)
        "jax_impl/toy.py:f:axis:7": (11, "0", "-1"),
        "jax_impl/toy.py:f:axis:8": (11, "1", "2"),
        "jax_impl/toy.py:f:axis:9": (11, "1", "0"),
    }  # fmt: skip
    # read as torch_impl's: no jnp or lax names, transpose swaps two axes, and axis= is no axis keyword (its tuple
    # is a plain one)
    torch_read = {(m.operator, m.original) for m in campaign.generate(JAX_TOY, "toy.py", "torch_impl")}
    assert not {op for op, _ in torch_read} & {"where-swap", "keepdims", "call-drop"}
    assert ("perm-swap", "(0, 1)") in torch_read and ("perm-swap", "z.transpose(0, 2, 1)") not in torch_read


@pytest.fixture(scope="module")
def jax_mutants():
    return campaign.generate_files(campaign.scope_files(package="jax_impl"), package="jax_impl")


def test_jax_kernel_mutants_are_prefixed_and_scoped(jax_mutants, torch_mutants):
    from spec import rule_ids

    files = set(campaign.scope_files(package="jax_impl"))
    assert {"kernels/xla.py", "kernels/tiles.py", "kernels/pallas.py", "masking.py", "heads.py"} <= files
    assert {"functional.py", "_checks.py", "schemes/huang.py", "schemes/__init__.py"} <= files
    assert not {"module.py", "interop.py", "ring.py", "__init__.py"} & files
    ids = [m.id for m in jax_mutants]
    assert len(ids) == len(set(ids)) and not set(ids) & {m.id for m in torch_mutants}
    known = set(rule_ids())
    for m in jax_mutants:
        assert m.id.startswith(f"jax_impl/{m.file}:{m.function}:{m.operator}:") and m.module.startswith("jax_impl")
        assert m.rules and set(m.rules) <= known, m.id
    # kernels/xla.py is shared (attend is the body of every query tile): jax:xla has no file of its own
    assert campaign.kernel_files(sorted(files), "jax_impl", ["jax:xla"]) == sorted(
        files - {"kernels/tiles.py", "kernels/pallas.py"}
    )
    assert campaign.kernel_files(sorted(files), "jax_impl", ["jax:tiles", "jax:pallas"]) == sorted(files)


@pytest.mark.parametrize(
    "argv,chosen",
    [
        (["--all"], {"numpy_ref": None, "torch_impl": None, "jax_impl": None}),
        (["--package", "jax_impl"], {"jax_impl": None}),
        (["--kernel", "jax:pallas"], {"jax_impl": ["jax:pallas"]}),
        (["--kernel", "jax:xla", "--kernel", "torch:sdpa"], {"torch_impl": ["torch:sdpa"], "jax_impl": ["jax:xla"]}),
        (["--package", "jax_impl", "--kernel", "jax:tiles"], {"jax_impl": None}),
        (["--target", "jax_impl/kernels/tiles.py"], {"jax_impl": None}),
        (["--mutant", "jax_impl/masking.py:*"], {"jax_impl": None}),
        ([], {"numpy_ref": None}),
    ],
)
def test_the_command_line_picks_jax_impl_and_its_kernels(argv, chosen):
    args = cli.parser().parse_args(["campaign", *argv])
    assert campaign.select_packages(args) == chosen


def test_the_small_jax_kernels_cut_every_case_into_a_few_tiles_and_blocks():
    """jax:tiles-small sizes query_rows to ceil(Lq / 3), at least 2: a plain causal call of Lq = 5 runs as query
    tiles of 2, 2 and 1 rows (Tiles cuts from Lq = 2 * query_rows on), L = 640 as tiles of 214, 214 and 212;
    jax:pallas-small takes the powers of two at most ceil(Lq / 3) and ceil(Lk / 2): Lq = 5, Lk = 7 -> blocks of
    2 queries (three programs per (batch, head)) and 4 keys (two steps), L = 640 -> 128 x 256, one query and
    key -> 1 x 1. Knob arithmetic only (no JAX); tests/test_jax_pallas.py runs blocks below 16."""
    from conformance.adapters.jax_impl_adapter import JaxSmallBlocksPallasAdapter, JaxSmallTilesAdapter

    assert [JaxSmallTilesAdapter.query_rows(Lq) for Lq in (1, 3, 4, 5, 6, 7, 640)] == [2, 2, 2, 2, 2, 3, 214]
    blocks = JaxSmallBlocksPallasAdapter.blocks
    assert [blocks(Lq, Lk) for Lq, Lk in ((5, 7), (640, 640), (1, 1), (6, 6), (37, 37))] == [
        (2, 4),
        (128, 256),
        (1, 1),
        (2, 2),
        (8, 16),
    ]


def test_merged_baselines_unite_the_cells_of_each_line_and_span():
    """Two children of the unmutated run: their checks add up, and a line or instruction span that both ran (the
    import's, cell -1) keeps the cells of both."""
    a = {"killed": None, "checks": 3, "failures": [], "lines": [["m.py", 1], ["m.py", 2]],
         "reach": [["m.py", 1, [-1]], ["m.py", 2, [0]]], "spans": [["m.py", 2, 4, 2, 9, [0]]]}  # fmt: skip
    b = {"killed": None, "checks": 4, "failures": [], "lines": [["m.py", 2], ["m.py", 5]],
         "reach": [["m.py", 1, [-1]], ["m.py", 2, [3]], ["m.py", 5, [3]]],
         "spans": [["m.py", 2, 4, 2, 9, [3]]]}  # fmt: skip
    assert campaign._merge_baselines([a, b]) == {
        "killed": None,
        "checks": 7,
        "failures": [],
        "lines": [("m.py", 1), ("m.py", 2), ("m.py", 5)],
        "reach": [["m.py", 1, [-1]], ["m.py", 2, [0, 3]], ["m.py", 5, [3]]],
        "spans": [["m.py", 2, 4, 2, 9, [0, 3]]],
    }


def test_the_stored_jax_arguments_name_generated_mutants_and_functions(jax_mutants):
    """campaign_data/jax_impl, likewise: its arguments and reasons name mutants and functions that exist."""
    data = campaign.PACKAGES["jax_impl"].data_dir
    equivalent = campaign.load_equivalent(data / "equivalent.json")
    assert equivalent and set(equivalent) <= {m.id for m in jax_mutants}
    unreached = campaign.load_unreached(data / "unreached.json")
    assert unreached and set(unreached) <= {f"{m.id_file}:{m.function}" for m in jax_mutants}


def test_a_torch_child_runs_flex_outside_dynamo_or_says_the_switch_is_gone(monkeypatch):
    """The torch children run eager FlexAttention in Python (the line tracer sees its score_mod); a PyTorch
    without the switch stops the campaign instead of tracing too few cells."""
    import torch
    import torch.nn.attention.flex_attention as flex

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this process keeps its threads
    monkeypatch.setattr(flex, campaign.FLEX_EAGER_FLAG, False)
    campaign._torch_child()
    assert getattr(flex, campaign.FLEX_EAGER_FLAG) is True
    monkeypatch.delattr(flex, campaign.FLEX_EAGER_FLAG)
    with pytest.raises(
        RuntimeError,
        match=r"^torch\.nn\.attention\.flex_attention has no "
        r"_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG in PyTorch ",
    ):
        campaign._torch_child()
