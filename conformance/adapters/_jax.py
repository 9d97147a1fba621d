"""Shared plumbing of the JAX adapters: x64, devices, conversion, matmul precision."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import numpy as np

from .base import Adapter


def jax_available():
    try:
        import flax  # noqa: F401
        import jax  # noqa: F401
    except ImportError as e:
        return f"jax / flax are not installed ({e}); pip install attnspec[jax]"
    return None


#: XLA's CPU compiler without its fusion emitters (its older loop emitters: the same HLO, optimised alike, emitted
#: as LLVM IR another way): a case's program compiles in about half the time (0.31 s where 0.72 s for
#: alibi/self/window-1-2's forward and VJP). A CPU-only flag; the GPU backends never read it.
FAST_CPU_COMPILES = "--xla_cpu_use_fusion_emitters=false"


def fast_cpu_compiles(environ=os.environ) -> bool:
    """Ask XLA's CPU compiler for ``FAST_CPU_COMPILES`` in this process and the ones it starts, unless XLA_FLAGS
    already names the flag (``XLA_FLAGS=--xla_cpu_use_fusion_emitters=true`` keeps the default emitters). Read by
    XLA when JAX starts its CPU backend: call it before. True when it was added."""
    flags = environ.get("XLA_FLAGS", "")
    if "xla_cpu_use_fusion_emitters" in flags:
        return False
    environ["XLA_FLAGS"] = f"{flags} {FAST_CPU_COMPILES}".strip()
    return True


#: A folder for XLA's compilation cache shared by the processes of one run (pytest-xdist
#: workers): set by the test session; otherwise each process makes a fresh one.
CACHE_ENV = "ATTNSPEC_JAX_CACHE_DIR"


def _compilation_cache() -> str:
    """A fresh, run-local folder for XLA's compilation cache (never one left from an earlier run).

    The kernel adapters of one implementation compile many identical
    programs (``jax`` lets jax_impl choose, which is ``jax:tiles`` for every
    built-in case); the cache compiles each once. It is keyed by the program
    and the compiler options, so it cannot change a result.
    """
    folder = os.environ.get(CACHE_ENV)
    if not folder:
        folder = tempfile.mkdtemp(prefix="attnspec-xla-")
        os.environ[CACHE_ENV] = folder
        atexit.register(shutil.rmtree, folder, True)
    return folder


def setup() -> dict:
    """float64 needs x64; conformance pins matmuls to full float32 precision; one compilation per program."""
    import jax

    jax.config.update("jax_enable_x64", True)
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", _compilation_cache())
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return {
        "jax": jax.__version__,
        "jax_enable_x64": True,
        "default_matmul_precision": "highest",
        "backend": jax.default_backend(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
    }


def devices() -> tuple:
    import jax

    return ("cpu", "gpu") if any(d.platform == "gpu" for d in jax.devices()) else ("cpu",)


def matmul_precision(dtype_name: str):
    """ "highest" (full float32 products, no bf16 passes) for float32 / float64;
    the 16-bit types have no such setting on every backend."""
    return "highest" if dtype_name in ("float32", "float64") else None


#: jax 0.10 on CPU rejects, under jit, the float16 x float16 -> float32 dot that
#: attention uses ("The precision 'F16_F16_F32' is not supported by dot_general
#: on CPU"): float16 is certified on GPU only.
UNSUPPORTED = {("cpu", "float16"): "jax cannot jit float16 attention on CPU (dot F16_F16_F32 unsupported)"}


def device_of(name: str):
    import jax

    return jax.devices("cpu" if name == "cpu" else "gpu")[0]


def to_jax(a, device: str):
    """The array on the device, its dtype kept (x64 is on).

    ``device_put`` copies a NumPy array as it is; ``jnp.asarray`` would first
    compile a small program per shape and dtype, which the per-case
    ``release`` then drops, so every case compiled its own again.
    """
    import jax

    if a is None:
        return None
    return jax.device_put(np.asarray(a), device_of(device))


def to_numpy(x) -> np.ndarray:
    return None if x is None else np.asarray(x)


def allowed_mask(spec, inputs: dict, B: int, H: int, Lq: int, Lk: int):
    """The boolean allowed-key mask (B, H, Lq, Lk) from the mask, top-left causal and the window.

    Default positions only (no position input; POS-3): delta = j - i, so causal is j <= i (CAUSAL-1)
    and the window -left <= j - i <= right (WINDOW-1, a None side unbounded).
    """
    import jax.numpy as jnp

    allowed = jnp.ones((B, H, Lq, Lk), dtype=bool)
    delta = jnp.arange(Lk)[None, :] - jnp.arange(Lq)[:, None]  # (Lq, Lk), POS-2 at default positions
    if spec.causal:
        allowed = allowed & (delta <= 0)
    if spec.window is not None:
        left, right = spec.window
        if left is not None:
            allowed = allowed & (delta >= -left)
        if right is not None:
            allowed = allowed & (delta <= right)
    if inputs.get("mask") is not None:
        allowed = allowed & jnp.asarray(inputs["mask"])
    return allowed


class JaxAdapter(Adapter):
    """Base of the JAX adapters: availability, x64 set-up, environment record."""

    def __init__(self):
        self._env = None

    def unavailable(self):
        return jax_available()

    def extra_environment(self) -> dict:
        return {}

    def release(self):
        """Drop this adapter's jitted programs and JAX's own caches (the compilation cache keeps them on disk)."""
        import jax

        for name in ("_compiled", "_compiled_forward"):
            compiled = getattr(type(self), name, None)
            if compiled is not None and hasattr(compiled, "cache_clear"):
                compiled.cache_clear()
        jax.clear_caches()

    def environment(self):
        if self._env is None:
            self._env = {**setup(), **self.extra_environment()}
        return self._env
