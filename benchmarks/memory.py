"""Peak memory of one forward pass, measured in a fresh process.

``python -m benchmarks.memory torch|jax IMPL SCHEME L DEVICE`` prints the
growth of peak memory during one forward call, in MiB: on the CPU the peak
resident set size during the call minus the resident set size just before
it (Linux: the peak is reset first through /proc/self/clear_refs, so memory
freed before the call does not hide the call's own peak; elsewhere the
process-lifetime ``ru_maxrss``), the allocator peak on a GPU. A warm-up call
on a short sequence first, so that libraries and kernels are not counted.
"""

from __future__ import annotations

import json
import resource
import sys


def _status_mib(field: str):
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        return None
    return None


def start_peak() -> float:
    """Reset the peak resident set size where the OS allows it; returns the size now (MiB)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # Linux: reset the peak RSS to the current RSS
        now = _status_mib("VmRSS")
        if now is not None:
            return now
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def peak_since(start: float) -> float:
    peak = _status_mib("VmHWM")
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return peak - start


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
        start = start_peak()
        layer(x)
        return peak_since(start)


def jax_peak(impl: str, scheme: str, L: int, device: str) -> float:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import numpy_ref

    from .common import D_HEAD, B, H, spec_for
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
    start = start_peak()
    compiled(p, x).block_until_ready()
    return peak_since(start)


def main(argv=None):
    framework, impl, scheme, L, device = argv or sys.argv[1:]
    peak = (torch_peak if framework == "torch" else jax_peak)(impl, scheme, int(L), device)
    print(json.dumps({"peak_mb": peak}))


if __name__ == "__main__":
    main()
