"""attnspec in PyTorch: a fast, device-agnostic implementation of the spec.

``attention`` is the functional core over tensors; ``MultiHeadAttention`` an
``nn.Module`` owning the parameters; ``from_torch_mha`` / ``to_torch_mha``
convert to and from ``torch.nn.MultiheadAttention``; ``ring_attention`` a rank's
rows of the same call with the sequence sharded over a ``torch.distributed``
group (ring attention, BLOCK-1..BLOCK-5). ``kernels`` holds the
ways to compute the core (``implementation=``, KERN-1), ``schemes`` one
module per position scheme (REL-4).

    torch_impl/
      functional.py   the entry point: checks, projections, heads, the kernel dispatch (KERN-1)
      _checks.py      the argument checks (INPUT-1), worded by spec.validation
      _core.py        what every kernel shares: the call, positions, allowed keys, softmax, head layout
      kernels/        eager (readable), sdpa (fused vanilla, after RoPE's rotation), tiles (fast explicit); the registry
      schemes/        shaw, huang, rope, alibi, t5, swin: the scheme hooks, eager and per tile (REL-4); the registry
      _workspace.py   reused tile buffers (tiles kernel, no gradient recorded)
      module.py       the nn.Module
      ring.py         ring attention over a torch.distributed group
      interop.py      the nn.MultiheadAttention layout map (PARAM-3)
      relative.py     the former import path of the relative helpers (re-exports only)
"""

from . import kernels, schemes
from .functional import attention
from .interop import from_torch_mha, to_torch_mha
from .module import MultiHeadAttention
from .ring import ring_attention

__all__ = [
    "attention",
    "ring_attention",
    "MultiHeadAttention",
    "from_torch_mha",
    "to_torch_mha",
    "kernels",
    "schemes",
]
