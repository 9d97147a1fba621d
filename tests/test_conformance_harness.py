"""The harness itself: coverage, stored data integrity, mutants, deviations, CLI."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from _random_calls import random_call

import spec
from conformance import catalog, generate, runner, store
from conformance.adapters import load_adapter
from conformance.adapters.numpy_ref_adapter import NumpyRefAdapter
from conformance.checks import CheckResult
from conformance.mutants import MUTANTS, killed_by_rule


def test_every_rule_has_a_case():
    covered = {r for c in catalog.CASES for r in c.all_rules}
    missing = [r for r in spec.rule_ids() if r not in covered]
    assert not missing, f"rules without a conformance case: {missing}"


def test_case_rules_exist_and_ids_are_stable_paths():
    declared = set(spec.rule_ids())
    for c in catalog.CASES:
        assert set(c.all_rules) <= declared, c.id
        assert c.id == c.id.strip() and " " not in c.id and c.id.count("/") >= 1


def test_catalog_covers_what_the_suite_promises():
    ids = [c.id for c in catalog.CASES]
    dims = [c.dims for c in catalog.CASES]
    assert any(d.Lq >= 512 for d in dims), "a long case"
    assert any(d.Lq == 37 for d in dims) and any(d.Lq == 1 for d in dims), "awkward sizes"
    assert any(c.spec.relative is not None and c.spec.relative.per_head for c in catalog.CASES)
    assert any("bottom-right" in i for i in ids) and any("top-left" in i for i in ids)
    assert {f"mask/rank{n}" for n in range(1, 5)} <= {i.rsplit("-", 1)[0] for i in ids if i.startswith("mask/rank")}
    assert sum(i.startswith("profile/") for i in ids) == 4


def test_manifest_is_canonical_and_matches_the_catalog():
    text = (store.GOLDEN_DIR / store.MANIFEST).read_text(encoding="utf-8")
    manifest = json.loads(text)
    assert store.dump_manifest(manifest) == text, "manifest.json is not in canonical form"
    assert manifest["spec_version"] == spec.SPEC_VERSION
    assert sorted(manifest["cases"]) == sorted(c.id for c in catalog.CASES)


def test_goldens_are_small():
    # about 95 KB per case (four dtypes, gradients, the manifest entry); 200 cases take 22.2 MiB, of which
    # the two ALiBi cases against 1024 and 2048 keys (ALIBI-5) take 1.0 MiB and the two long cases of the
    # combinations (every option past every kernel's first query tile: a 512 x 512 keep mask) 1.6 MiB
    total = sum(p.stat().st_size for p in store.GOLDEN_DIR.iterdir())
    assert total < 24 * 2**20, f"goldens take {total / 2**20:.1f} MiB"


def test_verify_finds_no_drift():
    assert generate.verify() == []


def test_tampered_golden_is_refused(tmp_path):
    shutil.copytree(store.GOLDEN_DIR, tmp_path / "g")
    case = catalog.BY_ID["vanilla/self/basic"]
    path = tmp_path / "g" / store.case_file(case.id)
    import ml_dtypes  # noqa: F401
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path))
    tensors["float64/golden/out"] = tensors["float64/golden/out"] + 1e-12
    save_file(tensors, str(path))
    entry = store.load_manifest(tmp_path / "g")["cases"][case.id]
    with pytest.raises(store.GoldenError, match="does not match its manifest sha256"):
        store.load_case(case.id, entry, tmp_path / "g")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "conformance",
            "--goldens",
            str(tmp_path / "g"),
            "run",
            "--adapter",
            "numpy",
            "--case",
            case.id,
            "--no-progress",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "refusing to judge against it" in out.stderr
    assert "Traceback" not in out.stderr


def test_naive_emulation_in_float64_is_a_second_implementation():
    """PREC-2: the ``conformance.naive`` package imports nothing from numpy_ref; at float64 the two must agree."""
    import numpy_ref
    from conformance import naive

    schemes = set()
    for seed in range(40):
        c = random_call(seed)
        schemes.add(None if c.spec.relative is None else c.spec.relative.name)
        key, value = c.key.copy(), c.value.copy()
        inputs = dict(query=c.query, key=key, value=value, **c.kwargs)
        g = np.random.default_rng(seed).normal(size=c.query.shape)
        out, w = numpy_ref.attention(c.spec, c.params, c.query, key, value, **c.kwargs, return_weights=True)
        grads = numpy_ref.attention_vjp(c.spec, c.params, c.query, key, value, g, **c.kwargs)
        for order in naive.ORDERS:
            n_out, n_w, cache = naive.forward(c.spec, c.params, inputs, "float64", order)
            n_grads = naive.backward(c.spec, cache, g, order)
            np.testing.assert_allclose(n_out, out, atol=1e-12, rtol=0)
            np.testing.assert_allclose(n_w, w, atol=1e-12, rtol=0)
            assert sorted(n_grads) == sorted(grads), seed
            for name in grads:
                np.testing.assert_allclose(n_grads[name], grads[name], atol=1e-11, rtol=0, err_msg=name)
    reached = f"the draws must reach every scheme's naive module, got {schemes}"
    assert schemes == {None, "shaw", "huang", "rope", "alibi", "t5", "swin"}, reached


def test_verify_tells_machine_noise_from_drift():
    """PREC-5: a golden within 8 float64 ulps of its largest entry, or a budget within a factor 4, is noise."""
    stored = np.array([1.0, -2.0, 0.5])
    ulp = np.finfo(np.float64).eps * 2.0  # the largest entry is 2
    assert generate.golden_change(stored.copy(), stored)[0] == "same"
    assert generate.golden_change(stored + np.array([0.0, 3 * ulp, 0.0]), stored)[0] == "noise"
    assert generate.golden_change(stored + np.array([0.0, 0.0, 1e-9]), stored)[0] == "drift"
    assert generate.golden_change(np.array([1.0, np.nan, 0.5]), stored)[0] == "drift"
    # a bias gradient that cancels to nearly 0 moves within ulps of its weight gradient (PREC-5, PREC-2)
    assert generate.golden_change(stored + np.array([0.0, 0.0, 1e-14]), stored)[0] == "drift"
    assert generate.golden_change(stored + np.array([0.0, 0.0, 1e-14]), stored, scale=100.0)[0] == "noise"
    assert generate.budget_change(1e-6, 1e-6) == "same"
    assert generate.budget_change(1e-6, 2e-6) == "noise"  # measured between two x86-64 machines
    assert generate.budget_change(1e-6, 3.9e-6) == "noise" and generate.budget_change(1e-6, 0.26e-6) == "noise"
    assert generate.budget_change(1e-6, 4.1e-6) == "drift" and generate.budget_change(1e-6, 0.24e-6) == "drift"


def test_reference_adapter_passes_within_its_budgets():
    """PREC-5: the reference on this machine passes the stored goldens (not necessarily bit for bit)."""
    results = runner.run(runner.Plan([NumpyRefAdapter()]))
    assert not [r for r in results if r.failed]
    assert max(r.margin or 0.0 for r in results) <= 1.0


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_killed_by_its_rule(name):
    """A mutant breaks one rule; a failing check must claim that rule (not just any check failing)."""
    mutant = MUTANTS[name]
    # a mutant of one scheme's rule (``mutant.scheme``) computes the reference on every other case: its
    # kill can only come from that scheme's cases
    cases = [c for c in catalog.CASES if not mutant.scheme or getattr(c.spec.relative, "name", "") == mutant.scheme]
    results = runner.run(runner.Plan([mutant()], cases=cases), deviations=[])
    killed_by = killed_by_rule(mutant.rule, results)
    from conftest import record_kill

    record_kill(name, mutant.rule, killed_by)
    assert killed_by, (
        f"mutant {name} ({mutant.description}) passed every check claiming {mutant.rule}: "
        f"the harness is broken (other failing checks: "
        f"{sorted({(r.case, r.check) for r in results if r.failed})[:5]})"
    )


def test_there_are_at_least_twelve_mutants():
    assert len(MUTANTS) >= 12
    assert all(m.rule in spec.rule_ids() for m in MUTANTS.values())


def test_deviation_that_stops_failing_is_reported():
    fake = runner.Deviation(adapter="numpy", case="vanilla/self/basic", check="out", reason="pretend", name="fake")
    results = runner.run(
        runner.Plan([NumpyRefAdapter()], cases=[catalog.BY_ID["vanilla/self/basic"]], dtypes=["float64"]),
        deviations=[fake],
    )
    bad = [r for r in results if r.status == "unexpected-pass"]
    assert len(bad) == 1 and "fake no longer occurs" in bad[0].message


def test_deviation_marks_a_real_failure_as_expected():
    fake = runner.Deviation(adapter="mutant/wrong-scale", case="vanilla/self/basic", check="*", reason="r", name="x")
    results = runner.run(
        runner.Plan([MUTANTS["wrong-scale"]()], cases=[catalog.BY_ID["vanilla/self/basic"]], dtypes=["float64"]),
        deviations=[fake],
    )
    assert {r.status for r in results} <= {"deviation", "pass"} and any(r.status == "deviation" for r in results)


def test_an_unavailable_adapter_is_never_asked_to_release():
    """An adapter whose framework is absent only skips: the runner never calls its release() (which would import
    that framework), so a run names it unavailable instead of crashing."""

    class Absent(NumpyRefAdapter):
        name = "absent"

        def unavailable(self):
            return "not installed here"

        def release(self):
            raise AssertionError("release() of an adapter that ran nothing")

    cases = [catalog.BY_ID["vanilla/self/basic"], catalog.BY_ID["shaw/k2/self/basic"]]
    results = runner.run(runner.Plan([Absent()], cases=cases, dtypes=["float64"]), deviations=[])
    assert {(r.status, r.message) for r in results} == {("skip", "adapter unavailable: not installed here")}


def test_deviation_dtypes_may_be_a_list():
    """A deviation's dtype, like its case, is one pattern or a list of them: it matches exactly the listed."""
    dev = runner.Deviation(adapter="a", case="c", check="*", dtype=["float64", "*16"], reason="r", name="x")
    base = dict(case="c", adapter="a", device="cpu", check="out", status="fail", rules=())
    matched = {t for t in ("float64", "float32", "bfloat16", "float16") if dev.matches(CheckResult(dtype=t, **base))}
    assert matched == {"float64", "bfloat16", "float16"}


