"""The fused kernels on a CUDA device: ``python -m benchmarks --gpu`` runs this module in a process of its own.

The attention core alone (q, k, v of shape (B, H, L, d) in, (B, H, L, d) out; no projections, which would cost
the same for every row): torch_impl's ``"triton"`` kernel for vanilla attention, Shaw (keys and values, k = 16),
ALiBi and T5, and its ``"flex"`` kernel (compiled FlexAttention, the same logit terms as one ``score_mod``; Shaw's
value term from its log-sum-exp) against ``F.scaled_dot_product_attention`` (FlashAttention for 16-bit inputs,
the memory-efficient kernel for float32, which flash does not take). B = 2, H = 16; L, d, dtypes, causal and
not; forward and forward+backward; peak memory of one forward+backward above the inputs. Every configuration
runs until ``--deadline`` (seconds since the epoch); what is left is written as not measured.

On a machine without a CUDA device ``--device cpu`` runs the same code (FlexAttention eager, Triton's
interpreter when installed, forward only): a smoke run, not a measurement.
Axis legend (AXES-1): B, H, L (= Lq = Lk), d.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import numpy_ref
from spec import Alibi, AttentionSpec, Shaw, T5Bias
from torch_impl import _core
from torch_impl.kernels import Flex, Triton, flex, fused

B, H = 2, 16
SHAW_K = 16
LENGTHS = (1024, 2048, 4096, 8192, 16384)
#: The targets on an H100/H200-class GPU, bfloat16, L = 4096 (causal and not): ratio to SDPA's vanilla attention.
TARGET_L = 4096
TARGETS = {"shaw": 1.3, "alibi": 1.2, "t5": 1.2}


def spec_for(scheme: str, d: int, causal: bool) -> AttentionSpec:
    relative = {"vanilla": None, "shaw": Shaw(SHAW_K), "alibi": Alibi(), "t5": T5Bias()}[scheme]
    return AttentionSpec(H, d, relative=relative, causal=causal)


def params_for(spec: AttentionSpec, device, dtype) -> dict:
    """The scheme's tables (Shaw's rel_k, rel_v; T5's rel_b) as tensors; the projections are not used."""
    p = numpy_ref.init_params(spec, seed=0)
    return {n: torch.as_tensor(a, dtype=dtype, device=device) for n, a in p.items() if n.startswith("rel_")}


def core(kernel, spec: AttentionSpec, params: dict):
    """q, k, v (B, H, L, d) -> o (B, H, L, d) through one torch_impl kernel (KERN-1), the call's checks done."""
    module = fused if kernel.name == "triton" else flex

    def f(q, k, v):
        call = _core.Call(q.shape[0], q.shape[2], k.shape[2], q.device, causal=spec.causal, dtype=q.dtype)
        reason = kernel.unsupported(spec, call)
        if reason is not None:
            raise ValueError(f"{kernel.name}: {reason}")
        return module.attention(kernel, spec, params, q, k, v, call)

    return f


def sdpa(spec: AttentionSpec):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=spec.causal)


def rows(device: str) -> list:
    """(impl, scheme) of every timed row; the anchor first."""
    out = [("sdpa (anchor)", "vanilla")]
    if not fused.triton_unavailable():
        out += [("triton", s) for s in ("vanilla", "shaw", "alibi", "t5")]
    out += [("flex", s) for s in ("shaw", "alibi", "t5")]
    return out


def layer(impl: str, scheme: str, d: int, causal: bool, device, dtype):
    spec = spec_for(scheme, d, causal)
    params = params_for(spec, device, dtype)
    if impl == "sdpa (anchor)":
        return sdpa(spec), params
    kernel = Triton() if impl == "triton" else Flex(compiled=device.type == "cuda")
    return core(kernel, spec, params), params


