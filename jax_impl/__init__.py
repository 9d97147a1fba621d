"""attnspec in JAX / Flax NNX: a jit-compiled implementation of the spec.

``attention`` is the pure functional core (jit with ``spec`` and
``implementation`` static); ``MultiHeadAttention`` an NNX module owning the
parameters; ``from_flax_mha`` / ``to_flax_mha`` convert to and from
``flax.nnx.MultiHeadAttention``; ``ring_attention`` the same call with the
sequence sharded over a mesh axis (ring attention, BLOCK-1..BLOCK-5). float64 needs
``jax.config.update("jax_enable_x64", True)``.

Layout: ``functional`` (the entry point: checks, projections, heads, kernel
dispatch), ``kernels/`` (*how*: ``xla`` the readable baseline, ``tiles`` the
fast algorithms; KERN-1), ``schemes/`` (*what* a position scheme adds: one
module per scheme, REL-3), ``masking`` and ``heads`` (the pieces every
kernel shares), ``module`` and ``interop`` (Flax).
"""

from . import kernels, schemes
from .functional import attention
from .interop import from_flax_mha, to_flax_mha
from .module import MultiHeadAttention
from .ring import ring_attention

__all__ = [
    "attention",
    "ring_attention",
    "MultiHeadAttention",
    "from_flax_mha",
    "to_flax_mha",
    "kernels",
    "schemes",
]
