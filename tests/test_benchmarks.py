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


@pytest.mark.fused  # FlexAttention eager (and Triton's interpreter where installed): .ci/run's fused tier
def test_the_gpu_benchmark_runs_its_code_on_the_cpu(tmp_path):
    """``benchmarks/gpu_bench.py`` (what ``python -m benchmarks --gpu`` runs on a CUDA device) on the CPU: every
    row is timed or says why not, the ratios are to the SDPA anchor, and the table has its sections (a smoke run
    of the code path; its numbers mean nothing)."""
    from benchmarks import gpu_bench

    path = tmp_path / "gpu.json"
    args = ["--device", "cpu", "--lengths", "32", "--dtypes", "float32", "--head-dims", "16", "--modes", "forward"]
    assert gpu_bench.main([*args, "--repeats", "1", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    timed = {(r["impl"], r["scheme"]) for r in result["records"] if r.get("seconds", 0) > 0}
    assert {("sdpa (anchor)", "vanilla"), ("flex", "shaw"), ("flex", "alibi"), ("flex", "t5")} <= timed
    assert all("seconds" in r or r["note"] for r in result["records"])
    assert {r["impl"] for r in result["ratios"]} >= {"flex"}
    for r in result["ratios"]:
        anchor = next(
            a["seconds"] for a in result["records"] if a["impl"] == "sdpa (anchor)" and a["causal"] == r["causal"]
        )
        assert r["ratio"] == pytest.approx(r["seconds"] / anchor)
    table = gpu_bench.markdown(result)
    assert "## Ratios to SDPA (vanilla)" in table and "## Targets (bfloat16, L = 4096, forward)" in table


def test_the_gpu_run_says_when_there_is_no_cuda_device(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the GPU run would run")
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--gpu", "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "python -m benchmarks --gpu: no CUDA device here (torch.cuda.is_available() is False)" in out.stderr