def cli(*args):
    return subprocess.run([sys.executable, "-m", "conformance", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "--adapter", "nope"], "conformance: unknown adapter 'nope': expected one of numpy"),
        (
            ["run", "--adapter", "no_such_module:Cls"],
            "conformance: adapter 'no_such_module:Cls': cannot import no_such_module",
        ),
        (
            ["run", "--dtype", "float8"],
            "conformance: --dtype float8: expected one of float64, float32, bfloat16, float16",
        ),
        (["run", "--device", "tpu"], "conformance: --device tpu: expected one of cpu, cuda, gpu"),
        (["run", "--headroom", "1.5"], "conformance: --headroom 1.5: expected a margin in (0, 1]"),
        (["run", "--case", "no/such/case"], "conformance: --case no/such/case: matches no case"),
        (
            ["run", "--report", "/proc/attnspec-report"],
            "conformance: --report /proc/attnspec-report: cannot write there",
        ),
    ],
)
def test_cli_usage_errors_are_one_line(args, message):
    out = cli(*args)
    assert out.returncode == 2
    assert out.stderr.strip().startswith(message), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_the_run_asks_xla_for_fast_cpu_compiles_unless_the_flag_is_named():
    """`conformance run` adds --xla_cpu_use_fusion_emitters=false to XLA_FLAGS before any backend starts, after the
    flags already there; a user who names the flag (either value) keeps it."""
    from conformance.adapters import _jax

    environ = {}
    assert _jax.fast_cpu_compiles(environ) is True
    assert environ == {"XLA_FLAGS": "--xla_cpu_use_fusion_emitters=false"}
    environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    assert _jax.fast_cpu_compiles(environ) is True
    assert environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4 --xla_cpu_use_fusion_emitters=false"
    for named in ("--xla_cpu_use_fusion_emitters=true", "--xla_cpu_use_fusion_emitters=false"):
        environ = {"XLA_FLAGS": named}
        assert _jax.fast_cpu_compiles(environ) is False and environ == {"XLA_FLAGS": named}


