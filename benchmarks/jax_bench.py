"""JAX benchmarks: jax_impl under jit against jax.nn.dot_product_attention under jit.

Run by ``python -m benchmarks``; one process for all JAX timings. Compilation
happens in the warm-up call and is not timed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jax_impl
import numpy_ref

from .common import D_HEAD, PROJECTIONS, B, H, bench_main, spec_for, timed_records


def dpa_layer(spec):
    """The anchor: jax.nn.dot_product_attention with the same projections."""

    def f(p, x):
        def heads(w, b):
            return (x @ p[w] + p[b]).reshape(B, -1, H, D_HEAD)  # (B, L, N, H) layout

        o = jax.nn.dot_product_attention(heads("wq", "bq"), heads("wk", "bk"), heads("wv", "bv"), is_causal=spec.causal)
        return o.reshape(x.shape) @ p["wo"] + p["bo"]

    return f


def projections_layer(spec):
    """The four projections and the head reshapes of the anchor, with no attention between them."""

    def f(p, x):
        def heads(w, b):
            return (x @ p[w] + p[b]).reshape(B, -1, H, D_HEAD)

        q, k, v = heads("wq", "bq"), heads("wk", "bk"), heads("wv", "bv")
        return (v + 0 * (q + k)).reshape(x.shape) @ p["wo"] + p["bo"]  # q and k stay live under jit

    return f


def jax_impl_layer(spec):
    return lambda p, x: jax_impl.attention(spec, p, x)


IMPLS = {
    "dot_product_attention (anchor)": (dpa_layer, ("vanilla", "vanilla-causal")),
    "jax_impl": (
        jax_impl_layer,
        ("vanilla", "vanilla-causal", "shaw", "huang", "huang-causal", "rope", "alibi", "t5", "swin"),
    ),
    PROJECTIONS: (projections_layer, ("vanilla",)),
}


def run(lengths, device: str, dtype_name: str, modes, quick: bool) -> list:
    """All implementations per (L, mode) in interleaved rounds; compilation happens in the warm-up round."""
    dtype = jnp.dtype(dtype_name)
    dev = jax.devices("cpu" if device == "cpu" else "gpu")[0]
    records = []
    for L in lengths:
        x = jax.device_put(jnp.asarray(np.random.default_rng(0).normal(size=(B, L, H * D_HEAD)), dtype), dev)
        for mode in modes:
            fns = {}
            for impl, (factory, schemes) in IMPLS.items():
                for scheme in schemes:
                    spec = spec_for(scheme, L)
                    p = {
                        n: jax.device_put(jnp.asarray(a, dtype), dev) for n, a in numpy_ref.init_params(spec, 0).items()
                    }
                    fns[(impl, scheme)] = _timed_fn(factory(spec), p, x, mode)
            records += timed_records("jax", fns, L, dtype_name, device, mode, rounds=3 if quick else 7)
    return records


def _timed_fn(layer, p, x, mode: str):
    if mode == "forward":
        fwd = jax.jit(layer)
        return lambda: fwd(p, x).block_until_ready()
    grad = jax.jit(jax.grad(lambda p, x: jnp.sum(layer(p, x)), argnums=(0, 1)))
    return lambda: jax.block_until_ready(grad(p, x))


def main(argv=None):
    bench_main(run, argv)


if __name__ == "__main__":
    main()
