"""The certification report a person reads at a glance: one self-contained HTML page and a PNG of its matrix.

``python -m conformance run --report DIR`` writes ``report.html`` and
``matrix.png`` beside ``results.jsonl`` and ``matrix.md``. The page needs no
network (inline CSS, no script): a rule x adapter matrix, each cell the worst
status of that adapter's checks of that rule over its dtypes and devices
(fail > deviation > pass; skip when no case of the rule ran), coloured and
titled with the status per dtype; a cell links to its adapter's section,
which lists every named deviation that adapter showed with its reason and
the largest error it measured against its budget (one click away), then the
counts per dtype. A named deviation colours the rules its reason names
(``named_rules``): the other rules of its case were exercised, not departed
from (``matrix.md`` keeps the strict reading for the claims of VER-2).
"""

from __future__ import annotations

import html
import pathlib
from collections import defaultdict

from spec import SPEC_VERSION, rule_ids

RANK = {"skip": 0, "pass": 1, "deviation": 2, "fail": 3}
COLOURS = {"pass": "#2e7d32", "deviation": "#f9a825", "fail": "#c62828", "skip": "#e0e0e0", None: "#ffffff"}
TEXT = {"pass": "#ffffff", "deviation": "#000000", "fail": "#ffffff", "skip": "#606060", None: "#000000"}
DEVIATION_PREFIX = "expected deviation "


def _status(r) -> str:
    return "fail" if r.failed else r.status


def named_rules(r) -> tuple:
    """The rules a check's status speaks for: a deviation's are the rule ids its reason names first ("PREC-1,
    ROPE-9: ..."), which is what departed (its other rules were only exercised by the case); any other
    check's are its rules."""
    if r.status != "deviation" or not r.message.startswith(DEVIATION_PREFIX):
        return r.rules
    reason = r.message[len(DEVIATION_PREFIX) :].partition(": ")[2]
    head = reason.partition(":")[0]
    named = tuple(t.strip() for t in head.split(","))
    known = set(rule_ids())
    return named if named and all(t in known for t in named) else r.rules


def adapter_matrix(results: list) -> tuple[list, list, dict, dict]:
    """(adapters, rules, cell, detail): cell[(rule, adapter)] the worst status over dtypes and devices,
    detail[(rule, adapter)] = {(dtype, device): worst status there}; rules in the spec's order. A named
    deviation counts for the rules it names (``named_rules``)."""
    adapters = list(dict.fromkeys(r.adapter for r in results))
    cell: dict = {}
    detail: dict = defaultdict(dict)
    for r in results:
        status = _status(r)
        for rule in named_rules(r):
            key, where = (rule, r.adapter), (r.dtype, r.device)
            if RANK[status] > RANK.get(cell.get(key), -1):
                cell[key] = status
            if RANK[status] > RANK.get(detail[key].get(where), -1):
                detail[key][where] = status
    return adapters, list(rule_ids()), cell, dict(detail)


def deviations_seen(results: list) -> dict:
    """adapter -> {deviation name: {"reason", "checks", "worst": (max_abs, budget, case, dtype, check)}}."""
    seen: dict = defaultdict(dict)
    for r in results:
        if r.status != "deviation" or not r.message.startswith(DEVIATION_PREFIX):
            continue
        name, _, rest = r.message[len(DEVIATION_PREFIX) :].partition(": ")
        reason = rest.rsplit(" (", 1)[0] if rest.endswith(")") else rest
        entry = seen[r.adapter].setdefault(name, {"reason": reason, "checks": 0, "worst": None})
        entry["checks"] += 1
        ratio = None if r.max_abs is None or not r.budget else r.max_abs / r.budget
        best = entry["worst"]
        if ratio is not None and (best is None or ratio > best[0] / best[1]):
            entry["worst"] = (r.max_abs, r.budget, r.case, r.dtype, r.check)
    return dict(seen)


def _anchor(adapter: str) -> str:
    return "adapter-" + "".join(c if c.isalnum() else "-" for c in adapter)