def test_the_cli_run_compiles_jax_with_the_fast_flag_and_reports_it(tmp_path):
    """The flag reaches the process that runs the cells (here --jobs 1: the CLI's own) and the report's environment
    records it."""
    pytest.importorskip("jax")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-m", "conformance", "run", "--adapter", "jax:xla", "--dtype", "float32", "--case",
         "vanilla/self/basic", "--jobs", "1", "--no-progress", "--report", str(tmp_path / "r")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert rows and {r["environment"]["XLA_FLAGS"] for r in rows} == {"--xla_cpu_use_fusion_emitters=false"}


def test_cli_run_headroom_fails_a_pass_past_the_battery_margin():
    """--headroom M (PREC-6's battery): every passing float64 check at margin <= M, or the run fails and names each
    check past it. numpy:blockwise sums the keys in three blocks: its margins are small but not zero."""
    args = ("run", "--adapter", "numpy:blockwise", "--case", "vanilla/cross/lq5-lk7", "--no-progress")
    ok = cli(*args, "--headroom", "0.5")
    assert ok.returncode == 0 and "headroom (PREC-6): 12 of 12 float64 checks at margin <= 0.5" in ok.stdout, ok.stdout
    tight = cli(*args, "--headroom", "1e-9")
    assert tight.returncode == 1, tight.stdout
    lines = [line for line in tight.stdout.splitlines() if line.startswith("HEADROOM numpy:blockwise cpu float64")]
    assert lines and all(line.endswith("> 1e-09") for line in lines)
    assert "0 failed" in tight.stdout


