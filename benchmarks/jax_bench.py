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

from .common import B, D_HEAD, H, bench_main, spec_for, timed_record


def dpa_layer(spec):
    """The anchor: jax.nn.dot_product_attention with the same projections."""

    def f(p, x):
        def heads(w, b):
            return (x @ p[w] + p[b]).reshape(B, -1, H, D_HEAD)  # (B, L, N, H) layout

        o = jax.nn.dot_product_attention(heads("wq", "bq"), heads("wk", "bk"), heads("wv", "bv"),
                                         is_causal=spec.causal)
        return o.reshape(x.shape) @ p["wo"] + p["bo"]

    return f


def jax_impl_layer(spec):
    return lambda p, x: jax_impl.attention(spec, p, x)


IMPLS = {
    "dot_product_attention (anchor)": (dpa_layer, ("vanilla", "vanilla-causal")),
    "jax_impl": (jax_impl_layer, ("vanilla", "vanilla-causal", "shaw", "huang", "huang-causal")),
}


def run(lengths, device: str, dtype_name: str, modes, quick: bool) -> list:
    dtype = jnp.dtype(dtype_name)
    dev = jax.devices("cpu" if device == "cpu" else "gpu")[0]
    records = []
    for L in lengths:
        for impl, (factory, schemes) in IMPLS.items():
            for scheme in schemes:
                spec = spec_for(scheme, L)
                p = {n: jax.device_put(jnp.asarray(a, dtype), dev) for n, a in numpy_ref.init_params(spec, 0).items()}
                x = jax.device_put(jnp.asarray(np.random.default_rng(0).normal(size=(B, L, H * D_HEAD)), dtype), dev)
                layer = factory(spec)
                fwd = jax.jit(layer)
                grad = jax.jit(jax.grad(lambda p, x: jnp.sum(layer(p, x)), argnums=(0, 1)))
                for mode in modes:
                    fn = (lambda: fwd(p, x).block_until_ready()) if mode == "forward" else \
                        (lambda: jax.block_until_ready(grad(p, x)))
                    records.append(timed_record("jax", impl, scheme, L, dtype_name, device, mode, fn,
                                                repeats=2 if quick else 5))
    return records


def main(argv=None):
    bench_main(run, argv)


if __name__ == "__main__":
    main()
