"""``python -m benchmarks``: speed and memory of relative attention against fused vanilla attention.

One process per framework for the timings (stable ratios on a noisy
machine), one process per configuration for peak memory. Writes
``results.json``, ``results.md`` and ``time_vs_length.png`` to ``--out``.

``python -m benchmarks --gpu`` is the one prepared run for a machine with a
CUDA device, within ``--budget`` seconds (default 480): the conformance
matrix of every kernel on the GPU (``--device cuda --device gpu``, bfloat16
and float32, a part of the budget), then the fused kernels' benchmark
(``benchmarks/gpu_bench.py``) until the budget ends; it writes
``conformance/`` and ``gpu.json``, ``gpu.md`` to ``--out`` and prints the
table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

from .common import CPU_LENGTHS, D_HEAD, GPU_LENGTHS, SHAW_K, B, H

HERE = pathlib.Path(__file__).resolve().parent

#: (scheme, anchor scheme, mode, limit) at L = 1024 on the CPU, float32 (the project's targets).
TARGETS = [
    ("shaw", "vanilla", "forward", 1.6),
    ("huang", "vanilla", "forward", 2.0),
    ("huang-causal", "vanilla-causal", "forward", 1.6),
    ("shaw", "vanilla", "forward+backward", 2.0),
    ("huang", "vanilla", "forward+backward", 2.5),
    ("rope", "vanilla", "forward", 1.15),
    ("alibi", "vanilla", "forward", 1.3),
    ("t5", "vanilla", "forward", 1.3),
    ("swin", "vanilla", "forward", 1.3),
]
TARGET_L = 1024
OURS = {"torch": "torch_impl", "jax": "jax_impl"}
ANCHOR = {"torch": "sdpa (anchor)", "jax": "dot_product_attention (anchor)"}
MEMORY_RUNS = [
    ("torch", "sdpa (anchor)", "vanilla"),
    ("torch", "torch_impl", "shaw"),
    ("torch", "shaw seed (naive)", "shaw"),
    ("torch", "torch_impl", "huang"),
    ("jax", "dot_product_attention (anchor)", "vanilla"),
    ("jax", "jax_impl", "shaw"),
]


def available(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def gpu_present(framework: str) -> bool:
    code = {
        "torch": "import torch; print(torch.cuda.is_available())",
        "jax": "import jax; print(any(d.platform == 'gpu' for d in jax.devices()))",
    }[framework]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return out.stdout.strip() == "True"


def run_timings(framework: str, lengths, device, dtype, quick) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "out.json"
        cmd = [
            sys.executable,
            "-m",
            f"benchmarks.{framework}_bench",
            "--lengths",
            *map(str, lengths),
            "--device",
            device,
            "--dtype",
            dtype,
            "--json",
            str(path),
        ] + (["--quick"] if quick else [])
        subprocess.run(cmd, check=True, cwd=HERE.parent)
        return json.loads(path.read_text())


def run_memory(framework, impl, scheme, L, device) -> float | None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", framework, impl, scheme, str(L), device],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
    )
    if out.returncode != 0:
        print(
            f"memory run failed: {framework} {impl} {scheme} L={L}: {out.stderr.strip().splitlines()[-1:]}",
            file=sys.stderr,
        )
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]


def ratio_rows(records: list) -> list:
    """time(ours, scheme) / time(anchor, vanilla or vanilla-causal) per framework, device, dtype, L, mode."""
    index = {
        (r["framework"], r["impl"], r["scheme"], r["L"], r["mode"], r["device"], r["dtype"]): r["seconds"]
        for r in records
    }
    rows = []
    for (fw, impl, scheme, L, mode, device, dtype), t in sorted(index.items()):
        if impl != OURS.get(fw):
            continue
        anchor_scheme = "vanilla-causal" if scheme.endswith("causal") else "vanilla"
        anchor = index.get((fw, ANCHOR[fw], anchor_scheme, L, mode, device, dtype))
        if anchor:
            rows.append(
                {
                    "framework": fw,
                    "scheme": scheme,
                    "L": L,
                    "mode": mode,
                    "device": device,
                    "dtype": dtype,
                    "seconds": t,
                    "anchor_seconds": anchor,
                    "ratio": t / anchor,
                }
            )
    return rows


def seed_speedups(records: list) -> list:
    out = []
    for r in records:
        if r["impl"].endswith("(naive)") and r["mode"] == "forward":
            ours = next(
                (
                    o
                    for o in records
                    if o["impl"] == "torch_impl"
                    and o["scheme"] == r["scheme"]
                    and o["L"] == r["L"]
                    and o["mode"] == "forward"
                    and o["device"] == r["device"]
                    and o["dtype"] == r["dtype"]
                ),
                None,
            )
            if ours:
                out.append(
                    {
                        "baseline": r["impl"],
                        "scheme": r["scheme"],
                        "L": r["L"],
                        "device": r["device"],
                        "baseline_seconds": r["seconds"],
                        "ours_seconds": ours["seconds"],
                        "speedup": r["seconds"] / ours["seconds"],
                    }
                )
    return out


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        "# attnspec benchmarks",
        "",
        f"Machine: {env['machine']}; {env['cpus']} CPUs; Python {env['python']}; "
        f"torch {env.get('torch', '-')}; jax {env.get('jax', '-')}. "
        f"B = {B}, H = {H}, d = {D_HEAD}, Shaw k = {SHAW_K}, Huang max_len = L. "
        "Times are medians of interleaved rounds (every implementation once per round); GFLOP/s count "
        "the vanilla 4 B H L^2 d for every scheme (x3 for forward+backward). Modes: forward and "
        "forward+backward of the whole layer (projections + attention); core = the layer's forward minus "
        "a projections-only forward timed in the same rounds.",
        "",
    ]
    lines += [
        "## Ratios to the framework's fused vanilla attention",
        "",
        "| framework | device | dtype | mode | scheme | " + " | ".join(f"L={L}" for L in result["lengths"]) + " |",
        "|---|---|---|---|---|" + "---|" * len(result["lengths"]),
    ]
    rows = result["ratios"]
    keys = sorted({(r["framework"], r["device"], r["dtype"], r["mode"], r["scheme"]) for r in rows})
    for key in keys:
        cells = []
        for L in result["lengths"]:
            r = next(
                (
                    r
                    for r in rows
                    if (r["framework"], r["device"], r["dtype"], r["mode"], r["scheme"]) == key and r["L"] == L
                ),
                None,
            )
            cells.append("-" if r is None else f"{r['ratio']:.2f}")
        lines.append("| " + " | ".join(key) + " | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## Targets (CPU, float32, L = {TARGET_L})",
        "",
        "| target | limit | measured | holds |",
        "|---|---|---|---|",
    ]
    for t in result["targets"]:
        measured = "not measured" if t["measured"] is None else f"{t['measured']:.2f}"
        lines.append(f"| {t['name']} | {t['limit']} | {measured} | {t['holds']} |")
    lines += [
        "",
        "## Against the naive seed algorithms (forward)",
        "",
        "| baseline | L | baseline ms | torch_impl ms | speedup |",
        "|---|---|---|---|---|",
    ]
    for s in result["seed_speedups"]:
        lines.append(
            f"| {s['baseline']} | {s['L']} | {s['baseline_seconds'] * 1e3:.1f} | "
            f"{s['ours_seconds'] * 1e3:.1f} | {s['speedup']:.1f}x |"
        )
    lines += [
        "",
        "## Peak memory of one forward pass (MiB, growth during the call)",
        "",
        "| framework | impl | scheme | " + " | ".join(f"L={L}" for L in result["lengths"]) + " |",
        "|---|---|---|" + "---|" * len(result["lengths"]),
    ]
    mem = result["memory"]
    for fw, impl, scheme in MEMORY_RUNS:
        cells = [
            next(
                (
                    f"{m['peak_mb']:.0f}"
                    for m in mem
                    if (m["framework"], m["impl"], m["scheme"], m["L"]) == (fw, impl, scheme, L)
                    and m["peak_mb"] is not None
                ),
                "-",
            )
            for L in result["lengths"]
        ]
        if any(c != "-" for c in cells):
            lines.append(f"| {fw} | {impl} | {scheme} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## All timings",
        "",
        "| framework | impl | scheme | mode | L | ms | GFLOP/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(result["records"], key=lambda r: (r["framework"], r["impl"], r["scheme"], r["mode"], r["L"])):
        lines.append(
            f"| {r['framework']} | {r['impl']} | {r['scheme']} | {r['mode']} | {r['L']} | "
            f"{r['seconds'] * 1e3:.1f} | {r['gflops']:.1f} |"
        )
    gpu = result.get("gpu")
    lines += ["", "## GPU", "", gpu if isinstance(gpu, str) else "see the tables above (device cuda / gpu)"]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted(
        {f"{r['framework']}: {r['impl']} / {r['scheme']}" for r in result["records"] if r["device"] == "cpu"}
    )
    colors = {label: plt.get_cmap("tab20")(i % 20) for i, label in enumerate(labels)}
    fig, axes = plt.subplots(1, 2, figsize=(15, 5))
    for ax, mode in zip(axes, ("forward", "forward+backward")):
        series: dict = {}
        for r in result["records"]:
            if r["mode"] == mode and r["device"] == "cpu":
                series.setdefault(f"{r['framework']}: {r['impl']} / {r['scheme']}", []).append((r["L"], r["seconds"]))
        for label, pts in sorted(series.items()):
            pts.sort()
            style = "--" if "anchor" in label else (":" if "naive" in label else "-")
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                style,
                marker="o",
                markersize=3,
                label=label,
                color=colors[label],
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_ylabel("seconds (median)")
        ax.set_title(f"{mode}, CPU float32, B={B} H={H} d={D_HEAD}")
        ax.grid(True, which="both", alpha=0.3)
    handles = {h.get_label(): h for ax in axes for h in ax.get_lines()}
    fig.legend(
        [handles[k] for k in sorted(handles)],
        sorted(handles),
        loc="center right",
        fontsize=7,
        title="dashed: fused anchor; dotted: seed algorithm",
    )
    fig.tight_layout(rect=(0, 0, 0.74, 1))
    fig.savefig(path, dpi=110)


#: The kernels' adapters the GPU run certifies on the device (KERN-1), in this order while its share of the budget
#: lasts.
GPU_ADAPTERS = ("torch:triton", "torch:flex", "torch:sdpa", "torch:tiles", "torch", "jax:pallas", "jax:tiles", "jax")


def run_gpu(out: pathlib.Path, budget: float, quick: bool) -> int:
    """The conformance matrix on the GPU, then the GPU benchmark, within ``budget`` seconds."""
    if not gpu_present("torch"):
        print("python -m benchmarks --gpu: no CUDA device here (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    start = time.time()
    deadline = start + budget
    cmd = [sys.executable, "-m", "conformance", "run", "--device", "cuda", "--device", "gpu", "--dtype", "bfloat16",
           "--dtype", "float32", "--report", str(out / "conformance"), "--no-progress", "--jobs", "1"]  # fmt: skip
    for name in GPU_ADAPTERS:
        cmd += ["--adapter", name]
    try:
        done = subprocess.run(cmd, cwd=HERE.parent, timeout=0.4 * budget, capture_output=True, text=True)
        conformance = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    except subprocess.TimeoutExpired:
        conformance = f"stopped after {0.4 * budget:.0f} s (its share of --budget): see {out / 'conformance'}"
    path = out / "gpu.json"
    bench = [sys.executable, "-m", "benchmarks.gpu_bench", "--json", str(path), "--deadline", str(deadline - 30)]
    if quick:
        bench += ["--lengths", "1024", "4096", "--repeats", "3"]
    subprocess.run(bench, cwd=HERE.parent, check=True)
    from . import gpu_bench

    result = json.loads(path.read_text(encoding="utf-8"))
    result["conformance"] = conformance
    result["seconds"] = time.time() - start
    path.write_text(json.dumps(result, indent=1), encoding="utf-8")
    table = gpu_bench.markdown(result) + f"\nConformance on the GPU: {conformance}\n"
    (out / "gpu.md").write_text(table, encoding="utf-8")
    print(table)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--out", default=str(HERE / "results"), help="output folder (default benchmarks/results)")
    ap.add_argument(
        "--lengths", type=int, nargs="+", help="sequence lengths (default 256 512 1024 2048; plus 4096 on a GPU)"
    )
    ap.add_argument("--frameworks", nargs="+", default=["torch", "jax"], choices=["torch", "jax"])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--replot", action="store_true", help="only redraw table and plot from --out/results.json")
    ap.add_argument("--gpu", action="store_true", help="the prepared GPU run: conformance, then gpu_bench")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for --gpu (default 480)")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.gpu:
        return run_gpu(out, args.budget, args.quick)
    if args.replot:
        result = json.loads((out / "results.json").read_text(encoding="utf-8"))
        (out / "results.md").write_text(markdown(result), encoding="utf-8")
        plot(result, out / "time_vs_length.png")
        return 0
    records, memory, gpu_note = [], [], "not measured: no GPU on the machine that produced these results"
    versions = {}
    for fw in args.frameworks:
        if not available({"torch": "torch_impl", "jax": "jax_impl"}[fw]) or not available(fw):
            print(f"skipping {fw}: not installed", file=sys.stderr)
            continue
        versions[fw] = __import__(fw).__version__
        lengths = args.lengths or CPU_LENGTHS
        records += run_timings(fw, lengths, "cpu", "float32", args.quick)
        if gpu_present(fw):
            device = "cuda" if fw == "torch" else "gpu"
            gl = args.lengths or GPU_LENGTHS
            for dtype in ("float32", "bfloat16"):
                records += run_timings(fw, gl, device, dtype, args.quick)
            gpu_note = None
    lengths = sorted({r["L"] for r in records})
    if not args.no_memory:
        for fw, impl, scheme in MEMORY_RUNS:
            if fw in versions:
                for L in lengths:
                    if impl == "shaw seed (naive)" and L > 2048:
                        continue
                    memory.append(
                        {
                            "framework": fw,
                            "impl": impl,
                            "scheme": scheme,
                            "L": L,
                            "peak_mb": run_memory(fw, impl, scheme, L, "cpu"),
                        }
                    )
    ratios = ratio_rows(records)
    targets = []
    for scheme, anchor, mode, limit in TARGETS:
        for fw in versions:
            r = next(
                (
                    r
                    for r in ratios
                    if r["framework"] == fw
                    and r["scheme"] == scheme
                    and r["mode"] == mode
                    and r["L"] == TARGET_L
                    and r["device"] == "cpu"
                    and r["dtype"] == "float32"
                ),
                None,
            )
            measured = None if r is None else r["ratio"]
            targets.append(
                {
                    "name": f"{fw} {scheme} / fused {anchor}, {mode}",
                    "limit": limit,
                    "measured": measured,
                    "holds": "not measured" if measured is None else ("yes" if measured <= limit else "NO"),
                }
            )
    speedups = seed_speedups(records)
    for s in speedups:
        if s["L"] == TARGET_L:
            limit = 10 if "shaw" in s["baseline"] else 100
            targets.append(
                {
                    "name": f"torch_impl vs {s['baseline']} speedup (x)",
                    "limit": f">= {limit}",
                    "measured": s["speedup"],
                    "holds": "yes" if s["speedup"] >= limit else "NO",
                }
            )
    mem_ours = next(
        (m["peak_mb"] for m in memory if m["impl"] == "torch_impl" and m["scheme"] == "shaw" and m["L"] == 2048), None
    )
    mem_seed = next((m["peak_mb"] for m in memory if m["impl"] == "shaw seed (naive)" and m["L"] == 2048), None)
    if mem_ours is not None and mem_seed is not None:
        ratio = mem_seed / max(mem_ours, 1.0)  # growth below 1 MiB counts as 1 MiB
        targets.append(
            {
                "name": "Shaw peak memory, materialised-table baseline / torch_impl (x), L=2048",
                "limit": ">= 4",
                "measured": ratio,
                "holds": "yes" if ratio >= 4 else "NO",
            }
        )
    result = {
        "environment": {
            "machine": platform.processor() or platform.machine(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            **versions,
        },
        "lengths": lengths,
        "records": records,
        "ratios": ratios,
        "targets": targets,
        "seed_speedups": speedups,
        "memory": memory,
        "gpu": gpu_note,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    (out / "results.md").write_text(markdown(result), encoding="utf-8")
    try:
        plot(result, out / "time_vs_length.png")
    except ImportError:
        print("matplotlib is not installed: no plot (pip install attnspec[bench])", file=sys.stderr)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
