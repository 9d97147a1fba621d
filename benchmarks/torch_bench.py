"""PyTorch benchmarks: torch_impl against fused SDPA and against the naive seed algorithms.

RoPE (``Rope()``, the whole head rotated) is timed as the forward of
``torch_impl.MultiHeadAttention``: the rotation of q and k, then the fused
kernel that the automatic choice picks for it; its ratio is to the same
fused vanilla anchor.

Run by ``python -m benchmarks``; one process for all PyTorch timings so that
ratios are taken under the same conditions. Every implementation gets the
same projections (B, L, D) -> (B, L, D), D = H * d.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import numpy_ref
import torch_impl
from spec import AttentionSpec, Huang

from .common import D_HEAD, PROJECTIONS, B, H, bench_main, spec_for, timed_record, timed_records


def params_for(spec, device, dtype) -> dict:
    p = numpy_ref.init_params(spec, seed=0)
    return {n: torch.as_tensor(a, dtype=dtype, device=device).requires_grad_(True) for n, a in p.items()}


def _linear(x, w, b):
    """x @ w + b as one addmm, as torch_impl projects (PROJ-1)."""
    return F.linear(x, w.t(), b)


def _heads(x, w, b):
    return _linear(x, w, b).view(B, -1, H, D_HEAD).transpose(1, 2)


def sdpa_layer(spec, p):
    """The anchor: the framework's fused vanilla attention with the same projections."""

    def f(x):
        q, k, v = _heads(x, p["wq"], p["bq"]), _heads(x, p["wk"], p["bk"]), _heads(x, p["wv"], p["bv"])
        o = F.scaled_dot_product_attention(q, k, v, is_causal=spec.causal)
        return _linear(o.transpose(1, 2).reshape(x.shape), p["wo"], p["bo"])

    return f


def torch_impl_layer(spec, p):
    return lambda x: torch_impl.attention(spec, p, x)


def torch_impl_module_layer(spec, p):
    """torch_impl.MultiHeadAttention's forward with the same parameters loaded (the RoPE rows)."""
    ref = p["wq"]
    m = torch_impl.MultiHeadAttention(spec, device=ref.device, dtype=ref.dtype)
    return m.load_canonical({n: t.detach() for n, t in p.items()})


#: Schemes whose torch_impl rows time the nn.Module's forward (the parameters as nn.Linear layers)
#: rather than the functional core; both project with the same addmm.
MODULE_SCHEMES = ("rope", "alibi", "t5", "swin")


def shaw_seed_layer(spec, p):
    """What the Shaw seed program does, in this project's own code: it gathers the
    tables into (Lq, Lk, d) arrays and multiplies against them (O(L^2 d) memory)."""
    k_max = spec.relative.max_distance

    def f(x):
        L = x.shape[1]
        q, k, v = _heads(x, p["wq"], p["bq"]), _heads(x, p["wk"], p["bk"]), _heads(x, p["wv"], p["bv"])
        pos = torch.arange(L, device=x.device)
        idx = (pos[None, :] - pos[:, None]).clamp(-k_max, k_max) + k_max  # (L, L)
        table_k, table_v = p["rel_k"][idx], p["rel_v"][idx]  # (L, L, d) each
        content = q @ k.transpose(-1, -2)
        rel = q.permute(2, 0, 1, 3).reshape(L, B * H, D_HEAD) @ table_k.transpose(1, 2)  # (L, B*H, L)
        logits = (content + rel.reshape(L, B, H, L).permute(1, 2, 0, 3)) / D_HEAD**0.5
        w = torch.softmax(logits, dim=-1)
        o = w @ v + (w.permute(2, 0, 1, 3).reshape(L, B * H, L) @ table_v).reshape(L, B, H, D_HEAD).permute(1, 2, 0, 3)
        return o.transpose(1, 2).reshape(x.shape) @ p["wo"] + p["bo"]

    return f


