"""Ring attention's scaling on one machine: per-shard memory and communication against the unsharded call.

``python -m benchmarks.ring_memory [--out DIR]`` compiles ``jax_impl.ring_attention`` for n = 1, 2, 4, 8 shards of
8 host devices (``--xla_force_host_platform_device_count=8``, set here before JAX starts) and the unsharded
``jax_impl.attention``, forward and forward+backward, and reads XLA's own memory analysis of each compiled
program: the temporary memory one device's program needs (its activations). Communication per ring step is
counted from the shapes: every shard sends its key and value block and their positions and key indices once
per step (n - 1 steps forward; the backward sends the blocks' gradients as many times again). Wall-clock
scaling needs real devices and is not measured here. Writes ``ring_memory.json``, ``ring_memory.md`` and
``ring_memory.png`` to ``--out``. Axis legend (AXES-1): B, H, L, d; n shards.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
SHARDS = (1, 2, 4, 8)
B, H, D_HEAD, SHAW_K = 1, 8, 64, 16


def measure(lengths, shards) -> list:
    """[{L, shards, mode, temp_mib, comm_mib_per_step}], the unsharded rows with shards = 0."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={max(shards)}"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    import jax_impl
    import numpy_ref
    from spec import AttentionSpec, Shaw

    spec = AttentionSpec(H, D_HEAD, relative=Shaw(SHAW_K), causal=True)
    params = {k: jnp.asarray(a, jnp.float32) for k, a in numpy_ref.init_params(spec, 0).items()}
    rows = []
    for L in lengths:
        x = jax.ShapeDtypeStruct((B, L, spec.model_dim), jnp.float32)
        calls = {0: lambda p, x: jax_impl.attention(spec, p, x)}
        for n in shards:
            mesh = Mesh(np.array(jax.devices()[:n]), ("seq",))
            calls[n] = (lambda mesh: lambda p, x: jax_impl.ring_attention(
                spec, p, x, mesh=mesh, axis_name="seq", layout="zigzag"))(mesh)  # fmt: skip
        for n, f in calls.items():
            for mode in ("forward", "forward+backward"):
                g = f if mode == "forward" else jax.grad(lambda p, x, f=f: f(p, x).sum(), argnums=(0, 1))
                analysis = jax.jit(g).lower(params, x).compile().memory_analysis()
                # per step each shard sends k and v (B, Hkv, L / n, d) in float32, positions and indices in int32
                comm = 0.0 if n in (0, 1) else B * (L // n) * (2 * spec.kv_heads * D_HEAD * 4 + 2 * 4) / 2**20
                rows.append({
                    "L": L, "shards": n, "mode": mode, "temp_mib": analysis.temp_size_in_bytes / 2**20,
                    "comm_mib_per_step": comm * (2 if mode == "forward+backward" else 1),
                })  # fmt: skip
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def markdown(rows: list) -> str:
    lines = [
        "# Ring attention: memory per shard and communication",
        "",
        f"jax_impl.ring_attention (zigzag layout, causal Shaw k = {SHAW_K}, B = {B}, H = {H}, d = {D_HEAD}, float32) "
        "compiled for n host devices; temporary memory of one device's program from XLA's memory analysis; "
        "shards = 0 is the unsharded jax_impl.attention. Communication: what one shard sends per ring step.",
        "",
        "| L | mode | unsharded MiB | " + " | ".join(f"n={n} MiB" for n in SHARDS) + " | n=8 comm MiB/step |",
        "|---|---|---|" + "---|" * len(SHARDS) + "---|",
    ]
    for L in sorted({r["L"] for r in rows}):
        for mode in ("forward", "forward+backward"):
            pick = {r["shards"]: r for r in rows if r["L"] == L and r["mode"] == mode}
            cells = [f"{pick[n]['temp_mib']:.0f}" if n in pick else "-" for n in (0, *SHARDS)]
            comm = f"{pick[8]['comm_mib_per_step']:.2f}" if 8 in pick else "-"
            lines.append(f"| {L} | {mode} | " + " | ".join(cells) + f" | {comm} |")
    return "\n".join(lines) + "\n"


def plot(rows: list, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for L in sorted({r["L"] for r in rows}):
        for mode, style in (("forward", "-"), ("forward+backward", "--")):
            mine = [r for r in rows if r["L"] == L and r["mode"] == mode and r["shards"]]
            pts = sorted((r["shards"], r["temp_mib"]) for r in mine)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=f"L={L} {mode}")
            first = pts[0][1]
            ax.plot([p[0] for p in pts], [first / p[0] for p in pts], ":", color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("shards n")
    ax.set_ylabel("temporary memory per shard (MiB)")
    ax.set_title("ring attention, per-shard memory (dotted: 1/n)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ring_memory", description=__doc__)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--shards", type=int, nargs="+", default=list(SHARDS))
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = measure(args.lengths, args.shards)
    (out / "ring_memory.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    (out / "ring_memory.md").write_text(markdown(rows), encoding="utf-8")
    try:
        plot(rows, out / "ring_memory.png")
    except ImportError:
        print("matplotlib is not installed: no plot (pip install attnspec[bench])", file=sys.stderr)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
