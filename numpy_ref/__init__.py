"""The float64 NumPy reference: the executable form of the attnspec text.

``attention`` and ``attention_vjp`` define the semantics that every other
implementation is checked against; ``attention_blockwise`` evaluates the
same function over a split of the keys (BLOCK-1..BLOCK-4, the oracle of
sharded and fused evaluation); ``definition`` is a literal loop-level
transcription of the rule formulas, used only to test the vectorised code.
"""

from spec import SPEC_VERSION

from . import definition
from .backward import attention_vjp
from .blockwise import attention_blockwise, attention_blockwise_vjp
from .forward import attention
from .params import identity_params, init_params
from .schemes.rope import apply_rope
from .schemes.t5 import t5_buckets

__all__ = [
    "attention",
    "attention_vjp",
    "attention_blockwise",
    "attention_blockwise_vjp",
    "apply_rope",
    "t5_buckets",
    "init_params",
    "identity_params",
    "definition",
    "SPEC_VERSION",
]
