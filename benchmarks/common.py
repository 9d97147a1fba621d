"""Shared pieces of the benchmarks: configurations, timing, flop counts, records."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field

B, H, D_HEAD = 2, 8, 64  # batch, heads, head dim (AXES-1: B, H, d)
SHAW_K = 16
CPU_LENGTHS = (256, 512, 1024, 2048)
GPU_LENGTHS = (256, 512, 1024, 2048, 4096)

#: (name, what it is) of every measured implementation; "anchor" rows are the
#: framework's own fused vanilla attention, the denominators of the ratios.
SCHEMES = ("vanilla", "shaw", "huang", "huang-causal")


def spec_for(scheme: str, L: int):
    """The measured layer of each scheme (the causal anchors use vanilla-causal)."""
    from spec import AttentionSpec, Huang, Shaw

    return {
        "vanilla": AttentionSpec(H, D_HEAD),
        "vanilla-causal": AttentionSpec(H, D_HEAD, causal=True),
        "shaw": AttentionSpec(H, D_HEAD, relative=Shaw(SHAW_K)),
        "huang": AttentionSpec(H, D_HEAD, relative=Huang(L)),
        "huang-causal": AttentionSpec(H, D_HEAD, relative=Huang(L), causal=True),
    }[scheme]


@dataclass
class Record:
    framework: str
    impl: str  # e.g. "torch_impl", "sdpa (anchor)", "shaw seed (naive)"
    scheme: str  # vanilla | vanilla-causal | shaw | huang | huang-causal
    L: int
    dtype: str
    device: str
    mode: str  # forward | forward+backward | core
    seconds: float
    repeats: int
    gflops: float = 0.0
    peak_mb: float | None = None
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def vanilla_flops(L: int, b: int = B, h: int = H, d: int = D_HEAD) -> float:
    """4 B H L^2 d: QK^T and WV, the count every scheme is reported against."""
    return 4.0 * b * h * L * L * d


def median_time(fn, sync=lambda: None, repeats: int = 5, warmup: int = 1, budget_s: float = 20.0) -> tuple[float, int]:
    """Median wall time of ``fn`` over ``repeats`` runs after ``warmup`` runs (fewer if it is slow)."""
    for _ in range(warmup):
        fn()
        sync()
    times = []
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s and len(times) >= 1:
            break
    return statistics.median(times), len(times)


def timed_record(framework: str, impl: str, scheme: str, L: int, dtype: str, device: str, mode: str, fn,
                 sync=lambda: None, repeats: int = 5, warmup: int = 1) -> Record:
    """Time ``fn`` (median), count vanilla GFLOP/s (x3 with the backward pass), log one line."""
    import sys

    seconds, n = median_time(fn, sync, repeats=repeats, warmup=warmup)
    flops = vanilla_flops(L) * (3 if mode != "forward" else 1)
    print(f"{framework:5s} {impl:30s} {scheme:14s} L={L:5d} {mode:16s} {seconds * 1e3:10.2f} ms",
          file=sys.stderr, flush=True)
    return Record(framework, impl, scheme, L, dtype, device, mode, seconds, n, gflops=flops / seconds / 1e9)


def write_json(records: list, path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump([r.to_json() for r in records], f, indent=1)


def bench_main(run, argv=None) -> None:
    """The command line of one framework's timing process (spawned by ``python -m benchmarks``)."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--modes", nargs="+", default=["forward", "forward+backward"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    write_json(run(args.lengths, args.device, args.dtype, args.modes, args.quick), args.json)
