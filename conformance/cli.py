"""``python -m conformance``: run, list, generate, verify, campaign, coverage, onnx-node-tests.

Usage errors (unknown adapter, dtype, device, case pattern, unwritable report
folder) print one line and exit with status 2; a run with any failure exits
with status 1.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import pathlib
import sys
import tempfile

from spec import SPEC_VERSION, rule_ids

from . import report
from .adapters import BUILTIN, EXTENDED, AdapterError, available_names, entry_points, load_adapter
from .catalog import CASES
from .store import GOLDEN_DIR, GoldenError

DTYPES = ("float64", "float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda", "gpu")


class UsageError(Exception):
    pass


def _progress_bar(total, enabled: bool):
    """A step function for the runner, or None (disabled, or no tqdm). ``total``: the number of cells, or a
    function that counts them, called in a thread while the run starts (counting asks every adapter for
    its capabilities, which imports every framework in this process)."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience; the run does not need it
        return None
    bar = tqdm(total=None if callable(total) else total, unit="cell", file=sys.stderr, dynamic_ncols=True, leave=False)
    if callable(total):
        import threading

        def count():
            bar.total = total()
            bar.refresh()

        threading.Thread(target=count, daemon=True).start()

    def step(adapter, device, dtype, case_id):
        bar.set_description_str(f"{adapter} {device} {dtype}", refresh=False)
        bar.update(1)

    step.close, step.bar = bar.close, bar
    return step


def _select_cases(patterns):
    if not patterns:
        return list(CASES)
    chosen = [c for c in CASES if any(fnmatch.fnmatchcase(c.id, p) or p in c.id for p in patterns)]
    if not chosen:
        raise UsageError(f"--case {' '.join(patterns)}: matches no case (see `python -m conformance list`)")
    return chosen


def _check_report_dir(path: str) -> pathlib.Path:
    directory = pathlib.Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise UsageError(f"--report {path}: cannot write there ({e.strerror or e})") from None
    return directory


def _adapter_names(names, everything: bool = True) -> list:
    """The names asked for, or every built-in (without the EXTENDED ones unless ``everything``) and
    entry-point adapter."""
    if names:
        return list(names)
    return [n for n in BUILTIN if everything or n not in EXTENDED] + sorted(entry_points())


def _adapters(names, everything: bool = True):
    out = []
    for n in _adapter_names(names, everything):
        try:
            out.append(load_adapter(n))
        except AdapterError as e:
            raise UsageError(str(e)) from None
    return out


DEFAULT_JOBS = min(2, os.cpu_count() or 1)


def cmd_run(args) -> int:
    from .adapters import _jax
    from .runner import Plan, matrix, run

    # before any JAX backend starts (this process's, its workers'): half the compile time of every JAX cell on a CPU
    _jax.fast_cpu_compiles()
    for d in args.dtype or ():
        if d not in DTYPES:
            raise UsageError(f"--dtype {d}: expected one of {', '.join(DTYPES)}")
    for d in args.device or ():
        if d not in DEVICES:
            raise UsageError(f"--device {d}: expected one of {', '.join(DEVICES)}")
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: expected an integer >= 1")
    if args.headroom is not None and not 0 < args.headroom <= 1:
        raise UsageError(f"--headroom {args.headroom}: expected a margin in (0, 1]")
    report_dir = _check_report_dir(args.report) if args.report else None
    plan = Plan(_adapters(args.adapter, args.all), _select_cases(args.case), args.dtype or None, args.device or None)
    if not args.adapter and not args.all:
        for name, why in EXTENDED.items():
            print(f"left out: {name} ({why}); --all or --adapter {name} runs it")
    progress = _progress_bar(lambda: sum(1 for _ in matrix(plan)), not args.no_progress)
    try:
        results = run(
            plan,
            directory=pathlib.Path(args.goldens),
            progress=progress,
            jobs=args.jobs,
            names=_adapter_names(args.adapter, args.all),
        )
    finally:
        if progress is not None:
            progress.close()
    print(f"attnspec {SPEC_VERSION} conformance: {len(plan.cases)} cases, {len(results)} checks")
    print(report.summary_table(results))
    if args.verbose:
        print(report.skip_reasons(results))
    failed = report.failures(results)
    if failed:
        print(failed)
    if report_dir:
        for path in report.write_reports(results, report_dir):
            print(f"wrote {path}")
    n_fail = sum(r.failed for r in results)
    print(
        f"{sum(r.status == 'pass' for r in results)} passed, {n_fail} failed, "
        f"{sum(r.status == 'deviation' for r in results)} expected deviations, "
        f"{sum(r.status == 'skip' for r in results)} skipped"
    )
    short = headroom_shortfalls(results, args.headroom) if args.headroom is not None else []
    for r in short:
        print(f"HEADROOM {r.adapter} {r.device} {r.dtype} {r.case} [{r.check}] margin {r.margin:.3f} > {args.headroom}")
    if args.headroom is not None:
        checked = sum(r.dtype == "float64" and r.status == "pass" and r.margin is not None for r in results)
        print(f"headroom (PREC-6): {checked - len(short)} of {checked} float64 checks at margin <= {args.headroom}")
        if not checked:
            print("headroom (PREC-6): no float64 check ran")
            return 1
    return 1 if n_fail or short else 0


