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
    from spec import Alibi, AttentionSpec, Huang, Rope, Shaw, Swin, T5Bias

    return {
        "vanilla": AttentionSpec(H, D_HEAD),
        "vanilla-causal": AttentionSpec(H, D_HEAD, causal=True),
        "shaw": AttentionSpec(H, D_HEAD, relative=Shaw(SHAW_K)),
        "huang": AttentionSpec(H, D_HEAD, relative=Huang(L)),
        "huang-causal": AttentionSpec(H, D_HEAD, relative=Huang(L), causal=True),
        "rope": AttentionSpec(H, D_HEAD, relative=Rope()),  # the whole head, half layout
        "alibi": AttentionSpec(H, D_HEAD, relative=Alibi()),
        "t5": AttentionSpec(H, D_HEAD, relative=T5Bias()),
        "swin": AttentionSpec(H, D_HEAD, relative=Swin((max(1, L // 32), 32))),  # one window of L tokens
    }[scheme]


@dataclass
class Record:
    framework: str
    impl: str  # e.g. "torch_impl", "sdpa (anchor)", "shaw seed (naive)"
    scheme: str  # vanilla | vanilla-causal | shaw | huang | huang-causal | rope | alibi | t5 | swin
    L: int
    dtype: str
    device: str
    mode: str  # forward | forward+backward | core (attention without the projections)
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


def interleaved_medians(fns: dict, sync=lambda: None, rounds: int = 5, warmup: int = 1, budget_s: float = 60.0) -> dict:
    """Median wall time of every function in ``fns``, timed in interleaved rounds.

    Each round runs every function once, so a slow spell of a shared machine
    falls on all of them alike and the ratios between them stay stable.
    Returns {key: (median seconds, runs)}; fewer rounds if the budget runs out.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
            sync()
    times = {key: [] for key in fns}
    start = time.perf_counter()
    for _ in range(rounds):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[key].append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return {key: (statistics.median(ts), len(ts)) for key, ts in times.items()}


def make_record(
    framework: str,
    impl: str,
    scheme: str,
    L: int,
    dtype: str,
    device: str,
    mode: str,
    seconds: float,
    repeats: int,
    notes: str = "",
) -> Record:
    """One measurement, with vanilla GFLOP/s (x3 with the backward pass); logs one line."""
    import sys

    flops = vanilla_flops(L) * (3 if mode == "forward+backward" else 1)
    print(
        f"{framework:5s} {impl:30s} {scheme:14s} L={L:5d} {mode:16s} {seconds * 1e3:10.2f} ms",
        file=sys.stderr,
        flush=True,
    )
    return Record(
        framework, impl, scheme, L, dtype, device, mode, seconds, repeats, gflops=flops / seconds / 1e9, notes=notes
    )


def timed_record(
    framework: str,
    impl: str,
    scheme: str,
    L: int,
    dtype: str,
    device: str,
    mode: str,
    fn,
    sync=lambda: None,
    repeats: int = 5,
    warmup: int = 1,
) -> Record:
    """Time ``fn`` alone (median) and make its record."""
    ((seconds, n),) = interleaved_medians({impl: fn}, sync, rounds=repeats, warmup=warmup, budget_s=20.0).values()
    return make_record(framework, impl, scheme, L, dtype, device, mode, seconds, n)


#: The implementation name of the projections-only layer: the attention-core
#: time of an implementation is its module forward minus this, both measured
#: in the same interleaved rounds.
PROJECTIONS = "projections only"
CORE_NOTE = "module forward minus the projections-only forward, same rounds"


def timed_records(
    framework: str, fns: dict, L: int, dtype: str, device: str, mode: str, sync=lambda: None, rounds: int = 5
) -> list:
    """Records for {(impl, scheme): fn} timed together; with mode forward also the derived core times."""
    medians = interleaved_medians(fns, sync, rounds=rounds)
    records = [
        make_record(framework, impl, scheme, L, dtype, device, mode, s, n)
        for (impl, scheme), (s, n) in medians.items()
        if impl != PROJECTIONS
    ]
    proj = next((s for (impl, _), (s, _n) in medians.items() if impl == PROJECTIONS), None)
    if mode == "forward" and proj is not None:
        for (impl, scheme), (s, n) in medians.items():
            if impl != PROJECTIONS and s > proj:
                records.append(
                    make_record(framework, impl, scheme, L, dtype, device, "core", s - proj, n, notes=CORE_NOTE)
                )
    return records


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
