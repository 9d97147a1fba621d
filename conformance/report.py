"""Summaries and reports of a conformance run.

- ``summary_table``: adapter x dtype x device with pass / fail / skip /
  expected-deviation counts, the worst margin (error / budget) and the
  seconds its cells took (their programs compiled and their checks run;
  summed over the cells, which ``--jobs`` runs side by side).
- ``write_reports``: ``results.jsonl`` (one record per check, with the
  adapter's environment) and ``matrix.md`` (rule x adapter x dtype x device)
  with the conformance claims each adapter may make (VER-2), ``report.html``
  and ``matrix.png`` (``conformance.html_report``: the page read at a glance).
"""

from __future__ import annotations

import json
import pathlib
import platform
from collections import defaultdict

from spec import SPEC_VERSION, rule_ids

STATUS_ORDER = ("pass", "fail", "unexpected-pass", "deviation", "skip")


def _key(r):
    return (r.adapter, r.dtype, r.device)


def summary_rows(results: list) -> list:
    groups: dict = defaultdict(list)
    for r in results:
        groups[_key(r)].append(r)
    rows = []
    for (adapter, dtype, device), rs in groups.items():
        counts = {s: sum(r.status == s for r in rs) for s in STATUS_ORDER}
        margins = [r.margin for r in rs if r.status == "pass" and r.margin is not None]
        rows.append(
            {
                "adapter": adapter,
                "dtype": dtype,
                "device": device,
                **counts,
                "worst_margin": max(margins) if margins else None,
                "seconds": sum(r.seconds or 0.0 for r in rs),
            }
        )
    return rows


def summary_table(results: list) -> str:
    rows = summary_rows(results)
    header = ("adapter", "dtype", "device", "pass", "fail", "deviation", "skip", "worst margin", "seconds")
    lines = [
        [
            r["adapter"],
            r["dtype"],
            r["device"],
            str(r["pass"]),
            str(r["fail"] + r["unexpected-pass"]),
            str(r["deviation"]),
            str(r["skip"]),
            "-" if r["worst_margin"] is None else f"{r['worst_margin']:.3f}",
            f"{r['seconds']:.1f}",
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" if i < 3 else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*row) for row in lines]
    return "\n".join(out)


def failures(results: list, limit: int = 30) -> str:
    bad = [r for r in results if r.failed]
    lines = [f"FAIL {r.adapter} {r.device} {r.dtype} {r.case} [{r.check}] {r.message}" for r in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"... and {len(bad) - limit} more (see --report)")
    return "\n".join(lines)


def skip_reasons(results: list) -> str:
    reasons: dict = defaultdict(int)
    for r in results:
        if r.status == "skip":
            reasons[(r.adapter, r.message)] += 1
    return "\n".join(f"skip {adapter}: {msg} ({n}x)" for (adapter, msg), n in sorted(reasons.items()))


def environment() -> dict:
    import numpy

    return {
        "attnspec_spec_version": SPEC_VERSION,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": numpy.__version__,
    }


def rule_matrix(results: list) -> tuple[list, dict]:
    """cell[(rule, adapter, dtype, device)] = pass | fail | deviation | skip."""
    columns = sorted({_key(r) for r in results})
    cell: dict = {}
    rank = {"skip": 0, "pass": 1, "deviation": 2, "fail": 3}
    for r in results:
        status = "fail" if r.failed else r.status
        for rule in r.rules:
            k = (rule,) + _key(r)
            if rank[status] > rank.get(cell.get(k), -1):
                cell[k] = status
    return columns, cell


def markdown_matrix(results: list) -> str:
    columns, cell = rule_matrix(results)
    symbol = {"pass": "pass", "fail": "**FAIL**", "deviation": "deviation", "skip": "skip", None: ""}
    head = "| rule | " + " | ".join(f"{a}<br>{dt}<br>{dev}" for a, dt, dev in columns) + " |"
    sep = "|---|" + "---|" * len(columns)
    lines = [
        f"# attnspec {SPEC_VERSION} conformance matrix",
        "",
        "Each cell: the worst status of the checks that exercise the rule (pass < deviation < FAIL);",
        "skip: no case of that rule ran for the column. Deviations are listed in conformance/deviations.json.",
        "",
        head,
        sep,
    ]
    for rule in rule_ids():
        lines.append(f"| {rule} | " + " | ".join(symbol[cell.get((rule,) + c)] for c in columns) + " |")
    lines += ["", "## Claims (rule VER-2)", ""]
    for col in columns:
        passed = [rule for rule in rule_ids() if cell.get((rule,) + col) == "pass"]
        lines.append(
            f"- {col[0]} ({col[1]}, {col[2]}): conforms to attnspec {SPEC_VERSION}, rules "
            f"{', '.join(passed) if passed else 'none'}"
        )
    return "\n".join(lines) + "\n"


def load_results(path: pathlib.Path) -> list:
    """The check records of a ``results.jsonl`` that ``write_reports`` wrote, as CheckResults."""
    from .checks import CheckResult

    out = []
    for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        rec["rules"] = tuple(rec["rules"])
        out.append(CheckResult(**rec))
    return out


def merge(runs: dict) -> list:
    """One result list of runs made in separate environments (``{label: results}``, in order): each adapter's
    records come from the run in which it ran (any record that is not a skip); an adapter that ran in none
    keeps the first run's skips, with their reasons. An adapter that ran in two runs is a ValueError naming
    both: which one certifies it would be a guess."""
    ran: dict = {}
    for label, results in runs.items():
        for name in {r.adapter for r in results if r.status != "skip"}:
            if name in ran:
                raise ValueError(f"adapter {name!r} ran in both {ran[name]} and {label}: expected it in one run")
            ran[name] = label
    first: dict = {}  # adapter -> the first run that names it
    for label, results in runs.items():
        for r in results:
            first.setdefault(r.adapter, label)
    source = {name: ran.get(name, label) for name, label in first.items()}
    return [r for label, results in runs.items() for r in results if source[r.adapter] == label]


def write_reports(results: list, directory: pathlib.Path) -> list:
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    env = environment()
    jsonl = directory / "results.jsonl"
    with jsonl.open("w", encoding="utf-8") as f:
        for r in results:
            rec = r.record()
            rec["environment"] = {**env, **r.environment}
            f.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
    md = directory / "matrix.md"
    md.write_text(markdown_matrix(results), encoding="utf-8")
    from . import html_report

    page = directory / "report.html"
    page.write_text(html_report.html_page(results), encoding="utf-8")
    png = directory / "matrix.png"
    return [jsonl, md, page] + ([png] if html_report.matrix_png(results, png) else [])