def headroom_shortfalls(results: list, headroom: float) -> list:
    """The passing float64 checks whose margin exceeds ``headroom`` (PREC-6's battery: an independent float64
    evaluation passes every check at margin <= 0.5, so that an order nobody here has tried has room)."""
    return [r for r in results if r.dtype == "float64" and r.status == "pass" and (r.margin or 0.0) > headroom]


def cmd_list(args) -> int:
    print(f"attnspec {SPEC_VERSION}: {len(CASES)} cases")
    for c in CASES:
        print(f"  {c.id:50s} {' '.join(c.dtypes):35s} {', '.join(c.rules)}")
    covered = {r for c in CASES for r in c.all_rules}
    print(f"\nrules ({len(rule_ids())}):")
    for r in rule_ids():
        n = sum(r in c.all_rules for c in CASES)
        print(f"  {r:10s} {n:3d} cases" + ("" if r in covered else "   (NOT COVERED)"))
    print("\nadapters:")
    for name in available_names():
        try:
            a = load_adapter(name)
            why = a.unavailable()
            caps = None if why else a.capabilities()
        except Exception as e:  # a broken outside adapter must not hide the others
            why, caps = f"cannot load ({e})", None
        if caps:
            # a dtype that no present device can run (Capabilities.unsupported) is not available
            runs = [t for t in caps.dtypes if any((dev, t) not in caps.unsupported for dev in caps.devices)]
            cannot = [t for t in caps.dtypes if t not in runs]
            print(
                f"  {name:34s} available: {', '.join(caps.devices)}; {', '.join(runs)}"
                f"{'' if caps.gradients else '; no gradients'}"
                f"{''.join(f'; no gradients on {dev}' for dev in caps.no_gradients if dev in caps.devices)}"
                f"{'; not ' + ', '.join(cannot) if cannot else ''}"
            )
        else:
            print(f"  {name:34s} unavailable: {why}")
        if name in EXTENDED:
            print(f"  {'':34s} run by --all or by name only: {EXTENDED[name]}")
    return 0


def cmd_generate(args) -> int:
    from .generate import generate

    rebuilt: list = []
    manifest = generate(
        pathlib.Path(args.goldens), progress=rebuilt.append, only=args.case, budgets_only=args.budgets_only
    )
    what = "the budgets of" if args.budgets_only else ""
    print(f"generated {what} {len(rebuilt)} of {len(manifest['cases'])} cases in {args.goldens}".replace("  ", " "))
    return 0


def cmd_verify(args) -> int:
    from .generate import verify

    noise: list = []
    problems = verify(pathlib.Path(args.goldens), noise=noise)
    for p in problems:
        print(f"drift: {p}")
    if args.verbose:
        for n in noise:
            print(f"noise: {n}")
    print(f"{len(noise)} changes within the noise bounds of PREC-5 (machine arithmetic; -v lists them)")
    print("goldens verified: no drift" if not problems else f"{len(problems)} changes beyond PREC-5: drift")
    return 1 if problems else 0


def cmd_campaign(args) -> int:
    from . import campaign

    try:
        import tqdm

        tqdm.tqdm.monitor_interval = 0  # no monitor thread in a process that forks
    except ImportError:
        pass
    bars = []

    def progress(total, package="numpy_ref"):
        step = _progress_bar(total, not args.no_progress)
        if step is None:
            return None
        bars.append(step)
        return lambda mutant_id: step(package, "cpu", "float64", mutant_id)

    try:
        return campaign.main(args, progress=progress)
    except campaign.CampaignArgumentError as e:
        raise UsageError(str(e)) from None
    finally:
        for step in bars:
            step.close()


