"""The certification report (conformance/html_report.py): the page's matrix, its deviations one click away, the
PNG, and the page opened in a real headless browser (Chromium from the system packages; the test skips with that
reason where none is installed)."""

import pathlib
import shutil
import subprocess

import pytest

from conformance import html_report, report
from conformance.checks import CheckResult


def _results():
    dev = "expected deviation demo-nan-rows: MASK-5: a fully masked row is NaN (error 0.5 exceeds budget 0.01)"
    return [
        CheckResult("c1", "lib-a", "float32", "cpu", "out", "pass", ("SCALE-1", "MASK-5"), 1e-8, None, 1e-6, 0.01),
        CheckResult("c2", "lib-a", "float64", "cpu", "out", "deviation", ("MASK-5",), 0.5, None, 0.01, 50, message=dev),
        CheckResult("c1", "lib-b", "float32", "cpu", "out", "fail", ("SCALE-1",), 3.0, None, 1e-6, 3e6),
        CheckResult("c1", "lib-b", "float32", "cpu", "*", "skip", ("MASK-5",), message="needs mask"),
    ]


def test_the_page_colours_each_rule_and_adapter_by_its_worst_status_and_lists_the_deviations():
    """Cells: the worst status over dtypes and devices (lib-a MASK-5 is a deviation though float32 passed); a
    cell links to its adapter's section, where the deviation's reason and largest error against its budget are;
    nothing is loaded from a network."""
    page = html_report.html_page(_results())
    assert 'class="deviation" title="MASK-5 / lib-a: float32 cpu: pass; float64 cpu: deviation"' in page
    assert 'class="pass" title="SCALE-1 / lib-a: float32 cpu: pass"' in page
    assert 'class="fail" title="SCALE-1 / lib-b' in page and 'class="skip" title="MASK-5 / lib-b' in page
    assert '<a href="#adapter-lib-a">dev</a>' in page and '<section id="adapter-lib-a">' in page
    assert "<b>demo-nan-rows</b> (1 checks): MASK-5: a fully masked row is NaN" in page
    assert "largest error 0.5 against a budget of 0.01 (c2, float64, out)" in page
    assert "<script" not in page and "http" not in page and "<link" not in page


def test_a_deviation_colours_the_rules_its_reason_names():
    """named_rules: a deviation whose reason starts "MASK-5:" speaks for MASK-5 only, though its check carries
    SCALE-1 too; a reason without leading rule ids speaks for all the check's rules."""
    dev = "expected deviation d: MASK-5: rows are NaN (error 1 exceeds budget 0.1)"
    r = CheckResult(
        "c", "lib", "float64", "cpu", "out", "deviation", ("SCALE-1", "MASK-5"), 1.0, None, 0.1, message=dev
    )
    assert html_report.named_rules(r) == ("MASK-5",)
    _, _, cell, _ = html_report.adapter_matrix([r])
    assert cell == {("MASK-5", "lib"): "deviation"}
    vague = CheckResult(
        "c", "lib", "float64", "cpu", "out", "deviation", ("SCALE-1",), message="expected deviation d: odd"
    )
    assert html_report.named_rules(vague) == ("SCALE-1",)


def test_the_reports_include_the_page_and_the_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed; pip install attnspec[bench]")
    paths = report.write_reports(_results(), tmp_path)
    assert [p.name for p in paths] == ["results.jsonl", "matrix.md", "report.html", "matrix.png"]
    assert (tmp_path / "matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(BROWSER is None, reason="no Chromium on this machine (Debian: apt-get install chromium)")
def test_the_page_opens_in_headless_chromium_showing_the_matrix(tmp_path):
    """The page as a browser builds it (--dump-dom) holds the matrix table with its coloured cells, and a
    screenshot of it is a real picture."""
    page = tmp_path / "report.html"
    page.write_text(html_report.html_page(_results()), encoding="utf-8")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    url = pathlib.Path(page).as_uri()
    dom = subprocess.run([BROWSER, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert '<table id="matrix">' in dom and 'class="deviation"' in dom and "demo-nan-rows" in dom
    shot = tmp_path / "shot.png"
    subprocess.run(
        [BROWSER, *flags, f"--screenshot={shot}", "--window-size=800,600", url], capture_output=True, timeout=120
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000


def _skip(adapter, why="adapter unavailable: not installed here"):
    return CheckResult("c1", adapter, "float32", "cpu", "*", "skip", ("SCALE-1",), message=why)


def test_results_read_back_as_they_were_written(tmp_path):
    """load_results is the inverse of the results.jsonl that write_reports writes (environment added)."""
    results = _results()
    report.write_reports(results, tmp_path)
    back = report.load_results(tmp_path / "results.jsonl")
    strip = [{k: v for k, v in r.record().items() if k != "environment"} for r in back]
    assert strip == [{k: v for k, v in r.record().items() if k != "environment"} for r in results]


def test_a_merged_report_takes_each_adapter_from_the_run_it_ran_in():
    """Runs in separate environments: lib-a and lib-b ran in the first, lib-c in the second (where the first only
    skipped it, unavailable); lib-d ran nowhere and keeps the first run's skip with its reason."""
    first = _results() + [_skip("lib-c"), _skip("lib-d", "adapter unavailable: lib-d is not installed")]
    c = CheckResult("c1", "lib-c", "float32", "cpu", "out", "pass", ("SCALE-1",), 1e-8, None, 1e-6, 0.01)
    second = [_skip("lib-a"), c, _skip("lib-d", "adapter unavailable: elsewhere too")]
    merged = report.merge({"main": first, "other-env": second})
    assert merged == _results() + [_skip("lib-d", "adapter unavailable: lib-d is not installed"), c]


def test_an_adapter_that_ran_in_two_runs_is_refused():
    with pytest.raises(ValueError, match="adapter 'lib-a' ran in both one and two: expected it in one run"):
        report.merge({"one": _results(), "two": _results()[:1]})


def test_the_report_command_merges_folders_and_names_a_folder_without_results(tmp_path):
    """`python -m conformance report DIR... --out DIR` writes the four files of one merged report; a folder that
    `run --report` did not write is a usage error (exit 2) naming it."""
    import sys

    from conformance.cli import main

    (tmp_path / "a").mkdir()
    report.write_reports([_skip("lib-c")] + _results(), tmp_path / "a")
    report.write_reports([CheckResult("c1", "lib-c", "float32", "cpu", "out", "pass", ("SCALE-1",))], tmp_path / "b")
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]) == 1  # lib-b
    merged = report.load_results(tmp_path / "m" / "results.jsonl")
    assert [r.status for r in merged if r.adapter == "lib-c"] == ["pass"]
    assert {p.name for p in (tmp_path / "m").iterdir()} >= {"results.jsonl", "matrix.md", "report.html"}
    assert main(["report", str(tmp_path / "b"), "--out", str(tmp_path / "m2"), "--adapter", "lib-c"]) == 0
    missing = subprocess.run(
        [sys.executable, "-m", "conformance", "report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m3")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2
    assert "nowhere: expected a folder that `run --report` wrote (with results.jsonl), got none" in missing.stderr