def music_seed_layer(spec, p):
    """What the Music Transformer seed program does, in this project's own code: the
    shifted relative logits filled one (i, j) at a time by a Python double loop."""

    def f(x):
        L = x.shape[1]
        q, k, v = _heads(x, p["wq"], p["bq"]), _heads(x, p["wk"], p["bk"]), _heads(x, p["wv"], p["bv"])
        rows = p["rel_k"][spec.relative.max_len - L : spec.relative.max_len + L - 1]  # distances -(L-1)..L-1
        s_rel = q @ rows.T  # (B, H, L, 2L - 1)
        shifted = torch.zeros(B, H, L, L, dtype=x.dtype, device=x.device)
        for i in range(L):
            for j in range(L):
                shifted[..., i, j] = s_rel[..., i, j - i + L - 1]
        w = torch.softmax((q @ k.transpose(-1, -2)) / D_HEAD**0.5 + shifted, dim=-1)
        return (w @ v).transpose(1, 2).reshape(x.shape) @ p["wo"] + p["bo"]

    return f


def projections_layer(spec, p):
    """The four projections and the head split and merge of the anchor, with no attention between them."""

    def f(x):
        v = _heads(x, p["wv"], p["bv"])
        _heads(x, p["wq"], p["bq"]), _heads(x, p["wk"], p["bk"])
        return _linear(v.transpose(1, 2).reshape(x.shape), p["wo"], p["bo"])

    return f


IMPLS = {
    # impl name: (layer factory, schemes it runs, longest L it is run at)
    "sdpa (anchor)": (sdpa_layer, ("vanilla", "vanilla-causal"), None),
    "torch_impl": (
        torch_impl_layer,
        ("vanilla", "vanilla-causal", "shaw", "huang", "huang-causal", "rope", "alibi", "t5", "swin"),
        None,
    ),
    PROJECTIONS: (projections_layer, ("vanilla",), None),
    "shaw seed (naive)": (shaw_seed_layer, ("shaw",), 2048),
    "music seed (naive)": (music_seed_layer, ("huang",), 1024),
}


def build(impl: str, scheme: str, L: int, device: str, dtype):
    spec = spec_for(scheme, L)
    factory = torch_impl_module_layer if impl == "torch_impl" and scheme in MODULE_SCHEMES else IMPLS[impl][0]
    if impl == "music seed (naive)":  # the seed's table is unscaled and shared by heads
        spec = AttentionSpec(H, D_HEAD, relative=Huang(L, per_head=False), scale_relative=False)
    p = params_for(spec, device, dtype)
    x = torch.randn(B, L, H * D_HEAD, device=device, dtype=dtype)
    return factory(spec, p), x, p


def _timed_fn(layer, x, mode: str):
    if mode == "forward":

        def fn():
            with torch.no_grad():
                layer(x)
    else:

        def fn():
            layer(x).sum().backward()

    return fn


def run(lengths, device: str, dtype_name: str, modes, quick: bool) -> list:
    """The fast implementations in interleaved rounds per (L, mode); the naive seed algorithms alone, forward only."""
    dtype = getattr(torch, dtype_name)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    records = []
    for L in lengths:
        fast = [(impl, scheme) for impl in ("sdpa (anchor)", "torch_impl", PROJECTIONS) for scheme in IMPLS[impl][1]]
        layers = {key: build(*key, L, device, dtype) for key in fast}
        for mode in modes:
            fns = {key: _timed_fn(layer, x, mode) for key, (layer, x, _) in layers.items()}
            records += timed_records("torch", fns, L, dtype_name, device, mode, sync, rounds=3 if quick else 7)
        del layers
        for impl in ("shaw seed (naive)", "music seed (naive)"):
            _, schemes, max_L = IMPLS[impl]
            if max_L is not None and L > max_L:
                continue
            for scheme in schemes:
                layer, x, _ = build(impl, scheme, L, device, dtype)
                music = "music" in impl
                records.append(
                    timed_record(
                        "torch",
                        impl,
                        scheme,
                        L,
                        dtype_name,
                        device,
                        "forward",
                        _timed_fn(layer, x, "forward"),
                        sync,
                        repeats=1 if music else 3,
                        warmup=0 if music else 1,
                    )
                )
    return records


def main(argv=None):
    torch.manual_seed(0)
    bench_main(run, argv)


if __name__ == "__main__":
    main()