def cmd_coverage(args) -> int:
    from . import coverage

    rows = coverage.table()
    text = coverage.render(rows)
    if args.write:
        coverage.STORED.write_text(text, encoding="utf-8")
        print(f"wrote {coverage.STORED}")
    else:
        print(text, end="")
    missing = coverage.gaps(rows) + coverage.combination_gaps(coverage.combinations())
    return 1 if missing else 0


def cmd_onnx_node_tests(args) -> int:
    try:
        import onnx
    except ImportError as e:
        raise UsageError(f'onnx-node-tests needs onnx ({e}); install it with pip install -e ".[onnx]"') from None
    from . import onnx_node_tests

    outcomes = onnx_node_tests.run(args.case)
    if args.case and not outcomes:
        raise UsageError(f"--case {' '.join(args.case)}: matches no ONNX Attention node test")
    print(f"attnspec {SPEC_VERSION} against ONNX's Attention node tests (onnx {onnx.__version__})")
    for outcome in outcomes:
        print(onnx_node_tests.render(outcome))
    print(onnx_node_tests.summary(outcomes))
    return 1 if any(o.status == "disagree" for o in outcomes) else 0


def cmd_report(args) -> int:
    """One report of runs made in separate environments (each ``run --report DIR``'s results.jsonl)."""
    runs = {}
    for folder in args.runs:
        path = pathlib.Path(folder) / "results.jsonl"
        if not path.is_file():
            raise UsageError(f"{folder}: expected a folder that `run --report` wrote (with results.jsonl), got none")
        runs[folder] = report.load_results(path)
    try:
        results = report.merge(runs)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.adapter:
        unknown = sorted(set(args.adapter) - {r.adapter for r in results})
        if unknown:
            raise UsageError(f"--adapter {', '.join(unknown)}: expected adapters of the runs, got none of that name")
        results = [r for r in results if r.adapter in args.adapter]
    print(report.summary_table(results))
    for path in report.write_reports(results, _check_report_dir(args.out)):
        print(f"wrote {path}")
    return 1 if any(r.failed for r in results) else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m conformance", description=f"attnspec {SPEC_VERSION} conformance harness"
    )
    p.add_argument("--goldens", default=str(GOLDEN_DIR), help="golden folder (default: the stored one)")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the conformance matrix")
    run.add_argument(
        "--adapter",
        action="append",
        help="adapter name, mutant/NAME or module:Class (repeatable; default: every built-in and entry-point "
        f"adapter but {', '.join(EXTENDED)})",
    )
    run.add_argument("--all", action="store_true", help=f"with no --adapter: every adapter, {', '.join(EXTENDED)} too")
    run.add_argument("--device", action="append", help="cpu, cuda or gpu (repeatable; default: all present)")
    run.add_argument("--dtype", action="append", help="float64, float32, bfloat16, float16 (repeatable)")
    run.add_argument("--case", action="append", help="case id pattern (fnmatch or substring; repeatable)")
    run.add_argument("--report", help="folder for results.jsonl, matrix.md, report.html and matrix.png")
    run.add_argument(
        "--jobs",
        type=int,
        default=DEFAULT_JOBS,
        help=f"processes, one (adapter, dtype) at a time each (default {DEFAULT_JOBS}: the cores, at most 2)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("-v", "--verbose", action="store_true", help="also list why cells were skipped")
    run.add_argument(
        "--headroom",
        type=float,
        metavar="MARGIN",
        help="also fail unless every passing float64 check has margin <= MARGIN (PREC-6's battery of float64 "
        "evaluations: 0.5)",
    )
    rep = sub.add_parser(
        "report", help="one report (results.jsonl, matrix.md, report.html, matrix.png) of runs in separate environments"
    )
    rep.add_argument("runs", nargs="+", help="folders written by `run --report`; each adapter from the run it ran in")
    rep.add_argument("--out", required=True, help="folder for the merged report")
    rep.add_argument("--adapter", action="append", help="keep only these adapters (repeatable)")
    sub.add_parser("list", help="cases, rules and adapters")
    gen = sub.add_parser("generate", help="rebuild the golden vectors and the manifest")
    gen.add_argument(
        "--case", action="append", help="rebuild only the cases matching this id pattern (fnmatch; repeatable)"
    )
    gen.add_argument(
        "--budgets-only",
        action="store_true",
        help="keep every stored golden; recompute the budgets and rule claims alone",
    )
    ver = sub.add_parser("verify", help="recompute the goldens; report drift beyond the noise bounds of PREC-5")
    ver.add_argument("-v", "--verbose", action="store_true", help="also list the changes within the noise bounds")
    camp = sub.add_parser(
        "campaign",
        help="mutation campaign: AST mutants of numpy_ref (or of torch_impl's or jax_impl's kernels) against the "
        "catalog (POSIX: forks per mutant)",
        description="AST mutants of a package run against the catalog, each in a forked child (POSIX). Default: "
        "numpy_ref through the numpy and numpy:blockwise adapters. --package torch_impl (or --kernel torch:eager, "
        "torch:tiles, torch:sdpa, torch:flex) mutates torch_impl's kernels and the code they share, run through "
        "those kernels' adapters (the tiles kernel also cut into tiles of a few rows, flex eager); --package "
        "jax_impl (or --kernel jax:xla, jax:tiles, jax:pallas) jax_impl's, its tiles kernel cut into a few query "
        "tiles and its pallas kernel into a few blocks per call. See conformance/campaign.py.",
    )
    camp.add_argument(
        "--package",
        action="append",
        help="package to mutate: numpy_ref (the default), torch_impl or jax_impl, every kernel of it (repeatable)",
    )
    camp.add_argument(
        "--kernel",
        action="append",
        help="one kernel to mutate, with the shared code it runs: numpy, torch:eager, torch:tiles, torch:sdpa, "
        "torch:flex, jax:xla, jax:tiles or jax:pallas (repeatable)",
    )
    camp.add_argument(
        "--all", action="store_true", help="every package and kernel (numpy_ref, then torch_impl, then jax_impl)"
    )
    camp.add_argument(
        "--target",
        action="append",
        help="file to mutate, relative to its package (numpy_ref by default) or the repository "
        "(torch_impl/kernels/tiles.py), or a pattern (repeatable)",
    )
    camp.add_argument("--mutant", action="append", help="mutant id pattern (fnmatch; repeatable)")
    camp.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    camp.add_argument(
        "--timeout",
        type=float,
        help="seconds per mutant before it counts as a timeout (default 30; jax_impl: 900, its survivors compile "
        "every case they run)",
    )
    camp.add_argument(
        "--max-cells",
        type=int,
        metavar="N",
        help="run each mutant in at most N of the (case, adapter) cells that evaluated it, the first of its order "
        "(the cases naming its rules, then those that killed the most mutants; default: all of them)",
    )
    camp.add_argument(
        "--report-dir",
        help="folder for report.json and REPORT.md (default conformance/campaign_data; a package other than "
        "numpy_ref writes to its subfolder, torch_impl/ or jax_impl/)",
    )
    camp.add_argument(
        "--equivalent",
        help="equivalence arguments (default conformance/campaign_data/equivalent.json, "
        "campaign_data/<package>/equivalent.json for torch_impl and jax_impl)",
    )
    camp.add_argument(
        "--trust-arguments",
        action="store_true",
        help="build the mutants argued equivalent but do not run them (each stands on its argument; an argument "
        "whose mutant a check now kills shows only without this option); the other mutants run as always",
    )
    camp.add_argument("--allow-survivors", action="store_true", help="exit 0 even when a mutant survived unargued")
    camp.add_argument("--list", action="store_true", help="list the mutants without running them")
    camp.add_argument("--show", metavar="ID", help="print one mutant as a diff without running it")
    camp.add_argument("--no-progress", action="store_true", help="no progress bar")
    cov = sub.add_parser(
        "coverage",
        help="the catalog-coverage tables: input dimension x scheme -> cases; scheme or option x causal, positions, "
        "decode step, long, dtype -> cases",
    )
    cov.add_argument("--write", action="store_true", help="write it to conformance/COVERAGE.md instead of printing")
    onnx_tests = sub.add_parser(
        "onnx-node-tests",
        help="ONNX's own Attention node tests mapped onto numpy_ref: agree / disagree / not expressible per case",
    )
    onnx_tests.add_argument("--case", action="append", help="node test name pattern (fnmatch or substring; repeatable)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    command = {
        "run": cmd_run,
        "report": cmd_report,
        "list": cmd_list,
        "generate": cmd_generate,
        "verify": cmd_verify,
        "campaign": cmd_campaign,
        "coverage": cmd_coverage,
        "onnx-node-tests": cmd_onnx_node_tests,
    }[args.command]
    try:
        return command(args)
    except UsageError as e:
        print(f"conformance: {e}", file=sys.stderr)
        return 2
    except GoldenError as e:
        print(f"conformance: {e}", file=sys.stderr)
        return 2
    except ImportError as e:  # the stored goldens need safetensors and ml_dtypes
        print(
            f'conformance: a package is missing ({e}); install it with pip install -e ".[conformance]" (or .[all])',
            file=sys.stderr,
        )
        return 2