def html_page(results: list) -> str:
    adapters, rules, cell, detail = adapter_matrix(results)
    seen = deviations_seen(results)
    esc = html.escape
    head = "".join(f'<th class="col"><a href="#{_anchor(a)}">{esc(a)}</a></th>' for a in adapters)
    rows = []
    for rule in rules:
        if not any((rule, a) in cell for a in adapters):
            continue
        tds = []
        for a in adapters:
            status = cell.get((rule, a))
            where = detail.get((rule, a), {})
            title = "; ".join(f"{dt} {dev}: {s}" for (dt, dev), s in sorted(where.items())) or "not run"
            label = {"pass": "pass", "deviation": "dev", "fail": "FAIL", "skip": "skip", None: ""}[status]
            tds.append(
                f'<td class="{status or "none"}" title="{esc(rule)} / {esc(a)}: {esc(title)}">'
                f'<a href="#{_anchor(a)}">{label}</a></td>'
            )
        rows.append(f'<tr><th class="rule">{esc(rule)}</th>{"".join(tds)}</tr>')
    sections = []
    for a in adapters:
        counts: dict = defaultdict(lambda: defaultdict(int))
        for r in results:
            if r.adapter == a:
                counts[(r.dtype, r.device)][_status(r)] += 1
        lines = "".join(
            f"<li>{esc(dt)} {esc(dev)}: "
            + ", ".join(f"{c[s]} {s}" for s in ("pass", "deviation", "fail", "skip") if c[s])
            + "</li>"
            for (dt, dev), c in sorted(counts.items())
        )
        devs = []
        for name, e in sorted(seen.get(a, {}).items()):
            worst = e["worst"]
            measured = (
                f"largest error {worst[0]:.3g} against a budget of {worst[1]:.3g} ({esc(worst[2])}, {esc(worst[3])}, "
                f"{esc(worst[4])})"
                if worst
                else "NaN or an exception (no finite error)"
            )
            devs.append(
                f'<li id="{_anchor(a)}-{esc(name)}"><b>{esc(name)}</b> ({e["checks"]} checks): '
                f"{esc(e['reason'])}<br><i>measured:</i> {measured}</li>"
            )
        dev_html = f"<ul>{''.join(devs)}</ul>" if devs else "<p>no deviations</p>"
        sections.append(
            f'<section id="{_anchor(a)}"><h2>{esc(a)}</h2><h3>named deviations</h3>{dev_html}'
            f"<h3>checks</h3><ul>{lines}</ul></section>"
        )
    style = " ".join(
        f"td.{s or 'none'} {{ background: {COLOURS[s]}; color: {TEXT[s]}; }} td.{s or 'none'} a {{ color: {TEXT[s]}; }}"
        for s in ("pass", "deviation", "fail", "skip", None)
    )
    total = defaultdict(int)
    for r in results:
        total[_status(r)] += 1
    summary = ", ".join(f"{total[s]} {s}" for s in ("pass", "deviation", "fail", "skip"))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>attnspec {SPEC_VERSION} certification report</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 12px; }}
th, td {{ border: 1px solid #bdbdbd; padding: 2px 5px; text-align: center; }}
th.col {{ writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; }}
th.rule {{ text-align: left; }}
td a {{ text-decoration: none; display: block; }}
{style}
</style></head><body>
<h1>attnspec {SPEC_VERSION} certification report</h1>
<p id="summary">{summary} checks. Each cell: the worst status of the adapter's checks of the rule over its dtypes
and devices (FAIL &gt; deviation &gt; pass; skip: no case of the rule ran); a named deviation counts for the rules
its reason names. Hover for each dtype, click for the adapter's named deviations with their reasons and measured
errors.</p>
<table id="matrix"><thead><tr><th>rule</th>{head}</tr></thead><tbody>
{chr(10).join(rows)}
</tbody></table>
{chr(10).join(sections)}
</body></html>
"""


def matrix_png(results: list, path: pathlib.Path) -> bool:
    """The matrix of ``html_page`` as a PNG (matplotlib); False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Patch
    except ImportError:
        return False
    adapters, rules, cell, _ = adapter_matrix(results)
    rules = [r for r in rules if any((r, a) in cell for a in adapters)]
    order = [None, "skip", "pass", "deviation", "fail"]
    grid = [[order.index(cell.get((r, a))) for a in adapters] for r in rules]
    fig, ax = plt.subplots(figsize=(1.0 + 0.28 * len(adapters), 1.5 + 0.16 * len(rules)), dpi=110)
    ax.imshow(grid, cmap=ListedColormap([COLOURS[s] for s in order]), vmin=0, vmax=len(order) - 1, aspect="auto")
    ax.set_xticks(range(len(adapters)), adapters, rotation=90, fontsize=7)
    ax.set_yticks(range(len(rules)), rules, fontsize=6)
    ax.set_xticks([x - 0.5 for x in range(1, len(adapters))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(rules))], minor=True)
    ax.grid(which="minor", color="#9e9e9e", linewidth=0.3)
    ax.tick_params(which="minor", length=0)
    ax.xaxis.tick_top()
    ax.legend(
        handles=[Patch(color=COLOURS[s], label=s) for s in ("pass", "deviation", "fail", "skip")],
        loc="upper left",
        bbox_to_anchor=(0, 0),
        ncol=4,
        fontsize=7,
        frameon=False,
    )
    ax.set_title(f"attnspec {SPEC_VERSION}: rule x adapter", fontsize=9, pad=4)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return True