def test_cli_run_writes_reports(tmp_path):
    out = cli("run", "--adapter", "numpy", "--case", "shaw/k2/*", "--report", str(tmp_path), "--no-progress")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "numpy" in out.stdout and "worst margin" in out.stdout
    assert out.stdout.strip().splitlines()[-1].endswith("skipped") and " 0 failed" in out.stdout
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert records and all(
        {"case", "check", "status", "max_abs", "max_rel", "budget", "margin", "where", "environment", "rules"} <= set(r)
        for r in records
    )
    assert all(r["environment"]["attnspec_spec_version"] == spec.SPEC_VERSION for r in records)
    matrix = (tmp_path / "matrix.md").read_text()
    assert "| SHAW-2 |" in matrix and "conforms to attnspec" in matrix


def test_cli_run_of_a_mutant_fails():
    out = cli("run", "--adapter", "mutant/wrong-scale", "--case", "vanilla/self/basic", "--no-progress")
    assert out.returncode == 1 and "FAIL mutant/wrong-scale" in out.stdout


def test_cli_list_names_cases_rules_and_adapters():
    out = cli("list")
    assert out.returncode == 0
    for text in ("vanilla/self/basic", "HUANG-3", "torch-sdpa", "mutant/wrong-scale", "NOT COVERED"):
        assert (text in out.stdout) == (text != "NOT COVERED"), text


def test_outside_adapter_by_module_class():
    a = load_adapter("conformance.adapters.numpy_ref_adapter:NumpyRefAdapter")
    assert a.name == "numpy"


