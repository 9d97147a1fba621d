"""The benchmark entry point runs and writes its table, JSON and plot (a tiny smoke run).

Speed itself is measured by ``python -m benchmarks``, never asserted in tests.
"""

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the benchmarks need PyTorch: pip install attnspec[torch]")
pytest.importorskip("matplotlib", reason="the plot needs matplotlib: pip install attnspec[bench]")


def test_benchmark_entry_point_writes_table_json_and_plot(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--lengths",
            "32",
            "--frameworks",
            "torch",
            "--quick",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((tmp_path / "results.json").read_text())
    impls = {(r["impl"], r["scheme"]) for r in result["records"]}
    assert {
        ("sdpa (anchor)", "vanilla"),
        ("torch_impl", "shaw"),
        ("torch_impl", "huang-causal"),
        ("shaw seed (naive)", "shaw"),
        ("music seed (naive)", "huang"),
    } <= impls
    assert all(r["seconds"] > 0 and r["gflops"] > 0 for r in result["records"])
    assert {r["scheme"] for r in result["ratios"]} >= {"shaw", "huang", "huang-causal"}
    assert any(m["peak_mb"] is not None for m in result["memory"])
    table = (tmp_path / "results.md").read_text()
    assert "Ratios to the framework's fused vanilla attention" in table and "not measured" in table
    assert (tmp_path / "time_vs_length.png").stat().st_size > 10_000
