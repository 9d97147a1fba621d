"""attnspec in JAX / Flax NNX: a jit-compiled implementation of the spec.

``attention`` is the pure functional core (jit with ``spec`` static);
``MultiHeadAttention`` an NNX module owning the parameters; ``from_flax_mha``
/ ``to_flax_mha`` convert to and from ``flax.nnx.MultiHeadAttention``.
float64 needs ``jax.config.update("jax_enable_x64", True)``.
"""

from .functional import attention
from .interop import from_flax_mha, to_flax_mha
from .module import MultiHeadAttention

__all__ = ["attention", "MultiHeadAttention", "from_flax_mha", "to_flax_mha"]