def test_porting_guide_example_passes_the_harness():
    """The complete example adapter in conformance/PORTING.md, run as written."""
    import re
    import types

    text = (store.GOLDEN_DIR.parent / "PORTING.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    module = types.ModuleType("porting_example")
    exec(compile(code, "PORTING.md", "exec"), module.__dict__)
    adapter = module.Float32Port()
    results = runner.run(runner.Plan([adapter]))
    ran = [r for r in results if r.status != "skip"]
    assert len({r.case for r in ran}) >= 15, "the example must exercise a good part of the catalog"
    assert not [f"{r.case} [{r.check}] {r.message}" for r in results if r.failed]


def test_outside_adapter_by_entry_point(monkeypatch):
    """An adapter registered in the attnspec.adapters entry-point group is found by name."""
    import conformance.adapters as registry

    monkeypatch.setattr(
        registry, "entry_points", lambda: {"my-port": "conformance.adapters.numpy_ref_adapter:NumpyRefAdapter"}
    )
    assert registry.load_adapter("my-port").name == "numpy"
    assert "my-port" in registry.available_names()


def test_cli_names_a_missing_package_in_one_line(monkeypatch, capsys):
    from conformance import cli

    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)  # import now fails
    code = cli.main(["run", "--adapter", "numpy", "--case", "vanilla/self/L1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("conformance: a package is missing") and "[conformance]" in err
    assert len(err.strip().splitlines()) == 1


def test_stored_bfloat16_inputs_round_through_float32():
    """PREC-5: the stored rounding is defined here, not by the installed ml_dtypes (0.6 and 0.7 differ on ties)."""
    x = np.array([1 + 2.0**-8 + 2.0**-30])  # float32 rounds it to the bfloat16 midpoint 1 + 2^-8, a tie to even
    assert float(generate.rounded(x, "bfloat16")[0]) == 1.0
    assert float(generate.rounded(x, "float32")[0]) == 1 + 2.0**-8
    assert float(generate.rounded(np.array([1 + 2.0**-11 + 2.0**-30]), "float16")[0]) == 1 + 2.0**-10


def test_units_keep_adapters_that_share_programs_in_one_process():
    """--jobs: ``jax`` runs beside ``jax:tiles`` (the kernel its automatic choice resolves to), others alone."""

    class Plain:
        pass

    class Sharing:
        shares_programs_with = ("tiles", "absent")

    plan = runner.Plan([Plain(), Sharing(), Plain(), Plain()])
    assert runner._units(plan, ["a", "auto", "xla", "tiles"]) == [(0,), (1, 3), (2,)]
    assert runner._units(runner.Plan([Sharing()]), ["auto"]) == [(0,)]


def test_parallel_run_gives_the_serial_results_in_the_same_order():
    """--jobs N changes neither the results nor their order (one adapter per process here)."""
    cases = [c for c in catalog.CASES if c.id in ("vanilla/cross/lq5-lk7", "peer/window/self/sliding-causal")]
    names = ["numpy", "mutant/window-sign-flipped"]
    adapters = [load_adapter(n) for n in names]
    serial = runner.run(runner.Plan(adapters, cases=cases, dtypes=["float64"]), deviations=[])
    parallel = runner.run(runner.Plan(adapters, cases=cases, dtypes=["float64"]), deviations=[], jobs=2, names=names)
    key = lambda r: (r.adapter, r.case, r.dtype, r.check, r.status, r.margin)  # noqa: E731
    assert [key(r) for r in parallel] == [key(r) for r in serial]
    assert any(r.failed for r in serial) and any(r.status == "pass" for r in serial)


class PidAdapter(NumpyRefAdapter):
    """The reference, recording the process that ran it; ``own_process`` like torch:triton."""

    name = "numpy-own-process"
    own_process = True

    def environment(self):
        return {"pid": os.getpid()}


class PidSharedAdapter(NumpyRefAdapter):
    name = "numpy-pool"

    def environment(self):
        return {"pid": os.getpid()}


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_own_process_adapter_runs_each_dtype_in_a_fresh_process(jobs):
    """An adapter with ``own_process`` never shares a worker with another adapter or another of its own shares
    (Triton's interpreter fails in a process where FlexAttention imported Triton for compiling)."""
    cases = [c for c in catalog.CASES if c.id == "vanilla/cross/lq5-lk7"]
    names = [f"{__name__}:PidSharedAdapter", f"{__name__}:PidAdapter"]
    adapters = [load_adapter(n) for n in names]
    plan = runner.Plan(adapters, cases=cases, dtypes=["float64", "float32"])
    results = runner.run(plan, deviations=[], jobs=jobs, names=names)
    assert results and all(r.status == "pass" for r in results if r.check != "*")
    pids = {(r.adapter, r.dtype): r.environment["pid"] for r in results}
    own = {pids["numpy-own-process", d] for d in ("float64", "float32")}
    pool = {pids["numpy-pool", d] for d in ("float64", "float32")}
    assert len(own) == 2 and not own & pool and os.getpid() not in own | pool


class ForwardOnlyRecorder(NumpyRefAdapter):
    """The reference with a ``forward_only`` that records its calls and can be made wrong."""

    name = "numpy-forward-only"

    def __init__(self, offset=0.0):
        super().__init__()
        self.offset, self.calls = offset, 0

    def forward_only(self, spec, params, inputs, *, device):
        self.calls += 1
        out = self.forward(spec, params, inputs, device=device, need_weights=False)["out"]
        return {"out": out + self.offset}


def test_twins_and_decoding_call_forward_only_and_judge_it():
    cases = [catalog.BY_ID["mask/rank2-QK"], catalog.BY_ID["rope/half/self/prefill-then-steps"]]
    right = ForwardOnlyRecorder()
    results = runner.run(runner.Plan([right], cases=cases, dtypes=["float64"]))
    judged = [r for r in results if r.check.startswith(("twin/", "decode/"))]
    assert judged and all(r.status == "pass" for r in judged)
    decode_steps = 1 + cases[1].dims.Lq - cases[1].decode_from  # the prefill, then one call per query
    assert right.calls == len(cases[0].twins) + decode_steps
    wrong = ForwardOnlyRecorder(offset=1e-3)
    results = runner.run(runner.Plan([wrong], cases=cases, dtypes=["float64"]))
    failed = {r.check for r in results if r.status == "fail"}
    assert failed == {r.check for r in judged}  # the main forward, weights and gradients are not forward_only's


class Follower(NumpyRefAdapter):
    """Says it runs as the reference's cell, and computes a wrong output when it runs its own."""

    name = "numpy-follower"
    shares_programs_with = ("numpy",)

    def runs_as(self, spec, inputs):
        return "numpy"

    def forward(self, spec, params, inputs, *, device, need_weights):
        result = super().forward(spec, params, inputs, device=device, need_weights=need_weights)
        return {**result, "out": result["out"] + 1e-3}


def test_an_adapter_that_runs_as_another_reports_that_cell_under_its_own_name():
    """``runs_as``: in one process with the adapter it names, its cell is that adapter's checks, renamed
    and noted; alone (or for an error case) it runs its own cell."""
    cases = [catalog.BY_ID["mask/rank2-QK"], catalog.BY_ID["errors/mask-not-boolean"]]
    plan = runner.Plan([Follower(), NumpyRefAdapter()], cases=cases, dtypes=["float64"])
    results = runner._run_cells(plan, store.GOLDEN_DIR, None, by_case=True)
    source = [r for r in results if r.adapter == "numpy" and r.case == cases[0].id]
    copied = [r for r in results if r.adapter == Follower.name and r.case == cases[0].id]
    assert source and [(r.check, r.status, r.max_abs) for r in copied] == [
        (r.check, r.status, r.max_abs) for r in source
    ]
    assert all(
        r.message.endswith("(the cell of numpy: the same kernel and compiled program)")
        or r.message == "the cell of numpy: the same kernel and compiled program"
        for r in copied
    )
    errors = [r for r in results if r.adapter == Follower.name and r.case == cases[1].id]
    assert errors and all("the cell of numpy" not in r.message for r in errors)
    alone = runner._run_cells(runner.Plan([Follower()], cases=cases[:1], dtypes=["float64"]), store.GOLDEN_DIR, None)
    assert any(r.check == "out" and r.status == "fail" for r in alone)


class NoCpuBackward(NumpyRefAdapter):
    """The reference, declaring what a framework without a CPU backward declares; its vjp must not be called."""

    name = "no-cpu-backward"

    def capabilities(self):
        return replace(super().capabilities(), no_gradients={"cpu": "no backward here"})

    def vjp(self, *args, **kwargs):
        raise AssertionError("vjp called on a device without gradients")


def test_a_device_without_gradients_skips_the_gradient_checks_and_runs_the_rest():
    """Capabilities.no_gradients: on that device one visible skip stands for the gradient checks, with the
    reason; the forward checks of the cell still run and pass."""
    case = catalog.BY_ID["mask/rank2-QK"]
    results = runner._run_cells(
        runner.Plan([NoCpuBackward()], cases=[case], dtypes=["float64"]), store.GOLDEN_DIR, None
    )
    by_check = {r.check: r for r in results}
    assert by_check["gradients"].status == "skip"
    assert by_check["gradients"].message == "no gradients on cpu: no backward here"
    assert "GRAD-1" in by_check["gradients"].rules
    assert not [r for r in results if r.check.startswith("grad/")]
    assert by_check["out"].status == "pass" and by_check["weights"].status == "pass"
    full = runner._run_cells(runner.Plan([NumpyRefAdapter()], cases=[case], dtypes=["float64"]), store.GOLDEN_DIR, None)
    assert [r for r in full if r.check.startswith("grad/")]  # the same cell with gradients has them


def test_run_leaves_the_extended_adapters_out_and_says_so(monkeypatch, capsys):
    """``python -m conformance run`` without --adapter: every adapter but EXTENDED's, each named with its
    reason; ``--all`` (or the name) brings one back."""
    from conformance import cli
    from conformance.adapters import BUILTIN, EXTENDED

    assert "jax:xla" in EXTENDED and set(EXTENDED) <= set(BUILTIN)
    assert "jax:xla" not in cli._adapter_names(None, False) and "jax" in cli._adapter_names(None, False)
    assert cli._adapter_names(None, True)[: len(BUILTIN)] == list(BUILTIN)
    assert cli._adapter_names(["jax:xla"], False) == ["jax:xla"]
    monkeypatch.setattr(cli, "BUILTIN", {"numpy": BUILTIN["numpy"], "jax:xla": BUILTIN["jax:xla"]})
    monkeypatch.setattr(cli, "EXTENDED", {"jax:xla": "slow here"})
    monkeypatch.setattr(cli, "entry_points", dict)
    assert cli.main(["run", "--case", "vanilla/self/L1", "--dtype", "float64", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "left out: jax:xla (slow here); --all or --adapter jax:xla runs it" in out
    assert "numpy " in out and "jax:xla " not in out.split("left out")[1].split("\n", 1)[1]


def test_the_progress_bar_counts_the_cells_beside_the_run():
    """The run starts before the matrix is counted (a thread sets the bar's total); --no-progress counts
    nothing at all."""
    import threading

    from conformance import cli

    pytest.importorskip("tqdm")
    release = threading.Event()

    def total():
        release.wait(5)
        return 7

    step = cli._progress_bar(total, True)
    assert step.bar.total is None  # not counted yet: the caller goes on
    release.set()
    for _ in range(100):
        if step.bar.total is not None:
            break
        threading.Event().wait(0.05)
    assert step.bar.total == 7
    step.close()
    assert cli._progress_bar(lambda: pytest.fail("counted without a bar"), False) is None