def timed(fn, sync, repeats: int) -> float:
    fn()
    sync()  # compile, warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(device_name: str, lengths, dtypes, head_dims, modes, deadline: float, repeats: int) -> list:
    device = torch.device(device_name)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    records = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for d in head_dims:
            for causal in (False, True):
                for L in lengths:
                    q, k, v = (torch.randn(B, H, L, d, device=device, dtype=dtype) for _ in range(3))
                    for impl, scheme in rows(device.type):
                        for mode in modes:
                            record = {
                                "impl": impl, "scheme": scheme, "L": L, "d": d, "dtype": dtype_name,
                                "causal": causal, "mode": mode, "device": device.type,
                            }  # fmt: skip
                            records.append(record)
                            if time.time() > deadline:
                                record["note"] = "not measured: the time budget ran out"
                                continue
                            try:
                                record.update(measure(impl, scheme, mode, q, k, v, causal, sync, repeats))
                            except Exception as e:  # a row that cannot run says why, the others go on
                                record["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                            print(json.dumps(record), file=sys.stderr, flush=True)
                    del q, k, v
    return records


def measure(impl, scheme, mode, q, k, v, causal, sync, repeats) -> dict:
    f, params = layer(impl, scheme, q.shape[-1], causal, q.device, q.dtype)
    if mode == "forward":

        def fn():
            with torch.no_grad():
                f(q, k, v)
    else:
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        for t in params.values():
            t.requires_grad_()
        grad = torch.randn_like(q)

        def fn():
            f(*leaves).backward(grad)

    seconds = timed(fn, sync, repeats)
    out = {"seconds": seconds}
    if q.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        sync()
        out["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return out


def ratios(records: list) -> list:
    """time / time of the anchor (SDPA, vanilla) of the same L, d, dtype, causal rule and mode."""
    anchor = {
        (r["L"], r["d"], r["dtype"], r["causal"], r["mode"]): r["seconds"]
        for r in records
        if r["impl"] == "sdpa (anchor)" and "seconds" in r
    }
    out = []
    for r in records:
        key = (r["L"], r["d"], r["dtype"], r["causal"], r["mode"])
        if r["impl"] != "sdpa (anchor)" and "seconds" in r and key in anchor:
            out.append({**r, "ratio": r["seconds"] / anchor[key]})
    return out


def targets(ratio_rows: list) -> list:
    """Issue targets at L = 4096 in bfloat16: each scheme's triton row within its limit of the anchor, and faster
    than the flex row with the same terms."""
    out = []
    for scheme, limit in TARGETS.items():
        for causal in (False, True):
            for d in sorted({r["d"] for r in ratio_rows}):
                pick = {
                    r["impl"]: r["ratio"]
                    for r in ratio_rows
                    if (r["scheme"], r["causal"], r["d"], r["L"], r["dtype"], r["mode"])
                    == (scheme, causal, d, TARGET_L, "bfloat16", "forward")
                }
                ours, other = pick.get("triton"), pick.get("flex")
                holds = "not measured" if ours is None else "yes" if ours <= limit else "NO"
                if ours is not None and other is not None and ours >= other:
                    holds = "NO (flex is faster)"
                out.append({"scheme": scheme, "causal": causal, "d": d, "limit": limit, "triton": ours, "flex": other,
                            "holds": holds})  # fmt: skip
    return out


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        "# attnspec GPU benchmark",
        "",
        f"Device: {env['device']}; torch {env['torch']}; triton {env.get('triton', '-')}. B = {B}, H = {H}, "
        f"Shaw k = {SHAW_K}. The attention core alone; times are medians; ratios are to SDPA's vanilla attention "
        "of the same L, d, dtype, causal rule and mode (flash for 16-bit inputs, memory-efficient for float32).",
        "",
        "## Ratios to SDPA (vanilla)",
        "",
    ]
    rr = result["ratios"]
    lengths = sorted({r["L"] for r in result["records"]})
    lines += [
        "| dtype | d | causal | mode | impl | scheme | " + " | ".join(f"L={L}" for L in lengths) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(lengths),
    ]
    keys = sorted({(r["dtype"], r["d"], r["causal"], r["mode"], r["impl"], r["scheme"]) for r in rr})
    for key in keys:
        cells = []
        for L in lengths:
            r = next((r for r in rr if (r["dtype"], r["d"], r["causal"], r["mode"], r["impl"], r["scheme"]) == key
                      and r["L"] == L), None)  # fmt: skip
            cells.append("-" if r is None else f"{r['ratio']:.2f}")
        lines.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(cells) + " |")
    lines += ["", f"## Targets (bfloat16, L = {TARGET_L}, forward)", "",
              "| scheme | causal | d | limit | triton | flex | holds |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in result["targets"]:
        fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"| {t['scheme']} | {t['causal']} | {t['d']} | {t['limit']} | {fmt(t['triton'])} | "
                     f"{fmt(t['flex'])} | {t['holds']} |")  # fmt: skip
    lines += ["", "## Peak memory of one forward+backward (MiB above the inputs)", "",
              "| dtype | d | causal | impl | scheme | " + " | ".join(f"L={L}" for L in lengths) + " |",
              "|---|---|---|---|---|" + "---|" * len(lengths)]  # fmt: skip
    mem = [r for r in result["records"] if "peak_mib" in r and r["mode"] == "forward+backward"]
    for key in sorted({(r["dtype"], r["d"], r["causal"], r["impl"], r["scheme"]) for r in mem}):
        cells = [
            next(
                (
                    f"{r['peak_mib']:.0f}"
                    for r in mem
                    if (r["dtype"], r["d"], r["causal"], r["impl"], r["scheme"]) == key and r["L"] == L
                ),
                "-",
            )  # fmt: skip
            for L in lengths
        ]
        lines.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(cells) + " |")
    missing = [r for r in result["records"] if "note" in r]
    if missing:
        lines += ["", "## Not measured", ""]
        lines += sorted({f"- {r['impl']} {r['scheme']}: {r['note']}" for r in missing})
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_bench", description=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--modes", nargs="+", default=["forward", "forward+backward"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--deadline", type=float, default=float("inf"), help="seconds since the epoch")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    records = run(args.device, args.lengths, args.dtypes, args.head_dims, args.modes, args.deadline, args.repeats)
    env = {"torch": torch.__version__, "device": args.device}
    if args.device == "cuda":
        env["device"] = torch.cuda.get_device_name()
    if not fused.triton_unavailable():
        import triton

        env["triton"] = triton.__version__
    rr = ratios(records)
    result = {"environment": env, "records": records, "ratios": rr, "targets": targets(rr)}
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
