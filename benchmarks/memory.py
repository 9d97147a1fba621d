"""Peak memory of one forward pass, measured in a fresh process.

``python -m benchmarks.memory torch|jax IMPL SCHEME L DEVICE`` prints the
growth of peak memory during one forward call, in MiB: resident set size on
the CPU (``ru_maxrss``), allocator peak on a GPU. A warm-up call on a short
sequence first, so that libraries and kernels are not counted.
"""

from __future__ import annotations

import json
import resource
import sys


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def torch_peak(impl: str, scheme: str, L: int, device: str) -> float:
    import torch

    from .torch_bench import build

    with torch.no_grad():
        layer, x, _ = build(impl, scheme, 8, device, torch.float32)
        layer(x)
        layer, x, _ = build(impl, scheme, L, device, torch.float32)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            layer(x)
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - base) / 2**20
        before = rss_mib()
        layer(x)
        return rss_mib() - before


def jax_peak(impl: str, scheme: str, L: int, device: str) -> float:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import numpy_ref

    from .common import B, D_HEAD, H
    from .common import spec_for
    from .jax_bench import IMPLS

    def make(L):
        spec = spec_for(scheme, L)
        p = {n: jnp.asarray(a, jnp.float32) for n, a in numpy_ref.init_params(spec, 0).items()}
        x = jnp.asarray(np.random.default_rng(0).normal(size=(B, L, H * D_HEAD)), jnp.float32)
        return jax.jit(IMPLS[impl][0](spec)), p, x

    f, p, x = make(8)
    f(p, x).block_until_ready()
    f, p, x = make(L)
    compiled = f.lower(p, x).compile()  # compile outside the measured call
    before = rss_mib()
    compiled(p, x).block_until_ready()
    return rss_mib() - before


def main(argv=None):
    framework, impl, scheme, L, device = (argv or sys.argv[1:])
    peak = (torch_peak if framework == "torch" else jax_peak)(impl, scheme, int(L), device)
    print(json.dumps({"peak_mb": peak}))


if __name__ == "__main__":
    main()
